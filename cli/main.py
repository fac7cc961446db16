"""`modelforge` command line. Each subcommand builds its settings here and passes them down.

Imports are local to each command so the agent-only install never imports the server stack.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path


def _api(_: argparse.Namespace) -> int:
    import uvicorn

    from api.app import create_app
    from api.logging import configure_logging
    from api.settings import ApiSettings

    settings = ApiSettings()
    configure_logging(settings.log_level)
    uvicorn.run(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        log_config=None,
        access_log=False,
        server_header=False,
    )
    return 0


def _migrate(_: argparse.Namespace) -> int:
    from api.settings import ApiSettings
    from store.migrate import upgrade

    upgrade(ApiSettings().database_url)
    print("database is at the latest schema revision")
    return 0


def _relay(_: argparse.Namespace) -> int:
    from api.logging import configure_logging
    from workers.relay import serve
    from workers.settings import RelaySettings

    settings = RelaySettings()
    configure_logging(settings.log_level)

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        await serve(settings, stop)

    asyncio.run(main())
    return 0


def _up(_: argparse.Namespace) -> int:
    from stack.settings import StackSettings
    from stack.up import run_up

    return run_up(StackSettings())


def _schemas_export(args: argparse.Namespace) -> int:
    from schemas.export import export

    written = export(Path(args.directory))
    print(f"wrote {len(written)} JSON Schema files to {args.directory}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="modelforge", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    def add(
        name: str, handler: Callable[[argparse.Namespace], int], help_text: str
    ) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=help_text)
        sub.set_defaults(handler=handler)
        return sub

    add("up", _up, "run the whole stack on embedded PostgreSQL and NATS")
    add("api", _api, "run the HTTP API (MODELFORGE_DATABASE_URL required)")
    add("migrate", _migrate, "bring the database schema to the latest revision")
    add("relay", _relay, "publish the transactional outbox to JetStream")
    schemas = commands.add_parser("schemas", help="wire model tools")
    schema_commands = schemas.add_subparsers(dest="schemas_command", required=True)
    export = schema_commands.add_parser("export", help="write JSON Schema for every wire model")
    export.add_argument("directory")
    export.set_defaults(handler=_schemas_export)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    handler: Callable[[argparse.Namespace], int] = args.handler
    return handler(args)


if __name__ == "__main__":
    sys.exit(main())
