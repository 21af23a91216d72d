"""What a processor writes to ``sys.stdout`` and ``sys.stderr`` from its shard's thread
becomes ``handler_output`` events with its shard id, one a line; other threads' writes
go where they went before."""

from __future__ import annotations

import contextlib
import io
import logging
import sys
import threading

import pytest

from mldserver.api.kclpy import output
from mldserver.api.kclpy.thread import ShardThread
from mldserver.base.logs import get_logger


class Kept(logging.Handler):
    def __init__(self):
        super().__init__()
        self.events = []

    def emit(self, record):
        self.events.append((record.getMessage(), record.fields))


@pytest.fixture
def logged():
    """The events of the logger the threads get."""
    logger = logging.getLogger("test.kclpy.output")
    kept = Kept()
    logger.addHandler(kept)
    logger.setLevel(logging.INFO)
    yield kept.events
    logger.removeHandler(kept)


@contextlib.contextmanager
def streams():
    """``sys.stdout`` and ``sys.stderr`` in memory for the block (pytest sets its own for
    each phase of a test: set here, inside the test), then what they were."""
    before = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = io.StringIO(), io.StringIO()
    try:
        yield sys.stdout, sys.stderr
    finally:
        sys.stdout, sys.stderr = before


def lines(events):
    return [(f["shard_id"], f["stream"], f["line"]) for event, f in events if event == "handler_output"]


async def test_prints_and_stderr_writes_become_events_with_the_shard_id_one_a_line(logged):
    with streams() as (stdout, stderr):
        a = ShardThread("shardId-a", get_logger("test.kclpy.output"))
        b = ShardThread("shardId-b", get_logger("test.kclpy.output"))
        assert isinstance(sys.stdout, output.ShardStream) and sys.stdout.fallback is stdout

        def talk(name):
            print("hello from", name)
            sys.stderr.write("held ")
            sys.stderr.write("without a newline")
            print("one\ntwo", end="\r\n", file=sys.stdout)
            sys.stdout.flush()
            return sys.stdout.isatty()

        assert await a.run(talk, "a") is False
        await b.run(talk, "b")
        print("from the loop's thread")  # not a shard's: where it went before
        other = threading.Thread(target=print, args=("from another thread",))
        other.start()
        other.join()
    assert lines(logged) == [
        ("shardId-a", "stdout", "hello from a"), ("shardId-a", "stdout", "one"), ("shardId-a", "stdout", "two"),
        ("shardId-a", "stderr", "held without a newline"),  # logged when the call returned
        ("shardId-b", "stdout", "hello from b"), ("shardId-b", "stdout", "one"), ("shardId-b", "stdout", "two"),
        ("shardId-b", "stderr", "held without a newline")]
    assert stdout.getvalue().splitlines() == ["from the loop's thread", "from another thread"]
    assert stderr.getvalue() == ""
    a.close()
    b.close()


async def test_a_long_text_without_a_newline_is_logged_in_pieces_and_bytes_are_refused(logged):
    def long():
        for _ in range(100):
            sys.stderr.write("Record (Partition Key: pk, Sequence Number: 1, Data Size: 8")  # the sample's way
        try:
            sys.stdout.write(b"bytes")
        except TypeError as exc:
            return str(exc)

    with streams():
        thread = ShardThread("shardId-a", get_logger("test.kclpy.output"))
        assert await thread.run(long) == "write() argument must be str, not bytes"
    pieces = [line for _, stream, line in lines(logged)]
    assert "".join(pieces) == "Record (Partition Key: pk, Sequence Number: 1, Data Size: 8" * 100
    assert len(pieces) > 1 and all(len(p) <= output.HELD_MAX + 100 for p in pieces)
    thread.close()


async def test_a_logging_handler_that_writes_to_sys_stderr_does_not_loop(logged):
    class ToStderr(logging.Handler):  # looks sys.stderr up as it writes: the shard's stream, in its thread
        def emit(self, record):
            sys.stderr.write(f"{record.getMessage()}\n")

    logger = logging.getLogger("test.kclpy.output")
    to_stderr = ToStderr()
    logger.addHandler(to_stderr)
    try:
        with streams() as (_, stderr):
            thread = ShardThread("shardId-a", get_logger("test.kclpy.output"))
            await thread.run(print, "once")
    finally:
        logger.removeHandler(to_stderr)
    assert lines(logged) == [("shardId-a", "stdout", "once")]
    assert stderr.getvalue() == "handler_output\n"  # the handler's own line, straight through
    thread.close()


async def test_threads_a_shard_thread_starts_write_lines_of_their_own_with_its_shard_id(logged):
    def background(name):
        print("from", name)
        sys.stdout.write("held until flushed")
        sys.stdout.flush()
        if name == "child":  # and the threads it starts, in turn
            grandchild = threading.Thread(target=background, args=("grandchild",), name="grandchild")
            grandchild.start()
            grandchild.join()

    def start():
        child = threading.Thread(target=background, args=("child",), name="child")
        child.start()
        child.join()

    with streams() as (stdout, _):
        thread = ShardThread("shardId-a", get_logger("test.kclpy.output"))
        await thread.run(start)
        other = threading.Thread(target=print, args=("not a shard's",))  # started by the loop's thread
        other.start()
        other.join()
    assert [(f["shard_id"], f.get("thread"), f["line"]) for event, f in logged if event == "handler_output"] == [
        ("shardId-a", "child", "from child"), ("shardId-a", "child", "held until flushed"),
        ("shardId-a", "grandchild", "from grandchild"), ("shardId-a", "grandchild", "held until flushed")]
    assert stdout.getvalue() == "not a shard's\n"
    thread.close()
