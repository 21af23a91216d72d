"""Committed intervals: which positions of a shard are committed, as a short list of
[low, high] ranges, both ends included, in position order. Pure values, no I/O.

One high mark ("everything at or below it is committed") loses rows when a shard is
read from below where an earlier owner started: an owner that started at LATEST, at
a timestamp, or after a checkpoint moved forward by hand never read the rows below
its start, so they are not committed though they lie below its highest position.
An owner's interval starts where it started reading: just above its initialize
checkpoint (``after(checkpoint)``), or at its first row when it started at a
sentinel (TRIM_HORIZON, LATEST, AT_TIMESTAMP); it ends at the highest position its
commits cover. A row is a duplicate only if it lies inside one::

    c = joined((), after(p(99)), p(150))      # ((Position(99, 1), Position(150, 0)),): rows 100..150
    covers(c, p(120)), covers(c, p(60))       # True, False
    c = joined(c, after(p(49)), p(160))       # ((Position(49, 1), Position(160, 0)),): one again
    joined((), None, p(150))                  # ((None, Position(150, 0)),): an old log's or table's high mark
    top(c)                                    # Position(160, 0): the committed position, as before

``low`` None is minus infinity: what a commit log entry or a table written before
intervals says (its one position, read as everything at or below it). Ranges that
overlap or touch (``low`` at most ``after(high)`` of the one before: a checkpoint at
C and an interval ending at C) are merged; past ``MAX_INTERVALS`` the two lowest are
merged, gap and all (the oldest positions, the least likely read again), so the list
stays short. The JSON form, of a commit log entry and a table property::

    to_json(c) == [[["49", 1], ["160", 0]]]; from_json(to_json(c)) == c
"""

from __future__ import annotations

import bisect
from typing import Any

from .positions import Position

Interval = tuple["Position | None", Position]  # [low, high]: low None is minus infinity
Intervals = tuple[Interval, ...]

MAX_INTERVALS = 8  # past this the two lowest are merged (the gap between them counts as committed)


def after(position: Position) -> Position:
    """The lowest position above ``position``: the first a shard initialized at it can
    deliver (a sub-sequence number further; every record above it is at or above)."""
    return Position(position.seq, position.sub + 1, position.text)


def _key(position: Position) -> tuple[int, int]:
    return position.seq, position.sub


def joined(intervals: Intervals, low: Position | None, high: Position) -> Intervals:
    """``intervals`` with [low, high] added, merged where they overlap or touch. A
    range whose low is above its high (nothing committed in it) adds nothing."""
    if low is not None and _key(low) > _key(high):
        return intervals
    if not intervals:
        return ((low, high),)
    last_low, last_high = intervals[-1]
    # the usual case: the owner's own interval, raised (low within it, high above)
    if _key(high) >= _key(last_high) and low is not None and (last_low is None or _key(low) >= _key(last_low)) \
            and _key(low) <= _key(after(last_high)):
        return (*intervals[:-1], (last_low, high))
    return _merged([*intervals, (low, high)])


def union(a: Intervals, b: Intervals) -> Intervals:
    """Both lists' ranges, merged."""
    if not a:
        return b
    if not b or a == b:
        return a
    if len(b) == 1:  # (a commit's claim: usually the last interval, raised)
        return joined(a, *b[0])
    return _merged([*a, *b])


def _merged(ranges: list[Interval]) -> Intervals:
    ranges.sort(key=lambda r: (-1, 0) if r[0] is None else _key(r[0]))
    out: list[Interval] = []
    for low, high in ranges:
        if out:
            last_low, last_high = out[-1]
            if low is None or _key(low) <= _key(after(last_high)):
                if _key(high) > _key(last_high):
                    out[-1] = (last_low, high)
                continue
        out.append((low, high))
    while len(out) > MAX_INTERVALS:
        (low, _), (_, high) = out[0], out[1]
        out[:2] = [(low, high)]
    return tuple(out)


def covers(intervals: Intervals, position: Position) -> bool:
    """Does a range hold ``position``?"""
    key = _key(position)
    for low, high in intervals:
        if key <= _key(high):
            return low is None or key >= _key(low)
    return False


def top(intervals: Intervals) -> Position | None:
    """The highest committed position (None: nothing committed)."""
    return intervals[-1][1] if intervals else None


def spans(intervals: Intervals, positions: Any) -> list[tuple[int, int]]:
    """The ranges as index spans [i, j) of ``positions`` (sorted): the records inside
    one. Empty spans left out."""
    out = []
    for low, high in intervals:
        i = 0 if low is None else bisect.bisect_left(positions, low)
        j = bisect.bisect_right(positions, high)
        if i < j:
            out.append((i, j))
    return out


def to_json(intervals: Intervals) -> list[Any]:
    return [[None if low is None else low.to_json(), high.to_json()] for low, high in intervals]


def from_json(value: Any) -> Intervals:
    """The inverse of ``to_json``; ValueError for anything else (a corrupt file)."""
    if not isinstance(value, list):
        raise ValueError(f"not intervals: {value!r} (expected [[low or null, high], ...])")
    ranges: list[Interval] = []
    for item in value:
        if not isinstance(item, list) or len(item) != 2:
            raise ValueError(f"not an interval: {item!r} (expected [low or null, high])")
        ranges.append((None if item[0] is None else Position.from_json(item[0]), Position.from_json(item[1])))
    return _merged(ranges)
