"""The runtime worker's held channel to the control plane (schemas/protocol.py:
RUNTIME_CHANNEL): one server-sent-events request, outbound like every other, held
instead of the agent's NOTIFICATIONS, reconnected with backoff (agent/jobs/wakeups.py:
hold_events, whose reader it shares).

* `event: job` (`{"event": "job.created", "job_id", "kind"}`) wakes the claim loop of
  its kind (Wakeups: the runtime kinds the runtime-jobs loop, the deployment kinds the
  deployment-jobs loop); the channel's first line wakes every loop.
* `event: invoke` (an `Invoke`, its lease with it) starts that invoke at once
  (agent/runtime/invoke.py: Invokes, which drops a second delivery of the same one).
* `event: cancel` (`{"invoke_id"}`): the invoke's client left; it is stopped.

An API without the channel (404) is held on NOTIFICATIONS instead, for the job notes;
each reconnect tries the channel again. While the channel is down, the loops poll and
the invokes already running carry on (their answers go over requests of their own).
"""

from __future__ import annotations

import asyncio
import logging

from pydantic import ValidationError

from agent.client import ProtocolClient
from agent.jobs.wakeups import Wakeups, hold_events, note_kind
from agent.runtime.invoke import Invokes
from schemas.gateway import InvokeCancel
from schemas.protocol import NOTIFICATIONS, RUNTIME_CHANNEL

logger = logging.getLogger("modelforge.runtime.channel")


class RuntimeChannel:
    def __init__(self, client: ProtocolClient, wakeups: Wakeups, invokes: Invokes) -> None:
        self.client = client
        self.wakeups = wakeups
        self.invokes = invokes

    def on_event(self, event: str | None, data: str) -> None:
        if event == "job":
            self.wakeups.note(note_kind(data))
        elif event == "invoke":
            self.invokes.deliver(data)
        elif event == "cancel":
            try:
                cancel = InvokeCancel.model_validate_json(data)
            except ValidationError:
                logger.warning("an invoke cancel without a readable invoke id: ignored")
                return
            self.invokes.cancel(cancel.invoke_id)

    async def hold(self, stop: asyncio.Event) -> None:
        await hold_events(
            self.client,
            [RUNTIME_CHANNEL, NOTIFICATIONS],
            stop,
            on_open=self.wakeups.every,
            on_event=self.on_event,
            what="the runtime channel",
        )
