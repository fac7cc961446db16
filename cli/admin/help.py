"""How `modelforge admin --help` reads: every group made the one way (Markdown help, so a
description is reflowed to the terminal rather than broken where the source was, and a
body's example is a code block), and a flag shown as a flag, without typer's `<bool>`
beside it.

The convention every command keeps (tests/test_cli_help.py walks them all): its help's
first line is its one-line description, shown in its group's list; details follow after
a blank line; the shape of a `-f` body, with an example, is its epilog."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Final

import typer
from typer._click.core import Command, Context
from typer.core import TyperGroup, TyperOption

HELP_NAMES: Final = ["-h", "--help"]


def group(help: str, **options: Any) -> typer.Typer:
    """A command group of `modelforge admin`: its one-line description, Markdown help."""
    return typer.Typer(
        help=help,
        rich_markup_mode="markdown",
        no_args_is_help=True,
        context_settings={"help_option_names": HELP_NAMES},
        **options,
    )


def commands(
    root: Command, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], Command]]:
    """root and every command under it, each with the words that reach it."""
    yield path, root
    if isinstance(root, TyperGroup):
        for name, command in sorted(root.commands.items()):
            yield from commands(command, (*path, name))


def quiet_flags(root: Command) -> Command:
    """Each flag (--json, --yes, --ended/--no-ended, --help) shown without a value's
    type: a flag takes none."""
    for _, command in commands(root):
        helper = command.get_help_option(Context(command, help_option_names=HELP_NAMES))
        for param in [*command.params, helper]:
            if isinstance(param, TyperOption) and param.is_flag and param.metavar is None:
                param.metavar = ""
    return root
