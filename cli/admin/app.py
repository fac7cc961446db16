"""The root of `modelforge admin`: the command tree (one module per area), the target
built once, and every failure said in one line with the exit status to match.

`modelforge admin …` arrives here from cli/main.py with the rest of its argv, so typer
(on click) parses it and argparse never sees it. Exit statuses: 0 done, 1 refused or
failed (the API's code and correlation id on stderr), 2 a usage mistake, 130 Ctrl-C. A
failure is one line on stderr, never a traceback, even one that nothing here expected.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import Annotated

import typer
from pydantic import ValidationError

from cli.admin import (
    audit,
    dead_letters,
    deployments,
    fleet,
    jobs,
    nodes,
    overview,
    runtime,
    service_clients,
    services,
    tokens,
    usage,
)
from cli.admin.client import AdminFailure
from cli.admin.context import Admin
from cli.admin.help import HELP_NAMES, quiet_flags
from cli.terminal import visible
from cli.version import package_version


def build_app() -> typer.Typer:
    app = typer.Typer(
        name="modelforge admin",
        help=(
            "Operate the control plane.\n\n"
            "The API comes from --api-url, MODELFORGE_API_URL or the running `modelforge up`; "
            "the operator key from MODELFORGE_OPERATOR_API_KEY or the file `up` keeps it in "
            "(never from the command line). Lists fit the terminal (`-o wide` shows whole "
            "ids, ISO times and every column; `-o json` the API's answer)."
        ),
        no_args_is_help=True,
        rich_markup_mode="markdown",
        # Our failures are one line (run below); a traceback is never an operator's answer.
        pretty_exceptions_enable=False,
        context_settings={"help_option_names": HELP_NAMES},
    )

    @app.callback()
    def root(
        ctx: typer.Context,
        api_url: Annotated[
            str | None, typer.Option(help="the control plane, e.g. https://cp.internal:8443")
        ] = None,
        version: Annotated[
            bool,
            typer.Option(
                "--version", is_eager=True, callback=show_version, help="print the version"
            ),
        ] = False,
    ) -> None:
        ctx.obj = Admin(api_url)

    app.add_typer(nodes.app, name="nodes")
    app.add_typer(tokens.app, name="tokens")
    app.add_typer(jobs.app, name="jobs")
    app.add_typer(runtime.app, name="runtime")
    app.add_typer(deployments.app, name="deployments")
    app.add_typer(service_clients.app, name="service-clients")
    app.add_typer(services.app, name="services")
    app.add_typer(fleet.app, name="fleet")
    app.add_typer(dead_letters.app, name="dead-letters")
    app.command("overview")(overview.overview)
    app.command("audit")(audit.audit)
    app.command("usage")(usage.usage)
    return app


def show_version(value: bool) -> None:
    if value:
        print(f"modelforge {package_version()}")
        raise typer.Exit()


def run(argv: Sequence[str]) -> int:
    command = quiet_flags(typer.main.get_command(build_app()))
    try:
        result = command.main(args=list(argv), prog_name="modelforge admin", standalone_mode=False)
    except AdminFailure as exc:
        say(exc.line())
        return exc.exit_code
    except typer.Abort:
        say("aborted")
        return 130
    except typer.TyperException as exc:
        # typer's own (vendored click) usage errors: their message and the usage line.
        show = getattr(exc, "show", None)
        if show is not None:
            show()
        else:
            say(f"error: {exc}")
        code = getattr(exc, "exit_code", 2)
        return code if isinstance(code, int) else 2
    except ValidationError as exc:
        # A body checked before it was sent (the API would refuse it the same way).
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or exc.title
        say(f"error: invalid input: {where}: {first['msg']}")
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # `… | head`: the reader left, which is not our failure. Stdout is pointed at
        # /dev/null so the interpreter's last flush does not fail loudly either.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Exception as exc:
        # A failure nothing above names is a bug of ours: still one line for the
        # operator; the traceback for whoever debugs it (python -X dev, PYTHONDEVMODE=1).
        if sys.flags.dev_mode:
            raise
        say(
            f"error: unexpected {type(exc).__name__}: {exc} (a bug in modelforge admin; "
            "PYTHONDEVMODE=1 shows where)"
        )
        return 1
    return result if isinstance(result, int) else 0


def say(line: str) -> None:
    """A failure's one line on stderr. It may hold what the server or the operator wrote
    (a refusal's message, a field's name): shown, never obeyed by the terminal."""
    print(visible(line), file=sys.stderr)
