"""Serving the app: uvicorn's Server, made to end held streams when it begins to stop.

uvicorn's shutdown closes the listeners, asks idle connections to close, then waits for
every open response to finish before the lifespan's shutdown runs; a held stream would
keep it waiting for ever (api/held_streams.py). `Server.shutdown` is where every way of
stopping meets (SIGINT, SIGTERM, `should_exit` set by an embedding test, the request
limit), so that is where the held streams are ended: after the listeners close, so that
a client that reconnects at once reaches another replica rather than this one.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import socket
from typing import Any

import uvicorn

from api.app import create_app
from api.heap import HeapKeeper
from api.held_streams import HeldStreams
from api.middleware.access_log import configure_access_log
from api.processes import inherited_socket
from api.settings import ApiSettings

# uvicorn.run's exit status when the server could not start (uvicorn.config.STARTUP_FAILURE).
STARTUP_FAILURE = 3


class ApiServer(uvicorn.Server):
    def __init__(
        self, config: uvicorn.Config, held_streams: HeldStreams, *, freeze_heap: bool = False
    ) -> None:
        super().__init__(config)
        self.held_streams = held_streams
        # Only a process of its own may freeze the heap: a test's embedded server shares
        # its process with everything else the test suite keeps alive.
        self.freeze_heap = freeze_heap
        self.heap: HeapKeeper | None = None

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        # What exists once the app has started (modules, the OpenAPI schemas, pydantic's
        # validators: about 190,000 objects) lives as long as the process. Left in the
        # collector's oldest generation, every full collection walks it, about 100 ms
        # with the event loop stopped: the fleet's p99 at 10,000 nodes (ops/bench/README.md).
        # Frozen, a full collection walks only what requests left behind.
        if self.freeze_heap:
            gc.freeze()
            # And what the fleet adds later, after each long full collection.
            self.heap = HeapKeeper(asyncio.get_running_loop())
            self.heap.install()

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        # Closing twice is harmless: uvicorn's shutdown closes them again.
        for server in self.servers:
            server.close()
        self.held_streams.close_all()
        if self.heap is not None:
            self.heap.remove()
            self.heap = None
        await super().shutdown(sockets)


def api_server(settings: ApiSettings, *, freeze_heap: bool = False, **options: Any) -> ApiServer:
    """The server for an app built from settings; options are uvicorn.Config's."""
    held = HeldStreams()
    config = uvicorn.Config(create_app(settings, held), **options)
    return ApiServer(config, held, freeze_heap=freeze_heap)


def serve(settings: ApiSettings, *, listen_fd: int | None = None) -> int:
    """Run `modelforge api` in the foreground until SIGINT/SIGTERM; the exit status.
    listen_fd: a listening socket inherited from `--processes N` (api/processes.py),
    served instead of binding host:port."""
    configure_access_log(settings.access_log)
    server = api_server(
        settings,
        freeze_heap=True,
        host=settings.host,
        port=settings.port,
        log_config=None,
        access_log=False,
        server_header=False,
        # No route reads the client's address or scheme: uvicorn's X-Forwarded-* rewrite
        # would be one more layer around every heartbeat for nothing.
        proxy_headers=False,
        timeout_keep_alive=int(settings.keep_alive_s),
        **settings.uvicorn_tls(),
    )
    # uvicorn raises the stopping signal again once it has stopped: SIGINT arrives here.
    sockets = [inherited_socket(listen_fd)] if listen_fd is not None else None
    with contextlib.suppress(KeyboardInterrupt):
        server.run(sockets=sockets)
    return 0 if server.started else STARTUP_FAILURE
