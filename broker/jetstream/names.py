"""Stream, subject, consumer and header names: one place, derived from the namespace."""

from __future__ import annotations

from dataclasses import dataclass

# Headers this broker writes. Nats-Msg-Id is JetStream's own (publish dedupe).
MSG_ID = "Nats-Msg-Id"
# Milliseconds since the epoch before which the message must not run; also in
# options["eta"], but the header lets the consumer decide without decoding.
ETA = "MF-ETA"
# Dead-letter metadata (all single-line strings; NATS headers cannot hold newlines).
DL_QUEUE = "MF-Queue"
DL_REASON = "MF-Reason"
DL_EXCEPTION = "MF-Exception"
DL_ERROR = "MF-Error"
DL_DELIVERIES = "MF-Deliveries"
DL_RETRIES = "MF-Retries"
DL_SOURCE_SEQ = "MF-Source-Seq"
DL_MESSAGE_ID = "MF-Message-Id"
DL_FAILED_AT = "MF-Failed-At"


@dataclass(frozen=True)
class Names:
    """Names for one namespace, e.g. "modelforge" -> MODELFORGE_TASKS, modelforge.tasks.<q>."""

    namespace: str

    @property
    def _stream_prefix(self) -> str:
        return self.namespace.upper().replace("-", "_")

    @property
    def tasks_stream(self) -> str:
        return f"{self._stream_prefix}_TASKS"

    @property
    def tasks_subjects(self) -> str:
        return f"{self.namespace}.tasks.>"

    @property
    def dead_letter_stream(self) -> str:
        return f"{self._stream_prefix}_DEAD_LETTERS"

    @property
    def dead_letter_subjects(self) -> str:
        return f"{self.namespace}.dead.>"

    def task_subject(self, queue_name: str) -> str:
        return f"{self.namespace}.tasks.{queue_name}"

    def dead_letter_subject(self, queue_name: str) -> str:
        return f"{self.namespace}.dead.{queue_name}"

    def queue_of_dead_letter_subject(self, subject: str) -> str:
        prefix = f"{self.namespace}.dead."
        if not subject.startswith(prefix):
            raise ValueError(f"{subject!r} is not a dead-letter subject of {self.namespace!r}")
        return subject[len(prefix) :]

    def durable(self, queue_name: str) -> str:
        """The consumer every worker of queue_name shares.

        dramatiq queue names are [a-zA-Z_][a-zA-Z0-9._-]*; consumer names may not hold
        ".", so it becomes "~", which no queue name can contain (no collisions).
        """
        return "tasks-" + queue_name.replace(".", "~")
