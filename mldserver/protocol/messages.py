"""Decoding daemon lines into events and encoding ours into lines.

Input is decoded with orjson (which accepts any UTF-8; invalid UTF-8 is replaced, the
JVM default charset being ASCII or UTF-8). Unknown keys are ignored and key order is
free; every declared key may be ``null``. Output carries exactly the keys the
daemon's JSON reader accepts (it silently skips a message with one extra key), is
ASCII-only (non-ASCII escaped, as the daemon may read with an ASCII charset), and is
one line ended by ``\\n``::

    >>> encode(Status(response_for="initialize"), Dialect.SEQUENCE)
    b'{"action":"status","responseFor":"initialize"}\\n'
    >>> encode(Checkpoint("42", 3), Dialect.V1)
    b'{"action":"checkpoint","checkpoint":"42"}\\n'
"""

from __future__ import annotations

import enum
import json
import re
from typing import Any

import orjson

from .errors import RemoteProtocolError
from .events import (
    DAEMON_ACTIONS,
    Action,
    Checkpoint,
    CheckpointReply,
    Event,
    Initialize,
    ProcessRecords,
    Shutdown,
    Status,
)
from .lazy import LazyRecords


class Dialect(enum.Enum):
    """How the daemon expects checkpoints to be written."""

    SEQUENCE = "sequenceNumber/subSequenceNumber (KCL 1.8+, 2.x, 3.x)"
    V1 = "checkpoint (KCL up to 1.7.1)"


class UnknownAction(Action):
    """An action this core does not know (a newer daemon?): answered with a status."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    @property
    def action(self) -> str:  # type: ignore[override]
        return self.name

    def __repr__(self) -> str:
        return f"UnknownAction({self.name!r})"


def _seq(value: Any, line: bytes, action: str) -> str | None:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    raise RemoteProtocolError(
        f"{action}: sequenceNumber must be a string or null, got {value!r}", line=line, action=action
    )


def _int(value: Any, name: str, line: bytes, action: str) -> int | None:
    if value is None or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    raise RemoteProtocolError(
        f"{action}: {name} must be an integer or null, got {value!r}", line=line, action=action
    )


def decode(line: bytes, lazy: bool = False, positions: bool = False) -> Event:
    """Turn one line from the daemon into an event, or raise RemoteProtocolError.

    ``lazy``: a processRecords line's records are read on demand (a
    :class:`~.lazy.LazyRecords`), not made into a dict each; ``positions``: their
    positions are read as the line is checked (``LazyRecords.parse``)."""
    if lazy and _PROCESS_RECORDS.match(line):
        event = _lazy_process_records(line, positions)
        if event is not None:
            return event
    try:
        obj = orjson.loads(line)
    except orjson.JSONDecodeError:
        try:
            obj = orjson.loads(line.decode("utf-8", "replace"))
        except orjson.JSONDecodeError as exc:
            raise RemoteProtocolError(f"not valid JSON ({exc})", line=line) from None
    if not isinstance(obj, dict):
        raise RemoteProtocolError(f"expected a JSON object, got {type(obj).__name__}", line=line)
    name = obj.get("action")
    if not isinstance(name, str):
        raise RemoteProtocolError("JSON object without a string 'action'", line=line)
    if name == "checkpoint":
        if "sequenceNumber" in obj or "checkpoint" not in obj:
            seq = obj.get("sequenceNumber")
        else:
            seq = obj.get("checkpoint")
        error = obj.get("error")
        return CheckpointReply(
            _seq(seq, line, name),
            _int(obj.get("subSequenceNumber"), "subSequenceNumber", line, name),
            error if error is None else str(error),
        )
    cls = DAEMON_ACTIONS.get(name)
    if cls is None:
        return UnknownAction(name)
    if cls is ProcessRecords:
        records = obj.get("records")
        if records is None:
            records = []
        if not isinstance(records, list):
            raise RemoteProtocolError(
                f"processRecords: 'records' must be a list, got {type(records).__name__}",
                line=line,
                action=name,
            )
        mbl = _int(obj.get("millisBehindLatest"), "millisBehindLatest", line, name)
        return ProcessRecords(records, mbl, line)
    if cls is Initialize:
        shard_id = obj.get("shardId")
        return Initialize(
            shard_id if shard_id is None else str(shard_id),
            _seq(obj.get("sequenceNumber"), line, name),
            _int(obj.get("subSequenceNumber"), "subSequenceNumber", line, name),
            "sequenceNumber" in obj,
        )
    if cls is Shutdown:
        reason = obj.get("reason")
        return Shutdown(reason if reason is None else str(reason))
    return cls()


# The daemon writes "action" first: a line that starts so is worth reading lazily.
_PROCESS_RECORDS = re.compile(rb'\s*\{\s*"action"\s*:\s*"processRecords"')


def _lazy_process_records(line: bytes, positions: bool = False) -> ProcessRecords | None:
    """The batch with its records unread, or None: the eager path decides."""
    # The parsed line (twice the line's size and more) is let go at once: a line waiting
    # for a handler process holds only its bytes, and, with ``positions`` (a sink), its
    # records' positions and arrival times, read by the check (some 64 bytes a record,
    # until ``LazyRecords.sequence_numbers`` hands them on); what else reads the records
    # parses the line again, once.
    records = LazyRecords.parse(line, positions=positions)
    if records is None:
        return None
    return ProcessRecords(records, records.millis_behind_latest, line)  # type: ignore[arg-type]


def _dumps(obj: dict[str, Any]) -> bytes:
    data = orjson.dumps(obj)
    if not data.isascii():
        data = json.dumps(obj, separators=(",", ":"), ensure_ascii=True).encode("ascii")
    return data + b"\n"


def encode(event: Event, dialect: Dialect) -> bytes:
    """One line for the daemon, with exactly the keys it accepts."""
    if isinstance(event, Status):
        return _dumps({"action": "status", "responseFor": event.response_for})
    if isinstance(event, Checkpoint):
        if dialect is Dialect.V1:
            return _dumps({"action": "checkpoint", "checkpoint": event.sequence_number})
        return _dumps(
            {
                "action": "checkpoint",
                "sequenceNumber": event.sequence_number,
                "subSequenceNumber": event.sub_sequence_number,
            }
        )
    raise TypeError(f"cannot send {event!r} to the daemon")
