"""The hand-off between the coordinator and a sink: ``Window``, ``JsonLines``, ``Sink``,
``Committed``. Everything ``sinks/`` and ``spark/`` need of the coordinator is here,
and this module imports nothing of theirs.

A window is [start, end) in epoch milliseconds, aligned to the epoch: tumbling, or
hopping (``kind``: windows a slide apart, each row in several; such a window's
``positions`` are those of the rows it commits, its oldest pane's, see
``coordinator.panes``); or the sessions that closed together (``kind`` "session": each
row carries its session's ``window_start`` and ``window_end``, the window's end is the
watermark it was cut at, and ``output`` says each shard's highest row handed over, see
``coordinator.sessions``); its id names it in the sink. By the time a sink sees it, it
is sealed::

    start = t - t % 60_000        # the window of event time t, for 60 s windows
    Window(start, start + 60_000, rows=JsonLines(...), late_rows=2,
           positions={"shardId-000000000001": Position(4959...8898, 0, "4959...8898")})
    window.id == "1700000100000-1700000160000"

``rows`` are the window's rows in merged order, each a JSON object (what the handler
passed to ``batch.emit``), held as JSON lines: one buffer, every row ending in a
newline, which is a JSON-lines file's content and what pyarrow's JSON reader parses::

    rows.buffer()          # b'{"k":1}\\n{"k":2}\\n...'  (a bytes-like object, not copied)
    rows.buffer(0, 2)      # the first two rows' lines
    len(rows); rows[0]     # 2; b'{"k":1}'  (one row, without its newline)
    list(rows)             # [b'{"k":1}', b'{"k":2}']

The first ``late_rows`` rows are late: rows older than a window already closed,
handed over with the next window instead of dropped (they sort first: their event
time is before this window's start). ``positions`` maps each shard to the highest
position this window covers (its last row's; past it, the records after it that made
no row, when the window has the last rows the shard's reading delivered): the commit
log of a sink records it (``position.to_json()``). ``starts`` maps each shard to where
the rows this server read of it start (just above the checkpoint it was initialized
at, or its first record): with ``claims()``, the interval [start, position] of the shard this commit
makes committed, which a sink keeps beside the others (``base.intervals``); a shard
without a start claims everything at or below its position, as one high mark did::

    window.starts == {"shardId-000000000001": Position(4959...8000, 1, ...)}   # initialized at ...8000
    window.claims() == {"shardId-000000000001": ((Position(4959...8000, 1), Position(4959...8898, 0)),)}

``sources`` says, row by row, where each row came from (its
shard and its record's position), for a sink that must leave out rows another server
already committed (the table sink, ``sinks/iceberg.py``)::

    list(window.sources)   # [("shardId-000000000001", Position(4959...8897, 0, ...)), ...]

The buffer is made on first use, by whoever asks first (a sink, in its thread): the
coordinator only decides the order (see ``merge.seal``), so the copy of a
window's rows into merged order never runs on the event loop.

A sink has two methods::

    class Sink:
        async def start(self) -> Committed: ...      # what its commit log says is done
        async def commit(self, window: Window) -> None: ...

A sink that several servers share (``iceberg:``) also says, for one shard, what is
committed there now, asked each time a shard is initialized here (the lease may have
come from another server, which committed past what ``start`` read)::

        async def committed_position(self, shard_id: str) -> Position | None: ...

and may say the shard's committed intervals (``base.intervals``), which the coordinator
then uses instead of everything at or below that position::

        async def committed_intervals(self, shard_id: str) -> Intervals: ...

``commit`` is called one window at a time, in window order, and must be durable when
it returns (the coordinator then marks the rows committed and lets shards checkpoint
past them). An exception means "not committed": the same window is offered again
after a backoff. ``start`` runs once, before any commit: the positions (or intervals)
it returns are filtered out of replays, and windows up to ``end`` are not closed again.

A sink whose commit has work to do before anything is published (the Spark sink turns
the rows into an Arrow file for the Spark process) may also be told, when several
windows closed at once, which window comes next, before the one in front commits::

        def prepare(self, window: Window) -> None: ...   # not awaited, never raises

    sink.prepare(w2); await sink.commit(w1); await sink.commit(w2)

It may start that work while ``w1`` commits (``sinks/parquet.py``: once ``w1``'s file
is handed over), never publish anything of ``w2`` before ``commit(w2)``; ``w2`` may
never be committed (the server stops first). Commits stay one at a time, in order.

Such a sink may also be told each batch's rows as the coordinator keeps them, before
their window closes (``sinks.ahead``: the Spark sink parses them into Arrow there)::

        def arrived(self, pieces: list[RowBatch]) -> None: ...   # not awaited, never raises
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from itertools import accumulate
from typing import Any, Callable, Iterable, Iterator, Protocol, Sequence, runtime_checkable

from .intervals import Intervals
from .positions import Position

Made = tuple[Any, Sequence[int]]  # a buffer, and the n + 1 offsets of its lines in it
Chunks = Callable[[int, int, bool], Iterator[memoryview]]  # rows start to stop, a run at a time (blocks?)


class JsonLines:
    """Rows as JSON lines in one buffer: row ``i`` is ``buffer[offsets[i]:offsets[i + 1]]``
    without its last byte (its newline). ``make`` builds the buffer and offsets on
    first use; ``JsonLines.of(rows)`` holds rows given one by one.

    A sink that only writes the lines out (the file sink) reads them with ``chunks``: a
    run of lines at a time, where they already are or gathered a block at a time
    (``chunks``, given by ``merge.seal``), so the window is never copied whole::

        for chunk in window.rows.chunks(late):    # memoryviews, each valid until the next
            f.write(chunk)

    ``chunks(..., blocks=True)`` (the file sink's, written past the page cache:
    ``base.direct``): the runs gathered are cut at disk blocks' edges, not between lines,
    and lie at page-aligned addresses, so they are written from where they are.

    ``pieces`` (given by ``merge.seal``; None for rows made otherwise): the batches of
    rows these lines are, and ``order``, the index of each line's row in those batches'
    rows one after another (None: in that order already), so a sink that turned each
    batch into another form as it arrived (``sinks.ahead``) can put them in merged
    order without parsing the lines again.
    """

    __slots__ = ("_n", "_make", "_chunks", "_buffer", "_offsets", "pieces")

    def __init__(self, n: int, make: Callable[[], Made], chunks: Chunks | None = None,
                 pieces: tuple[Sequence[Any], Any] | None = None) -> None:
        self._n = n
        self._make: Callable[[], Made] | None = make
        self._chunks = chunks
        self.pieces = pieces
        self._buffer: memoryview | None = None
        self._offsets: Sequence[int] = ()

    def chunks(self, start: int = 0, stop: int | None = None, blocks: bool = False) -> Iterator[memoryview]:
        """Rows ``start`` to ``stop`` (all by default) as JSON lines, in runs of lines
        one after another (with ``blocks``, runs of bytes: see above): together, what
        ``buffer(start, stop)`` holds. Each is valid until the next is asked for."""
        stop = self._n if stop is None else stop
        if stop <= start:
            return iter(())
        if self._chunks is None or self._make is None:  # one buffer, or made already
            return iter((self.buffer(start, stop),))
        return self._chunks(start, stop, blocks)

    @classmethod
    def of(cls, rows: Iterable[bytes]) -> JsonLines:
        """Rows given one by one (each a JSON object, without a newline)."""
        rows = list(rows)
        body = b"\n".join(rows) + b"\n" if rows else b""
        offsets = array("q", accumulate((len(r) + 1 for r in rows), initial=0))
        return cls(len(rows), lambda: (body, offsets))

    def _made(self) -> tuple[memoryview, Sequence[int]]:
        if self._make is not None:
            buffer, offsets = self._make()
            self._buffer, self._offsets, self._make = memoryview(buffer).cast("B"), offsets, None
        assert self._buffer is not None
        return self._buffer, self._offsets

    def buffer(self, start: int = 0, stop: int | None = None) -> memoryview:
        """Rows ``start`` to ``stop`` (all by default) as JSON lines, each ending in a newline."""
        buffer, offsets = self._made()
        stop = self._n if stop is None else stop
        if stop <= start:
            return buffer[:0]
        return buffer[int(offsets[start]) : int(offsets[stop])]

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i: int) -> bytes:
        if not -self._n <= i < self._n:
            raise IndexError(i)
        i %= self._n
        buffer, offsets = self._made()
        return bytes(buffer[int(offsets[i]) : int(offsets[i + 1]) - 1])

    def __iter__(self) -> Iterator[bytes]:
        buffer, offsets = self._made() if self._n else (memoryview(b""), ())
        ends = list(map(int, offsets))
        for start, end in zip(ends, ends[1:]):
            yield bytes(buffer[start : end - 1])

    def __repr__(self) -> str:
        return f"JsonLines({self._n} rows)"


@dataclass(slots=True)
class Window:
    start: int
    end: int
    rows: JsonLines = field(default_factory=lambda: JsonLines.of([]), repr=False)
    late_rows: int = 0
    positions: dict[str, Position] = field(default_factory=dict, repr=False)
    # per row, in row order: (shard id, the position of the record it came from);
    # None when whoever built the window did not say (a test's hand-made window)
    sources: Iterable[tuple[str, Position]] | None = field(default=None, repr=False)
    kind: str = "tumbling"  # or "hopping": windows a slide apart, each row in size/slide of them; or "session"
    # sessions, and rows out of order (max_out_of_orderness): each shard's highest row handed
    # over (rows still open may be below it, and are read again after a restart; see
    # ``coordinator.sessions``, ``coordinator.ordering``)
    output: dict[str, Position] = field(default_factory=dict, repr=False)
    # with allowed_lateness: the window may be handed over again, amended (1, 2, ...: the sink
    # replaces what it wrote of it); 0: handed over once. ``final_until``: windows ending at or
    # before it are final (their rows are what this commit lets shards checkpoint past)
    version: int = 0
    final_until: int | None = None
    # into a table with allowed_lateness: the windows amended where they are, in order, and how many
    # rows of each; those rows follow the ``late_rows`` (a table sink writes them in their own window)
    amends: list[tuple[str, int]] = field(default_factory=list, repr=False)
    # per shard of ``positions``: the lowest position the rows read here of it can have (the
    # low of the interval this commit claims); a shard not here: minus infinity
    starts: dict[str, Position] = field(default_factory=dict, repr=False)

    @property
    def id(self) -> str:
        return f"{self.start}-{self.end}"

    def claims(self) -> dict[str, Intervals]:
        """Per shard, the interval committing this window makes committed: [its start,
        its position] (none where the start is above the position)."""
        claims: dict[str, Intervals] = {}
        for shard_id, high in self.positions.items():
            low = self.starts.get(shard_id)
            if low is None or (low.seq, low.sub) <= (high.seq, high.sub):
                claims[shard_id] = ((low, high),)
        return claims

    def __len__(self) -> int:
        return len(self.rows)


@dataclass
class Committed:
    """What a sink's commit log says, read at start-up."""

    positions: dict[str, Position] = field(default_factory=dict)  # shard -> highest committed
    # shard -> its committed intervals (``base.intervals``), where the log says them; a shard
    # only in ``positions``: everything at or below its position
    intervals: dict[str, Intervals] = field(default_factory=dict)
    end: int | None = None  # the end of the last committed window
    windows: int = 0
    output: dict[str, Position] = field(default_factory=dict)  # sessions, disorder: shard -> highest row handed over
    final_until: int | None = None  # with allowed_lateness: windows ending at or before it are final
    # rows out of order (max_out_of_orderness): per shard, each commit's highest row handed over and
    # the end of the windows committed by then, those no later commit outdoes (``commitlog``)
    handed: dict[str, list[tuple[Position, int]]] = field(default_factory=dict)

    def by_shard(self) -> dict[str, Intervals]:
        """Per shard, its committed intervals: ``intervals``, else everything at or below
        its position."""
        return {**{s: ((None, p),) for s, p in self.positions.items()}, **self.intervals}


class Sink(Protocol):
    async def start(self) -> Committed: ...

    async def commit(self, window: Window) -> None: ...


@runtime_checkable
class PreparingSink(Sink, Protocol):
    """A sink told the next window ahead of its commit (``prepare``), to overlap work
    that publishes nothing with the commit in front of it."""

    def prepare(self, window: Window) -> None: ...


@runtime_checkable
class ArrivingSink(Sink, Protocol):
    """A sink told each batch's rows as the coordinator keeps them (``rows.RowBatch``
    pieces, tagged), to turn them into its own form before their window closes
    (``sinks.ahead``). Called on the loop: it must return at once and never raise."""

    def arrived(self, pieces: Sequence[Any]) -> None: ...


@runtime_checkable
class SharedSink(Sink, Protocol):
    """A sink several servers commit to: a shard's committed position is read again
    whenever the shard is initialized here (``Coordinator.open_shard``)."""

    async def committed_position(self, shard_id: str) -> Position | None: ...
