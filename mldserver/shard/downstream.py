"""What happens downstream of a shard's batches: erlmld's batch-processor role.
One interface, two implementations, chosen once per connection by the server::

    NoSink()                                  # no --sink: rows are not collected, and
                                              # what the handler checkpoints is sent as is
    CoordinatorLink(coordinator, interval=10.0)
    CoordinatorLink(coordinator, interval=10.0, on_commit=True)   # a --source shard
    RedriveLink(coordinator)                  # mldserver redrive's connection: its rows
                                              # never hold the watermark nor wait

    await downstream.open(shard_id, checkpoint)          # initialize (a Position or None)
    await downstream.ready()                             # before the next batch is read
    if await downstream.batch(rows, last, millis_behind, release, meanwhile=checkpoint_safe):
        ...                                              # checkpoint what is safe, now
    #   (rows: a RowBatch; while back-pressure holds its status, checkpoint_safe() is
    #   awaited at most every interval, after a commit: the daemon hears what committed)
    downstream.safe()                                    # how far a checkpoint may go
    await downstream.shard_ended()                       # before SHARD_END is stored
    downstream.lease_lost()                              # leaseLost / shutdown ZOMBIE
    downstream.close()                                   # the connection ended

One object per connection: the shard it serves is the one ``open`` named.

With the coordinator, every checkpoint waits for the sink (``holds_checkpoints``): it
is clamped to what the sink has committed (``safe``), and the server checkpoints that
itself, at most every ``checkpoint_interval`` on a batch and on ``shutdownRequested``.
``batch`` hands the rows over, gives up the shard's in-flight slot (``release``) and
waits out back-pressure before the batch's status goes back, meanwhile checkpointing
what commits (at most every ``checkpoint_interval``: a shard held for minutes would
otherwise store nothing, and a restart would read it all again); ``ready`` waits it out
again before the next batch is read, for a batch the daemon sent while the buffered
rows were under the mark stays in the kernel until the shard may go on (else every
shard adds one more batch past the mark); ``shard_ended`` spools the
shard's uncommitted rows, so SHARD_END may be stored before they commit; ``lease_lost``
drops them (the new owner reads them again) so they hold nothing back; ``close``
tells the coordinator the connection is gone, so it can forget the shard once its rows
are committed.

A shard a ``--source`` reader feeds (``on_commit``) is checkpointed whenever what is
safe has moved, not on the interval: its checkpoint is a local write (the positions
file, or the source's lease item), and a position stored with each commit is what
bounds a restart after SIGKILL to one window's records read again. A window committed
at 10:00:01.2 is stored at the shard's next action (its next batch, an empty one
when caught up, within ``source_poll_interval``), not at 10:00:10.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Awaitable, Callable, Protocol

from ..base.positions import Position

if TYPE_CHECKING:
    from ..coordinator import Coordinator
    from ..rows.batch import RowBatch


class Downstream(Protocol):
    collects_rows: bool  # does ``batch.emit`` keep rows?
    holds_checkpoints: bool  # are checkpoints clamped to ``safe`` and made by the server?

    async def open(self, shard_id: str, checkpoint: Position | None) -> None: ...

    async def ready(self) -> None: ...

    async def batch(
        self, rows: RowBatch, last: Position | None, millis_behind: int | None, release: Callable[[], None],
        meanwhile: Callable[[], Awaitable[None]] | None = None,
    ) -> bool: ...

    def safe(self) -> Position | None: ...

    async def shard_ended(self) -> None: ...

    def lease_lost(self) -> None: ...

    def close(self) -> None: ...


class NoSink:
    """Nothing downstream: everything delivered is safe, the handler checkpoints."""

    collects_rows = False
    holds_checkpoints = False

    async def open(self, shard_id: str, checkpoint: Position | None) -> None:
        pass

    async def ready(self) -> None:
        pass

    async def batch(
        self, rows: RowBatch, last: Position | None, millis_behind: int | None, release: Callable[[], None],
        meanwhile: Callable[[], Awaitable[None]] | None = None,
    ) -> bool:
        return False

    def safe(self) -> Position | None:
        return None

    async def shard_ended(self) -> None:
        pass

    def lease_lost(self) -> None:
        pass

    def close(self) -> None:
        pass


class CoordinatorLink:
    """The shared coordinator, as one shard connection sees it."""

    collects_rows = True
    holds_checkpoints = True

    def __init__(
        self, coordinator: Coordinator, *, interval: float, on_commit: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.coordinator = coordinator
        self.interval = interval
        self.on_commit = on_commit  # due whenever safe moved (a --source shard), not on the interval
        self.clock = clock
        self._last_checkpoint = clock()
        self._checkpointed: Position | None = None  # on_commit: the safe position last checkpointed
        self._opened: str | None = None  # the shard this connection opened
        self._held_safe: Position | None = None  # the last safe position checkpointed while held

    async def open(self, shard_id: str, checkpoint: Position | None) -> None:
        if self._opened is not None:  # a second initialize on one connection
            self.close()
        await self.coordinator.open_shard(shard_id, checkpoint)
        self._opened = shard_id

    async def ready(self) -> None:
        """Wait out back-pressure before the next batch is read (a shard not yet open,
        or not running ahead, goes on at once)."""
        if self._opened is not None:
            await self.coordinator.admit(self._opened)

    async def batch(
        self, rows: RowBatch, last: Position | None, millis_behind: int | None, release: Callable[[], None],
        meanwhile: Callable[[], Awaitable[None]] | None = None,
    ) -> bool:
        """Hand the rows over, wait out back-pressure (awaiting ``meanwhile`` when a
        checkpoint falls due during the wait); True when a checkpoint is due."""
        shard_id = self._shard_id()
        self.coordinator.add_batch(shard_id, rows, last, millis_behind)
        release()  # a delayed shard must not hold a slot the watermark's shard needs

        async def held() -> None:  # after each pass that leaves the shard waiting
            safe = self.safe()
            if meanwhile is not None and safe is not None and safe != self._held_safe and self._due():
                self._held_safe = safe
                await meanwhile()

        await self.coordinator.admit(shard_id, held)
        return self._due()

    def _due(self) -> bool:
        """A checkpoint is due (and counted as made): ``interval`` since the last; with
        ``on_commit``, what is safe has moved since the last."""
        if self.on_commit:
            safe = self.safe()
            if safe is None or safe == self._checkpointed:
                return False
            self._checkpointed = safe
            return True
        now = self.clock()
        if now - self._last_checkpoint < self.interval:
            return False
        self._last_checkpoint = now
        return True

    def safe(self) -> Position | None:
        return self.coordinator.safe_position(self._shard_id())

    async def shard_ended(self) -> None:
        await self.coordinator.shard_ended(self._shard_id())  # spooled before SHARD_END

    def lease_lost(self) -> None:
        """The lease is another worker's now: the shard's uncommitted rows go."""
        if self._opened is not None:
            self.coordinator.lease_lost(self._opened)

    def _shard_id(self) -> str:
        assert self._opened is not None, "open() names the shard before anything else"
        return self._opened

    def close(self) -> None:
        """The connection ended: once, whatever ended it."""
        shard_id, self._opened = self._opened, None
        if shard_id is not None:
            self.coordinator.shard_closed(shard_id)


class RedriveLink(CoordinatorLink):
    """The coordinator, as a redrive's connection sees it (``server.redrive``): its
    records are dead letters sent again, under a shard id of the redrive's own. Their
    rows are added without a watermark (nothing waits for that shard, which reads no
    stream), and without back-pressure (a redrive is a bounded batch an operator
    started); what is committed of them is ``safe()``, as for any shard."""

    def __init__(self, coordinator: Coordinator) -> None:
        super().__init__(coordinator, interval=0.0)

    async def open(self, shard_id: str, checkpoint: Position | None) -> None:
        if self._opened is not None:
            self.close()
        self.coordinator.shards.connected(shard_id)  # no lineage, no watermark: it reads no stream
        self._opened = shard_id

    async def ready(self) -> None:
        pass

    async def batch(
        self, rows: RowBatch, last: Position | None, millis_behind: int | None, release: Callable[[], None],
        meanwhile: Callable[[], Awaitable[None]] | None = None,
    ) -> bool:
        self.coordinator.add_batch(self._shard_id(), rows, last, millis_behind, redriven=True)
        release()
        return False

    async def shard_ended(self) -> None:
        pass  # (a redrive never ends its shard: its connection closes once its rows are committed)
