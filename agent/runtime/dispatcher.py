"""RoleMesh compatibility: when `dispatcher_base_url` is set, register the node with the
dispatcher (`POST /v1/nodes/register`, the payload `GET /v1/node/registration` shows) and
heartbeat it with the latest device metrics (`POST /v1/nodes/heartbeat`). A dispatcher
that answers 404 to a heartbeat has forgotten the node: it is registered again. Failures
are logged once per episode and retried at the next interval, never in a tight loop.
Only the answer's status is used; its body goes through the bounded reader
(schemas/bounded.py), so a hostile dispatcher cannot make the node hold a huge answer."""

from __future__ import annotations

import asyncio
import contextlib
import logging

import httpx

from agent.runtime.worker import RuntimeWorker
from schemas.bounded import Unreadable, read_capped
from schemas.runtime_local import DISPATCHER_HEARTBEAT, DISPATCHER_REGISTER

# Whatever a dispatcher answers beyond this is refused (a RoleMesh answer is a few bytes).
MAX_ANSWER_BYTES = 64 << 10

logger = logging.getLogger("modelforge.runtime.dispatcher")


async def dispatcher_loop(
    worker: RuntimeWorker, node_id: str, base_url: str, stop: asyncio.Event
) -> None:
    config = worker.config
    assert config.dispatcher_base_url is not None
    if config.listen_host in ("127.0.0.1", "localhost", "::1"):
        logger.warning(
            "registering with a dispatcher while listening on %s: only a dispatcher on this"
            " host can reach the node (set listen_host to a private address)",
            config.listen_host,
        )
    registered = False
    failing: str | None = None
    async with httpx.AsyncClient(
        base_url=config.dispatcher_base_url, timeout=10, trust_env=config.trust_env
    ) as http:
        while not stop.is_set():
            try:
                if not registered:
                    body = worker.registration(node_id, base_url).model_dump(mode="json")
                    response = await _post(http, DISPATCHER_REGISTER, body)
                    registered = response.is_success
                    if registered:
                        logger.info("registered with the dispatcher %s", config.dispatcher_base_url)
                else:
                    inventory = worker.inventory().model_dump(mode="json")
                    response = await _post(
                        http, DISPATCHER_HEARTBEAT, {"node_id": node_id, **inventory}
                    )
                    registered = response.status_code != 404
                problem = None if response.is_success else f"HTTP {response.status_code}"
            except httpx.HTTPError as exc:
                problem = type(exc).__name__
            except Unreadable as exc:
                problem = exc.reason
            if problem is not None and problem != failing:
                logger.warning("the dispatcher did not accept us (%s); retrying", problem)
            failing = problem
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), config.dispatcher_heartbeat_interval_s)


async def _post(http: httpx.AsyncClient, path: str, body: object) -> httpx.Response:
    """The answer, its body read through the size cap (and not used)."""
    async with http.stream("POST", path, json=body) as response:
        declared = response.headers.get("content-length")
        await read_capped(response.aiter_bytes(), MAX_ANSWER_BYTES, declared=declared)
    return response
