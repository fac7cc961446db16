"""A llama-server's layered health as the control plane's jobs report it (the runtime
health job, agent/runtime/device_jobs.py, and the deployment ones,
agent/runtime/deployments.py): process, /health, the model listed, then a one-token
inference when the layers below it held."""

from __future__ import annotations

import httpx

from agent.runtime.server import LlamaServer
from schemas.runtime import ServerHealth

NOTHING = ServerHealth(process_up=False, health_ok=False, model_listed=False, inference_ok=False)


async def server_health(server: LlamaServer | None) -> ServerHealth:
    """The layered health of a server right now (NOTHING when none runs)."""
    if server is None:
        return NOTHING
    layers = await server.health()
    inference = False
    if layers.ready:
        try:
            inference = (await server.one_token("ping")).status_code == 200
        except httpx.HTTPError:  # a failed call is a failed layer, reported as such
            inference = False
    return ServerHealth(
        process_up=layers.process_up,
        health_ok=layers.health_ok,
        model_listed=layers.model_listed,
        inference_ok=inference,
    )
