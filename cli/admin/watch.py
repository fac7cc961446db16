"""`-w/--watch`: follow the API's event stream (GET ADMIN_EVENTS), not poll.

The stream is opened, and the first view drawn, only once the API says it is subscribed:
a change that lands between the first view and the first event is then on the stream,
never lost between the two. Where the stream breaks (the API stops), we reconnect with
Last-Event-ID and the API sends what was published meanwhile first; where it ends with
`overflow` (we fell behind, or too much was missed to resume), we reconnect without it
and draw the view again. A stream that never opened is a failure, said at once: a wrong URL
or an API that is not there will not mend by retrying.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any, TypeVar

from pydantic import ValidationError

from cli.admin.client import AdminClient, AdminFailure, Refused
from cli.admin.output import Output
from schemas.events import CloudEvent
from schemas.protocol import ADMIN_EVENTS_OVERFLOW

# Reconnect backoff after the stream ends or breaks.
RETRY_S = (0.5, 1.0, 2.0, 5.0)

V = TypeVar("V")


class _Reached(Exception):
    """The followed object got where it was going (raised out of the event loop)."""


def follow(
    client: AdminClient,
    out: Output,
    *,
    redraw: Callable[[], None],
    on_event: Callable[[CloudEvent], bool],
    limit: int | None = None,
    **filters: Any,
) -> None:
    """redraw() each time the stream (re)opens; on_event(event) for each event, True when
    it showed something. Returns after `limit` shown events; otherwise runs until Ctrl-C."""
    shown = 0
    failures = 0
    opened = False
    # The last event seen: a reconnect resumes after it (nothing missed in between).
    last_id: str | None = None
    while True:
        try:
            for event_type, data in client.events(last_event_id=last_id, **filters):
                if event_type == "":
                    opened = True
                    failures = 0
                    if last_id is None:
                        redraw()
                    continue
                if event_type == ADMIN_EVENTS_OVERFLOW:
                    # Too far behind to resume: read the state again, then follow.
                    out.note("fell behind the event stream; reconnecting", style="yellow")
                    last_id = None
                    break
                try:
                    event = CloudEvent.model_validate_json(data)
                except ValidationError:
                    continue  # a newer API's envelope: not ours to show
                last_id = str(event.id)
                if on_event(event):
                    shown += 1
                    if limit is not None and shown >= limit:
                        return
        except AdminFailure as exc:
            # Refusals (a wrong key) will not mend by retrying, nor will a stream that
            # never opened; a broken one may.
            if isinstance(exc, Refused) or not opened:
                raise
            out.note(f"{exc}; reconnecting", style="yellow")
        failures += 1
        time.sleep(RETRY_S[min(failures, len(RETRY_S)) - 1])


def follow_one(
    client: AdminClient,
    out: Output,
    *,
    target: uuid.UUID,
    read: Callable[[], V],
    done: Callable[[V], bool],
    **filters: Any,
) -> V:
    """Follow one object (a job, a deployment) until done(its view): read() it (showing
    it is read's part) when the stream opens and again on each event about it; the view
    that was done is returned."""
    reached: list[V] = []

    def redraw() -> None:
        view = read()
        if done(view):
            reached.append(view)
            raise _Reached

    def on_event(event: CloudEvent) -> bool:
        if event.targetid == str(target):
            redraw()
        return False

    try:
        follow(client, out, redraw=redraw, on_event=on_event, **filters)
    except _Reached:
        return reached[0]
    raise AssertionError("with no limit, follow returns only by raising")
