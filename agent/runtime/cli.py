"""`modelforge runtime`: argument handling for cli/main.py, and the process's main loop
(the local API served by uvicorn; on SIGTERM/SIGINT every llama-server is stopped)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import math
import signal
import socket
import sys
from typing import TYPE_CHECKING

from agent.errors import AgentError, ConfigError

if TYPE_CHECKING:
    from agent.runtime.config import RuntimeConfig
    from agent.runtime.worker import RuntimeWorker
    from agent.state import Identity

logger = logging.getLogger("modelforge.runtime")
# Every invoke in flight holds one connection for its answer stream, beside the
# channel and the claim loops: a small pool queued the 11th concurrent answer behind
# the first ten (measured: +370 ms time to first token at 16 clients).
CONTROL_PLANE_CONNECTIONS = 256


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def run_runtime(args: argparse.Namespace) -> int:
    if args.config is None:
        _stderr("modelforge runtime: --config FILE is required")
        return 2
    from agent.diagnostics import configure_logging
    from agent.runtime.backends import UnsupportedBackend
    from agent.runtime.config import load_runtime_config

    try:
        config = load_runtime_config(args.config, args.config_override)
    except ConfigError as exc:
        _stderr(f"modelforge runtime: {exc}")
        return 1
    configure_logging(config.log_level)
    try:
        return asyncio.run(_serve(config))
    except (UnsupportedBackend, AgentError, OSError, ValueError) as exc:
        logger.error("%s", exc)
        return 1


async def _serve(config: RuntimeConfig) -> int:
    import uvicorn

    from agent.runtime.api import create_app
    from agent.runtime.worker import RuntimeWorker

    identity = _identity(config)
    node_id = str(identity.node_id) if identity else config.node_name or socket.gethostname()
    worker = RuntimeWorker(config)
    worker.start()
    server_config = uvicorn.Config(
        create_app(
            worker, node_id=node_id, base_url=f"http://{config.listen_host}:{config.listen_port}"
        ),
        host=config.listen_host,
        port=config.listen_port,
        log_level="warning",
        access_log=False,
        lifespan="off",
        # A backstop only: the grace below ends every request first.
        timeout_graceful_shutdown=math.ceil(config.shutdown_grace_s) + 5,
    )
    server = uvicorn.Server(server_config)
    # Our own handlers: stop taking requests, give those in flight the grace, then stop
    # the llama-servers (which ends what is still in flight with a clean error), in
    # that order. uvicorn's would wait for requests without a bound, and re-raise the
    # signal after serving, ending the process before the servers are stopped.
    server.capture_signals = contextlib.nullcontext  # type: ignore[method-assign,assignment]
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    overdue: list[asyncio.Task[None]] = []

    async def stop_servers_after(grace_s: float) -> None:
        await asyncio.sleep(grace_s)
        logger.info("stopping every llama-server (the shutdown grace has passed)")
        await worker.close()

    def shut_down() -> None:
        # A second signal does not wait for the grace.
        grace = 0.0 if worker.stopping.is_set() else config.shutdown_grace_s
        worker.stopping.set()
        server.should_exit = True
        stop.set()
        overdue.append(asyncio.create_task(stop_servers_after(grace)))

    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, shut_down)
    tasks = [asyncio.create_task(_control_plane(config, worker, stop))]
    if config.dispatcher_base_url is not None:
        from agent.runtime.dispatcher import dispatcher_loop

        local_url = f"http://{config.listen_host}:{config.listen_port}"
        tasks.append(asyncio.create_task(dispatcher_loop(worker, node_id, local_url, stop)))
    try:
        await server.serve()
    finally:
        stop.set()
        for task in overdue:
            task.cancel()  # a close under way goes on: it is shielded
        await asyncio.gather(*overdue, return_exceptions=True)
        await asyncio.gather(*tasks)
        await worker.close()
    return 0 if server.started else 1


def _identity(config: RuntimeConfig) -> Identity | None:
    from agent.state import StateDir

    if config.state_dir is None:
        return None
    return StateDir(config.state_dir).load_identity()


async def _control_plane(config: RuntimeConfig, worker: RuntimeWorker, stop: asyncio.Event) -> None:
    """Report and claim probes through the control plane, once the agent has enrolled
    the node (its identity in the state dir); without api_url, nothing."""
    if config.api_url is None:
        return
    from agent.client import ProtocolClient, TlsOptions, make_http_client
    from agent.runtime.control import ControlPlane, binary_environment

    identity = _identity(config)
    while identity is None and not stop.is_set():
        logger.info("waiting for the agent to enroll the node (%s)", config.state_dir)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 5)
        identity = _identity(config)
    if identity is None:
        return
    environment = await asyncio.to_thread(
        binary_environment, config.llama_server_path, config.backends[0]
    )
    tls = TlsOptions(config.ca_bundle, config.client_cert, config.client_key)
    async with make_http_client(
        config.api_url,
        tls=tls,
        timeout_s=config.request_timeout_s,
        trust_env=config.trust_env,
        max_connections=CONTROL_PLANE_CONNECTIONS,
        failover=config.api_urls,
    ) as http:
        client = ProtocolClient(http, identity.credential)

        def credential() -> str | None:
            current = _identity(config)
            return current.credential if current is not None else None

        plane = ControlPlane(worker, client, identity.node_id, environment, credential)
        await plane.run(stop)
