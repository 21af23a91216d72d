"""A shard's thread: its calls one at a time in it, the loop free meanwhile; a call
cancelled while it runs is stopped in its own code (``ProcessorStopped``, with its
stack), one not yet started never runs, and the thread serves the next call; the
thread ends when its handler instance is dropped."""

from __future__ import annotations

import asyncio
import gc
import threading
import traceback

import pytest

from mldserver.api.kclpy.thread import ProcessorStopped, ShardThread
from mldserver.base.logs import get_logger
from mldserver.errors import ExecutionTimeout

from ..harness import eventually


async def test_calls_run_in_the_shards_thread_one_at_a_time_while_the_loop_goes_on():
    thread = ShardThread("shardId-1", get_logger("t"))
    gate = threading.Event()
    order = []

    def blocked(n):
        order.append((n, threading.current_thread().name))
        gate.wait(10)
        return n

    first = asyncio.ensure_future(thread.run(blocked, 1))
    second = asyncio.ensure_future(thread.run(blocked, 2))
    await eventually(lambda: order, what="the first call running")
    for _ in range(5):  # the loop turns while the thread blocks
        await asyncio.sleep(0)
    assert order == [(1, "kclpy shardId-1")] and not first.done() and not second.done()
    gate.set()
    assert await asyncio.gather(first, second) == [1, 2]
    assert order == [(1, "kclpy shardId-1"), (2, "kclpy shardId-1")]
    thread.close()


def spin():
    while True:
        pass


async def test_a_call_cancelled_while_it_runs_is_stopped_in_its_own_code_and_the_thread_serves_the_next():
    thread = ShardThread("shardId-1", get_logger("t"))
    started = threading.Event()

    def spinning():
        started.set()
        spin()

    call = asyncio.ensure_future(thread.run(spinning))
    queued = asyncio.ensure_future(thread.run(lambda: pytest.fail("a call cancelled before it started ran")))
    await asyncio.to_thread(started.wait, 10)
    queued.cancel()
    call.cancel()
    with pytest.raises(ProcessorStopped) as caught:
        await call
    assert isinstance(caught.value, ExecutionTimeout) and not isinstance(caught.value, Exception)
    assert "while True" in "".join(traceback.format_exception(caught.value))  # where it was
    with pytest.raises(asyncio.CancelledError):
        await queued
    assert await thread.run(lambda: threading.current_thread().name) == "kclpy shardId-1"


async def test_a_call_that_swallows_the_stop_ends_as_it_ends_and_the_stop_is_not_raised_later():
    thread = ShardThread("shardId-1", get_logger("t"))
    started = threading.Event()

    def stubborn():
        started.set()
        try:
            spin()
        except BaseException:  # noqa: BLE001  (a processor that swallows everything)
            return "swallowed"

    call = asyncio.ensure_future(thread.run(stubborn))
    await asyncio.to_thread(started.wait, 10)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call  # it ended, not stopped: the caller's cancellation stands
    assert await thread.run(sum, [1, 2]) == 3  # no stop left pending in the thread


async def test_the_thread_ends_when_its_handler_instance_is_dropped():
    from tests.kclpy_handlers import Base
    from mldserver.api.kclpy import wrap
    from mldserver.api.records import ShardInfo

    handler = wrap(Base, 3)(None)
    await handler.initialize(ShardInfo("shardId-9", "TRIM_HORIZON", 0))
    worker = handler.thread._thread
    assert worker.is_alive() and handler.processor.shard_id == "shardId-9"
    del handler
    gc.collect()
    await asyncio.to_thread(worker.join, 10)
    assert not worker.is_alive()


async def test_a_stop_waits_while_the_thread_holds_a_lock_of_loggings_and_leaves_none_held():
    # A processor's print() is a log event: a stop raised just as logging's Handler.acquire
    # took the handler's lock (before the try that releases it) left the lock held by an
    # idle thread, and the next line the loop's thread logged waited for it forever.
    import logging
    import sys

    class Kept(logging.Handler):
        def emit(self, record):
            pass

    logger = logging.getLogger("test.kclpy.thread.locks")
    kept = Kept()
    logger.addHandler(kept)
    logger.setLevel(logging.INFO)
    try:
        thread = ShardThread("shardId-1", get_logger("test.kclpy.thread.locks"))

        def chatty():
            while True:
                print("a line")  # (one handler_output event a line, through ``kept``)

        def in_acquire():
            frame = sys._current_frames().get(thread._thread.ident)
            return frame is not None and frame.f_code.co_name == "acquire" and "logging" in frame.f_code.co_filename

        stops = []
        stop = thread._stop
        thread._stop = lambda future: stops.append(future) or stop(future)  # (noted as it is tried)
        kept.lock.acquire()  # the thread will wait for it, inside Handler.acquire, when the stop comes
        try:
            call = asyncio.ensure_future(thread.run(chatty))
            await eventually(in_acquire, timeout=30, what="the thread waiting for the handler's lock")
            call.cancel()
            await eventually(lambda: stops, what="the stop tried")
        finally:
            kept.lock.release()
        with pytest.raises(ProcessorStopped):
            await call

        def free():  # (another thread than the stopped one, which could take the RLock again)
            taken = kept.lock.acquire(timeout=10)
            if taken:
                kept.lock.release()
            return taken

        assert await asyncio.to_thread(free), "the stopped thread left the handler's lock held"
        logger.info("the loop's thread logs on")
        assert await thread.run(lambda: threading.current_thread().name) == "kclpy shardId-1"
        thread.close()
    finally:
        logger.removeHandler(kept)
