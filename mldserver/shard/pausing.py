"""Pause and resume (``POST /pause``, ``POST /resume``): one gate every shard driver
passes before its next action calls the handler.

Paused, actions under way finish; the next action of every shard waits at the gate
before its handler is called (its status is not sent, so the daemon simply waits and
leases stay held). While a batch waits, the driver still checkpoints what the sink has
committed (``meanwhile``), so windows closed before the pause commit and checkpoints
advance. Resume opens the gate: each waiting action goes on exactly where it stopped::

    pause = Pause()
    pause.pause()                                   # True (False: already paused)
    await pause.wait(every=1.0, meanwhile=checkpoint_committed, stop=aborted)  # once resumed
    await pause.hold("processRecords", log, meanwhile=checkpoint_committed, stop=aborted)
    #   the same for one shard's action (every PAUSED_CHECKPOINT_S), logged: paused_action, resumed_action
    pause.resume()                                  # every waiting shard goes on
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Awaitable, Callable

if TYPE_CHECKING:
    from ..base.logs import EventLogger

# Paused, a batch waiting at the gate checkpoints what the sink committed this often.
PAUSED_CHECKPOINT_S = 1.0


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

    async def hold(self, action: str, log: EventLogger, *, meanwhile: Callable[[], Awaitable[None]] | None,
                   stop: asyncio.Event) -> None:
        """One shard's ``action`` waits here before its handler call (the daemon waits
        for its status), logged as ``paused_action`` then ``resumed_action``; a batch
        meanwhile checkpoints what the sink commits, every ``PAUSED_CHECKPOINT_S``."""
        log.info("paused_action", action=action)
        await self.wait(every=PAUSED_CHECKPOINT_S, meanwhile=meanwhile, stop=stop)
        log.info("resumed_action", action=action)
