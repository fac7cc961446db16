"""Pull requests for one durable consumer, at most one open at a time, on a private inbox.

Why not nats-py's PullSubscription.fetch(): a fetch that times out on the client leaves
its request open on the server for a moment (the server counts `expires` from when it
receives the request). A message delivered into that window lands in the inbox after the
client stopped reading; if the client then closes the inbox, the message sits unacked
until ack_wait, and nats-server < 2.10.14 may even redeliver *another* message twice
when a delivery to a vanished inbox fails (nats-server PR #5305). So this class keeps
track of its request and, on close, waits for it to end (a message, or the server's
408) and hands back whatever arrived before unsubscribing.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time

from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.errors import TimeoutError as NatsTimeoutError

logger = logging.getLogger(__name__)

# Status codes JetStream answers a pull request with (NATS/1.0 <code> <description>).
_STATUS = "Status"
_DESCRIPTION = "Description"
_NO_MESSAGES = "404"
_REQUEST_TIMEOUT = "408"
_CONFLICT = "409"
_CONTROL = "100"
# No responders: nothing serves the consumer's pull subject. On a cluster that is the
# moment between a consumer leader's loss and the next election (or a consumer not yet
# placed); the client must not spin on it.
_NO_RESPONDERS = "503"
_NO_LEADER_BACKOFF_S = 0.25
# How long past its expiry a request with no answer is presumed lost (reconnect).
_GRACE_S = 0.5


class ConsumerGone(Exception):
    """The server says the consumer was deleted: re-declare it and start over."""


class Puller:
    def __init__(self, nc: NatsClient, stream: str, durable: str, *, expires_s: float) -> None:
        self._nc = nc
        # The JetStream API subject for pull requests; the default API prefix (no domain).
        self._next_subject = f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{durable}"
        self._expires_s = expires_s
        self._sub: Subscription | None = None
        self._inbox = ""
        self._open = False
        # Monotonic time by which every request we ever sent has surely expired.
        self._all_expired_at = 0.0
        self._open_until = 0.0
        # Pull requests answered 503 in a row (see _NO_RESPONDERS).
        self._unserved = 0

    async def start(self) -> None:
        self._inbox = self._nc.new_inbox()
        self._sub = await self._nc.subscribe(self._inbox)

    @property
    def _subscription(self) -> Subscription:
        if self._sub is None:
            raise RuntimeError("Puller.start() was not called")
        return self._sub

    def busy(self) -> bool:
        """A request is open or a delivery is waiting in the inbox."""
        if self._open and time.monotonic() > self._open_until + _GRACE_S:
            self._open = False  # its answer was lost (e.g. sent before a reconnect)
        return self._open or self._subscription.pending_msgs > 0

    async def request(self) -> None:
        """Ask for one message, waiting up to expires_s on the server."""
        if self._open:
            return
        now = time.monotonic()
        body = {"batch": 1, "expires": int(self._expires_s * 1e9)}
        await self._nc.publish(self._next_subject, json.dumps(body).encode(), reply=self._inbox)
        self._open = True
        self._open_until = now + self._expires_s
        self._all_expired_at = max(self._all_expired_at, self._open_until + _GRACE_S)

    async def receive(self, timeout_s: float) -> Msg | None:
        """The next delivered message; None when timeout_s passed or the open request
        ended without one (the caller may request again)."""
        try:
            msg = await self._subscription.next_msg(timeout=max(timeout_s, 0.001))
        except NatsTimeoutError:
            return None
        status = (msg.headers or {}).get(_STATUS)
        if status == _NO_RESPONDERS:
            self._open = False
            await self._unserved_wait(timeout_s)
            return None
        if self._unserved and status != _CONTROL:
            logger.info(
                "%s: served again after %d refused pulls", self._next_subject, self._unserved
            )
            self._unserved = 0
        if status is None:
            self._open = False  # batch of one: the request is fulfilled
            return msg
        if status == _CONTROL:
            return None
        self._open = False
        if status == _CONFLICT:
            description = (msg.headers or {}).get(_DESCRIPTION, "")
            if "deleted" in description.lower():
                raise ConsumerGone(description)
            logger.info("pull request ended: %s %s", status, description)
        elif status not in (_NO_MESSAGES, _REQUEST_TIMEOUT):
            logger.warning("unexpected pull status %s %s", status, msg.headers)
        return None

    async def _unserved_wait(self, timeout_s: float) -> None:
        """No consumer leader answers (an election, or the consumer being placed): one
        line when it starts, and the next request only after a short pause."""
        self._unserved += 1
        if self._unserved == 1:
            logger.warning(
                "%s: no responders (consumer leader lost or not elected yet); pulling every"
                " %g s until it answers",
                self._next_subject,
                _NO_LEADER_BACKOFF_S,
            )
        await asyncio.sleep(min(_NO_LEADER_BACKOFF_S, max(timeout_s, 0.0)))

    async def close(self) -> list[Msg]:
        """Wait for open requests to end, unsubscribe, and return the deliveries that
        arrived meanwhile: the caller must hand them back (nak)."""
        sub = self._subscription
        late: list[Msg] = []
        while (self._open or sub.pending_msgs > 0) and time.monotonic() < self._all_expired_at:
            msg = await self.receive(self._all_expired_at - time.monotonic())
            if msg is not None:
                late.append(msg)
        await sub.unsubscribe()
        return late
