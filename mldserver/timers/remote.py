"""Timers in a handler process (``pool/child.py``): ``self.timers`` there, the ops on
the wire to the server, and ``fire`` frames that run callbacks.

``create`` checks its arguments here, where the user's modules are (the callback must
import by its name), and adds the timer to the call's timers (``pending.py``): no
request, no wait. They cross to the server with the call's checkpoint request and its
``done`` frame, and the server commits them before it asks the daemon for the
checkpoint, and before the action's status::

    -> {"op":"checkpoint","id":7,"req":2,"sequence_number":"49..","sub_sequence_number":0,
        "timers":[["handlers.orders:remind","order-7",1763719260000,{"order":7}], ["handlers.orders:remind","order-3"]]}
    <- {"op":"reply","req":2,"error":null}                (or "timer_error": why, "retriable": true)
    -> {"op":"done","id":7,"result":"ok",...,"timers":[...]}   (the rest, committed before the status)

A create is four items, a cancel two, in the order they were made. What is written
outside a call (a task the handler started, after its call ended), a cancel the call's
timers cannot answer (with the call's timers so far), and a timer callback's timers
once it returned, go in a request of their own, answered once committed; those asked
for in one turn of the process's loop share one request and one commit::

    -> {"op":"timer_write","id":7,"req":3,"timers":[["handlers.orders:remind","order-7"]]}
    <- {"op":"reply","req":3,"error":null,"found":[true]}     (or "error": why, "retriable": true)
    -> {"op":"timer_refused","id":7,"req":5,"error":"timer 'order-7': context is 1730 bytes ..."}
    <- {"op":"reply","req":5}                      (counted as timer_create_failure)

These requests are the server's (``HandlerProcess.services``), not the call's.
"""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable, Sequence

import orjson

from ..base.logs import EventLogger
from .api import Timers, TimerError, encode_context
from .firing import call_all
from .store import Op, Timer

Request = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]


def encode(ops: Sequence[Op]) -> list[list[Any]]:
    """The ops as they cross: ``[callback, reference, due_ms, context]`` a create,
    ``[callback, reference]`` a cancel."""
    return [[op.callback, op.reference, op.due_ms, orjson.Fragment(op.context)] if isinstance(op, Timer)
            else [op[0], op[1]] for op in ops]


def decode(items: Any, context_size: int) -> list[Op]:
    """``encode``'s list, read and checked again where it is stored; TimerError if
    anything in it is not a create or a cancel."""
    ops: list[Op] = []
    try:
        for item in items:
            if len(item) == 4:
                callback, reference, due, context = item
                ops.append(Timer(str(callback), str(reference), int(due),
                                 encode_context(context, context_size, str(reference))))
            elif len(item) == 2:
                ops.append((str(item[0]), str(item[1])))
            else:
                raise ValueError(f"{len(item)} items")
    except (TypeError, ValueError) as exc:
        raise TimerError(f"malformed timer ops: {exc}") from None
    return ops


class RemoteTimers(Timers):
    def __init__(self, request: Request, call_id: Callable[[], int], context_size: int) -> None:
        super().__init__(context_size)
        self._request = request
        self._call_id = call_id
        self._batch: list[tuple[Sequence[Op], asyncio.Future[list[bool]]]] | None = None
        self._sending: set[asyncio.Task[None]] = set()

    async def write(self, ops: Sequence[Op]) -> list[bool]:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[list[bool]] = loop.create_future()
        if self._batch is None:
            self._batch = []
            loop.call_soon(self._flush)  # once every task ready in this turn has asked
        self._batch.append((ops, future))
        return await future

    def _flush(self) -> None:
        batch, self._batch = self._batch or [], None
        task = asyncio.get_running_loop().create_task(self._send(batch))
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    async def _send(self, batch: list[tuple[Sequence[Op], asyncio.Future[list[bool]]]]) -> None:
        error: TimerError | None = None
        try:
            reply = await self._request({"op": "timer_write", "id": self._call_id(),
                                         "timers": encode([op for ops, _ in batch for op in ops])})
            if reply.get("error") or not isinstance(reply.get("found"), list):
                error = TimerError(reply.get("error") or "no answer", retriable=bool(reply.get("retriable")))
        except Exception as exc:  # noqa: BLE001  (each write gets it)
            error = TimerError(f"{type(exc).__name__}: {exc}", retriable=True)
        found = iter(reply["found"] if error is None else ())
        for ops, future in batch:
            mine = [next(found, False) for op in ops if not isinstance(op, Timer)] if error is None else []
            if future.done():
                continue  # its caller was cancelled
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(mine)

    async def _refused(self, error: str) -> None:
        await self._request({"op": "timer_refused", "id": self._call_id(), "error": error})


async def fire(frame: dict[str, Any], *, track: Callable[[Any, int], Awaitable[Any]], timers: Timers,
               timeout: float, log: EventLogger) -> dict[str, Any]:
    """Run a ``fire`` frame's callbacks; its ``done`` frame. ``track(coroutine, id)``
    awaits a callback with its id marked as running (the process's state file); each
    callback's timers are written (``timers.write``) before it counts as done."""
    entries = frame["timers"]
    ids = [entry[0] for entry in entries]

    async def tracked(coro: Any, i: int) -> Any:
        return await track(coro, ids[i])

    results = await call_all([(entry[1], entry[3]) for entry in entries], timeout, wrap=tracked, log=log,
                             write=timers.write)
    return {"op": "done", "id": frame["id"], "result": "ok",
            "fired": [None if r.ok else [r.error, r.traceback] for r in results]}
