"""Timer callbacks fired in a handler process of the pool (``workers`` >= 1): the
``Firing`` the scheduler uses there (``timers/firing.py`` says what a firing is and
holds ``LoopFiring``, for ``workers = 0``). A batch of due timers goes to the live
process with the fewest calls in flight as one ``fire`` frame, answered by one
``done``::

    firing = PoolFiring(pool, settings.execution_timeout, log)
    results = await firing.fire([timer_a, timer_b])
    -> {"op":"fire","id":90,"timers":[[91,"handlers.orders:remind","order-7",{"order":7}], ...]}
    <- {"op":"done","id":90,"result":"ok","fired":[null, ["ValueError: no such order","Traceback ..."]]}

A callback that blocks the process's loop past ``execution_timeout`` (plus
``BLOCK_SLACK``) is found by its id in the process's state file, logged
``handler_timed_out`` with the stack, and its process killed (the pool replaces it);
the other timers of the batch come back uncounted (redone, not a failed attempt).
"""

from __future__ import annotations

import asyncio
from typing import Any, Sequence

import orjson

from ..base.logs import EventLogger
from ..timers.firing import BLOCK_SLACK, OK, Result, timed_out
from ..timers.store import Timer
from .pool import HandlerPool
from .process import HandlerProcess, ProcessDied


async def _no_requests(message: dict[str, Any]) -> dict[str, Any]:
    return {"error": f"unknown request {message.get('op')!r} during timer callbacks"}


class PoolFiring:
    """The callbacks run in a handler process of ``pool``."""

    def __init__(self, pool: HandlerPool, timeout: float, log: EventLogger) -> None:
        self.pool = pool
        self.timeout = timeout
        self.log = log

    async def fire(self, timers: Sequence[Timer]) -> list[Result]:
        proc = await self.pool.any_process()
        ids = [next(self.pool.call_ids) for _ in timers]
        frame = {"op": "fire", "id": next(self.pool.call_ids),
                 "timers": [[i, t.callback, t.reference, orjson.Fragment(t.context)] for i, t in zip(ids, timers)]}
        what = ("(timers)", f"{len(timers)} timer callbacks")
        proc.life.acting.add(frame["id"])  # (a retiring process is not stopped before the call is in flight)
        call = asyncio.ensure_future(proc.call(frame, b"", _no_requests, what))
        blamed: int | None = None
        try:
            while True:
                await asyncio.wait({call}, timeout=self.timeout + BLOCK_SLACK)
                if call.done():
                    break
                running = proc.running()
                if not proc.alive or running == 0 or running not in ids:
                    continue  # another call blocks the loop (its owner's time-out kills it), or it just ended
                blamed = running
                await self._kill(proc, timers[ids.index(running)], running)
            message, _ = call.result()
        except ProcessDied as exc:
            if proc.alive or not proc.life.died.is_set():
                try:
                    async with asyncio.timeout(5):
                        await proc.life.died.wait()  # a broken pipe may come before the reader sees the death
                except TimeoutError:
                    pass
            culprit = blamed if blamed is not None else proc.life.last_running
            results = []
            for i in ids:
                if i == blamed:
                    results.append(Result(False, f"{timed_out(self.timeout)}: its process was killed"))
                elif i == culprit:
                    results.append(Result(False, str(exc)))  # it was running when the process died
                else:
                    results.append(Result(False, str(exc), counted=False))
            return results
        finally:
            proc.life.acting.discard(frame["id"])
            if not call.done():
                call.cancel()
            del call  # (no cycle through its error's traceback: ``HandlerProcess.call``)
        return [OK if r is None else Result(False, r[0], r[1]) for r in message["fired"]]

    async def _kill(self, proc: HandlerProcess, timer: Timer, call_id: int) -> None:
        stack = await proc.kill_for(call_id, ("(timers)", timer.callback))
        self.log.error("handler_timed_out", callback=timer.callback, reference=timer.reference, pid=proc.pid,
                       timeout_s=self.timeout, stack=stack,
                       what_to_do="the timer callback blocks its process's loop; the process is replaced and the "
                                  "timer retried: await asyncio.to_thread(...) for blocking work")
