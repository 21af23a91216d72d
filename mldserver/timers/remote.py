"""Timers in a handler process (``pool/child.py``): ``self.timers`` asks the server,
and ``fire`` frames run callbacks.

``create`` checks its arguments here, where the user's modules are (the callback must
import by its name), then asks the server, which answers once the timer is committed
to the store: ``create`` returning means durable, whichever process called it::

    -> {"op":"timer_create","id":7,"req":3,"callback":"handlers.orders:remind","reference":"order-7",
        "due_ms":1763719260000,"context":{"order":7}}
    <- {"op":"reply","req":3,"error":null}
    -> {"op":"timer_cancel","id":7,"req":4,"callback":"handlers.orders:remind","reference":"order-7"}
    <- {"op":"reply","req":4,"error":null,"cancelled":true}
    -> {"op":"timer_refused","id":7,"req":5,"error":"timer 'order-7': context is 1730 bytes ..."}
    <- {"op":"reply","req":5}                      (counted as timer_create_failure)

These requests are the server's (``HandlerProcess.services``), not the call's: a
timer may be created from a shard's call, from a timer callback, or from a task the
handler started, and is answered the same way.
"""

from __future__ import annotations

from typing import Any, Awaitable, Callable

import orjson

from ..logs import EventLogger
from .api import Timers, TimerError
from .firing import call_all
from .store import Timer

Request = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]


class RemoteTimers(Timers):
    def __init__(self, request: Request, call_id: Callable[[], int], context_size: int) -> None:
        super().__init__(context_size)
        self._request = request
        self._call_id = call_id

    async def _create(self, timer: Timer) -> None:
        reply = await self._request({"op": "timer_create", "id": self._call_id(), "callback": timer.callback,
                                     "reference": timer.reference, "due_ms": timer.due_ms,
                                     "context": orjson.Fragment(timer.context)})
        if reply.get("error"):
            raise TimerError(reply["error"], retriable=bool(reply.get("retriable")))

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
