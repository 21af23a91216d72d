"""Whose turn it is to run Python in a handler process: the shards' threads take turns
while their processors compute, and never wait for one that blocks::

    turns = Turns()                 # one per process (``TURNS``)
    with turns.turn():              # in a shard's thread, around its processor's call
        processor.process_records(process_records_input)

Threads that all compute at once share one GIL: each runs in 5 ms slices, every batch
in flight is parsed and alive at the same time, and the hand-overs cost CPU (taking
turns nearly doubled the records/s of amazon_kclpy's sample at 16 shards, with less
memory: docs/performance.md). So a thread waits for its turn, first come first
served, while the threads that have one compute; it does not wait:

- for a thread that stopped computing (``time.sleep``, a socket, a checkpoint's round
  trip with the daemon, waiting for the GIL): its CPU clock (``pthread_getcpuclockid``)
  has not moved over the last poll, so the next thread goes in at once beside it. A
  thread the system left waiting for a core (a loaded machine) has not moved either,
  but it is runnable (``R`` in ``/proc/self/task/<tid>/stat``), not asleep: it still
  computes. Nor is a window judged when the look at it came late (more than a window
  after the last): the process itself waited for a core, and a computing thread that
  waited meanwhile for the GIL (asleep, its clock still) would pass for a blocked one;
- longer than ``patience`` (0.1 s) for a thread that computes: a long batch, or one
  spinning until ``execution_timeout`` stops it, is then shared with as before.

The first thread in line polls the others' clocks every ``poll`` (5 ms); the rest
sleep until it goes in. A turn is per call, not per shard.
"""

from __future__ import annotations

import collections
import contextlib
import threading
import time
from typing import Iterator

from ...errors import ExecutionTimeout


class Turns:
    def __init__(self, *, poll: float = 0.005, window: float = 0.02, patience: float = 0.1) -> None:
        self.poll = poll
        self.window = window
        self.patience = patience
        self._cond = threading.Condition()
        self._line: collections.deque[int] = collections.deque()  # waiting threads, first come first
        self._holders: dict[int, list[float]] = {}  # thread id -> [clock id, its CPU s, when read, since]
        self._judged = 0.0  # when the first in line last looked (``_computing``)

    @contextlib.contextmanager
    def turn(self) -> Iterator[None]:
        me = threading.get_ident()
        self._enter(me)
        try:
            yield
        finally:
            while True:
                try:
                    with self._cond:
                        self._holders.pop(me, None)
                        self._cond.notify_all()
                    break
                except ExecutionTimeout:  # (a stop that landed here: the call is over all the same)
                    continue

    def _enter(self, me: int) -> None:
        with self._cond:
            self._line.append(me)
            try:
                while not (self._line[0] == me and not self._computing()):
                    self._cond.wait(self.poll if self._line[0] == me else None)
                clock = time.pthread_getcpuclockid(me)
                now = time.monotonic()
                self._holders[me] = [clock, time.clock_gettime(clock), now, now, threading.get_native_id()]
            finally:  # in, or stopped while in line: out of the line either way
                self._line.remove(me)
                self._cond.notify_all()  # the next in line polls now

    def _computing(self) -> bool:
        """Is a thread computing in a turn it has had for less than ``patience``: has it
        used a tenth of the time since its clock was last read, over ``window`` at least
        (a thread that computes may wait for the GIL a few slices; one that blocks uses
        none), or is it waiting for a core?"""
        now = time.monotonic()
        late, self._judged = now - self._judged > self.window, now
        busy = False
        for held in self._holders.values():  # [clock id, its CPU s, when read, when its turn began, tid]
            if now - held[3] >= self.patience:
                continue  # had its turn: shared from now on
            if now - held[2] < self.window:
                busy = True  # too soon to tell
                continue
            cpu = time.clock_gettime(int(held[0]))
            if late:  # this look came a window late: the process waited for a core (or the GIL's
                busy = True  # holder did), and a thread's clock says nothing of it: judged afresh
                held[1], held[2] = cpu, now
                continue
            if cpu - held[1] >= 0.1 * (now - held[2]) or runnable(int(held[4])):
                busy = True
            held[1], held[2] = cpu, now
        return busy


def runnable(tid: int) -> bool:
    """Is thread ``tid`` of this process running or waiting for a core (state ``R``), not
    asleep? False where ``/proc`` cannot tell."""
    try:
        with open(f"/proc/self/task/{tid}/stat", "rb") as f:
            return f.read().rpartition(b")")[2][1:2] == b"R"
    except OSError:
        return False


class NoTurns:
    """Where a thread's CPU clock cannot be read (``pthread_getcpuclockid``: not macOS):
    every thread runs at once, as threads do."""

    @contextlib.contextmanager
    def turn(self) -> Iterator[None]:
        yield


TURNS = Turns() if hasattr(time, "pthread_getcpuclockid") else NoTurns()  # the process's
