"""Events of the MultiLangDaemon conversation, as small value types (frozen, but a batch).

Daemon to child (decoded by :mod:`mldserver.protocol.messages`)::

    {"action":"initialize","shardId":"shardId-000000000001","sequenceNumber":"TRIM_HORIZON","subSequenceNumber":0}
        -> Initialize(shard_id="shardId-000000000001", sequence_number="TRIM_HORIZON", ...)
    {"action":"processRecords","records":[...],"millisBehindLatest":0}
        -> ProcessRecords(records=[{...raw record dicts...}], millis_behind_latest=0)
    {"action":"checkpoint","sequenceNumber":"1234","subSequenceNumber":0,"error":null}
        -> CheckpointReply(sequence_number="1234", sub_sequence_number=0, error=None)
    {"action":"leaseLost"} -> LeaseLost()      {"action":"shardEnded"} -> ShardEnded()
    {"action":"shutdownRequested"} -> ShutdownRequested()
    {"action":"shutdown","reason":"TERMINATE"} -> Shutdown(reason="TERMINATE")   (KCL 1.x)

Child to daemon (encoded by the same module, exactly these keys)::

    Status(response_for="processRecords") -> {"action":"status","responseFor":"processRecords"}
    Checkpoint(sequence_number="1234", sub_sequence_number=0)
        -> {"action":"checkpoint","sequenceNumber":"1234","subSequenceNumber":0}

Every daemon action (everything but a checkpoint reply) is answered by exactly one
Status whose ``response_for`` is the action's name; ``Action.reply()`` builds it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar


class Event:
    """Base of every event; ``action`` is the wire name."""

    __slots__ = ()
    action: ClassVar[str]


class Action(Event):
    """A daemon message that waits for a status."""

    __slots__ = ()

    def reply(self) -> "Status":
        return Status(response_for=self.action)


@dataclass(frozen=True, slots=True)
class Initialize(Action):
    """First message: the shard and the lease's stored checkpoint (maybe a sentinel)."""

    action: ClassVar[str] = "initialize"
    shard_id: str | None
    sequence_number: str | None
    sub_sequence_number: int | None
    # The daemon writes every declared key: a ``sequenceNumber`` key (even null)
    # means it reads the sequenceNumber/subSequenceNumber checkpoint form.
    has_sequence_key: bool = True


@dataclass(slots=True)
class ProcessRecords(Action):
    """A batch. ``records`` are the raw record dicts, decoded lazily downstream.

    Not frozen, the one event that is not: ``let_go`` empties it once its rows are
    handed on, so a batch waiting out back-pressure for its status holds nothing of
    its line (some megabytes) but its rows::

        event.let_go()     # event.records == [], event.line == b""
    """

    action: ClassVar[str] = "processRecords"
    records: list[dict[str, Any]]
    millis_behind_latest: int | None = None
    # The line as it arrived: handler processes get the records as these bytes.
    line: bytes = field(default=b"", repr=False, compare=False)

    def let_go(self) -> None:
        self.records, self.line = [], b""


@dataclass(frozen=True, slots=True)
class ShutdownRequested(Action):
    """Graceful shutdown / lease hand-off: checkpoint what is safe; no batches follow."""

    action: ClassVar[str] = "shutdownRequested"


@dataclass(frozen=True, slots=True)
class LeaseLost(Action):
    """The lease went to another worker: checkpoints will fail."""

    action: ClassVar[str] = "leaseLost"


@dataclass(frozen=True, slots=True)
class ShardEnded(Action):
    """The shard is closed and fully read: SHARD_END must be checkpointed."""

    action: ClassVar[str] = "shardEnded"


@dataclass(frozen=True, slots=True)
class Shutdown(Action):
    """KCL 1.x terminal message: ``TERMINATE`` is a shard end, ``ZOMBIE`` a lost lease."""

    action: ClassVar[str] = "shutdown"
    reason: str | None

    @property
    def is_shard_end(self) -> bool:
        return self.reason == "TERMINATE"


@dataclass(frozen=True, slots=True)
class CheckpointReply(Event):
    """The daemon's answer to a Checkpoint; ``error`` is a Java exception's simple name.

    A reply the core cannot read (not JSON, a field of the wrong type) still settles
    the outstanding checkpoint, as a failed one: ``error`` is ``MALFORMED_REPLY`` and
    ``malformed`` says what was wrong with it."""

    action: ClassVar[str] = "checkpoint"
    sequence_number: str | None
    sub_sequence_number: int | None
    error: str | None = None
    malformed: str | None = None


@dataclass(frozen=True, slots=True)
class ConnectionClosed(Event):
    """End of input: the daemon closed the child's stdin (or died)."""

    action: ClassVar[str] = "<eof>"


@dataclass(frozen=True, slots=True)
class Status(Event):
    """Child to daemon: the action ``response_for`` is done."""

    action: ClassVar[str] = "status"
    response_for: str


@dataclass(frozen=True, slots=True)
class Checkpoint(Event):
    """Child to daemon: store this position; ``None`` means all delivered (or SHARD_END)."""

    action: ClassVar[str] = "checkpoint"
    sequence_number: str | None = None
    sub_sequence_number: int | None = None


# The error of a checkpoint whose reply could not be read (not a name the daemon sends).
MALFORMED_REPLY = "MalformedReply"

DAEMON_ACTIONS: dict[str, type[Action]] = {
    cls.action: cls
    for cls in (Initialize, ProcessRecords, ShutdownRequested, LeaseLost, ShardEnded, Shutdown)
}
