"""`modelforge agent ...`, `modelforge simulate`: argument handling for cli/main.py."""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from pathlib import Path

from agent.errors import AgentError, ConfigError


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def run_agent(args: argparse.Namespace) -> int:
    if getattr(args, "agent_command", None) == "install-credential":
        return install_credential(args)
    if args.config is None:
        _stderr("modelforge agent: --config FILE is required")
        return 2
    from agent.config import load_config
    from agent.diagnostics import configure_logging
    from agent.runner import EXIT_ERROR, Agent

    try:
        config = load_config(args.config, args.config_override)
    except ConfigError as exc:
        _stderr(f"modelforge agent: {exc}")
        return EXIT_ERROR
    configure_logging(config.log_level)

    async def main() -> int:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        return await Agent(config).run(stop)

    try:
        return asyncio.run(main())
    except AgentError as exc:
        import logging

        logging.getLogger("modelforge.agent").error("%s", exc)
        return EXIT_ERROR


def install_credential(args: argparse.Namespace) -> int:
    from agent.config import load_config
    from agent.state import StateDir

    state_dir: Path | None = args.state_dir
    try:
        if state_dir is None:
            if args.install_config is None:
                _stderr("modelforge agent install-credential: give --state-dir or --config")
                return 2
            state_dir = load_config(args.install_config, args.install_override).state_dir
        text = args.file.read_text() if args.file else sys.stdin.read()
        identity = StateDir(state_dir).install_credential(text)
    except (AgentError, OSError) as exc:
        _stderr(f"modelforge agent install-credential: {exc}")
        return 1
    print(
        f"installed credential {identity.credential_id} for node {identity.node_id} in "
        f"{state_dir}; a running agent picks it up when its old credential is refused, "
        "otherwise restart the agent"
    )
    return 0
