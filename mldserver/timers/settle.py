"""One batch of due timers fired and its end settled in the store: claimed first (a
shared store), called through the firing, each result sorted (done; failed, retried
with backoff; redone; dead-lettered after its last attempt), the dead ones written to
the dead letters, then ``store.finish`` (retried until the store takes it). The
scheduler (``scheduler.py``) runs one per batch and tells its memory what ended::

    settler = Settler(store, firing, attempts=3, backoff=Backoff(first=0.1, cap=5.0),
                      dead_letters=dead_letters, log=log, clock=clock, stats=stats)
    ended = Settlement()
    await settler.fire([timer_a, timer_b], ended)
    ended.done, ended.retry, ended.release, ended.dead   # what happened to each

``ended`` is filled as it goes: if the firing is cancelled half way (the server
stopping), it says what was decided so far. A timer redone (``Result.counted`` False:
its process died under another call) is handed back as it was, not counted as an
attempt, ``UNBLAMED_TIMER_REDOS`` times; then it counts.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

import orjson

from ..base.backoff import Backoff
from ..base.logs import EventLogger
from .firing import Firing, Result
from .store import Key, Store, Timer

if TYPE_CHECKING:
    from ..base.deadletters import DeadLetters

UNBLAMED_TIMER_REDOS = 10  # a timer redone (its process died under another call) this often counts a failure
STORE_RETRY = Backoff(first=0.1, cap=5.0)


@dataclass
class Stats:
    """What /metrics reads (Couchbase Eventing's names in brackets)."""

    created: int = 0  # timers stored by create (replacements included)
    cancelled: int = 0  # pending timers cancel removed
    create_failures: int = 0  # creates refused or not stored [timer_create_failure]
    success: int = 0  # callbacks that returned [timer_callback_success]
    failure: int = 0  # callback attempts that raised, timed out or died [timer_callback_failure]
    dead_lettered: int = 0  # timers that failed every attempt


@dataclass
class Settlement:
    """How a batch's timers ended, so far."""

    done: list[Timer] = field(default_factory=list)  # returned: deleted from the store
    retry: list[Timer] = field(default_factory=list)  # failed: stored again, due later, one more attempt
    release: list[Timer] = field(default_factory=list)  # redone: stored as they were
    dead: list[tuple[Timer, Result, int]] = field(default_factory=list)  # failed their last attempt (of how many)


class Settler:
    def __init__(self, store: Store, firing: Firing | None, *, attempts: int, backoff: Backoff,
                 dead_letters: "DeadLetters | None", log: EventLogger, clock: Callable[[], float],
                 stats: Stats) -> None:
        self.store = store
        self.firing = firing
        self.attempts = attempts
        self.backoff = backoff
        self.dead_letters = dead_letters
        self.log = log
        self.clock = clock
        self.stats = stats
        self.redos: dict[Key, int] = {}  # times each timer was redone in a row

    def forget(self, key: Key) -> None:
        """``key`` was replaced or cancelled: its redos count no more."""
        self.redos.pop(key, None)

    async def fire(self, batch: list[Timer], ended: Settlement) -> None:
        fired = await self._claim(batch) if self.store.shared else batch
        assert self.firing is not None
        results = await self.firing.fire(fired) if fired else []
        now = self.clock()
        for timer, result in zip(fired, results):
            key = timer.key
            if result.ok:
                self.redos.pop(key, None)
                self.stats.success += 1
                ended.done.append(timer)
                continue
            if not result.counted:
                redos = self.redos[key] = self.redos.get(key, 0) + 1
                if redos <= UNBLAMED_TIMER_REDOS:
                    self.log.warning("timer_redone", callback=timer.callback, reference=timer.reference,
                                     error=result.error)
                    ended.release.append(timer)
                    continue
            self.redos.pop(key, None)
            self.stats.failure += 1
            attempt = timer.attempts + 1
            again = attempt < self.attempts
            self.log.error("timer_callback_failed", callback=timer.callback, reference=timer.reference,
                           error=result.error, attempt=attempt, attempts=self.attempts, retry=again,
                           traceback=result.traceback)
            if again:
                delay_ms = round(self.backoff.delay(attempt - 1) * 1000)
                ended.retry.append(timer._replace(due_ms=int(now) + delay_ms, attempts=attempt))
            else:
                ended.dead.append((timer, result, attempt))
        if ended.dead:
            await self._dead_letter(ended.dead)
        await self._settle(ended.done + [t for t, _, _ in ended.dead], ended.retry, ended.release)

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
