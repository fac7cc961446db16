"""A steady load through the gateway with the official `openai` client, as an application
runs it: the client's own retries (max_retries=2: 408, 409, 429, 5xx and connection
errors, backing off 0.5 s to 8 s and honouring Retry-After), short answers, streamed
and plain in turn, from a few threads. Every request's outcome is recorded with its
time, so a test can judge each phase of what it did to the fleet underneath.

A request *failed* when the client raised after its retries. A stream is *cut* when it
ended without a chunk carrying a finish_reason (the gateway's error event raises in the
client: that is a cut too, `after_first_chunk`)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import openai

from schemas.protocol import GATEWAY_PREFIX, ROUTE_NODE_HEADER

PROMPT: list[Any] = [{"role": "user", "content": "Say hello."}]


@dataclass(frozen=True)
class Outcome:
    started: float  # time.monotonic()
    ended: float
    stream: bool
    ok: bool
    # Streamed: at least one chunk had arrived when it failed or ended without a finish.
    after_first_chunk: bool = False
    node: str | None = None
    error: str | None = None
    # The typed code of the gateway's refusal or error event, when it gave one.
    code: str | None = None


@dataclass
class Attempt:
    """One HTTP answer the client received (a retried attempt answers >= 400)."""

    at: float
    status: int


@dataclass
class SteadyLoad:
    base_url: str
    api_key: str
    model: str
    threads: int = 2
    # Between two requests of one thread: a few short answers per second in all, light
    # enough for two llama-servers on two shared cores.
    pause_s: float = 0.25
    max_tokens: int = 6
    outcomes: list[Outcome] = field(default_factory=list)
    attempts: list[Attempt] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _running: list[threading.Thread] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def client(self) -> openai.OpenAI:
        """The official client with its default retries; an event hook records every
        answer it got, so the retries it made are visible."""
        http = openai.DefaultHttpxClient(
            trust_env=False, event_hooks={"response": [self._answered]}
        )
        return openai.OpenAI(
            base_url=self.base_url + GATEWAY_PREFIX,
            api_key=self.api_key,
            max_retries=2,
            timeout=60,
            http_client=http,
        )

    def _answered(self, response: Any) -> None:
        with self._lock:
            self.attempts.append(Attempt(time.monotonic(), int(response.status_code)))

    def start(self) -> SteadyLoad:
        for index in range(self.threads):
            thread = threading.Thread(target=self._run, args=(index,), daemon=True)
            thread.start()
            self._running.append(thread)
        return self

    def stop(self) -> None:
        self._stop.set()
        for thread in self._running:
            thread.join(timeout=90)

    def _run(self, index: int) -> None:
        client = self.client()
        turn = index
        while not self._stop.is_set():
            outcome = self.streamed(client) if turn % 2 else self.plain(client)
            with self._lock:
                self.outcomes.append(outcome)
            turn += 1
            self._stop.wait(self.pause_s)

    def plain(self, client: openai.OpenAI) -> Outcome:
        started = time.monotonic()
        try:
            raw = client.chat.completions.with_raw_response.create(
                model=self.model, messages=PROMPT, max_tokens=self.max_tokens
            )
            answer = raw.parse()
        except openai.APIError as failed:
            return _failed(started, False, False, failed)
        finished = bool(answer.choices) and answer.choices[0].finish_reason is not None
        return Outcome(
            started,
            time.monotonic(),
            stream=False,
            ok=finished,
            node=raw.headers.get(ROUTE_NODE_HEADER),
            error=None if finished else "an answer without a finish_reason",
        )

    def streamed(self, client: openai.OpenAI) -> Outcome:
        started = time.monotonic()
        chunks = 0
        finish: str | None = None
        node: str | None = None
        try:
            raw = client.chat.completions.with_raw_response.create(
                model=self.model, messages=PROMPT, max_tokens=self.max_tokens, stream=True
            )
            node = raw.headers.get(ROUTE_NODE_HEADER)
            for chunk in raw.parse():
                chunks += 1
                if chunk.choices and chunk.choices[0].finish_reason is not None:
                    finish = chunk.choices[0].finish_reason
        except openai.APIError as failed:
            return _failed(started, True, chunks > 0, failed, node)
        return Outcome(
            started,
            time.monotonic(),
            stream=True,
            ok=finish is not None,
            after_first_chunk=chunks > 0,
            node=node,
            error=None if finish else f"the stream ended after {chunks} chunks, no finish",
        )

    # Reading what happened ----------------------------------------------------------------

    def between(self, start: float, end: float) -> list[Outcome]:
        """The requests that started in [start, end)."""
        with self._lock:
            return [o for o in self.outcomes if start <= o.started < end]

    def retried_between(self, start: float, end: float) -> int:
        """Answers >= 400 the client received (and retried, or gave up on) in [start, end)."""
        with self._lock:
            return sum(1 for a in self.attempts if start <= a.at < end and a.status >= 400)

    def served_by(self, node_id: str, since: float) -> bool:
        with self._lock:
            return any(o.ok and o.node == node_id and o.started >= since for o in self.outcomes)

    @contextmanager
    def phase(self, name: str, phases: dict[str, tuple[float, float]]) -> Iterator[None]:
        """Record [start, end) of a phase under its name."""
        start = time.monotonic()
        try:
            yield
        finally:
            phases[name] = (start, time.monotonic())


def _failed(
    started: float,
    stream: bool,
    after_first: bool,
    failed: openai.APIError,
    node: str | None = None,
) -> Outcome:
    body = failed.body if isinstance(failed.body, dict) else {}
    code = body.get("code") or (body.get("error") or {}).get("code")
    return Outcome(
        started,
        time.monotonic(),
        stream=stream,
        ok=False,
        after_first_chunk=after_first,
        node=node,
        error=f"{type(failed).__name__}: {failed}",
        code=str(code) if code else None,
    )


def summary(outcomes: list[Outcome]) -> str:
    """One line: counts, then each failure (for an assertion's message)."""
    failed = [o for o in outcomes if not o.ok]
    streams = sum(1 for o in outcomes if o.stream)
    lines = [f"{len(outcomes)} requests ({streams} streamed), {len(failed)} failed"]
    lines += [
        f"  {'stream' if o.stream else 'plain'} at {o.started:.2f}: {o.error}" for o in failed
    ]
    return "\n".join(lines)
