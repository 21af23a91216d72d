"""Pause and resume (``POST /pause``, ``POST /resume``): one gate every shard worker
passes before its next action calls the handler.

Paused, actions under way finish; the next action of every shard waits at the gate
before its handler is called (its status is not sent, so the daemon simply waits and
leases stay held). While a batch waits, the worker still checkpoints what the sink has
committed (``meanwhile``), so windows closed before the pause commit and checkpoints
advance. Resume opens the gate: each waiting action goes on exactly where it stopped::

    pause = Pause()
    pause.pause()                                   # True (False: already paused)
    await pause.wait(every=1.0, meanwhile=checkpoint_committed, stop=aborted)
    pause.resume()                                  # every waiting worker goes on
"""

from __future__ import annotations

import asyncio
import time
from typing import Awaitable, Callable


class Pause:
    def __init__(self) -> None:
        self._open = asyncio.Event()
        self._open.set()
        self.since: float | None = None  # epoch seconds of the pause, while paused
        self.waiting = 0  # actions held at the gate

    @property
    def paused(self) -> bool:
        return not self._open.is_set()

    def pause(self) -> bool:
        if self.paused:
            return False
        self._open.clear()
        self.since = time.time()
        return True

    def resume(self) -> bool:
        if not self.paused:
            return False
        self._open.set()
        self.since = None
        return True

    async def wait(
        self,
        *,
        every: float,
        meanwhile: Callable[[], Awaitable[None]] | None = None,
        stop: asyncio.Event | None = None,
    ) -> None:
        """Return once resumed (at once if not paused) or ``stop`` is set; every
        ``every`` seconds meanwhile, await ``meanwhile()``."""
        if not self.paused:
            return
        self.waiting += 1
        try:
            while self.paused and not (stop is not None and stop.is_set()):
                waits = [asyncio.ensure_future(self._open.wait())]
                if stop is not None:
                    waits.append(asyncio.ensure_future(stop.wait()))
                try:
                    done, _ = await asyncio.wait(waits, timeout=every, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    for w in waits:
                        w.cancel()
                if not done and meanwhile is not None:
                    await meanwhile()
        finally:
            self.waiting -= 1
