"""Timers in a handler process (``pool/child.py``): ``self.timers`` asks the server,
and ``fire`` frames run callbacks.

``create`` checks its arguments here, where the user's modules are (the callback must
import by its name), then asks the server, which answers once the timer is committed
to the store: ``create`` returning means durable, whichever process called it::

    -> {"op":"timer_create","id":7,"req":3,"timers":[["handlers.orders:remind","order-7",1763719260000,
                                                      {"order":7}], ...]}
    <- {"op":"reply","req":3,"errors":[null, ...]}       (or ["why", retriable] for one not stored)
    -> {"op":"timer_cancel","id":7,"req":4,"callback":"handlers.orders:remind","reference":"order-7"}
    <- {"op":"reply","req":4,"error":null,"cancelled":true}
    -> {"op":"timer_refused","id":7,"req":5,"error":"timer 'order-7': context is 1730 bytes ..."}
    <- {"op":"reply","req":5}                      (counted as timer_create_failure)

The creates asked for in one turn of the process's loop (a batch's, gathered) go in
one request, and the server stores them in one commit; a create awaited on its own
goes alone. These requests are the server's (``HandlerProcess.services``), not the call's: a
timer may be created from a shard's call, from a timer callback, or from a task the
handler started, and is answered the same way.
"""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable

import orjson

from ..base.logs import EventLogger
from .api import Timers, TimerError
from .firing import call_all
from .store import Timer

Request = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]


class RemoteTimers(Timers):
    def __init__(self, request: Request, call_id: Callable[[], int], context_size: int) -> None:
        super().__init__(context_size)
        self._request = request
        self._call_id = call_id
        self._batch: list[tuple[Timer, asyncio.Future[None]]] | None = None
        self._sending: set[asyncio.Task[None]] = set()

    async def _create(self, timer: Timer) -> None:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        if self._batch is None:
            self._batch = []
            loop.call_soon(self._flush)  # once every task ready in this turn has asked
        self._batch.append((timer, future))
        await future

    def _flush(self) -> None:
        batch, self._batch = self._batch or [], None
        task = asyncio.get_running_loop().create_task(self._send(batch))
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    async def _send(self, batch: list[tuple[Timer, asyncio.Future[None]]]) -> None:
        try:
            reply = await self._request({"op": "timer_create", "id": self._call_id(), "timers": [
                [t.callback, t.reference, t.due_ms, orjson.Fragment(t.context)] for t, _ in batch]})
            errors = reply.get("errors") or [[reply.get("error") or "no answer", False]] * len(batch)
        except Exception as exc:  # noqa: BLE001  (each create gets it)
            errors = [[f"{type(exc).__name__}: {exc}", True]] * len(batch)
        for (_, future), error in zip(batch, errors):
            if future.done():
                continue  # its caller was cancelled
            if error:
                future.set_exception(TimerError(error[0], retriable=bool(error[1])))
            else:
                future.set_result(None)

    async def _cancel(self, callback: str, reference: str) -> bool:
        reply = await self._request({"op": "timer_cancel", "id": self._call_id(), "callback": callback,
                                     "reference": reference})
        if reply.get("error"):
            raise TimerError(reply["error"], retriable=bool(reply.get("retriable")))
        return bool(reply.get("cancelled"))

    async def _refused(self, error: str) -> None:
        await self._request({"op": "timer_refused", "id": self._call_id(), "error": error})


async def fire(frame: dict[str, Any], *, track: Callable[[Any, int], Awaitable[Any]], timeout: float,
               log: EventLogger) -> dict[str, Any]:
    """Run a ``fire`` frame's callbacks; its ``done`` frame. ``track(coroutine, id)``
    awaits a callback with its id marked as running (the process's state file)."""
    entries = frame["timers"]
    ids = [entry[0] for entry in entries]

    async def tracked(coro: Any, i: int) -> Any:
        return await track(coro, ids[i])

    results = await call_all([(entry[1], entry[3]) for entry in entries], timeout, wrap=tracked, log=log)
    return {"op": "done", "id": frame["id"], "result": "ok",
            "fired": [None if r.ok else [r.error, r.traceback] for r in results]}
