"""Calling the callbacks of due timers: in a handler process of the pool
(``pool/firing.py``'s ``PoolFiring``), or in the server's loop with ``workers = 0``
(``LoopFiring``, here). The
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

A callback's timers (``timers.create`` inside it: ``pending.py``) are written in one
commit once it returned, before its result is ok; a write that fails fails it.

A failed result is an attempt: the scheduler retries it with backoff, then
dead-letters it.
"""

from __future__ import annotations

import asyncio
import contextvars
import traceback
from typing import Any, NamedTuple, Protocol, Sequence

import orjson

from ..base.logs import EventLogger
from . import pending as timer_ops
from .api import Timers, TimerError, current, resolve
from .pending import Pending, Write
from .store import Timer

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
                   log: EventLogger | None = None, write: Write | None = None) -> list[Result]:
    """Call each ``(callback name, context)`` concurrently, each in its own task, all
    within ``timeout``; ``wrap(coroutine, index)`` may wrap each call (the handler
    process marks which one runs). A callback's timers (``pending.py``) are written
    with ``write`` (``Timers.write``) once it returned, before it counts as done: a
    write that fails fails the callback. What both the server's loop and a handler
    process run."""
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
        if wrap is not None:
            coro = wrap(coro, i)
        tasks[loop.create_task(_durable(coro, write) if write is not None else coro)] = i
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


async def _durable(coro: Any, write: Write) -> Any:
    """Await a callback with timers of its own, then write them (in its task: the
    timers it creates, and its tasks', are its)."""
    call = Pending(write)
    timer_ops.current.set(call)
    try:
        result = await coro
    finally:
        ops = call.close()
    if call.failed is not None:
        raise call.failed  # a cancel's write failed, and the callback went on
    if ops:
        await write(ops)
    return result


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
        task = asyncio.get_running_loop().create_task(call_all(calls, self.timeout, log=self.log,
                                                               write=self.timers.write), context=context)
        return await task
