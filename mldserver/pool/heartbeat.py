"""A handler process's heartbeat and its watchdog: how the server and the process
itself learn that the process's loop stopped turning (a handler that blocks it with
``time.sleep`` or a long computation).

The loop beats by writing, into the state file the server maps (``frames.BEAT``), the
time by which it turns again at the latest: its last turn plus ``BLOCKED`` beats of
its period. The period is ``WATCH_INTERVAL`` (50 ms) while a call or a timer fire is
in flight and for ``IDLE_INTERVAL`` (1 s) after, ``IDLE_INTERVAL`` once none has been
for that long, so an idle process wakes twice a second (its beat and its watchdog), not
forty times; ``woken`` brings the short period back the moment work arrives, not at the
next idle beat::

    beat = Heartbeat(state.beat, in_flight=child.what, trim=rows_arena.trim)
    loop.create_task(beat.run())                # beats; trims the rows arena once a second
    threading.Thread(target=beat.watch, args=(1.0, threading.get_ident(), log)).start()
    child.what[7] = {...}; beat.woken()         # a call came: due in 0.2 s from now on

The server reads the due time (``Liveness.blocked``: past it, the loop is blocked, and
no shard is placed there). The watchdog thread logs ``handler_blocked`` with the loop's
stack, once per episode, when the loop is ``threshold`` seconds late past its period:
a background task that blocks an idle loop is reported up to a second later than one
that blocks a call.
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
import time
import traceback
from typing import Any, Callable

from .arena import TRIM_PERIOD
from .frames import IDLE_INTERVAL, WATCH_INTERVAL


class Heartbeat:
    """The loop's beat (``run``, a task) and its watchdog (``watch``, a thread)."""

    def __init__(self, write: Callable[[float], None], in_flight: dict[int, Any],
                 trim: Callable[[], None] | None = None) -> None:
        self._write = write  # the due time into the state file, given the period
        self._in_flight = in_flight  # call id -> what it is (the process's own map, read here)
        self._trim = trim  # once a trim period: the rows arena's unused pages back to the system
        self.last = time.monotonic()  # when the loop last turned
        self.period = WATCH_INTERVAL  # how often it beats now
        self._busy_at = float("-inf")  # when work was last seen in flight (none yet: idle)
        self._busy = asyncio.Event()  # work came: the short period again, now
        self._watch_busy = threading.Event()  # the same, for the watchdog's thread

    def woken(self) -> None:
        """A call or a fire is now in flight: if the process was idle (its long
        period), the short period starts now. (Busy, it costs one comparison.)"""
        if self.period != WATCH_INTERVAL and self._in_flight:
            self.last = self._busy_at = time.monotonic()
            self.period = WATCH_INTERVAL
            self._write(WATCH_INTERVAL)
            self._busy.set()
            self._watch_busy.set()

    async def run(self) -> None:
        """Beats while the loop runs (cancel it to stop). The long period starts only
        once nothing has been in flight for IDLE_INTERVAL: between one shard's batches
        (a few ms apart) the beat stays short, and a call costs ``woken`` nothing."""
        trim_at = time.monotonic() + TRIM_PERIOD
        while True:
            now = self.last = time.monotonic()
            if self._in_flight:
                self._busy_at = now
            self.period = WATCH_INTERVAL if now - self._busy_at < IDLE_INTERVAL else IDLE_INTERVAL
            self._write(self.period)
            if now >= trim_at and self._trim is not None:
                self._trim()
                trim_at = now + TRIM_PERIOD
            if self.period == WATCH_INTERVAL:
                await asyncio.sleep(WATCH_INTERVAL)
                continue
            self._busy.clear()
            try:
                await asyncio.wait_for(self._busy.wait(), IDLE_INTERVAL)
            except asyncio.TimeoutError:
                pass

    def watch(self, threshold: float, main: int, log: Any) -> None:
        """The watchdog thread's body: ``handler_blocked`` once per episode where the
        loop (thread ``main``) is ``threshold`` seconds late past its period."""
        warned = False
        while True:
            if self._watch_busy.wait(self.period):
                self._watch_busy.clear()
            blocked = time.monotonic() - self.last
            if blocked < threshold + self.period - WATCH_INTERVAL:
                warned = False
                continue
            if warned:
                continue
            warned = True
            frame = sys._current_frames().get(main)
            stack = "".join(traceback.format_stack(frame)) if frame is not None else ""
            log.warning("handler_blocked", pid=os.getpid(), blocked_ms=round(blocked * 1000),
                        in_flight=list(self._in_flight.values()), stack=stack,
                        what_to_do="a handler blocks its loop (and every shard of this process): "
                                   "await asyncio.to_thread(...) for blocking work")
