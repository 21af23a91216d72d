"""Pressure: which shard waits before its status, and why. Pure: no asyncio, no clock,
no state; the coordinator hands in what it sees and waits when told to.

There are two reasons to wait, checked in this order:

- **the sink is behind** (``Reason.SINK_BEHIND``): a closed window is sealed and waits
  behind the window being committed. Every shard waits, the watermark's holder too: the
  window in front commits without any of them, and rows read now would only wait in
  memory. So a window commits at most two commits after it closes, and a sink slower
  than the shards leaves the records in the stream, not in memory.
- **memory is past the high-water mark** (``Reason.BUFFERED_CAP``): three quarters of
  ``max_buffered_rows`` or of ``max_buffered_bytes``. Then a shard waits only if it
  runs ahead: it does not hold the global watermark back, it has already passed the
  end of the window the global watermark is in (that window closes, and its commit
  frees memory, only once every shard short of its end gets there, so those must go on
  together), and no child of it waits for it to end.

Back-pressure starts below the caps because what is under way still lands: a batch
is added before its shard waits, batches are being handled, and the shards the
window needs go on. What lands past ``max_buffered_bytes`` is spilled (``spill``).

One table a case::

    load = Load(rows=900, bytes=0, max_rows=1_000, max_bytes=1 << 30)    # past 750 rows
    here = Place(holder="B", watermark=130_000, window_end=120_000, parent_of_held=False)
    should_wait("A", load, lambda: here)          # Reason.BUFFERED_CAP: A runs ahead
    should_wait("B", load, lambda: Place("B", 61_000, 120_000, False))   # None: B holds
    should_wait("A", Load(0, 0, 1_000, 1 << 30, waiting=1, committing=True), lambda: here)
                                                  # Reason.SINK_BEHIND: everyone waits

``place`` is called only when memory is past the mark: finding the holder scans
every shard, and most batches never need it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Callable

# Back-pressure starts at this fraction of a cap: what is under way when it starts (the
# batches being handled, one more batch of each shard delayed, the watermark shard's
# own) lands below the cap.
HIGH_WATER = 0.75


class Reason(enum.Enum):
    """Why a shard waits before its status (the ``reason`` of ``backpressure``)."""

    SINK_BEHIND = "sink_behind"  # a sealed window waits behind the commit under way
    BUFFERED_CAP = "buffered_cap"  # memory past the high-water mark, and this shard runs ahead


@dataclass(frozen=True, slots=True)
class Load:
    """What is buffered, against the caps, and what waits to commit."""

    rows: int
    bytes: int
    max_rows: int
    max_bytes: int
    waiting: int = 0  # sealed windows waiting behind the commit under way
    committing: bool = False  # the committer is committing a window now

    @property
    def sink_behind(self) -> bool:
        return bool(self.waiting) and self.committing

    @property
    def over_high_water(self) -> bool:
        return self.rows > self.max_rows * HIGH_WATER or self.bytes > self.max_bytes * HIGH_WATER


@dataclass(frozen=True, slots=True)
class Place:
    """Where one shard stands against the global watermark."""

    holder: str | None  # the shard holding the global watermark back (None: none holds)
    watermark: float  # this shard's watermark (epoch ms)
    window_end: float  # the end of the window the global watermark is in (-inf: not finite)
    parent_of_held: bool  # a child of this shard has rows held, waiting for it to end


def runs_ahead(shard_id: str, place: Place) -> bool:
    """May this shard wait without stalling the window that must close next?"""
    if place.holder == shard_id:
        return False  # it holds the watermark back: delaying it would stall all
    if place.watermark < place.window_end:
        return False  # the window the watermark is in needs it to close
    return not place.parent_of_held  # a child waits on it: it must reach its end


def should_wait(shard_id: str, load: Load, place: Callable[[], Place]) -> Reason | None:
    """Why ``shard_id`` must wait before its status now, or None if it goes on."""
    if load.sink_behind:
        return Reason.SINK_BEHIND
    if load.over_high_water and runs_ahead(shard_id, place()):
        return Reason.BUFFERED_CAP
    return None
