"""The hand-off between the coordinator and a sink: ``Window``, ``Sink``, ``Committed``.
Everything ``sinks/`` and ``spark/`` need of the coordinator is here, and this module
imports nothing of theirs.

A window is [start, end) in epoch milliseconds, tumbling and aligned to the epoch;
its id names it in the sink. By the time a sink sees it, it is sealed::

    start = t - t % 60_000        # the window of event time t, for 60 s windows
    Window(start, start + 60_000, rows=[b'{"k":1}', ...], late_rows=2,
           positions={"shardId-000000000001": Position(4959...8898, 0, "4959...8898")})
    window.id == "1700000100000-1700000160000"

``rows`` are the window's rows in merged order, each a JSON object as bytes (what the
handler passed to ``batch.emit``). The first ``late_rows`` of them are late: rows older
than a window already closed, handed over with the next window instead of dropped
(they sort first: their event time is before this window's start). ``positions``
maps each shard to the highest position this window covers: the commit log of a sink
records it (``position.to_json()``). ``sources`` says, row by row, where each row came
from (its shard and its record's position), for a sink that must leave out rows
another server already committed (the table sink, ``sinks/iceberg.py``)::

    list(window.sources)   # [("shardId-000000000001", Position(4959...8897, 0, ...)), ...]

A sink has two methods::

    class Sink:
        async def start(self) -> Committed: ...      # what its commit log says is done
        async def commit(self, window: Window) -> None: ...

A sink that several servers share (``iceberg:``) also says, for one shard, what is
committed there now, asked each time a shard is initialized here (the lease may have
come from another server, which committed past what ``start`` read)::

        async def committed_position(self, shard_id: str) -> Position | None: ...

``commit`` is called one window at a time, in window order, and must be durable when
it returns (the coordinator then marks the rows committed and lets shards checkpoint
past them). An exception means "not committed": the same window is offered again
after a backoff. ``start`` runs once, before any commit: the positions it returns are
filtered out of replays, and windows up to ``end`` are not closed again.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Protocol, runtime_checkable

from ..positions import Position


@dataclass(slots=True)
class Window:
    start: int
    end: int
    rows: list[bytes] = field(default_factory=list, repr=False)
    late_rows: int = 0
    positions: dict[str, Position] = field(default_factory=dict, repr=False)
    # per row, in row order: (shard id, the position of the record it came from);
    # None when whoever built the window did not say (a test's hand-made window)
    sources: Iterable[tuple[str, Position]] | None = field(default=None, repr=False)

    @property
    def id(self) -> str:
        return f"{self.start}-{self.end}"

    def __len__(self) -> int:
        return len(self.rows)


@dataclass
class Committed:
    """What a sink's commit log says, read at start-up."""

    positions: dict[str, Position] = field(default_factory=dict)  # shard -> highest committed
    end: int | None = None  # the end of the last committed window
    windows: int = 0


class Sink(Protocol):
    async def start(self) -> Committed: ...

    async def commit(self, window: Window) -> None: ...


@runtime_checkable
class SharedSink(Sink, Protocol):
    """A sink several servers commit to: a shard's committed position is read again
    whenever the shard is initialized here (``Coordinator.open_shard``)."""

    async def committed_position(self, shard_id: str) -> Position | None: ...
