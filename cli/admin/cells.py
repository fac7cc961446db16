"""One value as the text of a cell, the one way every command shows it: an id short in a
table (8 characters, as `docker ps` and `kubectl` show them) and whole in `-o wide`; an
instant as its age in a table ("4s ago") and as ISO 8601 in `-o wide` and in a `get`; a
size in binary units; a time to first token in ms; a label in Title Case; the endpoints
served abbreviated in a table (`chat,compl,embed`) and whole elsewhere."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from enum import Enum
from typing import Final

from rich.text import Text

from cli.terminal import literal
from schemas.admin import Liveness

# An id in a table: enough to tell a fleet's objects apart by eye, as docker does.
SHORT_ID: Final = 8

# Liveness (and job and deployment states) by colour: what needs a look stands out.
STYLES: Final[dict[str, str]] = {
    Liveness.ONLINE.value: "green",
    Liveness.STALE.value: "yellow",
    Liveness.OFFLINE.value: "red",
    Liveness.DISABLED.value: "magenta",
    Liveness.DECOMMISSIONED.value: "dim",
    "active": "green",
    "ready": "green",
    "succeeded": "green",
    "complete": "green",
    "present": "green",
    "leased": "cyan",
    "queued": "cyan",
    "loading": "cyan",
    "failed": "red",
    "expired": "dim",
    "revoked": "dim",
    "used": "dim",
    "cancelled": "dim",
    "unloaded": "dim",
    "missing": "bold red",
}

# Words a label spells as people write them, not as Title Case would.
SPELLED: Final = {
    "id": "ID",
    "ids": "IDs",
    "gpu": "GPU",
    "gpus": "GPUs",
    "ram": "RAM",
    "cpu": "CPU",
    "cpus": "CPUs",
    "url": "URL",
    "api": "API",
    "ttft": "TTFT",
    "os": "OS",
    "seq": "Seq",
}


# An endpoint as a table shows it: three of them beside the rest of a row (`-o wide` and
# a `get` have the whole names).
ENDPOINT_ABBREVIATIONS: Final = {"chat": "chat", "completions": "compl", "embeddings": "embed"}


# A key's last word that is its unit: "drain_deadline_s" reads "Drain Deadline (s)".
UNITS: Final = {"s": "s", "ms": "ms", "bytes": "bytes", "percent": "%", "c": "°C", "w": "W"}


def styled(text: str) -> Text:
    """text coloured by what it says (STYLES: a liveness, a state), else as it is."""
    return literal(text, STYLES.get(text))


def cell(value: object, *, wide: bool = False) -> str:
    """A table's cell: short ids and ages, or (wide) whole ids and ISO instants."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, uuid.UUID):
        return str(value) if wide else short(value)
    if isinstance(value, datetime):
        return iso(value) if wide else ago(value)
    if isinstance(value, dict):
        return ",".join(f"{k}={cell(v, wide=wide)}" for k, v in sorted(value.items())) or "-"
    if isinstance(value, list | tuple | set | frozenset):
        return ",".join(cell(v, wide=wide) for v in value) or "-"
    if isinstance(value, Enum):
        return str(value.value)
    return str(value)


def detail_value(value: object) -> str:
    """A `get`'s value: whole ids, an instant as ISO with its age beside it."""
    if isinstance(value, datetime):
        return f"{iso(value)} ({ago(value)})"
    if isinstance(value, dict):
        return ", ".join(f"{k}={cell(v, wide=True)}" for k, v in sorted(value.items())) or "-"
    if isinstance(value, list | tuple | set | frozenset):
        return ", ".join(cell(v, wide=True) for v in value) or "-"
    return cell(value, wide=True)


def endpoints(served: Sequence[str], *, wide: bool = False) -> str:
    """What a deployment or a service serves: `chat,compl` in a table, whole names wide."""
    names = served if wide else [ENDPOINT_ABBREVIATIONS.get(e, e) for e in served]
    return ",".join(names) or "-"


def ident(text: str | None) -> uuid.UUID | str | None:
    """A str that holds an id (an audit target's, a correlation id) as that id, so it
    is shown short in a table like every other; any other str as it is."""
    if text is None or len(text) != 36:
        return text
    try:
        return uuid.UUID(text)
    except ValueError:
        return text


def short(value: uuid.UUID | str) -> str:
    return str(value)[:SHORT_ID]


def iso(at: datetime) -> str:
    """ISO 8601 to the second, in UTC with a Z (as the API's JSON reads at a glance)."""
    if at.tzinfo is None:
        at = at.replace(tzinfo=UTC)
    return at.astimezone(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def ago(at: datetime, now: datetime | None = None) -> str:
    """An instant as its age ("4s ago"), or how far ahead it is ("in 3m")."""
    if at.tzinfo is None:
        at = at.replace(tzinfo=UTC)
    seconds = int(((now or datetime.now(UTC)) - at).total_seconds())
    span = _span(abs(seconds))
    return f"{span} ago" if seconds >= 0 else f"in {span}"


def _span(seconds: int) -> str:
    for unit, length in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= length:
            return f"{seconds // length}{unit}"
    return f"{seconds}s"


def size(count: int | None) -> str:
    if count is None:
        return "-"
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return str(count)


def millis(seconds: float) -> str:
    """A short duration (a time to first token) in whole milliseconds: "412 ms"."""
    return f"{seconds * 1000:.0f} ms"


def label(name: str) -> str:
    """A key as a `get` shows it: snake_case or lower case in Title Case ("Last
    Heartbeat" for last_heartbeat_at, "GPUs", "Drain Deadline (s)"); a word already
    capitalised is left as written."""
    words = name.replace("_", " ").split()
    if len(words) > 1 and words[-1] == "at":
        # created_at: the value is an instant already.
        words.pop()
    unit = UNITS.get(words[-1]) if len(words) > 1 else None
    if unit is not None:
        words.pop()
    shown = " ".join(
        SPELLED.get(word, word.capitalize()) if word.islower() else word for word in words
    )
    return f"{shown} ({unit})" if unit is not None else shown
