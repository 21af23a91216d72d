"""Turns in a handler process: a shard's thread that computes keeps the others waiting
(first come, first served) until its call ends, or for ``patience`` at most; one that
blocks (no CPU used) lets the next in at once."""

from __future__ import annotations

import threading
import time

from mldserver.api.kclpy.turns import Turns

from ..harness import eventually


class Holder:
    """A thread that takes a turn, then computes or blocks until told to stop."""

    def __init__(self, turns: Turns, how: str) -> None:
        self.turns, self.how = turns, how
        self.inside = threading.Event()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        with self.turns.turn():
            self.inside.set()
            if self.how == "compute":
                while not self.stop.is_set():
                    pass
            else:
                self.stop.wait(30)  # blocked: no CPU

    def cpu(self) -> float:
        return time.clock_gettime(time.pthread_getcpuclockid(self.thread.ident))

    def end(self) -> None:
        self.stop.set()
        self.thread.join(10)


async def test_a_thread_that_computes_keeps_the_next_waiting_until_its_call_ends():
    turns = Turns(patience=60)
    a = Holder(turns, "compute")
    await eventually(a.inside.is_set, what="a's turn")
    b = Holder(turns, "compute")
    await eventually(lambda: turns._line, what="b in line")
    start = a.cpu()
    # (0.2 s of a's CPU: on a loaded machine, with the cores shared, that may take many
    # times as long on the clock; the bound is only how long before the test gives up)
    await eventually(lambda: a.cpu() - start > 10 * turns.window, timeout=120, what="a computing for ten windows")
    assert not b.inside.is_set()
    a.end()
    await eventually(b.inside.is_set, what="b's turn once a's ended")
    b.end()


async def test_a_thread_that_blocks_lets_the_next_in_at_once():
    turns = Turns(patience=60)
    a = Holder(turns, "block")
    await eventually(a.inside.is_set, what="a's turn")
    b = Holder(turns, "compute")
    await eventually(b.inside.is_set, what="b's turn while a blocks")
    assert a.thread.is_alive()
    b.end()
    a.end()


async def test_a_thread_that_computes_past_its_patience_shares_its_turn():
    turns = Turns(patience=0.05)
    a = Holder(turns, "compute")
    await eventually(a.inside.is_set, what="a's turn")
    b = Holder(turns, "compute")
    await eventually(b.inside.is_set, what="b's turn beside a's, past a's patience")
    assert a.thread.is_alive() and not a.stop.is_set()
    a.end()
    b.end()


async def test_threads_in_line_go_in_first_come_first_served():
    turns = Turns(patience=60)
    order = []

    def take(i):
        with turns.turn():
            order.append(i)

    first = Holder(turns, "compute")
    await eventually(first.inside.is_set, what="the first turn")
    threads = []
    for i in range(8):
        threads.append(threading.Thread(target=take, args=(i,)))
        threads[-1].start()
        await eventually(lambda: len(turns._line) == i + 1, what=f"thread {i} in line")
    first.end()
    for t in threads:
        t.join(10)
    assert order == list(range(8)) and turns._holders == {} and not turns._line


async def test_a_thread_is_runnable_while_it_computes_and_not_while_it_sleeps():
    # (what keeps a computing thread's turn on a loaded machine, where its CPU clock
    # barely moves while it waits for a core)
    from mldserver.api.kclpy.turns import runnable

    computing, blocked = Holder(Turns(), "compute"), Holder(Turns(), "block")
    await eventually(lambda: computing.inside.is_set() and blocked.inside.is_set(), what="both in their turns")
    await eventually(lambda: runnable(computing.thread.native_id), what="the computing thread runnable")
    # (``inside`` is set just before the blocked thread's wait begins: it may still be
    # running a moment; once asleep, it stays asleep)
    await eventually(lambda: not runnable(blocked.thread.native_id), what="the blocked thread asleep")
    assert not any(runnable(blocked.thread.native_id) for _ in range(50))
    computing.end()
    blocked.end()
