"""The scheduler: keeps the timers due soon in memory, fires them through the pool (or
the server's loop), and settles each firing in the store. One per server, an owned
task (``timer-scheduler``) started after the pool and stopped before it::

    scheduler = scheduler_for(settings, firing=PoolFiring(pool, ...), dead_letters=dead_letters)
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

Memory stays bounded whatever the store holds: ``held`` has at most ``max_held``
timers, the earliest (those due within ``horizon_ms``, read from the store's due
index a slice at a time), and at most ``max_in_flight`` are being fired. What is held
is exactly what the store has up to a frontier (``_through``: every timer due by then;
``_cursor``: every timer up to that key), kept true by every change the server makes
(create, cancel, a firing's end) under one lock with the reads. A shared store
(DynamoDB) also changes under other servers: there the scheduler reads again every
``poll_ms`` and relies on claims, not on what it holds.

Firing is at least once. A timer leaves the store only after its callback returned
(``finish(done=...)``, only that version: a replacement made meanwhile stays and fires
with its own context, a cancellation has deleted it already). A failed call is an
attempt (``handler_retries`` + 1 in all, ``handler_backoff`` between them, kept in the
store); the last one is dead-lettered with its context (``dead-letters/_timers.jsonl``)
before the timer is deleted. A crash fires again only what was in flight: fired, not
yet finished in the store, at most ``max_in_flight`` timers (per server).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Sequence

import orjson

from ..base.backoff import Backoff, CallPolicy
from ..base.config import Settings, TimerStoreSpec, state_path
from ..base.logs import EventLogger, get_logger
from .api import Timers, TimerError
from .firing import Firing, LoopFiring, Result
from .remote import decode
from .store import Key, Op, Store, Timer, net, new_version

if TYPE_CHECKING:
    from ..base.deadletters import DeadLetters

MAX_HELD = 10_000  # timers held in memory (the earliest due)
MAX_IN_FLIGHT = 1_000  # timers being fired at once, per server: what a crash may fire twice
BATCH = 250  # timers per fire frame
HORIZON_MS = 2_000  # read ahead this far
POLL_MS = 500  # a shared store is read again this often
UNBLAMED_TIMER_REDOS = 10  # a timer redone (its process died under another call) this often counts a failure
STORE_RETRY = Backoff(first=0.1, cap=5.0)

Answer = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass
class Stats:
    """What /metrics reads (Couchbase Eventing's names in brackets)."""

    created: int = 0  # timers stored by create (replacements included)
    cancelled: int = 0  # pending timers cancel removed
    create_failures: int = 0  # creates refused or not stored [timer_create_failure]
    success: int = 0  # callbacks that returned [timer_callback_success]
    failure: int = 0  # callback attempts that raised, timed out or died [timer_callback_failure]
    dead_lettered: int = 0  # timers that failed every attempt


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
        self.firing = firing
        self.attempts = attempts
        self.backoff = backoff
        self.context_size = context_size
        self.dead_letters = dead_letters
        self.log = log or get_logger("mldserver.timers")
        self.clock = clock
        self.max_held = max_held
        self.max_in_flight = max_in_flight
        self.batch = batch
        self.horizon_ms = horizon_ms
        self.poll_ms = poll_ms
        self.stats = Stats()
        self.held: dict[Key, Timer] = {}
        self.in_flight: dict[Key, Timer] = {}
        self.task: asyncio.Task[None] | None = None
        self._heap: list[tuple[int, int, Key, int]] = []  # (due, seq, key, version); stale ones skipped
        self._seq = itertools.count()
        self._through: int | None = None  # every stored timer due by this is held or in flight
        self._cursor: tuple[int, str, str] | None = None  # and every one up to this (due, callback, reference)
        self._polled = -POLL_MS  # when a shared store was last read from scratch
        self._lock = asyncio.Lock()  # a store read and what it loads; what each change leaves in memory
        self._deferred: dict[Key, Timer] = {}  # replacements of timers in flight, held once those end
        self._superseded: set[Key] = set()  # timers in flight replaced or cancelled meanwhile
        self._redos: dict[Key, int] = {}
        self._fires: set[asyncio.Task[None]] = set()
        self._crash: BaseException | None = None
        self._wake = asyncio.Event()
        self._asleep_until = 0.0
        self._closed = False
        self._read_failures = 0  # reads of the store that failed in a row
        self._read_again = 0.0  # when to read it again after one failed

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
            self._wake.clear()
            await self.step()
            if self._crash is not None:
                raise self._crash
            delay = self._delay_ms()
            self._asleep_until = self.clock() + delay
            try:
                await asyncio.wait_for(self._wake.wait(), delay / 1000)
            except TimeoutError:
                pass

    def _delay_ms(self) -> float:
        now = self.clock()
        delay = self.horizon_ms / 2
        if self._heap and len(self.in_flight) < self.max_in_flight:
            delay = min(delay, self._heap[0][0] - now)
        if self.store.shared:
            delay = min(delay, self._polled + self.poll_ms - now)
        if self._read_failures:
            delay = max(delay, self._read_again - now)
        return max(delay, 0.0)

    def _poke(self, due_ms: int) -> None:
        if due_ms <= self._asleep_until:
            self._wake.set()

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
                self._redos.pop(key, None)
                if timer is None:
                    self.held.pop(key, None)
                    self._deferred.pop(key, None)
                    if key in self.in_flight:
                        self._superseded.add(key)
                elif key in self.in_flight:
                    self._superseded.add(key)
                    if self._loaded(timer):
                        self._deferred[key] = timer
                    else:
                        self._deferred.pop(key, None)
                elif self._loaded(timer):
                    self._hold(timer)
                    self._poke(timer.due_ms)
                else:
                    self.held.pop(key, None)
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

    # -- what is held ---------------------------------------------------------------------

    def _loaded(self, timer: Timer) -> bool:
        """Is ``timer`` within what memory mirrors of the store?"""
        return (self._through is not None and timer.due_ms <= self._through) or (
            self._cursor is not None and timer.order <= self._cursor)

    def _hold(self, timer: Timer) -> None:
        self.held[timer.key] = timer
        heapq.heappush(self._heap, (timer.due_ms, next(self._seq), timer.key, timer.version))
        if len(self.held) > self.max_held * 5 // 4:
            self._evict()
        elif len(self._heap) > 2 * len(self.held) + 1000:
            self._heap = [(t.due_ms, next(self._seq), t.key, t.version) for t in self.held.values()]
            heapq.heapify(self._heap)

    def _evict(self) -> None:
        """Too many held (creates due soon came faster than they fire): keep the
        earliest ``max_held``; the frontier moves back to the last one kept."""
        keep = sorted(self.held.values(), key=lambda t: t.order)[: self.max_held]
        last = keep[-1]
        self._cursor = last.order
        if self._through is not None and self._through >= last.due_ms:
            self._through = last.due_ms - 1
        self.held = {t.key: t for t in keep}
        self._heap = [(t.due_ms, next(self._seq), t.key, t.version) for t in keep]
        heapq.heapify(self._heap)

    async def _refill(self, now: float) -> None:
        if self.store.shared and now >= self._polled + self.poll_ms:
            self._through = self._cursor = None  # others change it too: read it again from the start
        if self._cursor is not None:
            if len(self.held) >= self.max_held // 2:
                return
        elif self._through is not None and self._through >= now + self.horizon_ms / 2:
            return
        limit = self.max_held - len(self.held)
        if limit <= 0:
            return
        until = int(now + self.horizon_ms)
        async with self._lock:
            after = self._cursor if self._cursor is not None else self._through
            rows = await self.store.due(until, limit, after)
            if self.store.shared:
                self._polled = now
            for timer in rows:
                if timer.key in self.in_flight:
                    continue
                held = self.held.get(timer.key)
                if held is None or held.version != timer.version or held.due_ms != timer.due_ms:
                    self._hold(timer)
            if len(rows) < limit:
                self._through, self._cursor = until, None
            else:
                self._cursor = rows[-1].order

    # -- firing ---------------------------------------------------------------------------

    async def step(self) -> int:
        """One pass at ``clock()``: read ahead if memory runs short, then hand every
        timer due by now (as many as ``max_in_flight`` allows) to the firing. How many."""
        if self._closed:
            return 0
        now = self.clock()
        if now >= self._read_again:
            try:
                await self._refill(now)
            except Exception as exc:  # the store is unreachable or failing: what is held still fires
                self._read_failures += 1
                self._read_again = now + STORE_RETRY.delay(min(self._read_failures - 1, 20)) * 1000
                if self._read_failures == 1:
                    self.log.error("timer_store_failed", store=repr(self.store), error=f"{type(exc).__name__}: {exc}",
                                   what_to_do="reading the due timers is retried with backoff; the timers held "
                                              "in memory still fire")
            else:
                if self._read_failures:
                    self.log.warning("timer_store_recovered", store=repr(self.store), attempts=self._read_failures)
                self._read_failures = 0
        batch: list[Timer] = []
        room = self.max_in_flight - len(self.in_flight)
        heap = self._heap
        while heap and room > 0 and heap[0][0] <= now:
            due, _, key, version = heapq.heappop(heap)
            timer = self.held.get(key)
            if timer is None or timer.version != version or timer.due_ms != due:
                continue  # replaced, cancelled or moved since
            del self.held[key]
            self.in_flight[key] = timer
            batch.append(timer)
            room -= 1
        for i in range(0, len(batch), self.batch):
            task = asyncio.get_running_loop().create_task(self._fire(batch[i : i + self.batch]), name="timer-fire")
            self._fires.add(task)
            task.add_done_callback(self._fired)
        return len(batch)

    def _fired(self, task: asyncio.Task[None]) -> None:
        self._fires.discard(task)
        if not task.cancelled() and task.exception() is not None and self._crash is None:
            self._crash = task.exception()
        self._wake.set()

    async def drain(self) -> None:
        """Wait until every firing handed out has been settled in the store."""
        while self._fires:
            await asyncio.wait(list(self._fires))
        if self._crash is not None:
            raise self._crash

    async def _fire(self, batch: list[Timer]) -> None:
        done: list[Timer] = []
        retry: list[Timer] = []
        release: list[Timer] = []
        dead: list[tuple[Timer, Result, int]] = []
        try:
            fired = await self._claim(batch) if self.store.shared else batch
            assert self.firing is not None
            results = await self.firing.fire(fired) if fired else []
            now = self.clock()
            for timer, result in zip(fired, results):
                key = timer.key
                if result.ok:
                    self._redos.pop(key, None)
                    self.stats.success += 1
                    done.append(timer)
                    continue
                if not result.counted:
                    redos = self._redos[key] = self._redos.get(key, 0) + 1
                    if redos <= UNBLAMED_TIMER_REDOS:
                        self.log.warning("timer_redone", callback=timer.callback, reference=timer.reference,
                                         error=result.error)
                        release.append(timer)
                        continue
                self._redos.pop(key, None)
                self.stats.failure += 1
                attempt = timer.attempts + 1
                again = attempt < self.attempts
                self.log.error("timer_callback_failed", callback=timer.callback, reference=timer.reference,
                               error=result.error, attempt=attempt, attempts=self.attempts, retry=again,
                               traceback=result.traceback)
                if again:
                    delay_ms = round(self.backoff.delay(attempt - 1) * 1000)
                    retry.append(timer._replace(due_ms=int(now) + delay_ms, attempts=attempt))
                else:
                    dead.append((timer, result, attempt))
            if dead:
                await self._dead_letter(dead)
            await self._settle(done + [t for t, _, _ in dead], retry, release)
        finally:
            retried = {t.key: t for t in retry}
            finished = {t.key for t in done} | {t.key for t, _, _ in dead}
            async with self._lock:
                for timer in batch:
                    key = timer.key
                    self.in_flight.pop(key, None)
                    replacement = self._deferred.pop(key, None)
                    if key in self._superseded:
                        self._superseded.discard(key)
                        if replacement is not None:
                            self._hold(replacement)
                        continue
                    if key in finished:
                        continue
                    again = retried.get(key)
                    if again is not None:
                        if self._loaded(again):
                            self._hold(again)
                    elif not self.store.shared:
                        self._hold(timer)  # not called (or cut short): still stored, due
            self._wake.set()

    async def _claim(self, batch: list[Timer]) -> list[Timer]:
        try:
            return await self.store.claim(batch, int(self.clock()))
        except Exception as exc:
            self.log.error("timer_claim_failed", timers=len(batch), error=f"{type(exc).__name__}: {exc}",
                           store=repr(self.store), what_to_do="the timers are read again and claimed later")
            return []

    async def _dead_letter(self, dead: list[tuple[Timer, Result, int]]) -> None:
        """Written to the dead letters first, then logged and counted: the logs and the
        metrics never say a timer is dead-lettered while its entry waits on a full disk."""
        if self.dead_letters is not None:
            await self.dead_letters.timers([
                {"callback": t.callback, "reference": t.reference, "due_ms": t.due_ms, "error": r.error,
                 "attempts": attempts, "context": orjson.Fragment(t.context)}
                for t, r, attempts in dead
            ])
        self.stats.dead_lettered += len(dead)
        for timer, result, attempts in dead:
            self.log.error("timer_dead_lettered", callback=timer.callback, reference=timer.reference,
                           error=result.error, attempts=attempts,
                           what_to_do="its context is in the dead letters (_timers.jsonl); fix the callback and "
                                      "create the timer again from there")

    async def _settle(self, done: list[Timer], retry: list[Timer], release: list[Timer]) -> None:
        """Until the store takes it: the timers stay in flight (at most
        ``max_in_flight``) while a failing store is retried."""
        attempt = 0
        while True:
            try:
                await self.store.finish(done, retry, release)
                break
            except Exception as exc:
                if attempt == 0:
                    self.log.error("timer_store_failed", store=repr(self.store), timers=len(done) + len(retry),
                                   error=f"{type(exc).__name__}: {exc}",
                                   what_to_do="retried until it works; meanwhile no more timers fire than are "
                                              "in flight (a restart would fire these again)")
                await asyncio.sleep(STORE_RETRY.delay(min(attempt, 20)))
                attempt += 1
        if attempt:
            self.log.warning("timer_store_recovered", store=repr(self.store), attempts=attempt + 1)


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
    scheduler.firing = firing or LoopFiring(local, policy.timeout, log)
    return scheduler, local
