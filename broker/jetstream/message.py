"""The MessageProxy dramatiq's worker passes around, with the JetStream delivery attached."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dramatiq.broker import MessageProxy
from dramatiq.message import Message
from nats.aio.msg import Msg


@dataclass(frozen=True)
class Delivery:
    msg: Msg  # the delivered NATS message: its reply subject is the ack handle
    stream_seq: int
    # Server delivery count, and our estimate of how many of those reached an actor
    # (deliveries spent waiting for the ETA are not counted; see intake.py).
    num_delivered: int
    handoffs: int


class JetStreamMessage(MessageProxy):
    def __init__(self, message: Message[Any], delivery: Delivery) -> None:
        super().__init__(message)
        self.delivery = delivery

    @property
    def redelivered(self) -> bool:
        """An earlier delivery reached an actor (or a worker) and was never settled."""
        return self.delivery.handoffs > 1

    def encoded(self) -> bytes:
        """The message as it is now: middleware (Retries) may have changed its options."""
        return self._message.encode()

    def exception(self) -> BaseException | None:
        """What the last processing attempt raised; dramatiq clears it after settling."""
        return self._exception
