"""What a shard connection reports: the driver's running tally, and the frozen
``ShardStatus`` that ``ShardDriver.status()`` takes of it for the admin endpoint's
``/status`` and the metrics' scrape, so neither reaches into the driver::

    status = driver.status()
    ShardStatus(shard_id="shardId-000000000001", conn=3, state="READY", callback=None,
                last_action="processRecords", last_action_age_s=0.2, records=120000, batches=240,
                millis_behind_latest=0, stored=Position(1201, 0, "1201"), handler_process=41822)

``handler_process`` is the pid of the handler process that holds the shard's handler
instance (None with ``--workers 0``, or before the first call places it); it changes
when the shard moves to another process. ``stored`` is the checkpoint the daemon
stored last, as far as this connection knows.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from ..base.positions import Position

if TYPE_CHECKING:
    from ..protocol import Connection
    from .calls import Calls


class Meter(Protocol):
    """What a shard records as it goes (the server's ``Metrics``: the admin
    endpoint's ``/metrics``)."""

    def batch(self, shard_id: str, records: int) -> None: ...

    def forget(self, shard_id: str) -> None: ...

    def call(self, callback: str, result: str, error: str | None, seconds: float, stats: dict[str, int]) -> int:
        """One handler call; returns the rows it emitted that no sink keeps."""
        ...

    def checkpoint(self, outcome: str) -> None: ...


@dataclass(frozen=True, slots=True)
class ShardStatus:
    shard_id: str | None  # None until initialize
    conn: int | None  # the server's number for the connection (logs' ``conn``)
    state: str  # the protocol core's state: READY, PROCESSING, CHECKPOINTING, ...
    callback: str | None  # the handler callback under way
    last_action: str | None  # the last action that arrived ...
    last_action_age_s: float | None  # ... and how long ago
    records: int
    batches: int
    millis_behind_latest: int | None  # the daemon's, for the last batch
    stored: Position | None
    handler_process: int | None


class Tally:
    """Counted by the driver as the conversation goes (one update a batch), read
    through ``ShardStatus``; ``owed`` is the action being answered."""

    __slots__ = ("conn_id", "records", "batches", "millis_behind_latest", "last_action", "last_action_at",
                 "owed", "rows_discarded")

    def __init__(self, conn_id: int | None) -> None:
        self.conn_id = conn_id
        self.records = 0
        self.batches = 0
        self.millis_behind_latest: int | None = None
        self.last_action: str | None = None
        self.last_action_at: float | None = None  # epoch seconds
        self.owed: str | None = None
        self.rows_discarded = 0  # emitted with no sink to keep them (said once: rows_discarded)

    def batch(self, records: int, millis_behind_latest: int | None) -> None:
        self.batches += 1
        self.records += records
        self.millis_behind_latest = millis_behind_latest

    def status(self, conn: Connection, calls: Calls, stored: Position | None) -> ShardStatus:
        at = self.last_action_at
        return ShardStatus(
            shard_id=conn.shard_id, conn=self.conn_id, state=conn.state.name, callback=calls.running,
            last_action=self.last_action, last_action_age_s=None if at is None else round(time.time() - at, 3),
            records=self.records, batches=self.batches, millis_behind_latest=self.millis_behind_latest,
            stored=stored, handler_process=calls.pid,
        )
