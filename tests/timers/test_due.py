"""``DueTimers``, what the scheduler holds of the store, driven by hand: reads, writes,
firings and their ends, with no store and no loop; then, seeded and random, against a
naive model (the store as a plain dict of timers, scanned whole each time)."""

from __future__ import annotations

import random

import pytest

from mldserver.timers.due import DueTimers
from mldserver.timers.store import Key, Timer

CB = "tests.timer_handlers:fired"


def timer(ref: str, due: int, version: int = 1, attempts: int = 0) -> Timer:
    return Timer(CB, ref, due, b"{}", version, attempts)


def mirror(**overrides) -> DueTimers:
    return DueTimers(**{**dict(shared=False, max_held=100, max_in_flight=10, horizon_ms=2_000, poll_ms=500),
                        **overrides})


def test_a_read_asks_for_the_horizon_and_then_nothing_until_half_of_it_has_passed():
    due = mirror()
    assert due.wanted(1_000) == (3_000, 100) and due.after() is None
    due.read([timer("a", 1_500), timer("b", 2_500)], 3_000, 100, 1_000)
    assert set(due.held) == {(CB, "a"), (CB, "b")} and due.through == 3_000 and due.cursor is None
    assert due.wanted(2_000) is None
    assert due.wanted(2_001) == (4_001, 98) and due.after() == 3_000


def test_a_full_read_moves_the_cursor_to_its_last_row():
    due = mirror(max_held=4)
    rows = [timer(f"r{i}", 1_000 + i) for i in range(4)]
    assert due.wanted(1_000) == (3_000, 4)
    due.read(rows, 3_000, 4, 1_000)
    assert due.cursor == rows[-1].order and due.through is None
    assert due.loaded(timer("r3", 1_003)) and not due.loaded(timer("r4", 1_003))
    assert due.wanted(1_000) is None  # held, at least half of max_held


def test_due_timers_are_taken_in_due_order_up_to_max_in_flight():
    due = mirror(max_in_flight=2)
    due.read([timer("a", 30), timer("b", 10), timer("c", 20), timer("d", 5_000)], 3_000, 100, 0)
    assert due.next_due() == 10
    assert [t.reference for t in due.take(100)] == ["b", "c"]
    assert due.next_due() is None  # no room
    assert due.take(100) == []
    due.ended(timer("b", 10), finished=True)
    assert [t.reference for t in due.take(100)] == ["a"] and set(due.in_flight) == {(CB, "c"), (CB, "a")}


def test_a_write_within_the_frontier_is_held_and_one_beyond_it_is_not():
    due = mirror()
    due.read([], 3_000, 100, 0)
    assert due.written((CB, "a"), timer("a", 2_000)) is True
    assert due.written((CB, "b"), timer("b", 9_000)) is False and (CB, "b") not in due.held
    assert due.written((CB, "a"), timer("a", 8_000, version=2)) is False and not due.held  # moved out
    due.written((CB, "c"), timer("c", 100))
    due.written((CB, "c"), None)
    assert due.take(10_000) == []


def test_a_timer_replaced_while_in_flight_is_held_again_as_replaced_once_its_firing_ends():
    due = mirror()
    due.read([timer("a", 100)], 3_000, 100, 0)
    [fired] = due.take(100)
    replacement = timer("a", 500, version=2)
    due.written(fired.key, replacement)
    assert fired.key in due.superseded and due.deferred[fired.key] == replacement
    due.ended(fired, finished=True)
    assert due.held == {fired.key: replacement} and not due.superseded


def test_a_timer_cancelled_while_in_flight_is_not_held_again_whatever_its_firing_did():
    due = mirror()
    due.read([timer("a", 100)], 3_000, 100, 0)
    [fired] = due.take(100)
    due.written(fired.key, None)
    due.ended(fired)  # not called: would be held again, had it not been cancelled
    assert not due.held and not due.in_flight


def test_a_retried_timer_is_held_again_if_within_the_frontier():
    due = mirror()
    due.read([timer("a", 100), timer("b", 100)], 3_000, 100, 0)
    a, b = due.take(100)
    due.ended(a, again=a._replace(due_ms=1_000, attempts=1))
    due.ended(b, again=b._replace(due_ms=60_000, attempts=1))  # read again when the frontier gets there
    assert due.held == {a.key: a._replace(due_ms=1_000, attempts=1)}


def test_one_not_called_is_held_again_from_its_own_store_but_left_to_the_next_poll_from_a_shared_one():
    own, shared = mirror(), mirror(shared=True)
    for due in (own, shared):
        due.wanted(0)
        due.read([timer("a", 100)], 2_000, 100, 0)
        [fired] = due.take(100)
        due.ended(fired)
    assert list(own.held) == [(CB, "a")] and not shared.held


def test_a_shared_store_is_read_from_the_start_every_poll():
    due = mirror(shared=True)
    assert due.wanted(0) == (2_000, 100)
    due.read([timer("a", 100)], 2_000, 100, 0)
    assert due.polled == 0 and due.wanted(499) is None
    assert due.wanted(500) == (2_500, 99) and due.after() is None


def test_too_many_held_keeps_the_earliest_and_moves_the_frontier_back():
    due = mirror(max_held=4)
    due.read([], 10_000, 4, 0)
    for i in range(6):  # the sixth is past max_held * 5 / 4
        due.written((CB, f"r{i}"), timer(f"r{i}", 1_000 - i))
    assert sorted(t.due_ms for t in due.held.values()) == [995, 996, 997, 998]
    assert due.cursor == (998, CB, "r2") and due.through == 997
    assert not due.loaded(timer("r0", 1_000)) and due.loaded(timer("r9", 997))


def test_a_replacement_read_while_its_timer_is_in_flight_is_held_once_the_firing_ends():
    """Found by the naive model: before, the read skipped it (its key was in flight) and
    nothing held it afterwards, so it fired only after a restart."""
    due = mirror(max_held=100)
    due.read([timer("a", 100)], 2_000, 100, 0)
    [fired] = due.take(100)
    replacement = timer("a", 2_500, version=2)
    due.written(fired.key, replacement)  # beyond the frontier: not deferred yet
    assert fired.key not in due.deferred
    rows = [replacement]  # the frontier moves past it while the old one is still in flight
    assert due.wanted(1_001) == (3_001, 100) and due.after() == 2_000
    due.read(rows, 3_001, 100, 1_001)
    due.ended(fired, finished=True)
    assert due.held == {fired.key: replacement}


# -- against a naive model ---------------------------------------------------------------


class NaiveStore:
    """The store as a dict, scanned whole for every read."""

    def __init__(self) -> None:
        self.timers: dict[Key, Timer] = {}

    def due(self, until: int, limit: int, after) -> list[Timer]:
        rows = sorted(self.timers.values(), key=lambda t: t.order)
        if isinstance(after, int):
            rows = [t for t in rows if t.due_ms > after]
        elif after is not None:
            rows = [t for t in rows if t.order > after]
        return [t for t in rows if t.due_ms <= until][:limit]

    def finish(self, timer: Timer, *, done: bool, again: Timer | None) -> None:
        stored = self.timers.get(timer.key)
        if stored is None or stored.version != timer.version:
            return
        if done:
            del self.timers[timer.key]
        elif again is not None:
            self.timers[timer.key] = again


def check(due: DueTimers, store: NaiveStore, fired: dict[Key, Timer]) -> None:
    assert due.in_flight == fired
    for key, held in due.held.items():
        assert store.timers.get(key) == held, f"held {held}, stored {store.timers.get(key)}"
        assert key not in fired
    for key, stored in store.timers.items():
        if key in fired:
            if stored != fired[key]:
                assert key in due.superseded
        elif due.loaded(stored):
            assert due.held.get(key) == stored, f"{stored} is within the frontier and not held"


@pytest.mark.parametrize("seed", range(40))
def test_what_it_holds_and_hands_out_matches_a_naive_scan_of_the_store(seed):
    rng = random.Random(seed)
    max_held, max_in_flight = rng.choice([3, 8, 50]), rng.choice([1, 4, 20])
    due = mirror(max_held=max_held, max_in_flight=max_in_flight)
    store, fired = NaiveStore(), {}
    now, versions = 0, iter(range(1, 10**6))
    keys = [(CB, f"r{i}") for i in range(rng.choice([5, 20, 60]))]
    for _ in range(400):
        op = rng.random()
        if op < 0.3:  # a create (or replacement) committed
            key = rng.choice(keys)
            new = timer(key[1], now + rng.randint(-500, 6_000), next(versions))
            store.timers[key] = new
            due.written(key, new)
        elif op < 0.4:  # a cancel committed
            key = rng.choice(keys)
            store.timers.pop(key, None)
            due.written(key, None)
        elif op < 0.55:
            now += rng.randint(0, 1_500)
        elif op < 0.7:  # a read, as the scheduler's step makes it
            wanted = due.wanted(now)
            if wanted is not None:
                until, limit = wanted
                due.read(store.due(until, limit, due.after()), until, limit, now)
        elif op < 0.85:  # what is due, after reading until memory has enough
            while (wanted := due.wanted(now)) is not None:
                until, limit = wanted
                due.read(store.due(until, limit, due.after()), until, limit, now)
            room = max_in_flight - len(fired)
            expected = sorted((t for k, t in store.timers.items() if k not in fired and t.due_ms <= now),
                              key=lambda t: t.order)
            taken = due.take(now)
            assert len(taken) <= room and all(store.timers[t.key] == t for t in taken)
            if expected and room > 0:
                assert taken, f"nothing taken at {now}, {expected[0]} is due"
            dues = sorted(t.due_ms for t in taken)
            assert dues == [t.due_ms for t in expected[: len(taken)]], "not the earliest due"
            fired.update((t.key, t) for t in taken)
        elif fired:  # a firing ends
            key = rng.choice(sorted(fired))
            timer_ = fired.pop(key)
            how = rng.choice(["done", "retry", "release"])
            again = timer_._replace(due_ms=now + rng.randint(0, 4_000), attempts=1) if how == "retry" else None
            store.finish(timer_, done=how == "done", again=again)
            due.ended(timer_, finished=how == "done", again=again)
        check(due, store, fired)
