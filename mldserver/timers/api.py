"""What handlers and timer callbacks call: ``create`` and ``cancel`` (Couchbase
Eventing's ``createTimer`` and ``cancelTimer``), and the checks every argument goes
through before anything is stored::

    from datetime import datetime, timedelta, timezone
    import mldserver
    from mldserver import timers

    async def remind(context):                      # module level, async: stored by name
        await send_reminder(context["order"])
        await timers.create(remind, context["next"], f"order-{context['order']}", {...})  # re-arm

    class Orders(mldserver.Handler):
        async def process_records(self, batch, checkpointer):
            for record in batch.records:
                order = json.loads(record.data)
                at = datetime.now(timezone.utc) + timedelta(hours=1)
                await self.timers.create(remind, at, f"order-{order['id']}", {"order": order["id"]})
            ...

- ``callback``: a module-level ``async def`` (or its ``"module:function"`` name). It
  is stored by name and found again by importing it, in whichever handler process
  fires it, after any restart; it is called as ``await callback(context)``.
- ``at``: an aware ``datetime`` or epoch seconds (int or float); in the past means as
  soon as possible. A naive datetime is refused (which time zone?).
- ``reference``: a non-empty string; with the callback it names the timer: the same
  pair again replaces the timer (its time and context), ``cancel`` removes it.
- ``context``: anything JSON (as orjson encodes it), at most ``timer_context_size``
  bytes once encoded (1 KiB by default); the callback gets it back decoded.

``create`` checks the timer at once and adds it to the call's timers (``pending.py``),
without waiting for the store: the timers a call creates become durable together, in
one commit, before any checkpoint it asks for and before its action's status, so a
record checkpointed after a create never loses its timer. A call that fails loses
them with it, as it loses its records not yet checkpointed: the action is redone and
creates them again; a commit that fails fails the call (retried, then dead-lettered).
Outside a call (a task the handler started that outlives its call), ``create`` and
``cancel`` return once written. Mistakes raise :class:`TimerError` at once, naming the
timer, what was wrong and what to do, and count as ``timer_create_failure``::

    TimerError: timer 'order-7': context is 1730 bytes of JSON, over timer_context_size
    (1024 bytes): keep a key in it and look the rest up in the callback, or raise
    timer_context_size

``Timers`` is the object handlers reach as ``self.timers``; its ``write`` makes
creates and cancels durable in one commit: the server's (``scheduler.LocalTimers``)
stores directly, a handler process's (``remote.RemoteTimers``) asks the server, which
answers once it has committed. In a timer callback, which has no ``self``, the module
functions ``timers.create`` and ``timers.cancel`` reach the same object (``current``).
"""

from __future__ import annotations

import inspect
import math
from contextvars import ContextVar
from datetime import datetime, timedelta, timezone
from typing import Any, Awaitable, Callable, Sequence

import orjson

from ..errors import ConfigError, MldserverError
from ..base.importer import import_from_string
from .pending import pending
from .store import Op, Timer

MAX_AT_S = 253_402_300_799  # 9999-12-31T23:59:59Z
MAX_NAME_BYTES = 1024  # a reference, a callback name (a DynamoDB key holds both, at most 2048 bytes)
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_US = timedelta(microseconds=1)

Callback = Callable[[Any], Awaitable[Any]]


class TimerError(MldserverError):
    """A timer that cannot be created or cancelled. ``retriable``: the store failed
    (a full disk, DynamoDB unreachable), trying again later may work; else the
    arguments are wrong."""

    def __init__(self, message: str, *, retriable: bool = False) -> None:
        super().__init__(message)
        self.retriable = retriable


# -- the arguments -------------------------------------------------------------------

_names: dict[Any, str] = {}  # callback function -> its checked name
_resolved: dict[str, Callback] = {}  # name -> the function it imports to


def resolve(name: str) -> Callback:
    """The async function ``name`` (``module:function``) imports to, or TimerError."""
    fn = _resolved.get(name)
    if fn is not None:
        return fn
    try:
        fn = import_from_string(name, "timer callback")
    except ConfigError as exc:
        raise TimerError(f"timer callback {name!r} cannot be found by its name: {exc}") from None
    if not inspect.iscoroutinefunction(fn):
        raise TimerError(f"timer callback {name!r} must be an async function (`async def`): it is called as "
                         f"`await callback(context)`")
    _resolved[name] = fn
    return fn


def callback_name(callback: Any) -> str:
    """The name a callback is stored under, checked: it must be found again by it."""
    if isinstance(callback, str):
        _check_length("callback", callback)
        resolve(callback)
        return callback
    name = _names.get(callback) if _hashable(callback) else None
    if name is not None:
        return name
    module = getattr(callback, "__module__", None)
    qualname = getattr(callback, "__qualname__", None)
    what = f"{module}.{qualname}" if module and qualname else repr(callback)
    if not inspect.iscoroutinefunction(callback):
        raise TimerError(f"timer callback {what} must be an async function (`async def`) at the top level of "
                         f"a module: it is called as `await callback(context)`")
    if not module or not qualname or "." in qualname or "<" in qualname:
        raise TimerError(f"timer callback {what} must be defined at the top level of its module: it is stored "
                         f"by name (module:function) and found again after a restart, where no object or "
                         f"closure of today is left")
    if module == "__main__":
        raise TimerError(f"timer callback {what} lives in __main__, which a handler process cannot import: "
                         f"move it into a module")
    name = f"{module}:{qualname}"
    if resolve(name) is not callback:
        raise TimerError(f"timer callback {what}: {name} names another object (was the function redefined, or "
                         f"decorated without functools.wraps?): the timer would call that one")
    _check_length("callback", name)
    _names[callback] = name
    return name


def due_ms(at: Any, reference: str = "") -> int:
    """``at`` as epoch milliseconds, rounded up: a timer never fires before ``at``."""
    where = f"timer {reference!r}: " if reference else ""
    if isinstance(at, datetime):
        if at.tzinfo is None or at.utcoffset() is None:
            raise TimerError(f"{where}at = {at!r} is a naive datetime: say which time zone, as in "
                             f"datetime.now(timezone.utc) + timedelta(minutes=5), or give epoch seconds")
        us = (at - _EPOCH) // _US
        seconds: float = us / 1e6
        ms = -(-us // 1000)
    elif isinstance(at, (int, float)) and not isinstance(at, bool):
        seconds = at
        ms = math.ceil(at * 1000) if math.isfinite(at) else 0
    else:
        raise TimerError(f"{where}at must be a datetime or epoch seconds (int or float), got "
                         f"{type(at).__name__} {at!r:.80}")
    if not (isinstance(seconds, int) or math.isfinite(seconds)) or not 0 <= seconds <= MAX_AT_S:
        raise TimerError(f"{where}at = {at!r:.80} is out of range: give a time between 1970 and 9999 "
                         f"(epoch seconds 0 to {MAX_AT_S})")
    return ms


def check_reference(reference: Any) -> str:
    if not isinstance(reference, str) or not reference:
        raise TimerError(f"a timer's reference must be a non-empty string (it names the timer with its "
                         f"callback), got {reference!r:.80}")
    _check_length("reference", reference)
    return reference


def encode_context(context: Any, cap: int, reference: str = "") -> bytes:
    """The context as the JSON the store keeps, at most ``cap`` bytes."""
    try:
        data = orjson.dumps(context)
    except TypeError as exc:
        raise TimerError(f"timer {reference!r}: context is not JSON ({exc}): give dicts with string keys, lists, "
                         f"strings, numbers, booleans or None") from None
    if len(data) > cap:
        raise TimerError(f"timer {reference!r}: context is {len(data)} bytes of JSON, over timer_context_size "
                         f"({cap} bytes): keep a key in it and look the rest up in the callback, or raise "
                         f"timer_context_size")
    return data


def prepare(callback: Any, at: Any, reference: Any, context: Any, cap: int) -> Timer:
    """Every argument of ``create`` checked: the timer to store (its version is set
    by the store's owner)."""
    reference = check_reference(reference)
    return Timer(callback_name(callback), reference, due_ms(at, reference), encode_context(context, cap, reference))


def _check_length(what: str, text: str) -> None:
    if len(text.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES:
        raise TimerError(f"a timer's {what} is longer than {MAX_NAME_BYTES} bytes ({text[:60]!r}...): use a "
                         f"shorter one (a hash of a long key, say)")


def _hashable(obj: Any) -> bool:
    try:
        hash(obj)
    except TypeError:
        return False
    return True


# -- the handler-facing object -------------------------------------------------------


class Timers:
    """``self.timers`` in a handler; ``timers.create`` / ``timers.cancel`` in a timer
    callback. Subclasses write (``write``: creates and cancels in order, in one
    commit) and count refusals (``_refused``)."""

    def __init__(self, context_size: int) -> None:
        self.context_size = context_size

    async def create(self, callback: Any, at: Any, reference: str, context: Any = None) -> None:
        """Check the timer and add it to the call's timers (``pending.py``), durable
        before the call's checkpoints and its end; outside a call, write it before
        returning. The same callback and reference replaces the one stored."""
        try:
            timer = prepare(callback, at, reference, context, self.context_size)
        except TimerError as exc:
            await self._refused(str(exc))
            raise
        call = pending()
        if call is not None:
            call.create(timer)
        else:
            await self.write([timer])

    async def cancel(self, callback: Any, reference: str) -> bool:
        """Remove the timer; whether there was one pending (a timer firing now may
        still finish its call). Answered from the call's timers when they touched it,
        else by the store, with the call's timers so far in the same commit."""
        key = (callback_name(callback), check_reference(reference))
        call = pending()
        if call is None:
            return (await self.write([key]))[0]
        found = call.cancel(key)
        if found is not None:
            return found
        return (await call.send([*call.take(), key]))[-1]

    async def write(self, ops: Sequence[Op]) -> list[bool]:
        """``ops`` durable, in one commit; whether each cancel found a timer.
        TimerError (retriable) if the store failed."""
        raise NotImplementedError

    async def _refused(self, error: str) -> None:
        """A create refused before storing (counted as ``timer_create_failure``)."""


current: ContextVar[Timers | None] = ContextVar("mldserver_timers", default=None)


def _current() -> Timers:
    timers = current.get()
    if timers is None:
        raise TimerError("mldserver.timers.create/cancel work in handlers and timer callbacks run by mldserver; "
                         "in a handler, self.timers is the same")
    return timers


async def create(callback: Any, at: Any, reference: str, context: Any = None) -> None:
    """``Timers.create`` of the server or handler process this runs in."""
    await _current().create(callback, at, reference, context)


async def cancel(callback: Any, reference: str) -> bool:
    """``Timers.cancel`` of the server or handler process this runs in."""
    return await _current().cancel(callback, reference)
