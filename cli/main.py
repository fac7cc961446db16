"""`modelforge` command line. Each subcommand builds its settings here and passes them down.

Imports are local to each command so the agent-only install never imports the server stack.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from pydantic import ValidationError


def _api(args: argparse.Namespace) -> int:
    from api.processes import default_processes, supervise
    from api.server import STARTUP_FAILURE, serve
    from api.settings import ApiSettings
    from cli.logging import configure_logging

    settings = ApiSettings()
    configure_logging(settings.log_level)
    processes = args.processes if args.processes is not None else default_processes()
    if processes < 1:
        raise UsageError("--processes must be at least 1")
    if processes > 1 and args.listen_fd is None:
        return supervise(settings.host, settings.port, processes, startup_failure=STARTUP_FAILURE)
    return serve(settings, listen_fd=args.listen_fd)


def _migrate(_: argparse.Namespace) -> int:
    from store.migrate import upgrade
    from store.settings import DatabaseSettings

    upgrade(DatabaseSettings().database_url)
    print("database is at the latest schema revision")
    return 0


def _relay(_: argparse.Namespace) -> int:
    from cli.logging import configure_logging
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


def _worker(args: argparse.Namespace) -> int:
    import os

    from broker.jetstream import BrokerSettings
    from cli.logging import configure_logging
    from workers.main import PROCESS_INDEX_ENV, run_worker_process, supervise
    from workers.settings import WorkerSettings

    settings = WorkerSettings()
    configure_logging(settings.log_level)
    if args.processes > 1:
        return supervise(args.processes, args.threads)
    index = int(os.environ.get(PROCESS_INDEX_ENV, "0"))
    return run_worker_process(settings, BrokerSettings(), threads=args.threads, index=index)


def _up(args: argparse.Namespace) -> int:
    from stack.settings import StackSettings
    from stack.up import run_up

    settings = StackSettings()
    if args.access_log:
        settings = settings.model_copy(update={"access_log": True})
    return run_up(settings)


def _schemas_export(args: argparse.Namespace) -> int:
    from schemas.export import export

    written = export(Path(args.directory))
    print(f"wrote {len(written)} JSON Schema files to {args.directory}")
    return 0


def _events_tail(args: argparse.Namespace) -> int:
    import json

    from broker.settings import NatsSettings
    from broker.tail import TailOptions, tail
    from cli.errors import unreachable
    from schemas.events import EventType, subject_filter
    from schemas.stack import read_stack_info

    try:
        event_type = EventType(args.type) if args.type else None
    except ValueError:
        known = ", ".join(sorted(t.value for t in EventType))
        raise UsageError(f"unknown event type {args.type!r}; one of: {known}") from None
    # The explicit flag, then the environment, then the stack `modelforge up` runs:
    # never a default port, where some other NATS may answer.
    nats_url = args.nats_url or NatsSettings().nats_url or read_stack_info().nats_url
    options = TailOptions(
        subject=subject_filter(args.node, event_type),
        from_start=args.from_start,
        limit=args.limit,
        idle_exit_s=args.idle_exit,
    )

    def emit(event: dict[str, object]) -> None:
        print(json.dumps(event, separators=(",", ":")), flush=True)

    with contextlib.suppress(KeyboardInterrupt):
        try:
            asyncio.run(tail(nats_url, options, emit))
        except Exception as exc:
            problem = unreachable(exc)
            if problem is None:
                raise
            raise CommandFailed(f"NATS at {nats_url}: {problem}") from None
    return 0


def _events_catalog(args: argparse.Namespace) -> int:
    from schemas.catalog import render

    Path(args.file).write_text(render())
    print(f"wrote the event catalog to {args.file}")
    return 0


def _agent(args: argparse.Namespace) -> int:
    from agent.cli import run_agent

    return run_agent(args)


def _simulate(args: argparse.Namespace) -> int:
    from agent.simulator import run_simulate

    return run_simulate(args)


def _runtime(args: argparse.Namespace) -> int:
    from agent.runtime.cli import run_runtime

    return run_runtime(args)


def _ops_check(script: str) -> Callable[[argparse.Namespace], int]:
    """One of the checkout's GPU check scripts (ops/) as a command, run by the
    interpreter of this install, so it never lacks the agent's packages (`python
    ops/gpu_check.py` under a bare system Python does). They are not in the installed
    package: an install without the checkout says so in one line."""

    def run(_: argparse.Namespace) -> int:
        import runpy

        path = Path(__file__).resolve().parent.parent / "ops" / script
        if not path.is_file():
            raise CommandFailed(f"{path} is missing: the GPU checks run from a ModelForge checkout")
        main: Callable[[], int] = runpy.run_path(str(path))["main"]
        return main()

    return run


def _admin(args: argparse.Namespace) -> int:
    # Reached only for `modelforge admin` with nothing after it: main() hands everything
    # else to the admin CLI before argparse parses (its own parser, typer, reads it).
    return _run_admin(["--help"])


def _run_admin(argv: Sequence[str]) -> int:
    try:
        from cli.admin.app import run
    except ImportError as exc:
        print(
            f"modelforge admin: needs the admin extra: pip install 'modelforge[admin]' ({exc})",
            file=sys.stderr,
        )
        return 2
    return run(argv)


def _add_agent_commands(add: Callable[..., argparse.ArgumentParser]) -> None:
    agent = add("agent", _agent, "run the node agent (outbound HTTPS only)")
    agent.add_argument("--config", type=Path, help="YAML config (the tracked base)")
    agent.add_argument("--config-override", type=Path, help="YAML merged over --config")
    agent_commands = agent.add_subparsers(dest="agent_command")
    install = agent_commands.add_parser(
        "install-credential",
        help="install a rotated credential (stdin or --file) into the agent's state dir",
    )
    install.add_argument("--state-dir", type=Path)
    install.add_argument("--file", type=Path, help="read from this file instead of stdin")
    install.add_argument("--config", dest="install_config", type=Path, help="for state_dir")
    install.add_argument("--config-override", dest="install_override", type=Path)
    runtime = add(
        "runtime", _runtime, "run the runtime worker (one llama-server per device, local API)"
    )
    runtime.add_argument("--config", type=Path, help="YAML config (the tracked base)")
    runtime.add_argument("--config-override", type=Path, help="YAML merged over --config")
    sim = add("simulate", _simulate, "run N simulated agents in one process")
    sim.add_argument("--nodes", type=int, default=10)
    sim.add_argument("--api-url", help="default: the running `modelforge up` (its stack file)")
    sim.add_argument(
        "--operator-key", help="default: MODELFORGE_OPERATOR_API_KEY, else the running `up`'s"
    )
    sim.add_argument("--duration", type=float, default=0.0, help="seconds; 0 runs until Ctrl-C")
    sim.add_argument("--heartbeat-interval", type=float, default=5.0)
    sim.add_argument("--telemetry-interval", type=float, default=10.0)
    sim.add_argument(
        "--inventory-interval",
        type=float,
        default=60.0,
        help="seconds between inventory checks; sent on change, in full every 600 s",
    )
    sim.add_argument("--gpus", type=int, default=2, help="simulated GPUs per node")
    sim.add_argument("--concurrency", type=int, default=32, help="requests in flight at most")
    sim.add_argument("--ca-bundle", type=Path)
    sim.add_argument("--client-cert", type=Path)
    sim.add_argument("--client-key", type=Path)
    sim.add_argument("--log-level", default="WARNING")
    sim.add_argument(
        "--report-json", type=Path, help="also write counts and latencies here (benchmarks)"
    )
    sim.add_argument(
        "--latency-warmup", type=float, default=0.0, help="seconds of publishing not timed"
    )
    # Simulated runtime workers beside the agents (agent/sim_runtime.py).
    sim.add_argument(
        "--runtime",
        action="store_true",
        help="also run a simulated runtime worker per node (devices, deployments, invokes)",
    )
    sim.add_argument("--devices-per-node", type=int, help="default: --gpus")
    sim.add_argument("--device-memory-gib", type=float, default=80.0)
    sim.add_argument("--tokens-per-s", type=float, default=50.0, help="per invoke")
    sim.add_argument("--load-s", type=float, default=2.0, help="a deployment's load time")
    sim.add_argument("--acquire-s", type=float, default=0.5, help="an artifact job's time")
    sim.add_argument("--runtime-report-interval", type=float, default=30.0)
    sim.add_argument(
        "--job-poll-interval",
        type=float,
        default=30.0,
        help="seconds between claims when no note came on the channel",
    )
    sim.add_argument(
        "--label", action="append", metavar="KEY=VALUE", help="an extra label on every node"
    )


def build_parser() -> argparse.ArgumentParser:
    from cli.version import package_version

    parser = argparse.ArgumentParser(
        prog="modelforge",
        description="ModelForge: a control plane for fleets of GPU hosts, and its node agent.",
        epilog="`modelforge COMMAND --help` says more; the operator's tool is `modelforge admin`.",
    )
    parser.add_argument("--version", action="version", version=f"modelforge {package_version()}")
    # COMMAND, not the {up,api,...} choices: their list is wider than a terminal.
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(
        name: str, handler: Callable[[argparse.Namespace], int], help_text: str
    ) -> argparse.ArgumentParser:
        # The one line is the command's description on its own --help too.
        sub = commands.add_parser(
            name, help=help_text, description=help_text[:1].upper() + help_text[1:] + "."
        )
        sub.set_defaults(handler=handler)
        return sub

    up = add("up", _up, "run the whole stack on embedded PostgreSQL and NATS")
    up.epilog = (
        "Settings from the environment: MODELFORGE_DATA_DIR (.modelforge), MODELFORGE_HOST "
        "and MODELFORGE_PORT (127.0.0.1:8080), MODELFORGE_DATABASE_URL and MODELFORGE_NATS_URL "
        "(servers of your own instead of the embedded ones), MODELFORGE_ARTIFACT_SOURCE_URL "
        "(a Hugging Face mirror), MODELFORGE_API_PROCESSES."
    )
    up.add_argument(
        "--access-log",
        action="store_true",
        help="log every API request (off by default: the traffic is on /metrics)",
    )
    api = add("api", _api, "run the HTTP API (MODELFORGE_DATABASE_URL required)")
    api.add_argument(
        "--processes",
        type=int,
        help="API processes serving the one port (default: the machine's cores)",
    )
    # Internal: the listener a `--processes N` parent hands to each of its children.
    api.add_argument("--listen-fd", type=int, help=argparse.SUPPRESS)
    add("migrate", _migrate, "bring the database schema to the latest revision")
    add("relay", _relay, "publish the transactional outbox to JetStream")
    worker = add("worker", _worker, "run the dramatiq workers (liveness, relay, ...)")
    worker.add_argument("--processes", type=int, default=1, help="worker processes (default 1)")
    worker.add_argument("--threads", type=int, default=4, help="threads per process (default 4)")
    _add_agent_commands(add)
    add("admin", _admin, "operate the control plane: nodes, tokens, jobs, ... (`admin --help`)")
    add("gpu-check", _ops_check("gpu_check.py"), "run the NVML collector for real, print it")
    add(
        "gpu-runtime-check",
        _ops_check("gpu_runtime_check.py"),
        "build llama-server with CUDA; load, probe and unload the test model on every GPU",
    )
    schemas = commands.add_parser("schemas", help="wire model tools")
    schema_commands = schemas.add_subparsers(dest="schemas_command", required=True)
    export = schema_commands.add_parser("export", help="write JSON Schema for every wire model")
    export.add_argument("directory")
    export.set_defaults(handler=_schemas_export)
    events = commands.add_parser("events", help="node events on JetStream")
    event_commands = events.add_subparsers(dest="events_command", required=True)
    tail = event_commands.add_parser("tail", help="print events as JSON lines")
    tail.add_argument(
        "--nats-url", help="default: MODELFORGE_NATS_URL, else the running `modelforge up`"
    )
    tail.add_argument("--node", help="only this node id")
    tail.add_argument("--type", help="only this event type, e.g. node.gpu.missing")
    tail.add_argument("--from-start", action="store_true", help="replay the whole stream first")
    tail.add_argument("--limit", type=int, help="exit after this many events")
    tail.add_argument("--idle-exit", type=float, help="exit after this many idle seconds")
    tail.set_defaults(handler=_events_tail)
    catalog = event_commands.add_parser("catalog", help="write the event catalog (Markdown)")
    catalog.add_argument("file")
    catalog.set_defaults(handler=_events_catalog)
    return parser


# The commands that run as long-lived processes (their stderr is their log).
SERVERS = frozenset({"up", "api", "relay", "worker", "agent", "runtime", "simulate"})


class UsageError(Exception):
    """A mistake in how the command was called; one line, exit status 2."""


class CommandFailed(Exception):
    """A failure the operator can act on (e.g. a server that does not answer); one line."""


def _settings_problem(exc: ValidationError) -> str:
    """A settings ValidationError as one line naming the environment variables."""
    parts = []
    for error in exc.errors():
        name = "MODELFORGE_" + "_".join(str(p) for p in error["loc"]).upper()
        missing = error["type"] == "missing"
        parts.append(f"{name} is required" if missing else f"{name}: {error['msg']}")
    return "; ".join(parts) or str(exc)


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command. What an operator can fix (settings, usage, an unreachable
    server) is one line on stderr, never a traceback."""
    from cli.errors import unreachable
    from schemas.stack import StackFileError

    arguments = list(sys.argv[1:] if argv is None else argv)
    if arguments[:1] == ["admin"]:
        return _run_admin(arguments[1:])
    args = build_parser().parse_args(arguments)
    handler: Callable[[argparse.Namespace], int] = args.handler
    prefix = f"modelforge {args.command}"
    try:
        return handler(args)
    except ValidationError as exc:
        print(f"{prefix}: {_settings_problem(exc)}", file=sys.stderr)
        return 2
    except (UsageError, StackFileError) as exc:
        print(f"{prefix}: {exc}", file=sys.stderr)
        return 2
    except CommandFailed as exc:
        print(f"{prefix}: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:
        problem = unreachable(exc)
        if problem is None:
            # A process that serves (its stderr is its log) keeps the traceback for
            # whoever reads the log; a command run by hand says one line.
            if args.command in SERVERS or sys.flags.dev_mode:
                raise
            problem = (
                f"unexpected {type(exc).__name__}: {exc} (a bug in modelforge; "
                "PYTHONDEVMODE=1 shows where)"
            )
        print(f"{prefix}: {problem}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
