"""The scheduler: keeps the timers due soon in memory, fires them through the pool (or
the server's loop), and settles each firing in the store. One per server, an owned
task (``timer-scheduler``) started after the pool and stopped before it::

    scheduler, local = scheduler_for(settings, firing=PoolFiring(pool, ...), dead_letters=dead_letters)
    await scheduler.start()                  # timers due while the server was down fire now
    await scheduler.create(Timer("handlers.orders:remind", "order-7", due_ms, b'{"order":7}'))
    await scheduler.cancel("handlers.orders:remind", "order-7")   # -> True
    await scheduler.write([timer_a, timer_b, ("handlers.orders:remind", "order-3")])  # a call's: one commit
    await scheduler.stop(timeout=30)         # firings under way finish (or are cancelled)

Tests drive it by hand with a fake clock (epoch milliseconds)::

    scheduler = Scheduler(store, firing, clock=clock, ...)
    await scheduler.open()
    clock.advance(60_000)
    await scheduler.step()                   # the timers due by now are handed to the firing
    await scheduler.drain()                  # their results settled in the store

Memory stays bounded whatever the store holds: at most ``max_held`` timers are held,
the earliest (those due within ``horizon_ms``, read from the store's due index a slice
at a time), and at most ``max_in_flight`` are being fired. What memory holds, and
where to read next, is ``due.py``'s ``DueTimers`` (no I/O); this class reads the
store for it and tells it each change the server makes (create, cancel, a firing's
end) under one lock with the reads. A shared store (DynamoDB) also changes under
other servers: there the scheduler reads again every ``poll_ms`` and relies on
claims, not on what it holds.

Firing is at least once. A timer leaves the store only after its callback returned
(``finish(done=...)``, only that version: a replacement made meanwhile stays and fires
with its own context, a cancellation has deleted it already). A failed call is an
attempt (``handler_retries`` + 1 in all, ``handler_backoff`` between them, kept in the
store); the last one is dead-lettered with its context (``dead-letters/_timers.jsonl``)
before the timer is deleted. A crash fires again only what was in flight: fired, not
yet finished in the store, at most ``max_in_flight`` timers (per server). One batch's
firing, from the call to the store's ``finish``, is ``settle.py``'s ``Settler``.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Sequence

from ..base.backoff import Backoff, CallPolicy
from ..base.config import Settings, TimerStoreSpec, state_path
from ..base.durable import wall_clock_ms
from ..base.logs import EventLogger, get_logger
from .api import Timers, TimerError
from .due import DueTimers
from .firing import Firing, LoopFiring
from .remote import decode
from .settle import STORE_RETRY, Settlement, Settler, Stats
from .store import Op, Store, Timer, net, new_version

if TYPE_CHECKING:
    from ..base.deadletters import DeadLetters

MAX_HELD = 10_000  # timers held in memory (the earliest due)
MAX_IN_FLIGHT = 1_000  # timers being fired at once, per server: what a crash may fire twice
BATCH = 250  # timers per fire frame
HORIZON_MS = 2_000  # read ahead this far
POLL_MS = 500  # a shared store is read again this often

Answer = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]

class ReadBackoff:
    """Reads of the store that failed in a row, and when (epoch ms) to read it again."""

    def __init__(self) -> None:
        self.failures = 0
        self.again = 0.0

    def failed(self, now: float) -> bool:
        """One more failed read at ``now``; whether it is the first in a row."""
        self.failures += 1
        self.again = now + STORE_RETRY.delay(min(self.failures - 1, 20)) * 1000
        return self.failures == 1

    def succeeded(self) -> int:
        """A read worked; how many had failed in a row before it."""
        failures, self.failures = self.failures, 0
        return failures


class Alarm:
    """The scheduler's sleep between passes, and what cuts it short: a firing that
    ended, or a timer held that is due before the sleep ends (epoch ms)."""

    def __init__(self) -> None:
        self._event = asyncio.Event()
        self._until = 0.0

    def ring(self) -> None:
        self._event.set()

    def poke(self, due_ms: int) -> None:
        if due_ms <= self._until:
            self._event.set()

    def clear(self) -> None:
        self._event.clear()

    async def sleep(self, now: float, delay_ms: float) -> None:
        self._until = now + delay_ms
        try:
            await asyncio.wait_for(self._event.wait(), delay_ms / 1000)
        except TimeoutError:
            pass


class Scheduler:
    def __init__(
        self,
        store: Store,
        firing: Firing | None,
        *,
        attempts: int,
        backoff: Backoff,
        context_size: int,
        dead_letters: "DeadLetters | None" = None,
        log: EventLogger | None = None,
        clock: Callable[[], float] = wall_clock_ms,
        max_held: int = MAX_HELD,
        max_in_flight: int = MAX_IN_FLIGHT,
        batch: int = BATCH,
        horizon_ms: int = HORIZON_MS,
        poll_ms: int = POLL_MS,
    ) -> None:
        self.store = store
        self.context_size = context_size
        self.log = log or get_logger("mldserver.timers")
        self.clock = clock
        self.batch = batch
        self.stats = Stats()
        self.due = DueTimers(shared=store.shared, max_held=max_held, max_in_flight=max_in_flight,
                             horizon_ms=horizon_ms, poll_ms=poll_ms)
        self.settler = Settler(store, firing, attempts=attempts, backoff=backoff, dead_letters=dead_letters,
                               log=self.log, clock=clock, stats=self.stats)
        self.task: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()  # a store read and what it loads; what each change leaves in memory
        self._fires: set[asyncio.Task[None]] = set()
        self._crash: BaseException | None = None
        self._alarm = Alarm()
        self._reads = ReadBackoff()
        self._closed = False

    # -- lifecycle ------------------------------------------------------------------------

    async def open(self) -> None:
        await self.store.open()

    async def start(self) -> None:
        await self.open()
        self.log.info("timers_started", store=repr(self.store), pending=self.store.pending)
        self.task = asyncio.create_task(self._run(), name="timer-scheduler")

    async def stop(self, timeout: float = 30.0) -> None:
        """No more firing; the firings under way get ``timeout`` seconds to end (the
        others fire again after a restart), then the store is closed."""
        self._closed = True
        if self.task is not None:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)
        if self._fires:
            _, pending = await asyncio.wait(list(self._fires), timeout=timeout)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending)
        await self.store.close()

    async def _run(self) -> None:
        while True:
            self._alarm.clear()
            await self.step()
            if self._crash is not None:
                raise self._crash
            await self._alarm.sleep(self.clock(), self._delay_ms())

    def _delay_ms(self) -> float:
        now = self.clock()
        delay = self.due.horizon_ms / 2
        due = self.due.next_due()
        if due is not None:
            delay = min(delay, due - now)
        if self.store.shared:
            delay = min(delay, self.due.polled + self.due.poll_ms - now)
        if self._reads.failures:
            delay = max(delay, self._reads.again - now)
        return max(delay, 0.0)

    # -- what handlers ask ----------------------------------------------------------------

    async def create(self, timer: Timer) -> None:
        """Store ``timer`` (replacing the one with its key) durably, then hold it if it
        is due soon. TimerError (retriable) if the store failed."""
        await self.write([timer])

    async def create_many(self, timers: list[Timer]) -> None:
        """``create`` for each, in one commit."""
        await self.write(timers)

    async def cancel(self, callback: str, reference: str) -> bool:
        """Delete the timer; whether one was pending. One being fired now finishes
        its call, and is neither retried nor fired again."""
        return (await self.write([(callback, reference)]))[0]

    async def write(self, ops: Sequence[Op]) -> list[bool]:
        """Creates (a ``Timer``) and cancels (a key) in order, in one commit (a call's
        timers arrive so: ``pending.py``); whether each cancel found one pending. What
        memory holds follows once the store has committed. TimerError (retriable) if
        the store failed: none of them is stored."""
        ops = [op._replace(version=new_version(), attempts=0) if isinstance(op, Timer) else op for op in ops]
        created = sum(isinstance(op, Timer) for op in ops)
        if not ops:
            return []
        first = repr(ops[0][1]) if len(ops) == 1 else f"{ops[0][1]!r} and {len(ops) - 1} more"
        what = "stored" if created else "cancelled"
        if self._closed:
            self.stats.create_failures += created
            raise TimerError(f"timer {first} not {what}: the server is stopping", retriable=True)
        try:
            found = await self.store.write(ops)
        except Exception as exc:
            self.stats.create_failures += created
            error = f"{type(exc).__name__}: {exc}"
            self.log.error("timer_write_failed", callback=ops[0][0], reference=ops[0][1], creates=created,
                           cancels=len(ops) - created, error=error, store=repr(self.store),
                           what_to_do="the store refused the write (a full disk? DynamoDB unreachable?); the "
                                      "call that made these timers fails and is retried")
            raise TimerError(f"timer {first} not {what} ({error}) in {self.store!r}", retriable=True) from None
        self.stats.created += created
        self.stats.cancelled += sum(found)
        final, _, _ = net(ops)  # what each key is left with
        async with self._lock:
            for key, timer in final.items():
                self.settler.forget(key)
                if self.due.written(key, timer):
                    assert timer is not None
                    self._alarm.poke(timer.due_ms)
        return found

    def refused(self, error: str) -> None:
        """A create refused before it reached the store (bad arguments)."""
        self.stats.create_failures += 1
        self.log.warning("timer_create_refused", error=error)

    def services(self) -> dict[str, Answer]:
        """The requests of handler processes (``remote.RemoteTimers``), answered here
        once the store has committed."""
        return {"timer_write": self._serve_write, "timer_refused": self._serve_refused}

    async def _serve_write(self, message: dict[str, Any]) -> dict[str, Any]:
        """``timers``: creates and cancels (``remote.encode``); ``found``: each
        cancel's answer, or ``error`` and ``retriable``."""
        try:
            found = await self.write(decode(message.get("timers") or [], self.context_size))
        except TimerError as exc:
            return {"error": str(exc), "retriable": exc.retriable}
        return {"error": None, "found": found}

    async def _serve_refused(self, message: dict[str, Any]) -> dict[str, Any]:
        self.refused(str(message.get("error")))
        return {}

    # -- reading ahead --------------------------------------------------------------------

    async def _refill(self, now: float) -> None:
        wanted = self.due.wanted(now)
        if wanted is None:
            return
        until, limit = wanted
        async with self._lock:
            rows = await self.store.due(until, limit, self.due.after())
            self.due.read(rows, until, limit, now)

    # -- firing ---------------------------------------------------------------------------

    async def step(self) -> int:
        """One pass at ``clock()``: read ahead if memory runs short, then hand every
        timer due by now (as many as ``max_in_flight`` allows) to the firing. How many."""
        if self._closed:
            return 0
        now = self.clock()
        if now >= self._reads.again:
            try:
                await self._refill(now)
            except Exception as exc:  # the store is unreachable or failing: what is held still fires
                if self._reads.failed(now):
                    self.log.error("timer_store_failed", store=repr(self.store), error=f"{type(exc).__name__}: {exc}",
                                   what_to_do="reading the due timers is retried with backoff; the timers held "
                                              "in memory still fire")
            else:
                failures = self._reads.succeeded()
                if failures:
                    self.log.warning("timer_store_recovered", store=repr(self.store), attempts=failures)
        batch = self.due.take(now)
        for i in range(0, len(batch), self.batch):
            task = asyncio.get_running_loop().create_task(self._fire(batch[i : i + self.batch]), name="timer-fire")
            self._fires.add(task)
            task.add_done_callback(self._fired)
        return len(batch)

    def _fired(self, task: asyncio.Task[None]) -> None:
        self._fires.discard(task)
        if not task.cancelled() and task.exception() is not None and self._crash is None:
            self._crash = task.exception()
        self._alarm.ring()

    async def drain(self) -> None:
        """Wait until every firing handed out has been settled in the store."""
        while self._fires:
            await asyncio.wait(list(self._fires))
        if self._crash is not None:
            raise self._crash

    async def _fire(self, batch: list[Timer]) -> None:
        ended = Settlement()
        try:
            await self.settler.fire(batch, ended)
        finally:
            retried = {t.key: t for t in ended.retry}
            finished = {t.key for t in ended.done} | {t.key for t, _, _ in ended.dead}
            async with self._lock:
                for timer in batch:
                    self.due.ended(timer, finished=timer.key in finished, again=retried.get(timer.key))
            self._alarm.ring()


class LocalTimers(Timers):
    """``self.timers`` in the server's loop (``workers = 0``) and inside its timer
    callbacks: straight to the scheduler."""

    def __init__(self, scheduler: Scheduler) -> None:
        super().__init__(scheduler.context_size)
        self.scheduler = scheduler

    async def write(self, ops: Sequence[Op]) -> list[bool]:
        return await self.scheduler.write(ops)

    async def _refused(self, error: str) -> None:
        self.scheduler.refused(error)


def open_store(settings: Settings) -> Store:
    """The store ``timer_store`` names."""
    spec = TimerStoreSpec.parse(settings.timer_store)
    if spec.kind == "dynamodb":
        from .dynamodb import CLAIM_SLACK_MS, DynamoStore

        return DynamoStore(spec.where, region=settings.aws_region,
                           claim_ms=round(settings.execution_timeout * 1000) + CLAIM_SLACK_MS)
    from pathlib import Path

    from .sqlite import SqliteStore

    path = Path(spec.where).resolve() if spec.where else state_path(settings, "timers", "timers.db")
    return SqliteStore(path)


def scheduler_for(settings: Settings, *, firing: Firing | None, dead_letters: "DeadLetters | None",
                  log: EventLogger | None = None) -> tuple[Scheduler, LocalTimers]:
    """The server's scheduler (firing with ``firing``, the pool's ``PoolFiring``; in
    this loop with none) and the ``Timers`` of this loop."""
    log = log or get_logger("mldserver.timers")
    policy = CallPolicy.from_settings(settings)
    scheduler = Scheduler(
        open_store(settings), None,
        attempts=policy.retries + 1,
        backoff=policy.backoff,
        context_size=settings.timer_context_size, dead_letters=dead_letters, log=log,
    )  # fmt: skip
    local = LocalTimers(scheduler)
    scheduler.settler.firing = firing or LoopFiring(local, policy.timeout, log)
    return scheduler, local
