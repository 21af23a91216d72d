"""What a handler sees of a batch: ``Record``, ``Batch`` and ``ShardInfo``.

A record wraps the daemon's JSON object and decodes lazily: ``data`` (base64) is
decoded on first access, so a handler that only routes on ``partition_key`` pays
nothing for payloads::

    {"data":"bWVvdw==","partitionKey":"cat","sequenceNumber":"4959...8898",
     "subSequenceNumber":0,"approximateArrivalTimestamp":1476889707000,"action":"record"}
    record.data == b"meow"; record.partition_key == "cat"
    record.sequence_number == "4959...8898"   # a string: 56+ digits, never a float
    record.position == Position(4959...8898, 0, "4959...8898")   # parsed once, then kept

Sequence numbers stay strings; ``position`` (a :class:`~mldserver.base.positions.Position`)
compares them as integers where order matters. It is parsed on first use (or given by
the decoder) and kept: a record whose ``sequenceNumber`` is not digits has none, and
reading it raises ``ValueError`` (the server treats such a record as a bad record).
Any field but ``sequenceNumber`` may be null.

``data`` is decoded with SIMD (pybase64), strictly; what that refuses (a character
outside the alphabet, a line break) is read as ``binascii.a2b_base64`` reads it, which
skips such characters, so every line decodes as it always did, only faster. In a
handler process the records of a batch are read from the daemon's line, and the first
``data`` read decodes every record's of the batch at once, in C from the line's bytes
(``pool.frames.LineRecord``), with the same result; the line is parsed for the other
fields only when the handler first reads one of them.
"""

from __future__ import annotations

import binascii
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import pybase64

from ..base.positions import Position
from ..rows.emitted import Emitted, EmittedRows  # noqa: F401  (Emitted: what batch.rows gives back)


@dataclass(frozen=True, slots=True)
class ShardInfo:
    """The shard a connection serves, and where its lease's checkpoint stands."""

    shard_id: str
    sequence_number: str | None  # digits, or TRIM_HORIZON / LATEST / AT_TIMESTAMP, or None
    sub_sequence_number: int | None


class Record:
    """One record of a batch, as the daemon delivered it, decoded lazily::

        for record in batch.records:
            order = json.loads(record.data)           # bytes, base64-decoded on first access
            key = record.partition_key                 # "customer-7"
            await checkpointer.checkpoint(record.sequence_number, record.sub_sequence_number)

    ``sequence_number`` is a string of digits (never a number: 56 digits and more);
    ``position`` compares records in stream order."""

    __slots__ = ("_raw", "_data", "_position")

    def __init__(self, raw: dict[str, Any], data: bytes | None = None, position: Position | None = None) -> None:
        self._raw = raw
        self._data = data
        self._position = position

    @property
    def data(self) -> bytes:
        """The payload, base64-decoded from the daemon's ``data`` on first access (b"" when none)."""
        if self._data is None:
            b64 = self._raw.get("data")
            self._data = decode_data(b64) if b64 else b""
        return self._data

    @property
    def raw(self) -> Any:
        """The daemon's JSON object for this record, as it arrived: a dict, or in a handler
        process a read-only mapping over the line (``[key]``, ``get``), read when asked."""
        return self._raw

    @property
    def raw_data(self) -> str | None:
        """``data`` as the daemon sent it (base64), or None for a de-aggregated record."""
        return self._raw.get("data")

    @property
    def partition_key(self) -> str | None:
        """The producer's partition key (``"customer-7"``)."""
        return self._raw.get("partitionKey")

    @property
    def sequence_number(self) -> str:
        """The record's sequence number, a string of digits: ``"49590338271490256608559692538361571095921575989136588898"``."""
        return self._raw["sequenceNumber"]

    @property
    def sub_sequence_number(self) -> int | None:
        """Its index in a KPL aggregate (0 for a record that was not aggregated)."""
        return self._raw.get("subSequenceNumber")

    @property
    def approximate_arrival_timestamp(self) -> int | None:
        """When the stream received it, epoch ms (``1763719200123``): a row's event time
        when ``emit`` is given none."""
        return self._raw.get("approximateArrivalTimestamp")

    @property
    def explicit_hash_key(self) -> str | None:
        """The producer's explicit hash key, when it gave one (rare)."""
        return self._raw.get("explicitHashKey")

    @property
    def position(self) -> Position:
        """(sequence number, sub-sequence number) as integers, to compare records in
        stream order: ``max(batch.records, key=lambda r: r.position)``. ``ValueError``
        when the sequence number is not digits (the server dead-letters such a record)."""
        position = self._position
        if position is None:
            raw = self._raw
            position = self._position = Position.parse(raw.get("sequenceNumber"), raw.get("subSequenceNumber"))
            if position is None:
                raise ValueError(
                    f"not a position: sequenceNumber {raw.get('sequenceNumber')!r}, "
                    f"subSequenceNumber {raw.get('subSequenceNumber')!r}"
                )
        return position

    def to_json(self) -> dict[str, Any]:
        """The record as the daemon wrote it (data base64), e.g. for a dead letter."""
        raw = self._raw
        raw = dict(raw) if type(raw) is dict else raw.as_dict()  # (a record of a line read lazily)
        if raw.get("data") is None and self._data is not None:
            raw["data"] = binascii.b2a_base64(self._data, newline=False).decode("ascii")
        return raw

    def __repr__(self) -> str:
        return (
            f"Record(sequence_number={self.sequence_number!r}, "
            f"sub_sequence_number={self.sub_sequence_number!r}, partition_key={self.partition_key!r})"
        )


def decode_data(b64: str) -> bytes:
    """A record's base64 ``data`` as bytes: strict SIMD decoding, else binascii's lenient
    reading (non-alphabet characters skipped; bad padding still raises ``binascii.Error``)."""
    try:
        return _b64decode(b64, validate=True)
    except ValueError:  # binascii.Error, or a str that is not ASCII
        return binascii.a2b_base64(b64)


_b64decode = pybase64.b64decode


# Event times are epoch milliseconds from 1970 up to the end of year 9999: what a
# timestamp in Python (datetime), Arrow and Spark can hold, with room for a window's end
# in 64 bits. Anything else (a string, a float, a bool, microseconds by mistake, 2**64)
# makes its row a bad row, dead-lettered with its record, not a crash or a window in
# the year 57000 that would close every other.
MAX_EVENT_TIME_MS = 253_402_300_800_000  # 10000-01-01T00:00:00Z
EVENT_TIME = f"epoch milliseconds (an int in [0, {MAX_EVENT_TIME_MS}): 1970 to 9999)"


def valid_event_time(t: Any) -> bool:
    """Is ``t`` an event time: an int (not a bool) of epoch ms in [0, MAX_EVENT_TIME_MS)?"""
    return type(t) is int and 0 <= t < MAX_EVENT_TIME_MS


def times_valid(times: list[Any]) -> bool:
    """Is every time None or an event time (``valid_event_time``)? A batch's, checked
    together in C: the types at once, then the smallest and the largest."""
    kinds = set(map(type, times))
    if not kinds <= _TIME_TYPES:
        return False  # a float, a string, a bool...
    ints = [t for t in times if t is not None] if type(None) in kinds else times
    return not ints or (min(ints) >= 0 and max(ints) < MAX_EVENT_TIME_MS)


_TIME_TYPES = frozenset({int, type(None)})


def row_times(records: Sequence[Record], given: list[Any]) -> list[Any]:
    """Each emitted row's event time: ``emit``'s (``given``), else its record's
    ``approximate_arrival_timestamp`` (None when neither is given). Checked by the
    caller (``times_valid``); ``row_time`` says which one is wrong, and why."""
    if None not in given:
        return given
    return [r.approximate_arrival_timestamp if t is None else t for r, t in zip(records, given)]


def row_time(record: Record, given: Any) -> tuple[Any, str | None]:
    """One row's event time as ``row_times`` gives it, and the error if it is not
    None or an event time::

        row_time(record, 5.5)   # (5.5, "event time 5.5 from batch.emit(event_time_ms=...) is not ...")
        row_time(record, None)  # (1763719200123, None): the record's arrival time
    """
    if given is not None:
        t, source = given, "batch.emit(event_time_ms=...)"
    else:
        t, source = record.approximate_arrival_timestamp, "the record's approximateArrivalTimestamp"
    if t is None or valid_event_time(t):
        return t, None
    return t, f"event time {t!r:.80} from {source} is not {EVENT_TIME}"


class Batch:
    """One ``processRecords``: the records, how far behind the shard is, and the shard.

    ``emit`` passes a row downstream to the coordinator, attributed to a record's
    position (the shard checkpoints past that record only once the row is committed)::

        for record in batch.records:
            batch.emit(record, {"customer": record.partition_key, "amount": 3})
            batch.emit(record, row, event_time_ms=1763719200000)  # event time from the data

    A row is a dict that orjson can encode, encoded at its ``emit``: changing the dict
    afterwards does not change the row (``rows.emitted``). Without ``event_time_ms`` its
    event time is the record's ``approximate_arrival_timestamp``. An event time is epoch
    milliseconds, an ``int`` in [0, ``MAX_EVENT_TIME_MS``) (1970 to 9999); a row that
    cannot be encoded, or whose event time is anything else, is a bad row: dead-lettered
    with its record once the batch's rows are handed over (the batch goes on). A server
    with no sink ignores rows.

    ``fail`` gives up on one record (retry it first if that can help), and the batch
    goes on::

        try:
            handle(record)
        except ValueError as exc:
            batch.fail(record, exc)

    Once the call returns, the server dead-letters the record with its data and the
    error (reason ``record failed``), before the batch's status; the rows it emitted are
    dropped. Until then, a checkpoint the handler asks for stops short of the first
    failed record (``failures.FailureGuard``); once dead-lettered, a failed record
    counts as done. A failed call (the handler raised) dead-letters the whole batch as
    before, with the records it failed.
    """

    __slots__ = ("records", "millis_behind_latest", "shard", "rows", "line", "failed", "stats", "_index")

    def __init__(
        self,
        records: Sequence[Record],
        millis_behind_latest: int | None,
        shard: ShardInfo,
        rows: EmittedRows | None = None,
    ) -> None:
        self.records = records
        self.millis_behind_latest = millis_behind_latest
        self.shard = shard
        self.rows = rows  # what emit collected, or None when nothing collects rows
        # The daemon's processRecords line, when ``records`` are its records one for one
        # (a handler process decodes them from it; nothing is encoded again). In a handler
        # process, a handler that says ``parses_line`` gets the line alone (``records``
        # empty until it reads them from it: an amazon_kclpy processor, ``api/kclpy``).
        self.line: bytes | None = None
        # batch.fail: the index of each failed record -> (error, attempts)
        self.failed: dict[int, tuple[str, int]] | None = None
        # what the handler counted during the call (ChangeHandler: on_update_success, ...)
        self.stats: dict[str, int] | None = None
        self._index: dict[int, int] | None = None  # id(record) -> its index, made by the first fail

    @property
    def emit(self) -> Callable[..., None]:
        """``emit(record, row, event_time_ms=None)``: the collector's own ``add`` (written
        at once: ``emitted``), no call in between; with nothing to keep rows, a count."""
        rows = self.rows
        return self._discard if rows is None else rows.add

    def _discard(self, record: Record, row: dict[str, Any], event_time_ms: int | None = None) -> None:
        self.discarded()

    def stop_collecting(self) -> None:
        """The call is over: the batch keeps no more rows. A later ``batch.emit`` is
        counted as discarded; one kept from the call (a task the handler left running)
        raises, saying so (``EmittedRows.close``)."""
        if self.rows is not None:
            self.rows.close()
            self.rows = None

    def discarded(self) -> None:
        """A row emitted with nothing to keep it (no sink): counted in ``stats``
        (``rows_discarded``: the server warns once per shard and counts it)."""
        stats = self.stats
        if stats is None:
            stats = self.stats = {}
        stats["rows_discarded"] = stats.get("rows_discarded", 0) + 1

    def fail(self, record: Record, error: BaseException | str, attempts: int = 1) -> None:
        """Give up on ``record``: dead-lettered with its data and ``error`` once the call
        returns (``attempts``: how often it was tried, for the dead letter). A second
        ``fail`` of the same record keeps the first error."""
        index = self._index
        if index is None:
            index = self._index = {id(r): i for i, r in enumerate(self.records)}
        i = index.get(id(record))
        if i is None:
            i = self._find(record)
        if isinstance(error, BaseException):
            error = f"{type(error).__name__}: {error}"
        elif not isinstance(error, str):
            error = str(error)
        if self.failed is None:
            self.failed = {}
        self.failed.setdefault(i, (error, attempts))

    def _find(self, record: Any) -> int:
        """The index of a record given by value (a copy, a record made again): its position."""
        key = (getattr(record, "sequence_number", None), getattr(record, "sub_sequence_number", None))
        for i, r in enumerate(self.records):
            if (r.sequence_number, r.sub_sequence_number) == key:
                return i
        raise ValueError(f"batch.fail({record!r:.200}): not a record of this batch; pass one of batch.records")

    def settle_failures(self) -> list[tuple[int, str, int]]:
        """The call is over: the failed records as ``(index, error, attempts)`` in batch
        order, and the rows they emitted taken out of ``rows``."""
        failed = self.failed
        if not failed:
            return []
        if self.rows is not None:
            records = self.records
            gone = {id(records[i]) for i in failed}
            gone.update(key for key, i in (self._index or {}).items() if i in failed)
            self.rows.drop(gone)
        return [(i, error, attempts) for i, (error, attempts) in sorted(failed.items())]

    def __len__(self) -> int:
        return len(self.records)

