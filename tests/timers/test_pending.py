"""A call's timers (``timers/pending.py``) in the server's loop, as ``workers = 0`` runs
them: the real handler calls (``HandlerCalls``), the real checkpointer, the real
scheduler on the real SQLite store, read back through a fresh connection (committed
rows only). Nothing is written while the call runs; everything in one commit before
a checkpoint it asks for and before its end; a cancel answered from the call's own
timers; a write that fails fails the call, whatever the handler caught; a task that
outlives its call, and a timer callback, write theirs before they go on."""

from __future__ import annotations

import asyncio
import sqlite3
import time

import pytest

import mldserver
from mldserver.api.checkpointer import Checkpointer
from mldserver.base.backoff import Backoff
from mldserver.base.logs import get_logger
from mldserver.protocol import CheckpointReply
from mldserver.shard.calls import FAILED, OK, HandlerCalls
from mldserver.timers import TimerError
from mldserver.timers.firing import LoopFiring
from mldserver.timers.scheduler import LocalTimers, Scheduler
from mldserver.timers.sqlite import SqliteStore
from mldserver.timers.store import Timer

from .. import timer_handlers
from .serving import fired_file

LOG = get_logger("test.pending")
LATER = time.time() + 3600  # never due while a test runs


def on_disk(path) -> dict[str, bytes]:
    if not path.exists():
        return {}
    with sqlite3.connect(path) as conn:
        return dict(conn.execute("SELECT reference, context FROM timers"))


class Context:
    def __init__(self, timers: LocalTimers) -> None:
        self.timers = timers


@pytest.fixture
async def timers(tmp_path):
    scheduler = Scheduler(SqliteStore(tmp_path / "timers.db"), None, attempts=3, backoff=Backoff(first=0.01),
                          context_size=1024)
    await scheduler.open()
    yield LocalTimers(scheduler)
    await scheduler.stop()


def calls_for(handler_class, timers: LocalTimers, retries: int = 0) -> HandlerCalls:
    calls = HandlerCalls(handler_class, Context(timers), retries=retries, timeout=10.0,
                         backoff=Backoff(first=0.001, cap=0.001), log=LOG)
    assert calls.create() is None
    return calls


def store_of(timers: LocalTimers) -> SqliteStore:
    return timers.scheduler.store  # type: ignore[return-value]


async def test_a_calls_creates_are_one_commit_when_it_ends(timers):
    store = store_of(timers)
    seen = {}

    class Creates(mldserver.Handler):
        async def process_records(self, batch, checkpointer):
            for i in range(1000):
                await self.timers.create(timer_handlers.fired, LATER, f"r{i}", {"i": i})
            seen["during"] = (len(on_disk(store.path)), store.group.commits)

    outcome = await calls_for(Creates, timers).call("process_records", _batch(), lambda: None)
    assert outcome.result == OK
    assert seen["during"] == (0, 0)  # nothing written while it ran
    assert len(on_disk(store.path)) == 1000 and store.group.commits == 1  # all of it before it was answered
    assert timers.scheduler.stats.created == 1000


async def test_a_checkpoint_writes_the_calls_timers_first(timers):
    store = store_of(timers)
    at_checkpoint = []

    async def daemon(request):
        at_checkpoint.append(sorted(on_disk(store.path)))
        return CheckpointReply(request.sequence_number, request.sub_sequence_number, None)

    class Checkpoints(mldserver.Handler):
        async def process_records(self, batch, checkpointer):
            await self.timers.create(timer_handlers.fired, LATER, "a")
            await self.timers.create(timer_handlers.fired, LATER, "b")
            await checkpointer.checkpoint("1", 0)
            await self.timers.create(timer_handlers.fired, LATER, "c")

    checkpointer = Checkpointer(daemon, backoff=Backoff(first=0.01), retries=0)
    outcome = await calls_for(Checkpoints, timers).call("process_records", _batch(), lambda: checkpointer)
    assert outcome.result == OK
    assert at_checkpoint == [["a", "b"]]  # stored before the daemon was asked
    assert sorted(on_disk(store.path)) == ["a", "b", "c"] and store.group.commits == 2


async def test_a_cancel_after_a_create_in_the_same_call_nets_to_nothing(timers):
    store = store_of(timers)
    await timers.create(timer_handlers.fired, LATER, "old")  # outside any call: written before it returns
    assert sorted(on_disk(store.path)) == ["old"] and store.group.commits == 1
    answers = []

    class Cancels(mldserver.Handler):
        async def process_records(self, batch, checkpointer):
            await self.timers.create(timer_handlers.fired, LATER, "gone")
            answers.append(await self.timers.cancel(timer_handlers.fired, "gone"))  # answered here: no commit
            answers.append(await self.timers.cancel(timer_handlers.fired, "gone"))
            answers.append(store.group.commits)
            await self.timers.create(timer_handlers.fired, LATER, "kept")
            answers.append(await self.timers.cancel(timer_handlers.fired, "old"))  # the store answers
            answers.append((store.group.commits, sorted(on_disk(store.path))))  # with the ops so far, one commit

    outcome = await calls_for(Cancels, timers).call("process_records", _batch(), lambda: None)
    assert outcome.result == OK
    assert answers == [True, False, 1, True, (2, ["kept"])]
    assert sorted(on_disk(store.path)) == ["kept"] and store.group.commits == 2  # nothing left to write at the end


async def test_a_write_that_fails_fails_the_call_and_the_retry_writes_them(timers):
    store = store_of(timers)
    await timers.create(timer_handlers.fired, LATER, "first")  # the file exists, its connection open
    store._conn.execute("PRAGMA busy_timeout = 50")
    blocker = sqlite3.connect(store.path, timeout=0)
    blocker.execute("BEGIN EXCLUSIVE")  # another writer holds the database: no commit can happen
    attempts = []

    class Creates(mldserver.Handler):
        async def process_records(self, batch, checkpointer):
            attempts.append(len(attempts) + 1)
            if len(attempts) == 2:
                blocker.rollback()  # the disk is back
            for i in range(10):
                await self.timers.create(timer_handlers.fired, LATER, f"r{i}")

    try:
        outcome = await calls_for(Creates, timers, retries=2).call("process_records", _batch(), lambda: None)
    finally:
        blocker.close()
    assert outcome.result == OK and attempts == [1, 2]
    assert sorted(on_disk(store.path)) == ["first"] + [f"r{i}" for i in range(10)]
    assert timers.scheduler.stats.create_failures == 10


async def test_a_failed_write_fails_the_call_even_if_the_handler_catches_it(timers):
    store = store_of(timers)
    await timers.create(timer_handlers.fired, LATER, "first")
    store._conn.execute("PRAGMA busy_timeout = 50")
    blocker = sqlite3.connect(store.path, timeout=0)
    blocker.execute("BEGIN EXCLUSIVE")
    caught = []

    async def daemon(request):
        raise AssertionError("the daemon is never asked: the timers were not stored")

    class Swallows(mldserver.Handler):
        async def process_records(self, batch, checkpointer):
            await self.timers.create(timer_handlers.fired, LATER, "lost")
            try:
                await checkpointer.checkpoint("1", 0)
            except TimerError as exc:
                caught.append(exc.retriable)

    checkpointer = Checkpointer(daemon, backoff=Backoff(first=0.01), retries=0)
    try:
        outcome = await calls_for(Swallows, timers).call("process_records", _batch(), lambda: checkpointer)
    finally:
        blocker.rollback()
        blocker.close()
    assert caught == [True]
    assert outcome.result == FAILED and outcome.error.startswith("TimerError: timer 'lost' not stored")
    assert sorted(on_disk(store.path)) == ["first"]


async def test_a_task_that_outlives_its_call_writes_each_create_before_it_returns(timers):
    store = store_of(timers)
    go, tasks = asyncio.Event(), []

    class Spawns(mldserver.Handler):
        async def process_records(self, batch, checkpointer):
            async def later():
                await go.wait()
                await self.timers.create(timer_handlers.fired, LATER, "later")
                return sorted(on_disk(store.path))

            tasks.append(asyncio.get_running_loop().create_task(later()))

    assert (await calls_for(Spawns, timers).call("process_records", _batch(), lambda: None)).result == OK
    go.set()
    assert await tasks[0] == ["later"]


async def test_a_timer_callbacks_timers_are_written_before_it_counts_as_done(tmp_path, monkeypatch, timers):
    fired_file(tmp_path, monkeypatch)
    firing = LoopFiring(timers, 5.0, LOG)
    chain = Timer("tests.timer_handlers:rearm", "chain", 0, b'{"ref":"chain","left":1}')
    assert await firing.fire([chain]) == [(True, None, None, True)]
    assert on_disk(store_of(timers).path) == {"chain": b'{"ref":"chain","left":0}'}


def _batch():
    from mldserver.api.records import Batch, ShardInfo

    return Batch([], 0, ShardInfo("shardId-0", "1", 0), None)
