"""Watermarks: how far in event time each shard has certainly got, and the minimum
over the shards that still hold the others back. Pure: the clock is passed in.

A shard's watermark (epoch ms) is::

    the largest event time of its rows so far              (rows are clamped per shard;
                                                            with max_out_of_orderness, minus it:
                                                            ``Ordering.progress``)
    max(that, now - margin)  after a batch with millisBehindLatest 0 (caught up, empty
                             batches included), while event times are arrival times:
                             nothing older can still arrive
    -inf                     before its first row: a new shard holds everything back

Event times from the data (a handler's ``emit(..., event_time_ms=...)``: a replay, a
backfill, historic data) say nothing about the wall clock, so once any batch brings
one (``RowBatch.timed``) caught-up shards no longer follow the clock: a shard's
watermark is then only what its rows say, and a caught-up batch with no rows is not
activity (a shard with nothing to read goes idle instead of holding at what it read
last). Otherwise a caught-up replay would move its watermark years past the rows
other shards, a split's children or a lease taken later still have to deliver.

A shard stops holding the others back when it has been quiet (no batch, or with data
times no rows) for longer than ``idle_timeout``: its later rows, if older than a
closed window, are late. So a stream that goes quiet leaves its last windows open
until new rows come or the idle timeout passes. A shard the coordinator itself keeps
waiting (back-pressure: ``hold`` then ``release``) is not quiet: it never idles while
held, and its idle time starts again at release. An ended shard holds at its last
time until each of its children has reported a watermark (or, with no child ever
seen here, until the idle timeout)::

    wm = Watermarks(margin_ms=5_000, idle_timeout_ms=60_000, children_of=lineage.children)
    wm.expect("s1", now)   # s1 is about to be read here (its lease taken): it holds from now
    wm.open("s0", now); wm.batch("s0", last_time=1_000, caught_up=False, now=now)
    wm.minimum(now)   # 1_000; +inf when no shard holds (everything may close)
    wm.batch("s0", last_time=2_000, caught_up=True, now=now, timed=True)
    wm.minimum(now)   # 2_000: a time from the data, caught up or not
    wm.tracks("s0")   # True: until the coordinator forgets it
    wm.live("s0", now)   # True: not ended, not idle; it may still add rows

Only shards still known here are kept (the coordinator ``forget``s a shard gone from
here that no longer holds): ``minimum`` and ``holder`` scan those, not every shard
ever seen.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Iterable

NEG_INF = -math.inf
POS_INF = math.inf


@dataclass(slots=True)
class ShardMark:
    last: float = NEG_INF  # the largest event time of its rows
    clock: float = NEG_INF  # now - margin at its last caught-up batch (counts with arrival times only)
    last_active: float = 0.0
    ended: bool = False
    held: int = 0  # back-pressure waits under way: a held shard is not idle


class Watermarks:
    def __init__(
        self,
        *,
        margin_ms: float,
        idle_timeout_ms: float,
        children_of: Callable[[str], Iterable[str]] = lambda shard_id: (),
    ) -> None:
        self.margin_ms = margin_ms
        self.idle_timeout_ms = idle_timeout_ms
        self.children_of = children_of
        self.shards: dict[str, ShardMark] = {}
        self.data_times = False  # some row's event time came from the data: the clock says nothing

    def open(self, shard_id: str, now: float) -> None:
        """The shard (re)started here: it holds until it reports or idles."""
        mark = self.shards.setdefault(shard_id, ShardMark())
        mark.last_active = now
        mark.ended = False

    def expect(self, shard_id: str, now: float) -> None:
        """The shard is about to be read here (listed by the stream, its lease taken): it
        holds from now, unless it holds already or ended here. One that went quiet here
        (its lease elsewhere meanwhile) holds again, from its own watermark."""
        mark = self.shards.get(shard_id)
        if mark is None or not (mark.ended or self.holds(shard_id, now)):
            self.open(shard_id, now)

    def batch(self, shard_id: str, last_time: float | None, caught_up: bool, now: float, timed: bool = False) -> None:
        """A batch was processed; ``last_time`` is the event time of its last row (None:
        no rows), ``timed`` whether some row's event time came from the data."""
        if timed:
            self.data_times = True
        mark = self.shards.setdefault(shard_id, ShardMark())
        if last_time is not None or not caught_up or not self.data_times:
            mark.last_active = now  # (caught up with nothing, under data times, is quiet)
        if last_time is not None and last_time > mark.last:
            mark.last = last_time
        if caught_up and now - self.margin_ms > mark.clock:
            mark.clock = now - self.margin_ms

    def ended(self, shard_id: str, now: float) -> None:
        mark = self.shards.setdefault(shard_id, ShardMark())
        mark.ended = True
        mark.last_active = now

    def forget(self, shard_id: str) -> None:
        self.shards.pop(shard_id, None)

    def hold(self, shard_id: str) -> None:
        """The coordinator keeps the shard waiting for its status: not idle meanwhile."""
        mark = self.shards.get(shard_id)
        if mark is not None:
            mark.held += 1

    def release(self, shard_id: str, now: float) -> None:
        """The wait ``hold`` began is over: the shard's idle time starts at ``now``."""
        mark = self.shards.get(shard_id)
        if mark is not None:
            mark.held = max(0, mark.held - 1)
            mark.last_active = max(mark.last_active, now)

    def tracks(self, shard_id: str) -> bool:
        """Is the shard known here (opened, reported or ended, not forgotten)?"""
        return shard_id in self.shards

    def live(self, shard_id: str, now: float) -> bool:
        """Known here, not ended, and not idle at ``now``: it may still add rows."""
        mark = self.shards.get(shard_id)
        return mark is not None and not mark.ended and self.holds(shard_id, now)

    def reported(self, shard_id: str) -> bool:
        mark = self.shards.get(shard_id)
        return mark is not None and self._value(mark) != NEG_INF

    def holding(self, shard_id: str, now: float) -> bool:
        """Known here and holding the others back at ``now``."""
        return shard_id in self.shards and self.holds(shard_id, now)

    def holds(self, shard_id: str, now: float) -> bool:
        mark = self.shards[shard_id]
        if not mark.held and now - mark.last_active > self.idle_timeout_ms:
            return False
        if mark.ended:
            children = list(self.children_of(shard_id))
            return not children or not all(self.reported(c) for c in children)
        return True

    def _value(self, mark: ShardMark) -> float:
        return mark.last if self.data_times or mark.clock < mark.last else mark.clock

    def value(self, shard_id: str) -> float:
        mark = self.shards.get(shard_id)
        return NEG_INF if mark is None else self._value(mark)

    def by_shard(self) -> dict[str, float]:
        """Each shard's watermark, for every shard known here (for ``/status``)."""
        return {shard_id: self._value(mark) for shard_id, mark in self.shards.items()}

    def minimum(self, now: float) -> float:
        """The global watermark: the least over holding shards, +inf if none holds."""
        return min((self._value(m) for s, m in self.shards.items() if self.holds(s, now)), default=POS_INF)

    def holder(self, now: float) -> str | None:
        """The shard holding the global watermark back (for logs and back-pressure)."""
        holding = [(self._value(m), s) for s, m in self.shards.items() if self.holds(s, now)]
        return min(holding)[1] if holding else None
