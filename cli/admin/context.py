"""What every `modelforge admin` command receives: the API target, resolved once and only
when a command needs it (so `--help` works with no stack running), and the shared
options."""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass, field
from typing import Annotated, Any, Final

import typer

from cli.admin.client import AdminClient, Target, resolve_target
from cli.admin.output import Format, Output

# What a table shows of an id (or some more of it).
SHORT: Final = re.compile(r"[0-9a-fA-F-]{1,35}")

JsonOption = Annotated[bool, typer.Option("--json", help="the same as -o json")]
FormatOption = Annotated[
    Format | None,
    typer.Option(
        "--output",
        "-o",
        help="table (fits the terminal), wide (whole ids, ISO times, every column), "
        "json (the API's answer, one line)",
    ),
]
WatchOption = Annotated[
    bool, typer.Option("--watch", "-w", help="then follow the event stream (Ctrl-C stops)")
]
LimitOption = Annotated[int, typer.Option(min=1, max=1000, help="at most this many")]


def whole_id(text: str) -> uuid.UUID:
    """An id argument: the whole id. A table's 8 characters are said to be short, with
    where the whole one is, rather than "not a valid UUID"."""
    try:
        return uuid.UUID(text)
    except ValueError:
        pass
    if SHORT.fullmatch(text):
        raise typer.BadParameter(
            f"{text!r} is a short id: give the whole id (`-o wide` or --json shows it)"
        )
    raise typer.BadParameter(f"{text!r} is not an id")


def id_argument(help: str) -> Any:
    return typer.Argument(help=help, parser=whole_id)


def id_option(help: str) -> Any:
    return typer.Option(help=help, parser=whole_id, metavar="ID")


NodeArg = Annotated[uuid.UUID, id_argument("the node's id")]


@dataclass
class Admin:
    api_url: str | None
    _target: Target | None = field(default=None, init=False)

    @property
    def target(self) -> Target:
        if self._target is None:
            self._target = resolve_target(self.api_url)
        return self._target

    def client(self) -> AdminClient:
        return AdminClient(self.target)


def admin(ctx: typer.Context) -> Admin:
    found = ctx.find_object(Admin)
    assert found is not None, "the root callback sets it"
    return found


def form(json: bool, output: Format | None = None) -> Format:
    """-o's form; --json is -o json (and wins, as the older spelling a script uses)."""
    if json:
        return Format.JSON
    return output or Format.TABLE


def output(json: bool | Format, fmt: Format | None = None) -> Output:
    return Output(json if isinstance(json, Format) else form(json, fmt))
