"""The coordinator: one per server, shared by every shard connection. It merges the
handlers' rows into one ordered stream, closes event-time windows as the watermark
passes them, hands each to the sink, and tells each shard how far it may checkpoint.

What the shard driver calls, per shard (all on the event loop)::

    await coordinator.open_shard(shard_id, checkpoint)     # initialize (a Position, or None)
    coordinator.add_batch(shard_id, rows, last, millis_behind_latest)  # a RowBatch, the last Position
    await coordinator.admit(shard_id)                      # back-pressure, before the status
    coordinator.safe_position(shard_id)                    # what a checkpoint may cover
    await coordinator.shard_ended(shard_id)                # spools, before SHARD_END
    coordinator.lease_lost(shard_id)                       # leaseLost / shutdown ZOMBIE
    coordinator.shard_closed(shard_id)                     # its connection ended

A sink several servers share (``SharedSink``: ``iceberg:``) is asked at every
``open_shard`` what is committed of the shard there now: the lease may come from a
server that committed past what this one knew, and records at or below that are
dropped as duplicates (``committed_position``, logged as ``committed_position_read``).
``lease_lost`` lets go of the shard: its uncommitted rows are dropped (the new owner
reads them again from the last checkpoint) and it stops holding the watermark back.

Inside, one owned task (the committer) wakes on every change and on a tick and runs
``step()``: it releases children whose parents are done, computes the global
watermark at ``clock()``, and commits the windows it closed, one at a time, in order;
only after ``sink.commit`` returns are the rows marked committed in the ledger. Then
it ``forget``s the shards gone from here (no connection: ended, lease lost, or replayed
from the spool) whose rows are all committed and that no longer hold the watermark,
so what is kept per shard is bounded by the shards still here. Tests
call ``step()`` themselves, with a fake clock, instead of waiting for the tick::

    coordinator = Coordinator(settings, sink, clock=clock)   # clock() -> epoch ms
    clock.now += 600_001
    await coordinator.step()          # every window the watermark passed is committed

A sink that raises a retriable error (``errors.retriable``: a pipeline's SparkError,
an OSError) is retried with backoff, ``sink_commit_failed`` logged at every attempt
(and counted: ``mldserver_window_commit_failures_total``);
its rows stay buffered and back-pressure holds. Anything else is a bug: it ends the
committer, and the server, which watches ``coordinator.tasks``, logs ``task_crashed``
and shuts down.

Back-pressure comes two ways. The sink sets the pace: a window that closes while
another commits is sealed at once (the sink told to make it ready behind that one,
``prepare``), and while it waits every shard waits before its status, the watermark's
too, for the commit in front needs none of them; when that commit ends they go on
(``backpressure`` with ``reason="sink_behind"``). So a window commits at most two
commits after it closes, and a sink slower than the shards leaves the records in the
stream, not in memory::

    # window w1 commits; a batch of A closes w2
    coordinator.add_batch("A", rows, last, 0)   # w2 sealed, prepared behind w1
    await coordinator.admit("A")                 # waits until w1 is committed

Memory: past the high-water mark, three quarters of ``max_buffered_rows`` or of
``max_buffered_bytes`` (the memory the buffered rows hold: ``ledger``), ``admit`` makes
every shard that runs ahead wait before its status (so the daemon waits): every shard
whose watermark has passed the end of the window the global watermark is in, and
never a parent whose child is waiting on it. The others go on together: the window
they hold open closes, and its commit frees memory, only once each of them has passed
its end, so their batches come whatever the order (one at a time, each released as it
became the holder, they came as many and later: a cliff in throughput wherever a
window is large against the cap). What must still land past ``max_buffered_bytes``
(those batches, the batches already in handler processes) is spilled to files
(``spill``): the memory buffered never passes the cap. It starts below the caps because
what is under way still lands: a batch is added before its shard is delayed, up to
``max_batches_in_flight`` are being handled, and the shards the window needs go on.
With the default 256 MiB, 32 shards each a 10,000-row batch (3.4 MB of JSON, 4.2 MB
held) ahead of one slow shard::

    coordinator.add_batch("shardId-000000000007", rows, last, 1000)   # buffered_bytes 199 MiB
    await coordinator.admit("shardId-000000000007")   # waits (logs backpressure once): past
                                                      # 192 MiB, and past the end of the
                                                      # window the slow shard holds open
    await coordinator.admit("shardId-000000000000")   # returns at once: it holds the watermark

What the admin endpoint and the metrics report of it is one snapshot, read at once
(never its helpers' state)::

    coordinator.status()   # CoordinatorStatus(global_watermark=1763799995000.0, open_windows=2,
                           #   buffered_rows=4100, buffered_bytes=390000, peak_rows=9000, peak_bytes=850000,
                           #   windows_committed=12, rows_committed=52000, late_rows=0,
                           #   last_commit=LastCommit(window="1763799900000-1763799960000", rows=5200,
                           #                          late=0, at=1763800001.2),
                           #   watermarks={"shardId-000000000001": 1763799995000.0, ...})
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from ..base.backoff import Backoff
from ..base.config import Settings, state_path
from ..errors import retriable
from ..base.logs import EventLogger, get_logger
from ..base.positions import Position
from ..api.rows import RowBatch
from ..base.handoff import PreparingSink, SharedSink, Sink, Window
from .ledger import Ledger
from .lineage import Lineage, StreamShards
from .merge import seal
from .ordering import Ordering
from .spill import Spill
from .spool import Spool
from .watermarks import Watermarks


# Back-pressure starts at this fraction of a cap: what is under way when it starts (the
# batches being handled, one more batch of each shard delayed, the watermark shard's
# own) lands below the cap.
HIGH_WATER = 0.75


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(slots=True)
class ShardEntry:
    """What the coordinator itself keeps of one shard (its helpers keep theirs, each
    by shard id); made when the shard is first heard of, dropped by ``forget``."""

    connections: int = 0  # its connections open here
    committed: Position | None = None  # the highest position known committed
    spooled: bool = False  # its uncommitted rows are in the spool
    gone: bool = False  # no connection serves it here: forgotten once done (see step)
    lost: bool = False  # its lease was lost during a pass: dropped once that pass's windows commit


@dataclass(frozen=True, slots=True)
class Sealed:
    """A closed window, sealed, waiting for its commit."""

    window: Window
    counts: dict[str, int]  # each shard's rows in it
    watermark: float  # the global watermark that closed it
    closed_at: float  # perf_counter(): its close-to-commit latency starts here


@dataclass(frozen=True, slots=True)
class LastCommit:
    """The window committed last."""

    window: str  # its id
    rows: int
    late: int  # of its rows, late ones
    at: float  # epoch s


@dataclass(frozen=True, slots=True)
class CoordinatorStatus:
    """The coordinator at one moment, as ``/status`` and ``/metrics`` report it.
    Watermarks are epoch ms: -inf for a shard that has not reported, and the global
    one +inf while no shard holds it back."""

    global_watermark: float
    open_windows: int  # windows holding rows, not closed yet
    buffered_rows: int  # not committed yet
    buffered_bytes: int
    peak_rows: int  # the most buffered since start
    peak_bytes: int
    windows_committed: int
    rows_committed: int
    late_rows: int  # rows older than a window already closed, since start
    last_commit: LastCommit | None
    watermarks: Mapping[str, float]  # each shard known here


class Coordinator:
    def __init__(
        self,
        settings: Settings,
        sink: Sink,
        *,
        clock: Callable[[], float] = wall_clock_ms,
        log: EventLogger | None = None,
        metrics: Any = None,
    ) -> None:
        # The rows' columns (numpy) and the gather of a window whose shards interleave
        # (pyarrow): loaded here, before the loop serves. Left to the first batch and the
        # first such window, the imports (half a second) stalled the loop and that commit.
        import numpy  # noqa: F401
        import pyarrow.compute  # noqa: F401

        self.settings = settings
        self.sink = sink
        self.clock = clock
        self.log = log or get_logger("mldserver.coordinator")
        stream = None
        if settings.stream:
            stream = StreamShards(settings.stream, region=settings.aws_region, endpoint_url=settings.aws_endpoint_url)
        self.lineage = Lineage(stream)
        self.watermarks = Watermarks(
            margin_ms=settings.watermark_margin * 1000,
            idle_timeout_ms=settings.idle_timeout * 1000,
            children_of=self.lineage.children_of,
        )
        self.ordering = Ordering(
            window_ms=int(settings.window * 1000), blocks=self._blocks, parents_of=self.lineage.parents_of
        )
        self.ledger = Ledger()
        self.spool = Spool(state_path(settings, "spool"), self.log)
        self.spill = Spill(state_path(settings, "spill"))  # rows past max_buffered_bytes
        self.shards: dict[str, ShardEntry] = {}
        # Each shard's highest committed position, for the shards with no entry here:
        # those the commit log names at start-up (a stream's every past shard, hundreds
        # of thousands in a long-lived DynamoDB stream) and those forgotten since. A
        # position, not a shard's state: it becomes one only if the shard is heard of
        # again (``_entry``), so a pass costs what the shards served cost, while a
        # replay of a past shard is still dropped as the duplicate it is.
        self.floors: dict[str, Position] = {}
        self._changed = asyncio.Event()
        self._progress = asyncio.Condition()
        self._stepping = asyncio.Lock()  # passes never overlap: windows commit in order
        self._tasks: list[asyncio.Task[None]] = []
        self._inflight: asyncio.Task[None] | None = None  # the sink commit under way
        self._sealed: deque[Sealed] = deque()  # closed windows waiting for the commit in front of them
        self.sink_backoff = Backoff(first=0.5, cap=30.0)  # between attempts at a failing commit
        self.windows_committed = 0
        self.rows_committed = 0
        self.peak_rows = 0
        self.peak_bytes = 0
        self.metrics = metrics  # the server's Metrics: each window's commit duration
        self.last_commit: LastCommit | None = None

    # -- lifecycle ---------------------------------------------------------------

    async def start(self) -> None:
        """Read what the sink committed, replay the spool, then start the committer
        and its tick."""
        committed = await self.sink.start()
        await asyncio.to_thread(self.spill.clear)
        self.floors.update(committed.positions)  # replays at or below are dropped
        if committed.end is not None:
            self.ordering.resume(committed.end)
            self.log.info(
                "commit_log_read", windows=committed.windows, shards=len(committed.positions), end=committed.end
            )
        for spooled in await asyncio.to_thread(self.spool.read_all):
            self._replay(spooled.shard_id, spooled.rows, spooled.last, spooled.parents)
            if self.ledger.done(spooled.shard_id):  # every row committed before a stop (the commit log says):
                self.forget(spooled.shard_id)       # nothing waits on it, and no window would delete it
                await self._delete_spool(spooled.shard_id)
        self._tasks = [
            asyncio.create_task(self._committer(), name="coordinator-committer"),
            asyncio.create_task(self._ticker(), name="coordinator-tick"),
        ]

    async def stop(self) -> None:
        """Stop committing: a commit in progress finishes (rows still buffered are not
        checkpointed, so the daemon delivers them again after a restart)."""
        for task in self._tasks:
            task.cancel()
        tasks, self._tasks = self._tasks, []
        if tasks:
            await asyncio.wait(tasks)
        async with self._progress:
            self._progress.notify_all()  # no pass commits now: shards waiting behind the sink go on
        if self._inflight is not None and not self._inflight.done():
            await asyncio.wait([self._inflight], timeout=self.settings.shutdown_timeout)
        self.spill.close()
        self.log.info(
            "coordinator_stopped",
            windows=self.windows_committed,
            rows=self.rows_committed,
            buffered_rows=self.ledger.rows,
            clamped=self.ordering.clamped,
            duplicates=self.ordering.duplicates,
            late=self.ordering.late_rows,
            peak_rows=self.peak_rows,
            peak_bytes=self.peak_bytes,
            spilled_bytes=self.spill.bytes,
        )
        for task in tasks:
            if not task.cancelled() and task.exception() is not None:
                raise task.exception()  # a crash is not swallowed by stopping

    @property
    def tasks(self) -> list[asyncio.Task[None]]:
        """The committer and its tick, for the server to watch: neither ends by itself."""
        return list(self._tasks)

    def status(self) -> CoordinatorStatus:
        """What ``/status`` and ``/metrics`` report, at ``clock()``."""
        return CoordinatorStatus(
            global_watermark=self.watermarks.minimum(self.clock()),
            open_windows=self.ordering.buffered_windows(),
            buffered_rows=self.ledger.rows,
            buffered_bytes=self.ledger.bytes,
            peak_rows=self.peak_rows,
            peak_bytes=self.peak_bytes,
            windows_committed=self.windows_committed,
            rows_committed=self.rows_committed,
            late_rows=self.ordering.late_rows,
            last_commit=self.last_commit,
            watermarks=self.watermarks.by_shard(),
        )

    def _entry(self, shard_id: str) -> ShardEntry:
        """The shard's entry, made when it is first heard of (before its first rows
        reach ``ordering``), with its committed position if one is known (``floors``)."""
        entry = self.shards.get(shard_id)
        if entry is None:
            committed = self.floors.pop(shard_id, None)
            entry = self.shards[shard_id] = ShardEntry(committed=committed)
            if committed is not None:
                self.ordering.delivered(shard_id, committed)
        return entry

    def _replay(self, shard_id: str, rows: RowBatch, last: Position | None, parents: list[str]) -> None:
        if parents:
            self.lineage.learn(shard_id, tuple(parents))
        # Not offered as a parent to shards seen from now on: after a restart, shards
        # starting from TRIM_HORIZON are not likely its children. The stream's API
        # (``stream``) tells; without it the spooled shard holds until the idle timeout.
        self.lineage.mark_seen(shard_id)
        self.add_batch(shard_id, rows, last, None)
        self.watermarks.ended(shard_id, self.clock())
        entry = self._entry(shard_id)
        entry.spooled = True
        entry.gone = True  # no connection serves it here: forgotten once committed
        self.log.info("spool_replayed", shard_id=shard_id, rows=len(rows))

    # -- what workers call ---------------------------------------------------------

    async def open_shard(self, shard_id: str, checkpoint: Position | None) -> None:
        self._entry(shard_id).lost = False  # its lease came back before the drop
        await self._read_committed(shard_id)
        await self.lineage.started(shard_id, checkpoint)
        entry = self._entry(shard_id)  # after the awaits: a pass may have forgotten it meanwhile
        entry.connections += 1
        entry.gone = False
        self.watermarks.open(shard_id, self.clock())
        parents = self.lineage.parents_of(shard_id)
        if parents:
            self.log.info("lineage", shard_id=shard_id, parents=list(parents))
        self._changed.set()

    def add_batch(self, shard_id: str, rows: RowBatch, last: Position | None, millis_behind: int | None) -> None:
        now = self.clock()
        self._entry(shard_id)  # (its committed position first: what is at or below it is a duplicate)
        dropped, clamped = self.ordering.duplicates, self.ordering.clamped
        pieces = self.ordering.add(shard_id, rows, last, now, self._keeper())
        self.ledger.add(shard_id, pieces, last)
        self.watermarks.batch(shard_id, int(pieces[-1].times[-1]) if pieces else None, millis_behind == 0, now)
        if self.ledger.rows > self.peak_rows:
            self.peak_rows = self.ledger.rows
        if self.ledger.bytes > self.peak_bytes:
            self.peak_bytes = self.ledger.bytes
        if self.ordering.duplicates != dropped:
            self.log.info("duplicates_dropped", shard_id=shard_id, rows=self.ordering.duplicates - dropped)
        if self.ordering.clamped != clamped:
            self.log.info("event_time_clamped", shard_id=shard_id, rows=self.ordering.clamped - clamped)
        if self._stepping.locked():
            # A window this batch closed while one commits: sealed now, so the sink makes
            # it ready behind that one, and the shards wait for their status (``admit``).
            waiting = bool(self._sealed)
            self._seal(now)
            if not waiting:
                self._prepare_next()
        self._changed.set()

    async def _read_committed(self, shard_id: str) -> None:
        """A shared sink's committed position of the shard, before its first batch: what
        another server committed is a duplicate here. A failed read is logged and the
        shard goes on: the sink's commit still leaves out what is committed."""
        if not isinstance(self.sink, SharedSink):
            return
        started = time.perf_counter()
        try:
            position = await self.sink.committed_position(shard_id)
        except Exception as exc:
            if not retriable(exc):
                raise
            self.log.warning(
                "committed_position_failed",
                shard_id=shard_id,
                error=f"{type(exc).__name__}: {exc}",
                what_to_do="check the table's catalog; rows another server committed are left out at commit",
            )
            return
        self.log.info(
            "committed_position_read",
            shard_id=shard_id,
            position=position.to_json() if position is not None else None,
            duration_ms=round((time.perf_counter() - started) * 1000, 3),
        )
        if position is not None:
            self.ordering.delivered(shard_id, position)
            self._committed_at_least(shard_id, position)

    def _committed_at_least(self, shard_id: str, position: Position) -> None:
        entry = self._entry(shard_id)
        if entry.committed is None or position > entry.committed:
            entry.committed = position

    def lease_lost(self, shard_id: str) -> None:
        """The shard's lease went to another server (``leaseLost``, KCL 1.x ``shutdown``
        ZOMBIE): its uncommitted rows are dropped, for the new owner reads them again
        from the last checkpoint, and it stops holding the watermark back. Should it
        come back here, records up to what is committed of it are duplicates. A shard
        whose rows are spooled (it ended here) keeps them: the spool is replayed."""
        entry = self.shards.get(shard_id)
        if entry is not None and entry.spooled:
            return
        if self._stepping.locked():  # windows closed with its rows are being committed
            self._entry(shard_id).lost = True
            return
        self._drop(shard_id)

    def _drop(self, shard_id: str) -> None:
        floor = self.ledger.safe(shard_id)
        entry = self.shards.get(shard_id)
        known = self.floors.get(shard_id) if entry is None else entry.committed
        if known is not None and (floor is None or known > floor):
            floor = known
        rows = self.ledger.drop(shard_id)
        self.ordering.drop(shard_id, floor)
        self.watermarks.forget(shard_id)
        self.log.info("lease_lost_rows_dropped", shard_id=shard_id, rows=rows,
                      committed=floor.to_json() if floor is not None else None)
        self._changed.set()

    def safe_position(self, shard_id: str) -> Position | None:
        return self.ledger.safe(shard_id)

    async def shard_ended(self, shard_id: str) -> None:
        """Before SHARD_END is stored: the shard's uncommitted rows go to the spool."""
        self.lineage.ended(shard_id)
        self.watermarks.ended(shard_id, self.clock())
        rows = self.ledger.uncommitted(shard_id)
        if rows:
            last = self.ledger.last_end(shard_id)
            path = await self.spool.store(shard_id, rows, last, list(self.lineage.parents_of(shard_id)))
            self.log.info("spooled", shard_id=shard_id, rows=len(rows), path=str(path))
            if self.ledger.done(shard_id):  # their window committed while the spool was written: no commit
                await self._delete_spool(shard_id)  # to come would delete it
            else:  # (no await since the check: the commit that makes it done deletes it)
                self._entry(shard_id).spooled = True
        self._changed.set()

    def shard_closed(self, shard_id: str) -> None:
        """A connection that opened this shard ended (after its shard end, its lease
        lost, or the daemon gone): with no other, the shard is forgotten once done."""
        entry = self._entry(shard_id)
        if entry.connections > 1:
            entry.connections -= 1
            return
        entry.connections = 0
        entry.gone = True
        self._changed.set()

    def forget(self, shard_id: str) -> None:
        """Free everything kept for a shard gone from here, whose rows are all
        committed and which no longer holds the watermark (``step`` calls it); its
        committed position is kept (``floors``)."""
        entry = self.shards.pop(shard_id, None)
        if entry is not None and entry.committed is not None:
            self.floors[shard_id] = entry.committed
        self.ledger.forget(shard_id)
        self.ordering.forget(shard_id)
        self.watermarks.forget(shard_id)
        self.lineage.forget(shard_id)

    def _forget_done(self, now: float) -> None:
        for shard_id in [s for s, entry in self.shards.items() if entry.gone and self._done_here(s, now)]:
            self.forget(shard_id)

    def _done_here(self, shard_id: str, now: float) -> bool:
        if not self.ledger.done(shard_id):
            return False
        return not self.watermarks.tracks(shard_id) or not self.watermarks.holds(shard_id, now)

    def _keeper(self) -> Callable[[RowBatch], RowBatch]:
        """How a batch's pieces are kept: in memory up to ``max_buffered_bytes``, the
        rest in files (``spill``). Should a file fail (a full disk), the piece stays in
        memory: past the cap, but nothing lost."""
        room = self.settings.max_buffered_bytes - self.ledger.bytes

        def keep(piece: RowBatch) -> RowBatch:
            nonlocal room
            held = piece.held_bytes()
            if held > room:
                if not self.spill.bytes:
                    self.log.info("rows_spilled", directory=str(self.spill.directory), buffered_bytes=self.ledger.bytes,
                                  max_buffered_bytes=self.settings.max_buffered_bytes,
                                  what_to_do="none: rows past the cap wait in files until their window commits")
                try:
                    piece = piece.spilled(self.spill.put)
                    held = 0
                except OSError as exc:
                    self.log.error("spill_failed", directory=str(self.spill.directory), error=str(exc),
                                   what_to_do="free space there: the rows stay in memory, past max_buffered_bytes")
            room -= held
            return piece

        return keep

    async def admit(self, shard_id: str) -> None:
        """Wait while a closed window waits behind the one committing (every shard), or
        while memory is over the cap and this shard runs ahead. A shard waiting here is
        not idle: it holds the watermark as it did."""
        waited = False
        try:
            while self._sink_behind() or (self._over_cap() and self._may_delay(shard_id)):
                if not waited:
                    waited = True
                    self.watermarks.hold(shard_id)
                    self.log.info(
                        "backpressure",
                        shard_id=shard_id,
                        reason="sink_behind" if self._sink_behind() else "buffered_cap",
                        buffered_rows=self.ledger.rows,
                        buffered_bytes=self.ledger.bytes,
                        windows_waiting=len(self._sealed),
                        watermark=_ms(self.watermarks.value(shard_id)),
                        global_watermark=_ms(self.watermarks.minimum(self.clock())),
                        holder=self.watermarks.holder(self.clock()),
                    )
                async with self._progress:
                    await self._progress.wait()
        finally:
            if waited:
                self.watermarks.release(shard_id, self.clock())

    def _sink_behind(self) -> bool:
        """A closed window waits for its commit behind the one committing: the sink is
        what holds everything up. Every shard waits, the watermark's too, for the window
        in front commits without them; rows read now would only wait in memory."""
        return bool(self._sealed) and self._stepping.locked()

    def _over_cap(self) -> bool:
        """Past the high-water mark of either cap: back-pressure starts below the cap."""
        s = self.settings
        return (self.ledger.rows > s.max_buffered_rows * HIGH_WATER
                or self.ledger.bytes > s.max_buffered_bytes * HIGH_WATER)

    def _may_delay(self, shard_id: str) -> bool:
        """Does this shard run ahead? Not if it holds the watermark back, nor if it is
        still short of the end of the window the watermark is in: that window closes
        (and its commit frees memory) only once every such shard passes its end, so
        their batches must come whatever the order; waiting for each other in turn
        would only serialise them. Never a parent whose child waits on it."""
        holder = self.watermarks.holder(self.clock())
        if holder == shard_id:
            return False  # it holds the watermark back: delaying it would stall all
        watermark = self.watermarks.value(holder) if holder is not None else math.inf  # the global one
        if math.isfinite(watermark) and self.watermarks.value(shard_id) < self.ordering.window.end(watermark):
            return False  # the window the watermark is in needs it to close
        return not self.ordering.holds_children(self.lineage.children_of(shard_id))

    def _blocks(self, shard_id: str, now: float) -> bool:
        """Can this shard still add rows here at ``now`` (so its children must wait)?"""
        return self.watermarks.live(shard_id, now)

    # -- the committer -------------------------------------------------------------

    async def _ticker(self) -> None:
        tick = min(1.0, self.settings.idle_timeout / 4, self.settings.window / 4)
        while True:
            await asyncio.sleep(tick)
            self._changed.set()

    async def _committer(self) -> None:
        while True:
            await self._changed.wait()
            self._changed.clear()
            await self.step()

    async def step(self) -> int:
        """One committer pass at ``clock()``: release children whose parents are done,
        commit every window the global watermark closed (retrying a retriable failure
        until it commits), wake shards waiting in ``admit``. Returns the windows
        committed. A pass waits for one under way (a test's and the committer's)."""
        async with self._stepping:
            now = self.clock()
            for shard_id in self.ordering.release(now):
                self.log.info("child_released", shard_id=shard_id, parents=list(self.lineage.parents_of(shard_id)))
            self._seal(now)
            committed = 0
            while self._sealed:  # windows a batch closes while one commits join here (add_batch)
                closed = self._sealed.popleft()
                self._prepare_next()
                await self._commit(closed.window, closed.counts, closed.watermark, closed.closed_at)
                committed += 1
                async with self._progress:
                    self._progress.notify_all()  # its rows' memory is let go; the shards waiting behind it go on
            for shard_id in [s for s, entry in self.shards.items() if entry.lost]:
                self.shards[shard_id].lost = False
                self._drop(shard_id)
            self._forget_done(self.clock())
        async with self._progress:
            self._progress.notify_all()
        return committed

    def _seal(self, now: float) -> None:
        """Every window the global watermark at ``now`` has passed, cut out and sealed
        behind those waiting already. Sealing is on the loop: a sort of each shard's
        event times (runs already sorted, numpy), some 10 ns a row; the rows' JSON is
        put in that order by the sink."""
        watermark = self.watermarks.minimum(now)
        closed_at = time.perf_counter()
        for closed in self.ordering.close(watermark):
            window, counts = seal(closed)
            self._sealed.append(Sealed(window, counts, watermark, closed_at))

    def _prepare_next(self) -> None:
        """The sink is told the window that commits next, to make it ready while the
        one in front commits."""
        if self._sealed and isinstance(self.sink, PreparingSink):
            self.sink.prepare(self._sealed[0].window)

    async def _commit(self, window: Window, counts: dict[str, int], watermark: float, closed_at: float) -> None:
        started = time.perf_counter()
        attempt = 0
        while True:
            try:
                # Shielded: stopping the committer lets a commit under way finish.
                self._inflight = asyncio.ensure_future(self.sink.commit(window))
                await asyncio.shield(self._inflight)
                break
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if not retriable(exc):
                    raise  # a bug, not a failed commit: the committer ends, the server shuts down
                delay = self.sink_backoff.delay(attempt)
                attempt += 1
                if self.metrics is not None:
                    self.metrics.window_commit_failed()
                remote = getattr(exc, "traceback", "")  # a pipeline's, from the Spark process
                self.log.error(
                    "sink_commit_failed",
                    window=window.id,
                    rows=len(window),
                    error=f"{type(exc).__name__}: {exc}",
                    attempt=attempt,
                    retry_in_ms=round(delay * 1000),
                    what_to_do="the window is retried; its rows stay buffered and no shard checkpoints past them",
                    traceback=remote or None,
                    exc_info=attempt == 1 and not remote,
                )
                await asyncio.sleep(delay)
        for shard_id, position in window.positions.items():
            self._committed_at_least(shard_id, position)
        spooled = []  # shards whose spool this commit makes needless (deleted once it is said)
        for shard_id, count in counts.items():
            self.ledger.commit(shard_id, count)
            entry = self.shards.get(shard_id)
            if entry is not None and entry.spooled and self.ledger.done(shard_id):
                entry.spooled = False
                spooled.append(shard_id)
        self.windows_committed += 1
        self.rows_committed += len(window)
        duration = time.perf_counter() - started
        if self.metrics is not None:
            self.metrics.window_committed(duration)
        self.last_commit = LastCommit(window.id, len(window), window.late_rows, time.time())
        self.log.info(
            "window_committed",
            window=window.id,
            rows=len(window),
            late=window.late_rows,
            shards=len(counts),
            watermark=_ms(watermark),
            duration_ms=round(duration * 1000, 3),
            latency_ms=round((time.perf_counter() - closed_at) * 1000, 3),  # closed to committed
        )
        for shard_id in spooled:
            await self._delete_spool(shard_id)

    async def _delete_spool(self, shard_id: str) -> None:
        await asyncio.to_thread(self.spool.delete, shard_id)
        self.log.info("spool_deleted", shard_id=shard_id)


def _ms(value: float) -> int | None:
    return None if math.isinf(value) else int(value)
