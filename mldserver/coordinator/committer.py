"""The committer: closed windows, sealed, committed to the sink one at a time, in the
order they closed. It owns the sealed queue, the sink's preparation of the next window,
the retried commit, and the task that runs the coordinator's passes; it also asks a
shared sink what is committed of a shard there (``committed``: its intervals).

A pass (``Coordinator.step``) seals what the watermark closed and asks the committer
to commit it; while a commit is under way (``committing``, a fact the committer states,
not a lock read from outside) a batch that closes another window seals it at once, and
the sink is told to make it ready behind the one in front (``PreparingSink.prepare``)::

    committer = Committer(sink, log=log, on_commit=coordinator_bookkeeping)
    committer.seal(ordering.close(watermark), watermark)   # Sealed(window, commits, ...)
    async with committer.turn:                              # passes never overlap
        await committer.commit_sealed()                     # 1: window 0-60000 committed
    committer.windows_committed, committer.last_commit      # 1, LastCommit("0-60000", ...)

A sink that raises a retriable error (``errors.retriable``: a pipeline's SparkError, an
OSError) is retried with backoff, ``sink_commit_failed`` logged at every attempt (and
counted: ``mldserver_window_commit_failures_total``); its rows stay buffered and
back-pressure holds (``pressure``). Anything else is a bug: it ends the committer's
task, and the server, which watches it, logs ``task_crashed`` and shuts down.

Only after ``sink.commit`` returns is ``on_commit(window, commits)`` awaited: the
coordinator marks the rows committed in its ledger there, and deletes spools that
commit made needless. Shards waiting in ``admit`` wait on ``progress``, notified after
every commit and every pass.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Iterable

from ..rows.batch import RowBatch
from ..base.backoff import Backoff
from ..base.deadletters import DeadLetters
from ..base.handoff import ArrivingSink, PreparingSink, SharedSink, Sink, Window
from ..base.intervals import Intervals, to_json
from ..base.logs import EventLogger
from ..base.positions import Position
from ..errors import retriable
from .merge import seal
from .ordering import WindowRows


@dataclass(frozen=True, slots=True)
class Sealed:
    """A closed window, sealed, waiting for its commit."""

    window: Window
    commits: dict[str, list[RowBatch]]  # each shard's rows it commits (its late rows dropped too)
    watermark: float  # the global watermark that closed it
    closed_at: float  # perf_counter(): its close-to-commit latency starts here
    dropped: list[RowBatch] = field(default_factory=list)  # late rows left out (late_policy drop, dead-letter)
    again: int = 0  # an amended window's rows that an earlier version had (allowed_lateness)


@dataclass(frozen=True, slots=True)
class SinkFailing:
    """The sink has failed the window in front since ``since`` (epoch s), ``attempts``
    times, the last with ``error``: what ``/readyz``, ``/status`` and the metrics tell."""

    window: str
    error: str
    since: float
    attempts: int


@dataclass(frozen=True, slots=True)
class LastCommit:
    """The window committed last."""

    window: str  # its id
    rows: int
    late: int  # of its rows, late ones
    at: float  # epoch s


class Committer:
    def __init__(self, sink: Sink, *, log: EventLogger, on_commit: Callable[[Window, dict[str, list[RowBatch]]], Awaitable[None]],
                 metrics: Any = None, late_policy: str = "next", dead_letters: DeadLetters | None = None) -> None:
        self.sink = sink
        self._arrived = sink.arrived if isinstance(sink, ArrivingSink) else None
        self.late_policy = late_policy  # what a late row's window does with it: next, drop, dead-letter
        self.dead_letters = dead_letters  # where late rows go under dead-letter
        self.late_dropped = 0  # late rows left out of the windows (dropped or dead-lettered)
        self.log = log
        self.on_commit = on_commit
        self.metrics = metrics  # the server's Metrics: each window's commit duration, each failure
        self.sealed: deque[Sealed] = deque()  # closed windows waiting for the commit in front of them
        self.committing = False  # a pass is committing sealed windows now
        self.backoff = Backoff(first=0.5, cap=30.0)  # between attempts at a failing commit
        self.turn = asyncio.Lock()  # passes never overlap: windows commit in order
        self.progress = asyncio.Condition()  # notified after each commit and each pass
        self.windows_committed = 0
        self.rows_committed = 0
        self.last_commit: LastCommit | None = None
        self.failing: SinkFailing | None = None  # the window in front keeps failing
        self._inflight: asyncio.Task[None] | None = None  # the sink commit under way
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    # -- the task that runs passes --------------------------------------------------

    def start(self, step: Callable[[], Awaitable[Any]], tick: float,
              first: Callable[[], Awaitable[Any]] | None = None) -> None:
        """Run ``step`` at every ``wake()`` and every ``tick`` seconds, after ``first``
        (work that must not hold up the start: a lookup of the stream's shards)."""
        self._tasks = [
            asyncio.create_task(self._loop(step, first), name="coordinator-committer"),
            asyncio.create_task(self._ticker(tick), name="coordinator-tick"),
        ]

    @property
    def tasks(self) -> list[asyncio.Task[None]]:
        return list(self._tasks)

    def arrived(self, pieces: list[RowBatch]) -> None:
        """A batch's rows kept (``ordering.add``'s pieces): told to a sink that wants
        them before their window closes (``ArrivingSink``)."""
        if self._arrived is not None and pieces:
            self._arrived(pieces)

    def wake(self) -> None:
        """Something changed: a pass runs soon."""
        self._wake.set()

    async def _ticker(self, tick: float) -> None:
        while True:
            await asyncio.sleep(tick)
            self._wake.set()

    async def _loop(self, step: Callable[[], Awaitable[Any]], first: Callable[[], Awaitable[Any]] | None) -> None:
        if first is not None:
            await first()
        while True:
            await self._wake.wait()
            self._wake.clear()
            await step()

    async def stop(self, timeout: float) -> list[asyncio.Task[None]]:
        """Stop running passes; a commit under way finishes (within ``timeout``).
        Returns the stopped tasks, for the caller to raise what crashed them."""
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)
        await self.notify()  # no pass commits now: shards waiting behind the sink go on
        if self._inflight is not None and not self._inflight.done():
            await asyncio.wait([self._inflight], timeout=timeout)
        return tasks

    async def notify(self) -> None:
        async with self.progress:
            self.progress.notify_all()

    async def wait(self) -> None:
        """Until the next commit or pass ends."""
        async with self.progress:
            await self.progress.wait()

    async def committed(self, shard_id: str) -> Intervals:
        """A shared sink's committed intervals of the shard (``committed_intervals``, or
        everything at or below its ``committed_position``; none: not shared, nothing
        committed, or the read failed): what another server committed is a duplicate
        here. A failed read is logged and the shard goes on: the sink's commit still
        leaves out what is committed."""
        if not isinstance(self.sink, SharedSink):
            return ()
        started = time.perf_counter()
        try:
            if hasattr(self.sink, "committed_intervals"):
                intervals = await self.sink.committed_intervals(shard_id)
            else:
                position = await self.sink.committed_position(shard_id)
                intervals = () if position is None else ((None, position),)
        except Exception as exc:
            if not retriable(exc):
                raise
            self.log.warning(
                "committed_position_failed",
                shard_id=shard_id,
                error=f"{type(exc).__name__}: {exc}",
                what_to_do="check the table's catalog; rows another server committed are left out at commit",
            )
            return ()
        self.log.info(
            "committed_position_read",
            shard_id=shard_id,
            position=intervals[-1][1].to_json() if intervals else None,
            intervals=to_json(intervals),
            duration_ms=round((time.perf_counter() - started) * 1000, 3),
        )
        return intervals

    # -- sealing and committing -----------------------------------------------------

    def seal(self, closed: Iterable[WindowRows], watermark: float,
             reading: Callable[[str], tuple[Position | None, Position | None]] = lambda s: (None, None)) -> None:
        """Windows the watermark closed, sealed behind those waiting already (on the
        loop: a sort of each shard's event times, runs already sorted, some 10 ns a
        row; the rows' JSON is put in that order by the sink). ``reading``: where each
        shard's rows read here start (``Window.starts``), and how far its reading has
        delivered when no row of it is left for a later window (``Ordering.reading``):
        the last window sealed with the shard's rows covers that far (``positions``)."""
        closed_at = time.perf_counter()
        windows = []
        for rows in closed:
            # late rows committed, left out of the output
            dropped: list[RowBatch] = rows.drop_late() if self.late_policy != "next" else []
            again = rows.again
            window, commits = seal(rows)
            windows.append(window)
            self.sealed.append(Sealed(window, commits, watermark, closed_at, dropped, again))
        last = {shard_id: window for window in windows for shard_id in window.positions}  # each shard's last
        readings = {shard_id: reading(shard_id) for shard_id in last}
        for window in windows:
            window.starts = {s: start for s in window.positions if (start := readings[s][0]) is not None}
        for shard_id, window in last.items():
            reach = readings[shard_id][1]
            if reach is not None and reach > window.positions[shard_id]:
                window.positions[shard_id] = reach

    def prepare_next(self) -> None:
        """The sink is told the window that commits next, to make it ready while the
        one in front commits."""
        if self.sealed and isinstance(self.sink, PreparingSink):
            self.sink.prepare(self.sealed[0].window)

    async def commit_sealed(self) -> int:
        """Commit every sealed window, in order, those sealed meanwhile included; each
        retried until it commits. Returns how many committed."""
        committed = 0
        self.committing = True
        try:
            while self.sealed:
                closed = self.sealed.popleft()
                self.prepare_next()
                await self._commit(closed)
                committed += 1
                await self.notify()  # its rows' memory is let go; the shards waiting behind it go on
        finally:
            self.committing = False
        return committed

    async def _commit(self, closed: Sealed) -> None:
        window = closed.window
        if closed.dropped:
            await self._late(window, closed.dropped)
        if len(window) or not closed.dropped:  # (a window of dropped late rows alone writes nothing)
            await self._write(closed)
        await self.on_commit(window, closed.commits)
        for rows in (*(window.rows.pieces[0] if window.rows.pieces else ()), *closed.dropped):
            rows.page_out()  # rows spilled to a file: the pages read from it, let go

    async def _write(self, closed: Sealed) -> None:
        """The window into the sink, retried until it commits, then counted and logged."""
        window = closed.window
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
            except Exception as exc:  # whatever the sink raised: retried, the server stays up and says so
                delay = self.backoff.delay(attempt)
                attempt += 1
                since = time.time() if self.failing is None else self.failing.since
                self.failing = SinkFailing(window.id, f"{type(exc).__name__}: {exc}", since, attempt)
                self._failed(window, exc, attempt, delay)
                await asyncio.sleep(delay)
        if self.failing is not None:
            self.log.info("sink_recovered", window=window.id, attempts=self.failing.attempts,
                          failed_for_s=round(time.time() - self.failing.since, 3))
            self.failing = None
        self.windows_committed += window.version <= 1  # (an amended window is counted once)
        self.rows_committed += len(window) - closed.again
        duration = time.perf_counter() - started
        if self.metrics is not None:
            self.metrics.window_committed(duration)
        self.last_commit = LastCommit(window.id, len(window), window.late_rows, time.time())
        self.log.info(
            "window_committed",
            window=window.id,
            rows=len(window),
            late=window.late_rows,
            **({"amended": sum(n for _, n in window.amends)} if window.amends else {}),  # into a table, in place
            **({"version": window.version} if window.version else {}),  # allowed_lateness: 2 and on, amended
            shards=len(closed.commits),
            watermark=ms(closed.watermark),
            duration_ms=round(duration * 1000, 3),
            latency_ms=round((time.perf_counter() - closed.closed_at) * 1000, 3),  # closed to committed
        )

    async def _late(self, window: Window, dropped: list[RowBatch]) -> None:
        """Late rows left out of ``window`` (``late_policy``): dead-lettered with their
        data (before the commit that lets their shards checkpoint past them), or dropped;
        counted either way."""
        n = sum(map(len, dropped))
        self.late_dropped += n
        if self.late_policy == "dead-letter" and self.dead_letters is not None:
            error = f"event time before the window {window.id} it came with: its own window had closed"
            path = await self.dead_letters.rows(window.id, [(row.data, f"{error} ({row.time})")
                                                           for rows in dropped for row in rows], "late row")
            self.log.warning("late_rows_dead_lettered", window=window.id, rows=n, path=str(path),
                             what_to_do="rows came after their window closed: if a shard went quiet and came back, "
                                        "raise idle_timeout; late_policy = \"next\" commits such rows with the "
                                        "next window instead")
        else:
            self.log.info("late_rows_dropped", window=window.id, rows=n)

    def _failed(self, window: Window, exc: Exception, attempt: int, delay: float) -> None:
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
            what_to_do="the window is retried; its rows stay buffered and no shard checkpoints past them"
                       + ("" if retriable(exc) else " (not an I/O error: a bug in the sink or the pipeline, or rows "
                                                    "it cannot take; fix it and reload or restart: nothing is lost)"),
            traceback=remote or None,
            exc_info=attempt == 1 and not remote,
        )


def ms(value: float) -> int | None:
    """A watermark for a log line: None for +-inf."""
    return None if math.isinf(value) else int(value)
