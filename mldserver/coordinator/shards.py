"""Shards: what the coordinator itself keeps of each shard it serves (its helpers,
``ordering``, ``watermarks``, ``ledger``, ``lineage``, keep their own, each by shard
id), and the committed intervals of every shard it no longer keeps (``floors``).

What is committed of a shard is a short list of intervals (``base.intervals``: each
owner's, from where it started reading to the highest position its commits cover),
not one high mark: rows below an owner's start that no owner read are not committed.
An entry is made when a shard is first heard of (before its first rows reach
``ordering``), with its committed intervals if any are known, and goes with ``forget``,
leaving them behind as a floor::

    shards = Shards(on_floor=ordering.delivered)   # told a new entry's floor, and intervals learnt since
    shards.floors.update(committed.by_shard())     # the commit log's, at start-up
    entry = shards.entry("shardId-000000000001")   # on_floor(id, its floor), if it had one
    entry.connections += 1
    shards.committed_in("shardId-000000000001", ((after(p99), p120),))   # rows 100..120 (on_floor told)
    shards.forget("shardId-000000000001")          # floors["shardId-000000000001"] == ((.., p120),)

``floors`` holds those intervals for the shards without an entry: those the commit
log names at start-up (a stream's every past shard, hundreds of thousands in a
long-lived DynamoDB stream) and those forgotten since. A value, not a shard's state:
it becomes one only if the shard is heard of again, so a pass costs what the shards
served cost, while a replay of a past shard is still dropped as the duplicate it is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator

from ..base.intervals import Intervals, union


@dataclass(slots=True)
class ShardEntry:
    """One shard as the coordinator keeps it."""

    connections: int = 0  # its connections open here
    committed: Intervals = ()  # the intervals known committed
    spooled: bool = False  # its uncommitted rows are in the spool
    gone: bool = False  # no connection serves it here: forgotten once done (``Coordinator.step``)
    lost: bool = False  # its lease was lost during a commit: dropped once that pass's windows commit
    restarted: bool = False  # its stream was created again: dropped with nothing of it committed (no floor)


class Shards:
    """Every shard's entry, by id, and the floors of those without one."""

    def __init__(self, on_floor: Callable[[str, Intervals], None]) -> None:
        self.entries: dict[str, ShardEntry] = {}
        self.floors: dict[str, Intervals] = {}
        self.on_floor = on_floor  # a new entry's floor, and intervals committed since: records inside are duplicates

    def __getitem__(self, shard_id: str) -> ShardEntry:
        return self.entries[shard_id]

    def __contains__(self, shard_id: str) -> bool:
        return shard_id in self.entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.entries)

    def __len__(self) -> int:
        return len(self.entries)

    def get(self, shard_id: str) -> ShardEntry | None:
        return self.entries.get(shard_id)

    def entry(self, shard_id: str) -> ShardEntry:
        """The shard's entry, made when it is first heard of."""
        entry = self.entries.get(shard_id)
        if entry is None:
            committed = self.floors.pop(shard_id, ())
            entry = self.entries[shard_id] = ShardEntry(committed=committed)
            if committed:
                self.on_floor(shard_id, committed)
        return entry

    def connected(self, shard_id: str) -> ShardEntry:
        """A connection opened the shard: it is here (not gone) until its last closes."""
        entry = self.entry(shard_id)
        entry.connections += 1
        entry.gone = False
        return entry

    def committed(self, shard_id: str) -> Intervals:
        """The intervals known committed of the shard, kept or not."""
        entry = self.entries.get(shard_id)
        return self.floors.get(shard_id, ()) if entry is None else entry.committed

    def committed_in(self, shard_id: str, intervals: Intervals) -> None:
        """These intervals of the shard are committed too (``on_floor`` is told)."""
        entry = self.entry(shard_id)
        entry.committed = union(entry.committed, intervals)
        if intervals:
            self.on_floor(shard_id, intervals)

    def restarted(self, shard_id: str) -> bool:
        """Was the shard's stream created again (``restarted`` set)? If so the flag goes,
        and so do its committed intervals: the id names a new shard."""
        entry = self.entries.get(shard_id)
        if entry is None or not entry.restarted:
            return False
        entry.restarted, entry.committed = False, ()
        return True

    def flagged(self, flag: str) -> list[str]:
        """The shards whose entry has ``flag`` (``gone``, ``lost``) set."""
        return [shard_id for shard_id, entry in self.entries.items() if getattr(entry, flag)]

    def forget(self, shard_id: str) -> None:
        """The entry goes; its committed intervals stay, as a floor."""
        entry = self.entries.pop(shard_id, None)
        if entry is not None and entry.committed:
            self.floors[shard_id] = entry.committed
