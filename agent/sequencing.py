"""One sequencing for every stream the node sends: the agent's inventory and telemetry
(agent/publisher.py) and the runtime worker's report (agent/runtime/control.py).

Every attempt takes a new number from Sequences (agent/state.py), so a retry never
replays one even when the earlier attempt reached the server. A replayed sequence (409
`sequence_replayed`) means the local cursor is behind the server's (a restored state
dir, a new run dir): the cursor jumps past the server's, is persisted, and the payload
is sent again. Any other 409 is the caller's to judge: it is raised as it came.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

from agent.errors import Conflict
from agent.state import Sequences
from schemas.errors import ErrorCode

logger = logging.getLogger("modelforge.agent")

T = TypeVar("T")

REPLAY_JUMPS = 3
# A replay answer without the server's cursor: skip 1024, then 1024**2, then 1024**3
# ahead. Sequences must rise, not be contiguous, and 2**63 leaves room for any skip.
UNKNOWN_CURSOR_SKIP = 1024


async def send_sequenced(
    sequences: Sequences,
    stream: str,
    send: Callable[[int], Awaitable[T]],
    *,
    prefix: str = "",
) -> T:
    """send(sequence) with the stream's next number, again past the server's cursor after
    a replay (at most REPLAY_JUMPS times: then that replay is raised)."""
    replayed: Conflict | None = None
    for jump in range(REPLAY_JUMPS):
        sequence = sequences.take(stream)
        try:
            return await send(sequence)
        except Conflict as conflict:
            if conflict.code != ErrorCode.SEQUENCE_REPLAYED:
                raise
            replayed = conflict
            if conflict.cursor is not None:
                cursor, known = conflict.cursor, f"server cursor {conflict.cursor}"
            else:
                # Something between us and the API dropped the cursor: skip ahead,
                # further each time, rather than crawl up one by one.
                cursor = sequence + UNKNOWN_CURSOR_SKIP ** (jump + 1)
                known = "server cursor not reported"
            logger.warning(
                "%s%s sequence %d was already received (%s): the local cursor was "
                "behind (a restored state dir or run dir?); moving past it",
                prefix,
                stream,
                sequence,
                known,
            )
            sequences.advance_past(stream, cursor)
    assert replayed is not None
    raise replayed
