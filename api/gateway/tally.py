"""The tokens a node's answer reports (OpenAI's `usage`), read as the answer passes
through the gateway (api/gateway/call.py), for the client's usage
(api/gateway/usage.py).

A plain answer carries `usage` in its body (an embeddings answer reports
`prompt_tokens` only: input tokens). The body may be 32 MiB: it is not parsed whole
(pydantic's parser builds every value, even of keys it then ignores: ~15 times the
body's size, and the event loop blocked meanwhile). The last `"usage"` key's object is
read, within USAGE_WINDOW bytes: in llama-server's answers (obs, 0.3.36) nothing after
that key holds the word as a key (a completion's `id` and `timings` follow it; an
embeddings answer's `data`, floats or base64, follows it), nor does the worker's merged
list answer, whose usage is last; text inside a string never holds `"usage"` (its
quotes are escaped).

A chat stream carries it in a last event of its own (`choices: []`), sent only when
asked (`stream_options.include_usage`): the gateway always asks the node for it, and
takes that event out of the stream of a client that did not ask, so the client sees
what it asked for and its tokens are counted either way. A completions stream carries
it on its final choice event (`finish_reason` and `usage` in one, asked or not): that
event is never taken out, only an event with `choices: []` is.

The stream is read line by line as it passes (an event's `data:` line ends at a
newline, however the node's chunks split it): a chunk goes out up to its last newline,
the rest waits for the next one (a client can read no partial line anyway). Only a
`data:` line holding `"usage"` is parsed. A stream cut before its usage came is
estimated: one completion token per delta with text relayed (content, reasoning or a
tool call's arguments), no prompt tokens. A chunk of whole lines without a usage, the
usual one, is only counted.

The node is outside the trust boundary: its usage is read by pydantic's parser (no
recursion on nesting), bounded, and ignored when it is not the shape OpenAI gives it.
What it reports is then held to what the request allows (`bounded`): at most the
invoke's max_tokens completion tokens, at most a token per byte of the prompt's text
(every tokenizer's token covers at least one byte) plus the chat template's own (a
completion's prompts and embeddings' inputs alike), so a node cannot charge a client
more than the request could have cost. A stream's
completion is at least the content events it relayed, so a node cannot hide what the
client saw either; a plain answer has no such floor (its text is not read).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, Strict, ValidationError

from schemas.gateway_tools import Message, Tool, message_text

# Far above any one answer's tokens, far below what would overflow a day's sums.
MAX_TOKENS = 10_000_000
# A line longer than this without a newline goes out as it is, unread: what waits for
# the rest of a line stays bounded.
MAX_LINE = 64 * 1024
# A usage object's bytes at most (OpenAI's, with its details, is ~150).
USAGE_WINDOW = 4096
# An OpenAI stream's last event.
DONE = b"data: [DONE]"
_LINE_DONE = b"\n" + DONE

# A chat template's own tokens: per message (role markers, separators), and once (a
# default system prompt, the generation prompt). Generous: an honest count never
# reaches the bound.
TEMPLATE_TOKENS_PER_MESSAGE = 32
TEMPLATE_TOKENS = 2048

_Tokens = Annotated[int, Strict(), Field(ge=0, le=MAX_TOKENS)]


class _Usage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    prompt_tokens: _Tokens = 0
    completion_tokens: _Tokens = 0


class _Reported(BaseModel):
    """An answer, or a stream's event, read for its usage alone."""

    model_config = ConfigDict(extra="ignore")

    usage: _Usage | None = None
    choices: list[Any] | None = None


def _read(raw: bytes | str) -> _Reported | None:
    try:
        return _Reported.model_validate_json(raw)
    except ValidationError:
        return None


def chat_texts(messages: Sequence[Message], tools: Sequence[Tool] | None = None) -> list[str]:
    """A chat request's prompt text: its messages, and its tools' definitions (a template
    renders them too)."""
    return [message_text(m) for m in messages] + [t.model_dump_json() for t in tools or ()]


def prompt_texts(prompt: str | Sequence[str]) -> list[str]:
    """A completion's prompts, or an embeddings request's inputs."""
    return [prompt] if isinstance(prompt, str) else list(prompt)


def bounded(tokens: tuple[int, int], texts: Sequence[str], max_tokens: int) -> tuple[int, int]:
    """(prompt, completion) as a node reported them, held to what the request allows:
    at most a token per byte of its prompt texts (each with a template's own tokens),
    at most `max_tokens` completion tokens (0 for embeddings, which complete nothing)."""
    prompt, completion = tokens
    ceiling = TEMPLATE_TOKENS + TEMPLATE_TOKENS_PER_MESSAGE * len(texts)
    # Characters first (never more than bytes): the bytes only when that is not enough.
    if prompt > ceiling + sum(len(text) for text in texts):
        prompt = min(prompt, ceiling + sum(len(text.encode()) for text in texts))
    return prompt, min(completion, max_tokens)


def plain_usage(body: bytes) -> tuple[int, int]:
    """(prompt, completion) tokens a plain answer reports; (0, 0) without a usage.
    Only the last `"usage"` key's value is decoded (the C decoder stops at its end and
    raises RecursionError on deep nesting): a node that puts it elsewhere, or writes it
    otherwise, hides its own usage, which it could by leaving it out."""
    at = body.rfind(b'"usage"')
    if at < 0:
        return 0, 0
    window = body[at + len(b'"usage"') : at + len(b'"usage"') + USAGE_WINDOW]
    text = window.decode("utf-8", "replace").lstrip()
    if not text.startswith(":"):
        return 0, 0
    try:
        value, _ = _DECODER.raw_decode(text[1:].lstrip())
        usage = _Usage.model_validate(value)
    except (ValueError, RecursionError):  # ValidationError is a ValueError
        return 0, 0
    return usage.prompt_tokens, usage.completion_tokens


_DECODER = json.JSONDecoder()


class StreamTally:
    """One relayed stream's tokens. `feed` each chunk and send what it answers; `end`
    answers what was still held."""

    __slots__ = (
        "_held",
        "_skip_blank",
        "_strip",
        "_tail",
        "completion",
        "done",
        "events",
        "prompt",
        "reported",
    )

    def __init__(self, *, strip_usage: bool) -> None:
        self._strip = strip_usage
        self._held = b""
        # A usage event taken out: the blank line that ended it goes too.
        self._skip_blank = False
        self.prompt = 0
        self.completion = 0
        self.reported = False
        # Content events relayed: the estimate of a stream cut short.
        self.events = 0
        # The stream's terminator went out: a client that leaves after it read it
        # whole, even if the node's end frame had not reached the gateway yet.
        self.done = False
        # The last bytes fed (a newline before the first: the stream starts a line).
        self._tail = b"\n"

    @property
    def tokens(self) -> tuple[int, int]:
        """(prompt, completion): as reported, or the estimate; the completion at least
        the content events relayed."""
        if self.reported:
            return self.prompt, max(self.completion, self.events)
        return 0, self.events

    def feed(self, chunk: bytes) -> bytes:
        # At a line's start only (inside an event's text it is only text), and across
        # however the node's chunks split it.
        if not self.done:
            seen = self._tail + chunk
            self.done = _LINE_DONE in seen
            self._tail = seen[-len(DONE) :]
        plain = not self._held and not self._skip_blank and chunk.endswith(b"\n")
        if plain and b'"usage"' not in chunk:
            # The usual chunk: whole events, none with a usage; counted, sent as is.
            self.events += _content_events(chunk)
            return chunk
        data = self._held + chunk if self._held else chunk
        cut = data.rfind(b"\n") + 1
        if cut == 0:
            if len(data) > MAX_LINE:
                self._held = b""
                return data
            self._held = data
            return b""
        self._held = data[cut:]
        whole = data[:cut]
        return self._lines(whole)

    def end(self) -> bytes:
        held, self._held = self._held, b""
        return self._lines(held) if held else b""

    def _lines(self, whole: bytes) -> bytes:
        lines = whole.splitlines(keepends=True)
        kept: list[bytes] | None = None
        for i, line in enumerate(lines):
            if self._line(line):
                if kept is None:
                    # Rebuilt only when a line goes: a chunk usually goes out as it came.
                    kept = lines[:i]
            elif kept is not None:
                kept.append(line)
        return whole if kept is None else b"".join(kept)

    def _line(self, line: bytes) -> bool:
        """Read one line; True if it is not for the client."""
        if self._skip_blank:
            self._skip_blank = False
            if not line.strip():
                return True
        if not line.startswith(b"data:"):
            return False
        if b'"usage"' in line:
            reported = _read(line[5:].strip())
            if reported is not None and reported.usage is not None:
                self.reported = True
                self.prompt = reported.usage.prompt_tokens
                self.completion = reported.usage.completion_tokens
                if self._strip and reported.choices == []:
                    self._skip_blank = True
                    return True
        self.events += _content_events(line)
        return False


def _content_events(data: bytes) -> int:
    """Deltas with text (content or reasoning_content, a tool call's arguments, or a
    completion's `text`) in these whole lines."""
    text = data.count(b'content":"') - data.count(b'content":""')
    text += data.count(b'"text":"') - data.count(b'"text":""')
    return text + data.count(b'arguments":"') - data.count(b'arguments":""')
