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
    coordinator.shards.connected(redrive_id)               # mldserver redrive: dead letters
    coordinator.add_batch(redrive_id, rows, last, 0, redriven=True)   # sent again, no watermark held

It is a facade over pieces that each do one job: ``ordering`` (queues, windows, late
rows), ``watermarks``, ``lineage``, ``ledger`` (what is committed, what is buffered),
``pressure`` (who waits before its status, and why), ``committer`` (the sealed windows
and the retried commit), ``spool`` and ``spill`` (rows on disk), ``shards`` (its own
record of each shard). A pass, ``step()``, runs on the committer's task at every change
and tick; tests call it themselves with a fake clock instead of waiting::

    coordinator = Coordinator(settings, sink, clock=clock)   # clock() -> epoch ms
    clock.now += 600_001
    await coordinator.step()          # every window the watermark passed is committed

A pass releases children whose parents are done, seals and commits every window the
global watermark closed, then drops the shards whose lease was lost meanwhile and
``forget``s those gone from here whose rows are all committed and that no longer hold
the watermark, so what is kept per shard is bounded by the shards still here.

What is committed of a shard is a few intervals (``base.intervals``), not one high
mark: each reading of it covers from where it started (just above the checkpoint
``open_shard`` was given, or its first record after a sentinel such as LATEST) to
the highest position its commits reach (``Window.starts``, ``Window.claims``). A
record is a duplicate only inside one, so a shard read again from below where an
earlier reading started has the rows no reading had committed, not dropped.

A sink several servers share (``SharedSink``: ``iceberg:``) is asked at every
``open_shard`` what is committed of the shard there now (the lease may come from a
server that committed past what this one knew): records inside are duplicates.
``lease_lost`` lets go of the shard: its uncommitted rows are dropped (the new owner
reads them again from the last checkpoint) and it stops holding the watermark back.

What the admin endpoint and the metrics report is one snapshot, read at once::

    coordinator.status()   # CoordinatorStatus(global_watermark=1763799995000.0, open_windows=2,
                           #   buffered_rows=4100, buffered_bytes=390000, peak_rows=9000, ...,
                           #   windows_committed=12, rows_committed=52000, late_rows=0,
                           #   last_commit=LastCommit(window="1763799900000-1763799960000", ...),
                           #   watermarks={"shardId-000000000001": 1763799995000.0, ...})
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Mapping

from ..rows.batch import RowBatch
from ..base.config import Settings, state_path
from ..base.deadletters import DeadLetters
from ..base.durable import wall_clock_ms
from ..base.handoff import Sink, Window
from ..base.intervals import to_json
from ..base.logs import EventLogger, get_logger
from ..base.positions import Position
from .committer import Committer, LastCommit, SinkFailing, ms
from .ledger import Ledger
from .lineage import Lineage, StreamShards
from .merge import native_gather
from .ordering import Ordering
from .pressure import Load, Place, should_wait
from .shards import Shards
from .spill import Spill
from .spool import Spool
from .watermarks import Watermarks


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
    sink_failing: SinkFailing | None = None  # the window in front keeps failing


class Coordinator:
    def __init__(self, settings: Settings, sink: Sink, *, clock: Callable[[], float] = wall_clock_ms,
                 log: EventLogger | None = None, metrics: Any = None, dead_letters: DeadLetters | None = None) -> None:
        # The rows' columns (numpy) and, without ``_gather``, the gather of interleaved
        # shards (pyarrow's 30 MiB, which the file sink never needs): loaded before the loop
        # serves. Left to the first batch and window, the imports stalled the loop and that commit.
        import numpy  # noqa: F401

        if native_gather is None:
            import pyarrow.compute  # noqa: F401

        self.settings = settings
        self.clock = clock
        self.log = log or get_logger("mldserver.coordinator")
        stream = None
        if settings.stream:
            stream = StreamShards(settings.stream, region=settings.aws_region, endpoint_url=settings.aws_endpoint_url)
        self.lineage = Lineage(stream)
        self.watermarks = Watermarks(margin_ms=settings.watermark_margin * 1000,
                                     idle_timeout_ms=settings.idle_timeout * 1000, children_of=self.lineage.children_of)
        self.ordering = Ordering.of(settings, blocks=self.watermarks.live, parents_of=self.lineage.parents_of)
        self.ledger = Ledger()
        self.spool = Spool(state_path(settings, "spool"), self.log)
        self.spill = Spill(state_path(settings, "spill"))  # rows past max_buffered_bytes
        self.shards = Shards(on_floor=self.ordering.delivered)
        if dead_letters is None and settings.late_policy == "dead-letter":
            dead_letters = DeadLetters(state_path(settings, "dead-letters"), metrics=metrics)
        self.committer = Committer(sink, log=self.log, on_commit=self._committed, metrics=metrics,
                                   late_policy=settings.late_policy, dead_letters=dead_letters)

    # -- lifecycle ---------------------------------------------------------------

    async def start(self) -> None:
        """Read what the sink committed, replay the spool, then start the committer
        and its tick."""
        committed = await self.committer.sink.start()
        await asyncio.to_thread(self.spill.clear)
        self.shards.floors.update(committed.by_shard())  # replays inside are dropped
        if committed.end is not None:
            self.ordering.resume(committed.end, committed.output, committed.final_until, committed.handed)
            self.log.info(
                "commit_log_read", windows=committed.windows, shards=len(committed.positions), end=committed.end
            )
        for spooled in await asyncio.to_thread(self.spool.read_all):
            self._replay(spooled.shard_id, spooled.rows, spooled.last, spooled.parents)
            if self.ledger.done(spooled.shard_id):  # every row committed before a stop (the commit log says):
                self.forget(spooled.shard_id)       # nothing waits on it, and no window would delete it
                await self._delete_spool(spooled.shard_id)
        s = self.settings
        self.committer.start(self.step, tick=min(1.0, s.idle_timeout / 4, s.window / 4), first=self._expect_stream)

    async def _expect_stream(self) -> None:
        """With ``stream``, each shard the stream still holds is expected (``expect``)."""
        for shard_id, parents in (await self.lineage.to_come()).items():
            self.expect(shard_id, parents)

    async def stop(self) -> None:
        """Stop committing: a commit in progress finishes (rows still buffered are not
        checkpointed, so the daemon delivers them again after a restart)."""
        tasks = await self.committer.stop(self.settings.shutdown_timeout)
        self.spill.close()
        o = self.ordering
        self.log.info("coordinator_stopped", windows=self.committer.windows_committed, rows=self.committer.rows_committed,
                      buffered_rows=self.ledger.rows, clamped=o.clamped, duplicates=o.duplicates, late=o.late_rows,
                      peak_rows=self.ledger.peak_rows, peak_bytes=self.ledger.peak_bytes, spilled_bytes=self.spill.bytes)
        for task in tasks:
            if not task.cancelled() and task.exception() is not None:
                raise task.exception()  # a crash is not swallowed by stopping

    @property
    def tasks(self) -> list[asyncio.Task[None]]:
        """The committer and its tick, for the server to watch: neither ends by itself."""
        return self.committer.tasks

    def status(self) -> CoordinatorStatus:
        """What ``/status`` and ``/metrics`` report, at ``clock()``."""
        ledger, committer = self.ledger, self.committer
        return CoordinatorStatus(
            self.watermarks.minimum(self.clock()), self.ordering.buffered_windows(), ledger.rows, ledger.bytes,
            ledger.peak_rows, ledger.peak_bytes, committer.windows_committed, committer.rows_committed,
            self.ordering.late_rows, committer.last_commit, self.watermarks.by_shard(), committer.failing)

    def _replay(self, shard_id: str, rows: RowBatch, last: Position | None, parents: list[str]) -> None:
        if parents:
            self.lineage.learn(shard_id, tuple(parents))
        # Not offered as a parent to shards seen from now on: after a restart, shards
        # starting from TRIM_HORIZON are not likely its children. The stream's API
        # (``stream``) tells; without it the spooled shard holds until the idle timeout.
        self.lineage.mark_seen(shard_id)
        self.add_batch(shard_id, rows, last, None)
        self.watermarks.ended(shard_id, self.clock())
        entry = self.shards.entry(shard_id)
        entry.spooled = entry.gone = True  # no connection serves it here: forgotten once committed
        self.log.info("spool_replayed", shard_id=shard_id, rows=len(rows))

    # -- what shard drivers call -----------------------------------------------------

    async def open_shard(self, shard_id: str, checkpoint: Position | None) -> None:
        self.shards.entry(shard_id).lost = False  # its lease came back before the drop
        committed = await self.committer.committed(shard_id)  # another server's, in a shared sink
        self.shards.committed_in(shard_id, committed)  # (and ordering.delivered: inside, duplicates)
        if self.ordering.apart(shard_id, checkpoint) and not self.ledger.done(shard_id):
            async with self.committer.turn:  # rows of another stretch of the shard: dropped (as if a lease was lost)
                self._drop(shard_id)
        self.ordering.opened(shard_id, checkpoint, buffered=self.ledger.opened(shard_id, checkpoint))
        await self.lineage.started(shard_id, checkpoint)
        self.shards.connected(shard_id)  # after the awaits: a pass may have forgotten it meanwhile
        self.watermarks.open(shard_id, self.clock())
        if parents := self.lineage.parents_of(shard_id):
            self.log.info("lineage", shard_id=shard_id, parents=list(parents))
        self.committer.wake()

    def expect(self, shard_id: str, parents: tuple[str, ...] | None = None) -> None:
        """The shard is to be read here: listed with its ``parents`` (``--source``, ``stream``)
        or its lease taken (``mldserver run``; None: as lineage knows). With no parent here to
        hold for it, it holds from now until it reports or idles (``Watermarks.expect``)."""
        if parents is not None:
            self.lineage.given(shard_id, parents)
        if not any(map(self.watermarks.tracks, self.lineage.parents_of(shard_id))):
            self.watermarks.expect(shard_id, self.clock())

    def add_batch(self, shard_id: str, rows: RowBatch, last: Position | None, millis_behind: int | None, *,
                  redriven: bool = False) -> None:  # redriven: dead letters sent again, holding no watermark
        now = self.clock()
        self.shards.entry(shard_id)  # (its committed position first: what is at or below it is a duplicate)
        dropped, clamped = self.ordering.duplicates, self.ordering.clamped
        keep = self.spill.keeper(self.settings.max_buffered_bytes - self.ledger.bytes,
                                 self.settings.max_buffered_bytes, self.log)
        pieces = self.ordering.add(shard_id, rows, last, now, keep)
        self.ledger.add(shard_id, pieces, last)
        self.committer.arrived(pieces)
        if not redriven:
            self.watermarks.batch(shard_id, self.ordering.progress(shard_id, pieces), millis_behind == 0, now, rows.timed)
        if self.ordering.duplicates != dropped:
            self.log.info("duplicates_dropped", shard_id=shard_id, rows=self.ordering.duplicates - dropped)
        if self.ordering.clamped != clamped:
            self.log.info("event_time_clamped", shard_id=shard_id, rows=self.ordering.clamped - clamped)
        if self.committer.committing:
            # A window this batch closed while one commits: sealed now, so the sink makes
            # it ready behind that one, and the shards wait for their status (``admit``).
            waiting = bool(self.committer.sealed)
            self._seal(now)
            if not waiting:
                self.committer.prepare_next()
        self.committer.wake()

    def lease_lost(self, shard_id: str) -> None:
        """The shard's lease went to another server (``leaseLost``, KCL 1.x ``shutdown``
        ZOMBIE): its uncommitted rows are dropped, for the new owner reads them again
        from the last checkpoint, and it stops holding the watermark back. Should it
        come back here, records up to what is committed of it are duplicates. A shard
        whose rows are spooled (it ended here) keeps them: the spool is replayed."""
        entry = self.shards.get(shard_id)
        if entry is not None and entry.spooled:
            return
        if self.committer.committing:  # windows closed with its rows are being committed
            self.shards.entry(shard_id).lost = True
            return
        self._drop(shard_id)

    def restart_shard(self, shard_id: str) -> None:
        """A ``--source`` stream created again while read: the id names a new shard (``shard_restarted``)."""
        self.shards.entry(shard_id).restarted = True
        self.lease_lost(shard_id)

    def _drop(self, shard_id: str) -> None:
        restarted = self.shards.restarted(shard_id)  # (then nothing of the old shard counts as committed)
        safe, committed = self.ledger.safe(shard_id), self.shards.committed(shard_id)  # inside: duplicates if back
        rows = self.ledger.drop(shard_id, forget=restarted)
        self.ordering.drop(shard_id, committed, safe, forget=restarted)
        self.watermarks.forget(shard_id)
        if restarted:
            self.log.warning("shard_restarted", shard_id=shard_id, rows=rows)
        else:  # committed: its intervals (inside, records are duplicates should it come back)
            self.log.info("lease_lost_rows_dropped", shard_id=shard_id, rows=rows, committed=to_json(committed))
        self.committer.wake()

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
                self.shards.entry(shard_id).spooled = True
        self.committer.wake()

    def shard_closed(self, shard_id: str) -> None:
        """A connection that opened this shard ended (after its shard end, its lease
        lost, or the daemon gone): with no other, the shard is forgotten once done."""
        entry = self.shards.entry(shard_id)
        if entry.connections > 1:
            entry.connections -= 1
            return
        entry.connections = 0
        entry.gone = True
        self.committer.wake()

    def forget(self, shard_id: str) -> None:
        """Free everything kept for a shard gone from here, whose rows are all
        committed and which no longer holds the watermark (``step`` calls it); its
        committed intervals are kept (``shards.floors``)."""
        self.shards.forget(shard_id)
        self.ledger.forget(shard_id)
        self.ordering.forget(shard_id)
        self.watermarks.forget(shard_id)
        self.lineage.forget(shard_id)

    # -- back-pressure ---------------------------------------------------------------

    async def admit(self, shard_id: str, meanwhile: Callable[[], Awaitable[None]] | None = None) -> None:
        """Wait while ``pressure`` says this shard must (a sealed window behind the
        commit under way; memory past the high-water mark while this shard runs ahead).
        A shard waiting here is not idle: it holds the watermark; ``meanwhile()`` follows each pass."""
        waited = False
        try:
            while (reason := should_wait(shard_id, self._load(), lambda: self._place(shard_id))) is not None:
                if not waited:
                    waited = True
                    self.watermarks.hold(shard_id)
                    now = self.clock()
                    self.log.info("backpressure", shard_id=shard_id, reason=reason.value, buffered_rows=self.ledger.rows,
                                  buffered_bytes=self.ledger.bytes, windows_waiting=len(self.committer.sealed),
                                  watermark=ms(self.watermarks.value(shard_id)),
                                  global_watermark=ms(self.watermarks.minimum(now)), holder=self.watermarks.holder(now))
                await self.committer.wait()
                if meanwhile is not None:
                    await meanwhile()
        finally:
            if waited:
                self.watermarks.release(shard_id, self.clock())

    def _load(self) -> Load:
        s = self.settings
        return Load(self.ledger.rows, self.ledger.bytes, s.max_buffered_rows, s.max_buffered_bytes,
                    len(self.committer.sealed), self.committer.committing)

    def _place(self, shard_id: str) -> Place:
        holder = self.watermarks.holder(self.clock())
        watermark = self.watermarks.value(holder) if holder is not None else math.inf  # the global one
        end = self.ordering.window.end(watermark) if math.isfinite(watermark) else -math.inf
        children = self.lineage.children_of(shard_id)  # waiting on it: rows held, or not reported yet
        waited = self.ordering.holds_children(children) or not all(map(self.watermarks.reported, children))
        return Place(holder, self.watermarks.value(shard_id), end, waited)

    # -- the pass --------------------------------------------------------------------

    async def step(self) -> int:
        """One pass at ``clock()``: release children whose parents are done, commit
        every window the global watermark closed (retrying a retriable failure until it
        commits), wake shards waiting in ``admit``. Returns the windows committed. A
        pass waits for one under way (a test's and the committer's)."""
        async with self.committer.turn:
            now = self.clock()
            for shard_id in self.ordering.release(now):
                self.log.info("child_released", shard_id=shard_id, parents=list(self.lineage.parents_of(shard_id)))
            self._seal(now)
            committed = await self.committer.commit_sealed()  # windows a batch closes meanwhile too
            for shard_id in self.shards.flagged("lost"):
                self.shards[shard_id].lost = False
                self._drop(shard_id)
            now = self.clock()
            done = [s for s in self.shards.flagged("gone") if self.ledger.done(s) and not self.watermarks.holding(s, now)]
            for shard_id in done:
                self.forget(shard_id)
        await self.committer.notify()
        return committed

    def _seal(self, now: float) -> None:
        """Every window the global watermark at ``now`` has passed, cut out and sealed
        behind those waiting already."""
        watermark = self.watermarks.minimum(now)
        self.committer.seal(self.ordering.close(watermark), watermark, self.ordering.reading)

    async def _committed(self, window: Window, commits: dict[str, list[RowBatch]]) -> None:
        """After the sink committed ``window``: its rows are committed in the ledger, and
        the spools it made needless are deleted."""
        for shard_id, claim in window.claims().items():
            self.shards.committed_in(shard_id, claim)
        spooled = []
        for shard_id, rows in commits.items():
            self.ledger.commit(shard_id, rows)
            entry = self.shards.get(shard_id)
            if entry is not None and entry.spooled and self.ledger.done(shard_id):
                entry.spooled = False
                spooled.append(shard_id)
        for shard_id in spooled:
            await self._delete_spool(shard_id)

    async def _delete_spool(self, shard_id: str) -> None:
        await asyncio.to_thread(self.spool.delete, shard_id)
        self.log.info("spool_deleted", shard_id=shard_id)
