"""One deployment.invoke.v1 on the runtime worker: run it on the deployment's
llama-server and stream the answer back to the control plane (schemas/protocol.py:
INVOKE_STREAM), under the lease that came with the delivery.

* **Checked again**: the delivery is validated as an `Invoke` (schemas/gateway.py)
  whatever the control plane sent; one that is not is refused `invoke_invalid` (422)
  when its envelope (id, lease, gateway) can be read, and dropped otherwise.
* **Admission**: the deployment must be loaded here (else `deployment_not_loaded`,
  503), serve the invoke's endpoint (chat, completions or embeddings, as its load
  declared them; else `endpoint_not_served`, 404: this deployment has no such
  endpoint, another may), not be draining (`deployment_draining`, 503; so while the
  worker stops), and be below its `max_concurrent` (`deployment_busy`, 429). A
  refusal is the answer's status with an `InvokeRefusal` body; the gateway retries
  those elsewhere.
* **The request** is built from the typed params only (agent/runtime/llama_body.py)
  and posted to the endpoint's llama-server path: for chat the served name, the
  messages, a token bound within the worker's ceiling, the sampling values that were
  set, the stop strings, the stream flag, and the tools, response format and log
  probabilities asked for (and, on the shipped tool template, an assistant message
  opening a required call); for completions the prompt in place of the messages and
  no tools; for embeddings the inputs and their encoding. Nothing else reaches
  llama-server.
* **No turn**: the device is pinned to the deployment's model (it cannot switch), and
  llama-server queues requests itself; `max_concurrent` is the bound.
* **The answer** goes back as it comes: llama-server's status and content type in the
  headers, its bytes unchanged as a chunked body (a non-streamed answer, so every
  embeddings answer, is read whole first, or refused `upstream_unavailable` when it
  breaks off). A stream that ends without `[DONE]`, or breaks, gets
  agent/runtime/api.py's error event at its end. A whole completion for a list of
  prompts is asked one prompt at a time and merged (agent/runtime/completion_list.py:
  llama-server's own answer to a list counts one prompt's usage), under the one
  concurrency slot the invoke holds.
* **Stop**: the invoke's task cancelled (a `cancel` on the channel), or the API
  refusing or dropping the stream (409 once the gateway retried elsewhere or the
  invoke ended), closes its llama-server connection at once, which is what stops
  llama-server's work on it. A drain's cut closes that connection from the other
  side (the unload), and the stream ends with the error event.

`Invokes` holds this worker's invokes by id for the channel (agent/runtime/channel.py):
a delivery starts one task at once, a second delivery of the same (id, epoch) is
ignored, and a newer epoch replaces an older one.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import uuid
from collections import OrderedDict
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from typing import Any

import aiohttp
from pydantic import BaseModel, ConfigDict, ValidationError

from agent.client import ProtocolClient
from agent.errors import RequestFailed, invalid_fields
from agent.runtime.api import RELAY_ERRORS, STREAM_DONE, STREAM_FAILED
from agent.runtime.completion_list import BrokenAnswer, complete_each, listed_prompts
from agent.runtime.deployed import Deployed
from agent.runtime.llama_body import endpoint_of, llama_request
from agent.runtime.worker import RuntimeWorker
from schemas.gateway import GatewayId, Invoke, InvokeRefusal
from schemas.jobs import LeaseFence

logger = logging.getLogger("modelforge.runtime.invoke")

_JSON = "application/json"
# Deliveries remembered for deduplication.
REMEMBERED = 4096


class _Envelope(BaseModel):
    """What a delivery must carry to be answered at all, read leniently: an invoke that
    fails validation is refused under its own lease."""

    model_config = ConfigDict(extra="ignore")

    invoke_id: uuid.UUID
    lease: LeaseFence
    gateway: GatewayId


class Refused(Exception):
    def __init__(self, status: int, refusal: InvokeRefusal) -> None:
        super().__init__(refusal.message)
        self.status = status
        self.refusal = refusal


def _refused(status: int, code: Any, message: str) -> Refused:
    return Refused(status, InvokeRefusal(code=code, message=message))


def _as_json(delivered: Invoke | Mapping[str, Any] | str | bytes) -> str | bytes:
    if isinstance(delivered, Invoke):
        return delivered.model_dump_json()
    if isinstance(delivered, Mapping):
        return json.dumps(dict(delivered))
    return delivered


def envelope(delivered: Invoke | Mapping[str, Any] | str | bytes) -> _Envelope | None:
    try:
        return _Envelope.model_validate_json(_as_json(delivered))
    except (ValidationError, TypeError, ValueError):
        return None


async def run_invoke(
    worker: RuntimeWorker,
    client: ProtocolClient,
    delivered: Invoke | Mapping[str, Any] | str | bytes,
) -> str:
    """Run one delivered invoke to its end; what became of it, as a word for the log
    and the tests ("relayed", "refused <code>", "stream refused", "dropped"). Run it as
    a task of its own (Invokes does): a drain's cut cancels the task that runs it."""
    outer = envelope(delivered)
    if outer is None:
        logger.warning("an invoke delivery without a readable id, lease and gateway: dropped")
        return "dropped"
    try:
        invoke = Invoke.model_validate_json(_as_json(delivered))
    except ValidationError as exc:
        refusal = _refused(422, "invoke_invalid", f"invalid fields: {invalid_fields(exc)}")
        return await _refuse(client, outer, refusal)
    try:
        deployed = _admit(worker, invoke)
    except Refused as refusal:
        return await _refuse(client, outer, refusal)
    task = asyncio.current_task()
    if task is None:
        raise RuntimeError("run_invoke runs as a task")
    deployed.invokes[invoke.invoke_id] = task
    try:
        return await _relay(worker, client, invoke, deployed)
    except Refused as refusal:
        return await _refuse(client, outer, refusal)
    finally:
        if deployed.invokes.get(invoke.invoke_id) is task:
            del deployed.invokes[invoke.invoke_id]
        deployed.ended.set()


def _admit(worker: RuntimeWorker, invoke: Invoke) -> Deployed:
    deployed = worker.deployments.get(invoke.deployment_id)
    if deployed is None:
        raise _refused(503, "deployment_not_loaded", "the deployment is not loaded here")
    endpoint = endpoint_of(invoke.params)
    if endpoint not in deployed.model.endpoints:
        raise _refused(404, "endpoint_not_served", f"the deployment does not serve {endpoint}")
    if deployed.draining or worker.stopping.is_set():
        raise _refused(503, "deployment_draining", "the deployment takes no new invokes")
    if deployed.in_flight >= deployed.max_concurrent:
        raise _refused(
            429, "deployment_busy", f"{deployed.in_flight} invokes in flight (the bound)"
        )
    return deployed


async def _relay(
    worker: RuntimeWorker, client: ProtocolClient, invoke: Invoke, deployed: Deployed
) -> str:
    server = deployed.server
    if server is None:
        raise _refused(503, "upstream_unavailable", "the deployment's server is not running")
    model = deployed.model
    path, body = llama_request(
        invoke.params, model.served_name, worker.config.max_tokens_ceiling, model.chat_template
    )
    prompts = listed_prompts(invoke.params)
    if prompts is not None:
        try:
            each = await complete_each(server, path, body, prompts)
        except BrokenAnswer as exc:
            raise _refused(503, "upstream_unavailable", str(exc)) from None
        return await _send(client, invoke, each.status, each.content_type, each.body)
    try:
        upstream = await server.post_relayed(path, json.dumps(body).encode())
    except (*RELAY_ERRORS, RuntimeError) as exc:  # RuntimeError: its session just closed
        raise _refused(
            503, "upstream_unavailable", f"llama-server did not answer ({type(exc).__name__})"
        ) from None
    answer = _stream(upstream) if invoke.params.stream else None
    try:
        if answer is None:
            try:
                content: bytes | AsyncIterator[bytes] = await upstream.read()
            except RELAY_ERRORS:
                raise _refused(
                    503, "upstream_unavailable", "llama-server failed mid-answer"
                ) from None
        else:
            content = answer
        content_type = upstream.headers.get("Content-Type", _JSON)
        return await _send(client, invoke, upstream.status, content_type, content)
    finally:
        # Closed, not released: the connection's end is what stops llama-server's work.
        upstream.close()
        if answer is not None:
            with contextlib.suppress(RuntimeError):
                await answer.aclose()


async def _send(
    client: ProtocolClient,
    invoke: Invoke,
    status: int,
    content_type: str,
    body: bytes | AsyncIterator[bytes],
) -> str:
    try:
        await client.stream_invoke(
            invoke.invoke_id,
            invoke.lease,
            invoke.gateway,
            status=status,
            content_type=content_type,
            body=body,
        )
    except RequestFailed as exc:
        # Refused (409: the gateway retried elsewhere, or the invoke ended) or the API
        # unreachable: nobody reads the rest, so llama-server stops here.
        logger.info("invoke %s: the answer stream was not taken (%s)", invoke.invoke_id, exc)
        return "stream refused"
    return "relayed"


async def _stream(upstream: aiohttp.ClientResponse) -> AsyncGenerator[bytes, None]:
    """llama-server's answer as it comes, with an error event at its end when an event
    stream was cut (no `[DONE]`, or a broken read)."""
    events = upstream.status == 200 and upstream.content_type == "text/event-stream"
    tail = b""
    try:
        async for chunk in upstream.content.iter_any():
            tail = (tail + chunk)[-64:]
            yield chunk
        cut = events and STREAM_DONE not in tail
    except RELAY_ERRORS:
        cut = True
    if cut:
        logger.warning("an invoke's llama-server stream was cut")
        yield STREAM_FAILED


async def _refuse(client: ProtocolClient, outer: _Envelope, refused: Refused) -> str:
    code = refused.refusal.code
    logger.info("invoke %s refused: %s", outer.invoke_id, code)
    with contextlib.suppress(RequestFailed):
        await client.stream_invoke(
            outer.invoke_id,
            outer.lease,
            outer.gateway,
            status=refused.status,
            content_type=_JSON,
            body=refused.refusal.model_dump_json().encode(),
        )
    return f"refused {code}"


class Invokes:
    """This worker's invokes in flight, by id, as the channel delivers them."""

    def __init__(self, worker: RuntimeWorker, client: ProtocolClient) -> None:
        self.worker = worker
        self.client = client
        self.running: dict[uuid.UUID, tuple[int, asyncio.Task[str]]] = {}
        self._seen: OrderedDict[tuple[uuid.UUID, int], None] = OrderedDict()

    def deliver(self, delivered: Invoke | Mapping[str, Any] | str | bytes) -> bool:
        """Start a delivered invoke at once; False when it was a duplicate delivery (two
        channels briefly open), an older epoch than the one running, or unreadable."""
        outer = envelope(delivered)
        if outer is None:
            logger.warning("an invoke delivery without a readable id, lease and gateway")
            return False
        key = (outer.invoke_id, outer.lease.epoch)
        if key in self._seen:
            return False
        self._seen[key] = None
        while len(self._seen) > REMEMBERED:
            self._seen.popitem(last=False)
        current = self.running.get(outer.invoke_id)
        if current is not None:
            if current[0] > outer.lease.epoch:
                return False
            current[1].cancel()  # its lease is stale: the newer delivery replaces it
        task = asyncio.create_task(run_invoke(self.worker, self.client, delivered))
        self.running[outer.invoke_id] = (outer.lease.epoch, task)
        task.add_done_callback(lambda done: self._ended(outer.invoke_id, done))
        return True

    def _ended(self, invoke_id: uuid.UUID, task: asyncio.Task[str]) -> None:
        if self.running.get(invoke_id, (0, None))[1] is task:
            del self.running[invoke_id]
        if not task.cancelled() and task.exception() is not None:
            logger.error("invoke %s failed", invoke_id, exc_info=task.exception())

    def cancel(self, invoke_id: uuid.UUID) -> bool:
        """The invoke's client left: stop it (its llama-server connection closes)."""
        current = self.running.get(invoke_id)
        if current is None:
            return False
        current[1].cancel()
        return True

    async def close(self, grace_s: float) -> None:
        """Give the invokes in flight `grace_s` to end, then cut the rest."""
        tasks = [task for _, task in self.running.values()]
        if not tasks:
            return
        _, late = await asyncio.wait(tasks, timeout=grace_s)
        for task in late:
            task.cancel()
        await asyncio.gather(*late, return_exceptions=True)
