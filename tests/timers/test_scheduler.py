"""The scheduler with a fake clock, the real SQLite store and a firing that records
what it is handed (and answers as the test says): when timers fire, what a
replacement or a cancellation does to one in flight, retries and the dead letter,
what a restart fires, and that memory stays bounded."""

from __future__ import annotations

import asyncio
import json

import pytest

from mldserver.base.backoff import Backoff
from mldserver.base.deadletters import DeadLetters
from mldserver.timers.firing import OK, Result
from mldserver.timers.scheduler import Scheduler
from mldserver.timers.sqlite import SqliteStore
from mldserver.timers.store import Timer

from ..helpers import FakeClock

CB = "tests.timer_handlers:fired"
T0 = 1_000_000


class Recording:
    """A firing that keeps each batch; ``answer(timer)`` says how each call ends;
    while ``gate`` is set, calls wait for it to open."""

    def __init__(self) -> None:
        self.fired: list[Timer] = []
        self.answer = lambda timer: OK
        self.gate: asyncio.Event | None = None
        self.waiting = 0

    async def fire(self, timers):
        self.fired.extend(timers)
        if self.gate is not None:
            self.waiting += len(timers)
            await self.gate.wait()
        return [self.answer(t) for t in timers]

    def refs(self) -> list[str]:
        return [t.reference for t in self.fired]

    def contexts(self) -> list[dict]:
        return [json.loads(t.context) for t in self.fired]


def timer(ref: str, due: int, **context) -> Timer:
    return Timer(CB, ref, due, json.dumps(context or {"ref": ref}).encode())


@pytest.fixture
def clock():
    return FakeClock(T0)


@pytest.fixture
def firing():
    return Recording()


@pytest.fixture
async def make(tmp_path, clock, firing):
    made = []

    async def make(**overrides) -> Scheduler:
        settings = dict(attempts=3, backoff=Backoff(first=1.0, cap=1.0, rng=lambda: 1.0), context_size=1024,
                        dead_letters=DeadLetters(tmp_path / "dead-letters"), clock=clock)
        scheduler = Scheduler(SqliteStore(tmp_path / "timers.db"), firing, **{**settings, **overrides})
        await scheduler.open()
        made.append(scheduler)
        return scheduler

    yield make
    for scheduler in made:
        if not scheduler._closed:
            await scheduler.stop()


async def fire(scheduler: Scheduler) -> int:
    n = await scheduler.step()
    await scheduler.drain()
    return n


async def test_a_timer_fires_at_its_time_not_before(make, clock, firing):
    s = await make()
    await s.create(timer("a", T0 + 1000))
    await s.create(timer("b", T0 + 2000))
    assert await fire(s) == 0
    clock.advance(999)
    assert await fire(s) == 0
    clock.advance(1)
    assert await fire(s) == 1 and firing.refs() == ["a"]
    assert s.store.pending == 1
    clock.advance(5000)
    assert await fire(s) == 1 and firing.refs() == ["a", "b"]
    assert s.store.pending == 0 and s.stats.success == 2


async def test_timers_fire_in_due_order(make, clock, firing):
    s = await make()
    for i, due in enumerate([50, 10, 40, 20, 30]):
        await s.create(timer(f"r{i}", T0 + due))
    clock.advance(100)
    await fire(s)
    assert firing.refs() == ["r1", "r3", "r4", "r2", "r0"]


async def test_a_timer_due_while_the_server_was_down_fires_at_start(make, clock, firing):
    first = await make()
    await first.create(timer("a", T0 + 1000))
    await first.stop()
    clock.advance(3_600_000)  # down for an hour
    second = await make()
    assert await fire(second) == 1 and firing.refs() == ["a"]


async def test_the_same_callback_and_reference_replaces(make, clock, firing):
    s = await make()
    await s.create(timer("a", T0 + 100, v=1))
    await s.create(timer("a", T0 + 500, v=2))
    clock.advance(100)
    assert await fire(s) == 0
    clock.advance(400)
    assert await fire(s) == 1 and firing.contexts() == [{"v": 2}]
    assert s.store.pending == 0


async def test_a_cancelled_timer_never_fires(make, clock, firing):
    s = await make()
    await s.create(timer("a", T0 + 100))
    await s.create(timer("b", T0 + 100))
    assert await s.cancel(CB, "a") is True
    assert await s.cancel(CB, "a") is False
    assert await s.cancel("tests.timer_handlers:other", "b") is False  # another callback's "b": none
    clock.advance(1000)
    await fire(s)
    assert firing.refs() == ["b"] and s.stats.cancelled == 1


async def test_a_replacement_made_while_firing_fires_after_with_its_context(make, clock, firing):
    s = await make()
    await s.create(timer("a", T0, v=1))
    firing.gate = asyncio.Event()
    await s.step()
    assert list(s.due.in_flight) == [(CB, "a")]
    await s.create(timer("a", T0, v=2))  # while v1's call runs
    assert await s.step() == 0  # not twice at once
    firing.gate.set()
    await s.drain()
    assert s.store.pending == 1  # v1's end did not delete v2
    await fire(s)
    assert firing.contexts() == [{"v": 1}, {"v": 2}] and s.store.pending == 0


async def test_a_replacement_due_later_fires_though_read_ahead_while_the_old_one_was_firing(make, clock, firing):
    s = await make()  # (the read skipped it, its key being in flight: it fired only after a restart)
    await s.create(timer("a", T0, v=1))
    firing.gate = asyncio.Event()
    await s.step()
    await s.create(timer("a", T0 + 10_000, v=2))  # beyond what memory holds of the store
    clock.advance(9_000)
    await s.step()  # reads ahead past it while v1's call runs
    firing.gate.set()
    await s.drain()
    clock.advance(1_000)
    assert await fire(s) == 1 and firing.contexts() == [{"v": 1}, {"v": 2}] and s.store.pending == 0


async def test_a_timer_cancelled_while_firing_is_not_retried(make, clock, firing):
    s = await make()
    await s.create(timer("a", T0))
    firing.gate = asyncio.Event()
    firing.answer = lambda t: Result(False, "ValueError: boom")
    await s.step()
    assert await s.cancel(CB, "a") is True  # deleted, though its call is under way
    firing.gate.set()
    await s.drain()
    clock.advance(60_000)
    await fire(s)
    assert firing.refs() == ["a"] and s.store.pending == 0 and not s.due.held


async def test_a_failing_callback_is_retried_with_backoff_then_dead_lettered(tmp_path, make, clock, firing):
    s = await make()
    await s.create(timer("a", T0, order=7))
    firing.answer = lambda t: Result(False, "ValueError: no such order", "Traceback ...")
    assert await fire(s) == 1
    assert s.store.pending == 1 and s.stats.failure == 1
    clock.advance(999)
    assert await fire(s) == 0  # backoff: 1 s
    clock.advance(1)
    assert await fire(s) == 1
    clock.advance(1000)
    assert await fire(s) == 1
    assert s.stats.failure == 3 and s.stats.dead_lettered == 1 and s.store.pending == 0
    [letter] = [json.loads(line) for line in (tmp_path / "dead-letters" / "_timers.jsonl").read_text().splitlines()]
    assert letter["callback"] == CB and letter["reference"] == "a" and letter["context"] == {"order": 7}
    assert letter["error"] == "ValueError: no such order" and letter["attempts"] == 3
    clock.advance(60_000)
    assert await fire(s) == 0


async def test_attempts_are_kept_across_a_restart(make, clock, firing):
    first = await make()
    await first.create(timer("a", T0))
    firing.answer = lambda t: Result(False, "ValueError: boom")
    await fire(first)
    await first.stop()
    clock.advance(1000)
    second = await make()
    await fire(second)
    clock.advance(1000)
    await fire(second)
    assert [t.attempts for t in firing.fired] == [0, 1, 2] and second.stats.dead_lettered == 1


async def test_a_call_not_finished_through_no_fault_of_its_own_is_redone_uncounted(make, clock, firing):
    s = await make()
    await s.create(timer("a", T0))
    answers = iter([Result(False, "the handler process died (signal SIGKILL)", counted=False), OK])
    firing.answer = lambda t: next(answers)
    await fire(s)
    await fire(s)
    assert firing.refs() == ["a", "a"] and s.stats.failure == 0 and s.stats.success == 1
    assert [t.attempts for t in firing.fired] == [0, 0]


async def test_redos_without_end_count_as_failures_after_a_while(make, clock, firing):
    s = await make(attempts=1)
    await s.create(timer("a", T0))
    firing.answer = lambda t: Result(False, "died", counted=False)
    for _ in range(12):
        await fire(s)
    assert s.stats.dead_lettered == 1 and len(firing.fired) == 11  # 10 redone, the 11th counted


async def test_in_flight_is_bounded(make, clock, firing):
    s = await make(max_in_flight=100, batch=30)
    for i in range(250):
        await s.create(timer(f"r{i:03}", T0))
    firing.gate = asyncio.Event()
    assert await s.step() == 100
    assert len(s.due.in_flight) == 100 and await s.step() == 0
    firing.gate.set()
    await s.drain()
    for _ in range(3):
        await fire(s)
    assert firing.refs() == [f"r{i:03}" for i in range(250)] and s.store.pending == 0


async def test_memory_holds_only_what_is_due_soon(make, clock, firing):
    s = await make(max_held=200, horizon_ms=10_000)
    await asyncio.gather(*(s.create(timer(f"r{i:05}", T0 + 60_000 + i * 10)) for i in range(5_000)))
    await fire(s)
    assert len(s.due.held) == 0  # nothing due within the horizon
    held = []
    while s.store.pending:
        clock.advance(997)
        await fire(s)
        held.append(len(s.due.held))
    assert max(held) <= 200 * 5 // 4
    assert firing.refs() == [f"r{i:05}" for i in range(5_000)]
    assert all(t.due_ms <= clock.now for t in firing.fired)


async def test_creates_due_soon_beyond_the_cap_stay_in_the_store_until_their_turn(make, clock, firing):
    s = await make(max_held=100, max_in_flight=50)
    await fire(s)  # read ahead: everything due within the horizon is mirrored
    for i in range(1_000):
        await s.create(timer(f"r{i:04}", T0 + 500 + i))
        assert len(s.due.held) <= 125
    clock.advance(2_000)
    while s.store.pending:
        await fire(s)
    assert sorted(firing.refs()) == [f"r{i:04}" for i in range(1_000)] and len(firing.fired) == 1_000


async def test_a_firing_that_crashes_the_scheduler_surfaces(make, clock, firing):
    s = await make()
    await s.create(timer("a", T0))

    async def broken(timers):
        raise TypeError("a bug")

    firing.fire = broken
    await s.step()
    with pytest.raises(TypeError, match="a bug"):
        await s.drain()
    assert s.store.pending == 1 and list(s.due.held) == [(CB, "a")]  # still there, fired after a restart


async def test_creates_after_stop_are_refused(make):
    s = await make()
    await s.stop()
    with pytest.raises(Exception, match="stopping"):
        await s.create(timer("a", T0))
    assert s.stats.create_failures == 1


async def test_a_store_that_cannot_be_read_is_read_again_later_and_held_timers_still_fire(make, clock, firing,
                                                                                           caplog):
    s = await make()
    await s.create(timer("a", T0 + 10))
    await fire(s)  # read: "a" is held
    real = s.store.due
    failures = []

    async def failing(*args, **kwargs):
        failures.append(1)
        raise OSError(5, "Input/output error")

    s.store.due = failing
    clock.advance(2_000)  # time to read ahead again: it fails, "a" fires anyway
    assert await fire(s) == 1 and len(failures) == 1
    assert await fire(s) == 0 and len(failures) == 1  # not again at once: backoff
    s.store.due = real
    await s.create(timer("b", T0 + 100_000))
    clock.advance(100_000)
    assert await fire(s) == 1 and firing.refs() == ["a", "b"]
    assert [r.getMessage() for r in caplog.records if r.getMessage().startswith("timer_store")] == [
        "timer_store_failed", "timer_store_recovered"]
