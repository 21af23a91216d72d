"""One thread per shard for an amazon_kclpy processor: its synchronous calls run there,
one at a time, so a processor that blocks (``time.sleep(5)`` after a throttled
checkpoint, a slow HTTP call) holds its own shard only; the loop of its handler
process goes on answering the other shards::

    thread = ShardThread("shardId-000000000001", log)
    result = await thread.run(processor.process_records, process_records_input)
    thread.call_soon(coro)           # from the thread: await coro in the loop, its result back
    thread.close()                   # the thread ends once its queue is empty

A call cancelled while it runs (past ``execution_timeout``) is stopped where it runs:
``ProcessorStopped`` (an ``ExecutionTimeout``, not an ``Exception``) is raised in the
thread, in the processor's code, and ``run`` raises it with that traceback once the
call has ended, so its stack says where it was. Python raises it at the next bytecode:
a call blocked in C (``time.sleep``, a socket read) ends only when that returns; the
server then kills the handler process after a grace, as for any call that does not
stop (``pool/calls.py``). A stop that arrives after the call has ended is dropped.

A stop never lands while the thread holds one of ``logging``'s locks (a handler's, or
the module's): a processor's ``print()`` is a log event (``output.py``), and Python
raises a stop at the next bytecode, which may be just after ``Handler.acquire`` took
the lock and before the ``try`` that releases it; the lock stayed held by a thread that
went on idle, and the next log line of the loop's own thread (a server's, at its close)
waited for it forever. So while the thread holds one, a stop waits, and is raised as it
lets go of the last (``_hold`` and ``_unhold``, around ``logging``'s acquire and
release, from the first ``ShardThread`` on).

Writes to ``sys.stdout`` and ``sys.stderr`` from the thread, and from the threads it
starts, become ``handler_output`` log events with the shard id (``output.py``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import ctypes
import logging
import queue
import threading
from typing import Any, Awaitable, Callable, TypeVar

from ...errors import ExecutionTimeout
from ...base.logs import EventLogger
from .output import Lines, bind, install

T = TypeVar("T")

_set_async_exc = ctypes.pythonapi.PyThreadState_SetAsyncExc
_set_async_exc.argtypes = (ctypes.c_ulong, ctypes.py_object)


class ProcessorStopped(ExecutionTimeout):
    """Raised in a processor's thread when its call is stopped (past ``execution_timeout``)."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*(args or ("the processor's call was stopped past execution_timeout",)))


class ShardThread:
    def __init__(self, shard_id: str, log: EventLogger, lines: Lines | None = None) -> None:
        """``lines``: the shard's output (``output.Lines``; by default one logging to ``log``
        with the shard's id)."""
        self.shard_id = shard_id
        self.loop = asyncio.get_running_loop()
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._running: concurrent.futures.Future[Any] | None = None  # the call the thread is in
        self._held = 0  # logging's locks the thread holds (in its call): a stop waits for none
        self._deferred = False  # a stop came while it held one: raised as it lets go of the last
        install()
        _hold_stops_in_logging()
        self._thread = threading.Thread(target=self._serve, args=(lines or Lines(log.bind(shard_id=shard_id)),),
                                        name=f"kclpy {shard_id}", daemon=True)
        self._thread.start()

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` in the shard's thread (with this task's context variables)."""
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        self._queue.put((future, contextvars.copy_context(), fn, args))
        waited = asyncio.wrap_future(future)
        try:
            return await asyncio.shield(waited)
        except (asyncio.CancelledError, ExecutionTimeout):  # (SIGUSR2 may land in this coroutine's step)
            if future.cancel():
                raise  # not started: nothing runs
            while not future.done() and not self._stop(future):
                await asyncio.sleep(0.005)  # between its start and its first step: stopped once it runs
            try:
                await waited  # ended: ProcessorStopped, with the processor's stack, if it was stopped
            except ProcessorStopped:
                raise
            except BaseException:  # it ended otherwise (or this task is cancelled again)
                pass
            raise

    def call_soon(self, coro: Awaitable[T]) -> T:
        """From the shard's thread: ``coro`` awaited in the loop, its result (or exception) here."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()  # type: ignore[arg-type]

    def close(self) -> None:
        """No more calls: the thread ends once those queued are done."""
        self._queue.put(None)

    def _stop(self, future: concurrent.futures.Future[Any]) -> bool:
        """ProcessorStopped raised in the thread, if it is in ``future``'s call."""
        with self._lock:
            if self._running is not future or self._thread.ident is None:
                return False
            if self._held:
                self._deferred = True  # raised by _unhold, once the thread holds no lock of logging's
            else:
                _set_async_exc(self._thread.ident, ProcessorStopped)
            return True

    def _serve(self, lines: Lines) -> None:
        _serving.shard = self
        bind(lines)
        while True:
            item = self._queue.get()
            if item is None:
                return
            self._one(lines, *item)
            del item  # (the handler's method among them: nothing here keeps the handler alive)

    def _one(self, lines: Lines, future: concurrent.futures.Future[Any], context: contextvars.Context,
             fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        try:
            if not future.set_running_or_notify_cancel():
                return
            with self._lock:
                self._running = future
            try:
                result = context.run(_flushed, lines, fn, args)
            except BaseException as exc:
                self._settle(future, exc)
            else:
                self._settle(future, result=result)
        except ProcessorStopped as exc:  # landed outside the processor's code, the call not yet settled
            if not future.done():
                self._settle(future, exc)

    def _settle(self, future: concurrent.futures.Future[Any], exc: BaseException | None = None,
                result: Any = None) -> None:
        self._done()
        if exc is not None:
            future.set_exception(exc)
        else:
            future.set_result(result)

    def _done(self) -> None:
        """The call is over: no stop reaches the thread from here on (one that landed
        on the way here is dropped)."""
        while True:
            try:
                with self._lock:
                    self._running = None
                    self._held, self._deferred = 0, False  # (a stop that landed in a hold: never let go)
                    _set_async_exc(threading.get_ident(), _NULL)
                return
            except ProcessorStopped:
                continue


def _flushed(lines: Lines, fn: Callable[..., T], args: tuple[Any, ...]) -> T:
    try:
        return fn(*args)
    finally:
        lines.flush()  # what the call wrote without a newline: logged before its result


_NULL = ctypes.py_object()  # PyThreadState_SetAsyncExc(id, NULL) clears a pending exception

_serving = threading.local()  # .shard: the ShardThread whose thread this is (unset elsewhere)


def _hold() -> None:
    """The calling thread is about to take a lock of logging's: a stop of its shard's call
    waits (nothing, outside a shard's thread). A stop already pending is raised here, at
    the latest as the ``with`` below ends: before the lock is taken."""
    shard = getattr(_serving, "shard", None)
    if shard is not None:
        with shard._lock:
            shard._held += 1


def _unhold() -> None:
    """The calling thread let go of a lock of logging's: once it holds none, a stop that
    waited is raised (at its next bytecode, as any stop)."""
    shard = getattr(_serving, "shard", None)
    if shard is not None:
        with shard._lock:
            shard._held = max(shard._held - 1, 0)
            if shard._held == 0 and shard._deferred and shard._running is not None:
                shard._deferred = False
                _set_async_exc(threading.get_ident(), ProcessorStopped)


def _hold_stops_in_logging() -> None:
    """``logging.Handler.acquire`` and ``release``, and ``logging``'s module lock, wrapped
    in ``_hold`` and ``_unhold`` (once a process)."""
    handler = logging.Handler
    if getattr(handler.acquire, "holds_stops", False):
        return
    acquire, release = handler.acquire, handler.release
    module_acquire, module_release = logging._acquireLock, logging._releaseLock  # type: ignore[attr-defined]

    def held_acquire(self: logging.Handler) -> None:
        _hold()
        acquire(self)

    def held_release(self: logging.Handler) -> None:
        release(self)
        _unhold()

    def held_module_acquire() -> None:
        _hold()
        module_acquire()

    def held_module_release() -> None:
        module_release()
        _unhold()

    held_acquire.holds_stops = True  # type: ignore[attr-defined]
    handler.acquire, handler.release = held_acquire, held_release  # type: ignore[method-assign]
    logging._acquireLock, logging._releaseLock = held_module_acquire, held_module_release  # type: ignore[attr-defined]
