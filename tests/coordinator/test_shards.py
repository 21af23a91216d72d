"""Shards: an entry made when a shard is first heard of, from its floor; forgotten
back into a floor."""

from __future__ import annotations

from mldserver.base.intervals import after
from mldserver.base.positions import Position
from mldserver.coordinator.shards import Shards


def position(seq):
    return Position(seq, 0, str(seq))


def upto(seq):
    return ((None, position(seq)),)


def test_an_entry_starts_from_its_floor_and_tells_who_dedups():
    told = []
    shards = Shards(on_floor=lambda shard_id, p: told.append((shard_id, p)))
    shards.floors["s"] = upto(7)
    entry = shards.entry("s")
    assert entry.committed == upto(7) and "s" not in shards.floors
    assert told == [("s", upto(7))]
    assert shards.entry("s") is entry and told == [("s", upto(7))]  # made once
    assert shards.entry("t").committed == () and len(told) == 1


def test_committed_intervals_only_grow_and_survive_forget():
    shards = Shards(on_floor=lambda shard_id, p: None)
    shards.committed_in("s", ((after(position(99)), position(150)),))
    shards.committed_in("s", ((after(position(120)), position(130)),))  # inside: nothing new
    shards.committed_in("s", ((after(position(9)), position(20)),))  # below, apart
    both = ((after(position(9)), position(20)), (after(position(99)), position(150)))
    assert shards.committed("s") == both
    shards.forget("s")
    assert "s" not in shards and shards.floors == {"s": both} and shards.committed("s") == both
    shards.forget("never")
    assert shards.committed("never") == ()


def test_flagged_lists_the_shards_with_a_flag_set():
    shards = Shards(on_floor=lambda shard_id, p: None)
    shards.entry("a").gone = True
    shards.entry("b").lost = True
    shards.entry("c")
    assert shards.flagged("gone") == ["a"] and shards.flagged("lost") == ["b"] and len(shards) == 3
