"""Frames between the server and a handler process (``child.py``): the one module
both sides speak, built on the framing of every pipe of the server (``spark/pipes.py``: an 8-byte
header, a JSON object, an optional binary body).

What crosses, and how often (one shard's action is one ``call`` and one ``done``)::

    server -> child
      {"op":"start","handler":"pkg.mod:Attr","settings":{...},"sys_path":[...],"state":"/x/h-1",
       "arena":[5,67108864],"rows_arena":[6,67108864]}       (the arenas' fds and sizes)
      {"op":"call","id":7,"shard":3,"action":"process_records","line":true,"records":1000,
       "info":["shardId-0","TRIM_HORIZON",0],"millis_behind_latest":0,"collect":true} | the line
      {"op":"call",...,"arena":[0,1462000]}    (the line in the arena at (offset, size): arena.py)
      {"op":"call",...,"held":true}            (parse the line, then wait for its go frame)
      {"op":"go","id":7,"call":true}           (a held call's batch is sound: call the handler;
                                                false: answer done "skipped" without calling it)
      {"op":"reply","req":2,"error":null}                      (a checkpoint's answer)
      {"op":"reply","req":3,"rows":[{...}],"done":false}       (context.sql rows)
      {"op":"drop","shard":3}                                  (the shard left this process)
      {"op":"free","region":[0,1200000]}       (bytes of the rows arena the server is done with, exactly:
                                                a region's extent, or a window's part of it)
      {"op":"fire","id":90,"timers":[[91,"mod:callback","ref",{context}], ...]}   (due timers)
      {"op":"stop"}
    child -> server
      {"op":"ready","pid":4242}  or  {"op":"import_failed","error":"Could not import ..."}
      {"op":"checkpoint","id":7,"req":2,"sequence_number":"49..","sub_sequence_number":0}
      {"op":"checkpoint",...,"retry":false}       (one round trip, no retry: ``checkpoint(retry=False)``)
      {"op":"checkpoint",...,"timers":[["mod:callback","ref",1763719260000,{context}],["mod:callback","ref2"]]}
      {"op":"sql_fetch","id":7,"req":3,"cursor":1,"query":"SELECT ..","params":{},"n":64}
      {"op":"sql_close","id":7,"req":4,"cursor":1}
      {"op":"done","id":7,"result":"ok","error":null,"rows":2,"bad":[]} | rows, columnar
      {"op":"done",...,"rows":10000,"rows_arena":[0,3100000]}   (the rows in the rows arena: arena.py)
      {"op":"done","id":7,"result":"skipped",...}                (a held call its go frame refused)
      {"op":"done",...,"failed":[[41,"ValueError: bad order",3]],"stats":{"on_update_success":999}}
      {"op":"done",...,"timers":[["mod:callback","ref",1763719260000,{context}], ...]}  (the call's timers)
      {"op":"timer_write","id":7,"req":5,"timers":[["mod:callback","ref",1763719260000,{context}], ...]}
      {"op":"timer_refused","id":7,"req":6,"error":"timer 'ref': context is 1730 bytes ..."}
      {"op":"done","id":90,"result":"ok","fired":[null,["ValueError: ..","Traceback .."]]}  (a fire's)

A held call lets the server read the batch's positions (every record's sequence
number, which a sink needs before the handler may see the batch: ``shard.batches``)
while the handler process parses the same line: the server writes the call, scans the
line, then writes ``go``; the process parses, then waits for it. On 2 cores, a batch
of 10,000 records reaches its handler some 1.2 ms sooner (the scan no longer comes
first). A ``go`` that says no (a record without a position) is answered ``skipped``:
the server dead-letters those records and calls again with the others.

The timers a call creates cross with its checkpoint requests and its ``done`` frame
(``timers``: a create four items, a cancel two, in order), committed by the server
before it asks the daemon and before the action's status; a timer request
(``timer_write``: outside a call, a cancel the call cannot answer, a callback's
timers) is answered by the server whichever call sends it (services); a ``fire``
frame's callbacks each run under their own id (``[91, ...]``), so the server can tell
which one blocks (``mldserver.timers.firing``, ``.remote``, ``.pending``).

The records of a batch cross as the daemon's processRecords line, the bytes that
arrived (``"line": true``, and ``"records"``: how many the server read there), or,
when the server changed them (KPL aggregates expanded, malformed records taken out), as
one JSON array of record objects (``encode_records``); the child wraps a line's in lazy
``LineRecord``s: their data decoded natively, every record's at once, when the handler
first reads one, and their other fields over the line parsed once by pysimdjson
(``protocol/lazy.py``) when it first reads one of those: a field becomes a Python
object when the handler reads it. The rows a batch emitted
come back as one columnar body per batch, never a frame per row (``encode_rows`` /
``decode_rows``), which the server reads in place, into the coordinator's columns::

    n x u32 record index | n x i64 event time (-2: none given) | n x u64 end offset | row JSON lines...

Each row's JSON ends in a newline: the rows are JSON lines, as a sink takes them. A
row emitted without an event time carries ``ARRIVAL_TIME`` (-2): its record's
``approximateArrivalTimestamp``, which the server read with the positions in one
native pass over the line (``protocol/_scan.c``) and fills in, checked there
(``shard.batches.encoded_rows``), so the handler process reads no field the handler
did not. Records the server re-encoded (``encode_records``: KPL's user records) were
read from no line: for those the handler process reads the arrival times itself
(``encode_rows(..., read_arrivals=True)``; -1 where a record has none).

A row that orjson cannot encode, or whose event time (``event_time_ms``) is not epoch
milliseconds (``records.valid_event_time``), is not in the body: ``bad`` holds
``[index, error]``.
The records the handler gave up on (``batch.fail``; ``failures.py``) are in ``failed``
as ``[index, error, attempts]``, their rows left out of the body; ``stats`` holds what
the handler counted in the call (``ChangeHandler``: ``on_update_success``, ...). Both
are left out when empty.
"""

from __future__ import annotations

import struct
import sys
from array import array
from itertools import repeat
from operator import is_
from typing import Any, Iterable, Literal, NamedTuple, NotRequired, Sequence, TypedDict

import orjson

from ..protocol.lazy import LazyRecords
from ..rows.emitted import EmittedRows
from ..api.records import Record, row_time, row_times, times_valid
from ..rows.batch import ARRIVAL_TIME, NO_TIME
from ..native import load_native
from ..spark.pipes import HEADER, encode, read_frame, read_frame_async
from ..shard.calls import SKIPPED  # a held call's done when its go frame says no (above)

# Every record's data decoded from the line in one native pass (``_b64.c``, setup.py builds it); None
# without a C compiler, or with MLDSERVER_NO_EXTENSIONS set: Record.data serves.
_b64 = load_native("mldserver.pool._b64")
_datas = _b64.datas if _b64 is not None else None

__all__ = [
    "CallFrame",
    "DoneFrame",
    "FireFrame",
    "SKIPPED",
    "StartFrame",
    "decode_rows",
    "encode",
    "encode_head",
    "encode_records",
    "encode_rows",
    "line_of",
    "read_frame",
    "read_frame_async",
    "record_indexes",
    "records_from",
]

# The state file a child shares with the server (shared memory, little-endian i64s): the
# id of the call whose code is executing (RUN, written by the child around every step),
# the id of a call the server stops (STOP, written by the server before its SIGUSR2), and
# by when the child's loop turns again at the latest (BEAT, time.monotonic_ns(): its last
# turn plus BLOCKED beats of its period; past it, its loop is blocked). The loop beats
# every WATCH_INTERVAL while a call or a timer fire is in flight (and IDLE_INTERVAL
# after), every IDLE_INTERVAL once none has been: ``heartbeat.py``.
RUN = struct.Struct("<q")
STOP = struct.Struct("<q")
BEAT = struct.Struct("<q")
STOP_AT, BEAT_AT = RUN.size, RUN.size + STOP.size
STATE_SIZE = RUN.size + STOP.size + BEAT.size
WATCH_INTERVAL = 0.05
IDLE_INTERVAL = 1.0
BLOCKED = 4  # beats missed: the loop is blocked

ACTIONS = ("initialize", "process_records", "shutdown_requested", "shard_ended", "lease_lost")


class StartFrame(TypedDict):
    op: Literal["start"]
    handler: str  # MODULE:ATTR, imported once by the child
    settings: dict[str, Any]  # the server's Settings, as fields
    sys_path: list[str]
    state: str  # the process's state file prefix (which call runs, stack dumps)
    arena: list[int] | None  # [fd, size]: the shared memory a call's line may land in (arena.py)
    rows_arena: NotRequired[list[int] | None]  # [fd, size]: where the child may put a batch's rows


class CallFrame(TypedDict, total=False):
    op: Literal["call"]
    id: int
    shard: int  # the server's key for the shard's connection
    action: str  # one of ACTIONS
    info: tuple[str, str | None, int | None]  # ShardInfo: shard id, sequence number, sub-sequence
    millis_behind_latest: int | None
    collect: bool  # process_records: does the server want the rows?
    line: bool  # process_records: the body is the daemon's line (else a records array)
    records: int  # process_records with the line: how many records the server read in it
    arena: tuple[int, int]  # the body is in the arena at (offset, size), not after the frame
    held: bool  # process_records: the handler is called only once a go frame says so


class FireFrame(TypedDict):
    op: Literal["fire"]
    id: int
    timers: list[tuple[int, str, str, Any]]  # (call id, callback name, reference, context)


class DoneFrame(TypedDict):
    op: Literal["done"]
    id: int
    result: str  # "ok", "checkpoint_failed", "failed", SKIPPED
    error: str | None
    traceback: str | None
    rows: int
    bad: list[tuple[int, str]]
    failed: NotRequired[list[tuple[int, str, int]]]  # batch.fail: [index, error, attempts]
    stats: NotRequired[dict[str, int]]  # what the handler counted (on_update_success, ...)
    timers: NotRequired[list[list[Any]]]  # the call's timers not yet written (timers.remote.encode)
    rows_arena: NotRequired[tuple[int, int]]  # the rows body is in the rows arena at (offset, size)


def encode_head(message: dict[str, Any], body_size: int) -> bytes:
    """A frame without its body (``encode``'s first part): the body, a batch's line of
    megabytes, is written after it as it is, not copied into one buffer with it."""
    data = orjson.dumps(message, default=str)
    return HEADER.pack(len(data), body_size) + data


def encode_records(records: Sequence[Record]) -> bytes:
    """The batch's records as the daemon wrote them (a de-aggregated record carries
    its user record's data, base64; a record of a line read lazily, as a bisected
    batch's part has, is made a dict)."""
    return orjson.dumps([r._raw if type(r._raw) is dict and (r._data is None or r._raw.get("data") is not None)
                         else r.to_json() for r in records])


def records_from(body: bytes | memoryview, line: bool = False, count: int | None = None) -> list[Record]:
    """The batch's records from a ``call`` body: the daemon's whole processRecords
    line (``line``), or the array ``encode_records`` made; in the arena (a memoryview)
    or read from the pipe; ``count``: how many records the line holds, when the server
    said (the line is then not read here at all). A line's records are read when the handler reads them
    (``LineRecord``): their data decoded natively, every record's at once, and the rest
    parsed (pysimdjson) the first time a handler reads anything else of one. The
    records keep nothing of ``body`` once their line is closed (``line_of``, at the
    call's end): what records kept past the call still need of it is copied then."""
    if not body:
        return []
    if not line:
        return list(map(Record, orjson.loads(body)))
    if _datas is None:  # pragma: no cover  (not built, or MLDSERVER_NO_EXTENSIONS set)
        lazy = LazyRecords.parse(body, keep=True)
        if lazy is not None:
            return list(map(Record, lazy.objects()))
    else:
        if count is None:
            lazy = LazyRecords.parse(body)  # checked natively: how many records, none of them parsed
            count = len(lazy) if lazy is not None else None
        if count is not None:
            shared = LineData(body)
            records = shared.records = list(map(LineRecord, repeat(shared), range(count)))
            return records
    return list(map(Record, _tolerant(body)))


def _tolerant(line: bytes | memoryview) -> list[Any]:
    """A line's records as the protocol core's eager decoder reads them: invalid UTF-8
    replaced (pysimdjson refuses such a line)."""
    try:
        message = orjson.loads(line)
    except orjson.JSONDecodeError:
        message = orjson.loads(bytes(line).decode("utf-8", "replace"))
    return message.get("records") or []


class LineData:
    """The line a batch's ``LineRecord``s were read from.

    The first ``data`` a handler reads decodes every record's at once, from the line's
    bytes in one native pass (``_b64.datas``: base64 in C, no str per record), so a
    handler that reads every record's data pays some 0.1 us a record for it, and one
    that reads none pays nothing. The first other field read (``partition_key``,
    ``sequence_number``, ``raw``, ...) parses the line with pysimdjson, every record's at
    once (``raw``): a handler that reads only the data never parses it (some 0.25 ms
    and 1,000 Python objects for 1,000 x 1 KiB). Once the call is over (``close``), the
    line's region goes back: a line not yet parsed is copied first, if the handler kept
    a record past the call; if not, nothing is copied::

        records = records_from(body, line=True); line = line_of(records)
        batch = Batch(records, ...); del records    # ... the call ...
        batch = None; line.close()                  # no record left: no copy of body
    """

    __slots__ = ("body", "records", "raws", "decoded")

    def __init__(self, body: bytes | memoryview) -> None:
        self.body: bytes | memoryview | None = body
        self.records: list[LineRecord] | None = None  # until the call is over (a cycle until then)
        self.raws: list[Any] | None = None  # every record parsed: a lazy mapping each (or what the daemon sent)
        self.decoded = False  # every record's data decoded

    def decode(self) -> None:
        body, records = self.body, self.records
        if body is None or records is None or self.decoded:
            return
        self.decoded = True  # (once)
        found = _datas(body)
        if found is None or len(found) != len(records):  # pragma: no cover  (simdjson read this line)
            return
        for record, data in zip(records, found):
            if data is not None:  # None: not plain base64, read the usual way (Record.data)
                record._data = data

    def raw(self, i: int) -> Any:
        """Record ``i`` parsed: the line parsed once, and every record's set at once."""
        raws = self.raws
        if raws is None:
            lazy = LazyRecords.parse(self.body, keep=True)  # type: ignore[arg-type]
            raws = self.raws = list(lazy.objects()) if lazy is not None else _tolerant(self.body)  # type: ignore[arg-type]
            for record, raw in zip(self.records or (), raws):
                record._raw = raw
        return raws[i]

    def close(self) -> None:
        """The call is over: its body (the arena's region) may be reused. A record still
        read after it decodes its data the usual way, and reads a copy of the line, made
        now if any record outlives the list this line held them in (the handler kept
        one, or the caller still holds the batch): each record refers to this line, so
        the line's references drop by one for each record that goes with the list."""
        records, self.records = self.records, None
        held, n = sys.getrefcount(self), len(records or ())
        del records  # the records only the list held go now
        kept = sys.getrefcount(self) > held - n
        body = self.body
        self.body = bytes(body) if kept and self.raws is None and body is not None else None  # (pysimdjson copied it)


class LineRecord(Record):
    """A record of a batch's line in a handler process (``records_from``): its data
    and its other fields read from the line when the handler first reads them
    (``LineData``). Its ``_raw`` is unset until then: reading it (``__getattr__``, only
    called for an attribute not set) parses the line; after that it is read as any
    record's, at no cost."""

    __slots__ = ("_line", "_i")

    def __init__(self, line: LineData, i: int) -> None:
        self._data = None
        self._position = None
        self._line = line
        self._i = i

    def __getattr__(self, name: str) -> Any:
        if name != "_raw":
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        raw = self._raw = self._line.raw(self._i)
        return raw

    @property
    def data(self) -> bytes:
        if self._data is None:
            self._line.decode()  # every record's of the line, at once
            if self._data is None:
                return Record.data.fget(self)  # type: ignore[attr-defined]  (the usual way: pybase64, binascii)
        return self._data


def line_of(records: Sequence[Record]) -> LineData | None:
    """The line ``records_from`` read these records from, to ``close`` when their call
    is over (its body goes back); None for records read otherwise. Closed once the
    caller holds no more of the records, it copies nothing."""
    return records[0]._line if records and type(records[0]) is LineRecord else None  # type: ignore[attr-defined]


_U32, _I64, _U64 = "I", "q", "Q"


def encode_rows(emitted: EmittedRows | Iterable[tuple[Any, Any, Any]],
                records: Sequence[Any], read_arrivals: bool = False) -> tuple[int, list[Any], list[tuple[int, str]]]:
    """One body for a batch's rows (already JSON lines: ``rows.emitted``; or
    ``(record, row, event_time_ms)`` tuples), emitted for the batch's ``records``.
    Returns the row count, the body as its parts (the columns, then the JSON lines
    where ``emit`` wrote them: written one after another, never joined, for a batch's
    rows are megabytes) and the rows that could not be rows: not JSON, or an event
    time that is not one::

        n, parts, bad = encode_rows(batch.rows, batch.records)
        decode_rows(n, b"".join(parts))     # what the server reads

    A row without an event time is ``ARRIVAL_TIME``: the server fills in its record's
    arrival time, read with the positions from the daemon's line. With
    ``read_arrivals`` (records the server re-encoded, KPL's user records: it read no
    line for them) the arrival times are read here instead, and checked here."""
    if not isinstance(emitted, EmittedRows):
        emitted = EmittedRows.of(emitted)
    bad_at = record_indexes([record for record, _ in emitted.bad], records)
    bad = [(i, error) for i, (_, error) in zip(bad_at, emitted.bad)]
    given = row_times(emitted.records, emitted.times) if read_arrivals else emitted.times
    none = NO_TIME if read_arrivals else ARRIVAL_TIME  # what a time of None is sent as
    n = len(given)
    if not read_arrivals and not emitted.timed:  # (the usual batch: no event time given)
        times = array(_I64, [none]) * n
    elif times_valid(given):
        times = array(_I64, [none if t is None else t for t in given] if None in given else given)
    else:
        times = None
    if times is not None:
        idx = record_indexes(emitted.records, records, emitted.one_for_one(records))
        return len(idx), [idx, times, emitted.ends(), emitted.view()], bad
    idx, times, ends = array(_U32), array(_I64), array(_U64)
    body = bytearray()
    for (line, record, t), i in zip(emitted.each(), record_indexes(emitted.records, records)):
        if t is not None or read_arrivals:
            t, error = row_time(record, t)  # (None: the record's arrival time, read now)
            if error is not None:
                bad.append((i, error))
                continue
        idx.append(i)
        times.append(none if t is None else t)
        body += line
        ends.append(len(body))
    return len(idx), [idx, times, ends, body], bad


def record_indexes(of: Sequence[Any], records: Sequence[Any], one_for_one: bool | None = None) -> array:
    """Each row's record (``of``), as its index in the batch: ``0, 1, 2, ...`` at once
    when the rows are the records one for one, in order (a passthrough's; checked in
    C), else found by identity. ``one_for_one``: already checked (``EmittedRows.one_for_one``,
    in C: 10,000 rows in some 10 us, where the check here takes 120)::

        record_indexes([b, b], [a, b])   # array('I', [1, 1])
        record_indexes([], [a, b])       # array('I'): no index of the batch is built
    """
    if not of:  # (a batch without bad rows: the usual one)
        return array(_U32)
    if one_for_one is None:
        one_for_one = len(of) == len(records) and all(map(is_, of, records))
    if one_for_one:
        return _iota(len(of))
    index = {id(r): i for i, r in enumerate(records)}
    return array(_U32, map(index.__getitem__, map(id, of)))


_counting = array(_U32)


def _iota(n: int) -> array:
    """``array('I', range(n))``, sliced from one made once (10,000 in 2 us, not 160)."""
    global _counting
    if len(_counting) < n:
        _counting = array(_U32, range(max(n, 2 * len(_counting))))
    return _counting[:n]


class RowColumns(NamedTuple):
    """``encode_rows``'s body read in place: typed views of it, nothing copied."""

    records: memoryview  # u32: each row's record, its index in the batch
    times: memoryview  # i64: each row's event time, ARRIVAL_TIME when none was given
    ends: memoryview  # u64: where each row's JSON line ends in ``lines``
    lines: memoryview  # the rows' JSON lines, back to back

    def rows(self) -> list[bytes]:
        """Each row's JSON, without its newline."""
        lines, start, out = self.lines, 0, []
        for end in self.ends:
            out.append(bytes(lines[start : end - 1]))
            start = end
        return out


def decode_rows(n: int, body: bytes) -> RowColumns:
    """The columns of ``encode_rows``'s body of ``n`` rows."""
    view = memoryview(body)
    return RowColumns(view[: 4 * n].cast(_U32), view[4 * n : 12 * n].cast(_I64), view[12 * n : 20 * n].cast(_U64),
                      view[20 * n :])
