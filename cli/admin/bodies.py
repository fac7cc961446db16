"""Request bodies too rich for flags (a runtime profile's settings, a deployment), read
from a JSON file and checked against the wire model before anything is sent."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter, ValidationError

from cli.admin.client import AdminFailure


def read_body(path: Path, model: Any) -> Any:
    """The file's JSON (stdin's for `-`) as `model` (a class or an annotated union), or
    one line saying which field is wrong."""
    try:
        # `-f -`: the body on stdin, e.g. a heredoc in a script.
        raw = sys.stdin.buffer.read() if str(path) == "-" else path.read_bytes()
    except OSError as exc:
        raise AdminFailure(f"{path}: {exc.strerror}") from None
    try:
        return TypeAdapter(model).validate_json(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "(body)"
        raise AdminFailure(f"{path}: {where}: {first['msg']}") from None
