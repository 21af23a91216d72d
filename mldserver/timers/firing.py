"""Calling the callbacks of due timers: in a handler process of the pool
(``PoolFiring``), or in the server's loop with ``workers = 0`` (``LoopFiring``). The
scheduler hands over a batch and gets one :class:`Result` per timer, in order::

    results = await firing.fire([timer_a, timer_b])
    # [Result(ok=True), Result(ok=False, error="ValueError: no such order", traceback="...")]

A firing is not tied to a shard: a timer outlives the lease of the shard that created
it (the shard may be on another server by then, or gone), its callback is a module
function that needs no handler instance, and a timer due while the server was down
fires before any shard connects. So a batch goes to the live handler process with the
fewest calls in flight, as one ``fire`` frame answered by one ``done`` frame::

    -> {"op":"fire","id":90,"timers":[[91,"handlers.orders:remind","order-7",{"order":7}], ...]}
    <- {"op":"done","id":90,"result":"ok","fired":[null, ["ValueError: no such order","Traceback ..."]]}

Each callback has the execution time-out (``execution_timeout``), counted from the
batch's start:

- one that awaits past it is cancelled in the handler process and fails with
  ``timed out after ... (execution_timeout)``;
- one that blocks its process's loop past it (plus ``BLOCK_SLACK``): the server finds
  it by its id in the process's state file, logs ``handler_timed_out`` with the
  stack, kills the process (the pool replaces it) and fails that timer only; the
  others of the batch are handed back uncounted (``counted=False``: redone, not a
  failed attempt), as are those of a process that dies under another call.

A failed result is an attempt: the scheduler retries it with backoff, then
dead-letters it.
"""

from __future__ import annotations

import asyncio
import contextvars
import traceback
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, Sequence

import orjson

from ..logs import EventLogger
from .api import Timers, TimerError, current, resolve
from .store import Timer

if TYPE_CHECKING:
    from ..pool.pool import HandlerPool
    from ..pool.process import HandlerProcess

GRACE_CAP = 1.0  # a cancelled callback gets this long to end before it is abandoned
BLOCK_SLACK = 1.0  # past execution_timeout, the process's own time-out has had its chance


class Result(NamedTuple):
    ok: bool
    error: str | None = None
    traceback: str | None = None
    counted: bool = True  # False: not called to its end through no fault of its own (redo it)


OK = Result(True)


class Firing(Protocol):
    async def fire(self, timers: Sequence[Timer]) -> list[Result]: ...


def timed_out(timeout: float) -> str:
    return f"timed out after {timeout} s (execution_timeout)"


async def call_all(calls: Sequence[tuple[str, Any]], timeout: float, *, wrap: Any = None,
                   log: EventLogger | None = None) -> list[Result]:
    """Call each ``(callback name, context)`` concurrently, each in its own task, all
    within ``timeout``; ``wrap(coroutine, index)`` may wrap each call (the handler
    process marks which one runs). What both the server's loop and a handler process
    run."""
    loop = asyncio.get_running_loop()
    results: list[Result | None] = [None] * len(calls)
    tasks: dict[asyncio.Task[Any], int] = {}
    for i, (name, context) in enumerate(calls):
        try:
            coro = resolve(name)(context)
        except TimerError as exc:
            results[i] = Result(False, str(exc))
            continue
        except Exception as exc:  # calling it raised before it could be awaited
            results[i] = Result(False, f"{type(exc).__name__}: {exc}", traceback.format_exc())
            continue
        tasks[loop.create_task(wrap(coro, i) if wrap is not None else coro)] = i
    if tasks:
        _, pending = await asyncio.wait(tasks, timeout=timeout)
        for task in pending:
            task.cancel()
            results[tasks[task]] = Result(False, timed_out(timeout))
        if pending:
            _, stuck = await asyncio.wait(pending, timeout=min(GRACE_CAP, max(timeout / 2, 0.05)))
            for task in stuck:
                task.add_done_callback(_retrieve)
                results[tasks[task]] = Result(False, f"abandoned: still running after its time-out ({timeout} s) "
                                                     f"cancelled it; it swallows asyncio.CancelledError")
                if log is not None:
                    log.error("timer_callback_stuck", callback=calls[tasks[task]][0], timeout_s=timeout,
                              what_to_do="let asyncio.CancelledError propagate (re-raise it) in the callback")
        for task, i in tasks.items():
            if results[i] is not None:
                if task.done() and not task.cancelled():
                    task.exception()  # retrieved: the time-out is what counts
                continue
            if task.cancelled():
                results[i] = Result(False, "CancelledError: raised by the callback (a cancelled task inside it?)")
            elif (exc := task.exception()) is not None:
                results[i] = Result(False, f"{type(exc).__name__}: {exc}",
                                    "".join(traceback.format_exception(exc)))
            else:
                results[i] = OK
    return results  # type: ignore[return-value]


def _retrieve(task: asyncio.Task[Any]) -> None:
    if not task.cancelled():
        task.exception()


class LoopFiring:
    """``workers = 0``: the callbacks run in the server's own loop (a callback that
    blocks blocks the server, as a handler does there)."""

    def __init__(self, timers: Timers, timeout: float, log: EventLogger) -> None:
        self.timers = timers
        self.timeout = timeout
        self.log = log

    async def fire(self, timers: Sequence[Timer]) -> list[Result]:
        context = contextvars.copy_context()
        context.run(current.set, self.timers)  # timers.create / cancel inside a callback
        calls = [(t.callback, orjson.loads(t.context)) for t in timers]
        task = asyncio.get_running_loop().create_task(call_all(calls, self.timeout, log=self.log), context=context)
        return await task


async def _no_requests(message: dict[str, Any]) -> dict[str, Any]:
    return {"error": f"unknown request {message.get('op')!r} during timer callbacks"}


class PoolFiring:
    """The callbacks run in a handler process of ``pool``."""

    def __init__(self, pool: "HandlerPool", timeout: float, log: EventLogger) -> None:
        self.pool = pool
        self.timeout = timeout
        self.log = log

    async def fire(self, timers: Sequence[Timer]) -> list[Result]:
        from ..pool.process import ProcessDied

        proc = await self.pool.any_process()
        ids = [next(self.pool.call_ids) for _ in timers]
        frame = {"op": "fire", "id": next(self.pool.call_ids),
                 "timers": [[i, t.callback, t.reference, orjson.Fragment(t.context)] for i, t in zip(ids, timers)]}
        what = ("(timers)", f"{len(timers)} timer callbacks")
        call = asyncio.ensure_future(proc.call(frame, b"", _no_requests, what))
        blamed: int | None = None
        try:
            while True:
                done, _ = await asyncio.wait({call}, timeout=self.timeout + BLOCK_SLACK)
                if done:
                    break
                running = proc.running()
                if not proc.alive or running == 0 or running not in ids:
                    continue  # another call blocks the loop (its owner's time-out kills it), or it just ended
                blamed = running
                await self._kill(proc, timers[ids.index(running)], running)
            message, _ = call.result()
        except ProcessDied as exc:
            if proc.alive or not proc.died.is_set():
                try:
                    async with asyncio.timeout(5):
                        await proc.died.wait()  # a broken pipe may come before the reader sees the death
                except TimeoutError:
                    pass
            culprit = blamed if blamed is not None else proc.last_running
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
            if not call.done():
                call.cancel()
        return [OK if r is None else Result(False, r[0], r[1]) for r in message["fired"]]

    async def _kill(self, proc: "HandlerProcess", timer: Timer, call_id: int) -> None:
        stack = await proc.kill_for(call_id, ("(timers)", timer.callback))
        self.log.error("handler_timed_out", callback=timer.callback, reference=timer.reference, pid=proc.pid,
                       timeout_s=self.timeout, stack=stack,
                       what_to_do="the timer callback blocks its process's loop; the process is replaced and the "
                                  "timer retried: await asyncio.to_thread(...) for blocking work")
