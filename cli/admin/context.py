"""What every `modelforge admin` command receives: the API target, resolved once and only
when a command needs it (so `--help` works with no stack running), and the shared
options."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated

import typer

from cli.admin.client import AdminClient, Target, resolve_target
from cli.admin.output import Output

JsonOption = Annotated[bool, typer.Option("--json", help="the API's answer as JSON (one line)")]
WatchOption = Annotated[
    bool, typer.Option("--watch", "-w", help="then follow the event stream (Ctrl-C stops)")
]
LimitOption = Annotated[int, typer.Option(min=1, max=1000, help="at most this many")]


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


def output(json_mode: bool) -> Output:
    return Output(json_mode)
