"""Shards: what the coordinator itself keeps of each shard it serves (its helpers,
``ordering``, ``watermarks``, ``ledger``, ``lineage``, keep their own, each by shard
id), and the committed position of every shard it no longer keeps (``floors``).

An entry is made when a shard is first heard of (before its first rows reach
``ordering``), with its committed position if one is known, and goes with ``forget``,
leaving that position behind as a floor::

    shards = Shards(on_floor=ordering.delivered)   # told what a new entry starts from
    shards.floors.update(committed.positions)      # the commit log's, at start-up
    entry = shards.entry("shardId-000000000001")   # on_floor(id, its floor), if it had one
    entry.connections += 1
    shards.committed_at_least("shardId-000000000001", Position(120, 0, "120"))
    shards.forget("shardId-000000000001")          # floors["shardId-000000000001"] == 120

``floors`` holds those positions for the shards without an entry: those the commit
log names at start-up (a stream's every past shard, hundreds of thousands in a
long-lived DynamoDB stream) and those forgotten since. A position, not a shard's state:
it becomes one only if the shard is heard of again, so a pass costs what the shards
served cost, while a replay of a past shard is still dropped as the duplicate it is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator

from ..base.positions import Position


@dataclass(slots=True)
class ShardEntry:
    """One shard as the coordinator keeps it."""

    connections: int = 0  # its connections open here
    committed: Position | None = None  # the highest position known committed
    spooled: bool = False  # its uncommitted rows are in the spool
    gone: bool = False  # no connection serves it here: forgotten once done (``Coordinator.step``)
    lost: bool = False  # its lease was lost during a commit: dropped once that pass's windows commit
    restarted: bool = False  # its stream was created again: dropped with nothing of it committed (no floor)


class Shards:
    """Every shard's entry, by id, and the floors of those without one."""

    def __init__(self, on_floor: Callable[[str, Position], None]) -> None:
        self.entries: dict[str, ShardEntry] = {}
        self.floors: dict[str, Position] = {}
        self.on_floor = on_floor  # a new entry starts from a floor: records at or below are duplicates

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
            committed = self.floors.pop(shard_id, None)
            entry = self.entries[shard_id] = ShardEntry(committed=committed)
            if committed is not None:
                self.on_floor(shard_id, committed)
        return entry

    def connected(self, shard_id: str) -> ShardEntry:
        """A connection opened the shard: it is here (not gone) until its last closes."""
        entry = self.entry(shard_id)
        entry.connections += 1
        entry.gone = False
        return entry

    def committed(self, shard_id: str) -> Position | None:
        """The highest position known committed of the shard, kept or not."""
        entry = self.entries.get(shard_id)
        return self.floors.get(shard_id) if entry is None else entry.committed

    def committed_at_least(self, shard_id: str, position: Position) -> None:
        entry = self.entry(shard_id)
        if entry.committed is None or position > entry.committed:
            entry.committed = position

    def restarted(self, shard_id: str) -> bool:
        """Was the shard's stream created again (``restarted`` set)? If so the flag goes,
        and so does its committed position: the id names a new shard."""
        entry = self.entries.get(shard_id)
        if entry is None or not entry.restarted:
            return False
        entry.restarted, entry.committed = False, None
        return True

    def flagged(self, flag: str) -> list[str]:
        """The shards whose entry has ``flag`` (``gone``, ``lost``) set."""
        return [shard_id for shard_id, entry in self.entries.items() if getattr(entry, flag)]

    def forget(self, shard_id: str) -> None:
        """The entry goes; its committed position stays, as a floor."""
        entry = self.entries.pop(shard_id, None)
        if entry is not None and entry.committed is not None:
            self.floors[shard_id] = entry.committed
