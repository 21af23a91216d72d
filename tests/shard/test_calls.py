"""Calling the handler: retries, time-outs, a checkpoint error ending the action, a
factory that fails; through the fake daemon and the real relay, and with plain objects."""

from __future__ import annotations

import asyncio
import base64

import pytest

import mldserver
from mldserver.base.backoff import Backoff
from mldserver.errors import CheckpointError, ConfigError
from mldserver.base.logs import get_logger
from mldserver.api.records import Batch, Record, ShardInfo
from mldserver.api.checks import check_class
from mldserver.shard.calls import CHECKPOINT_FAILED, FAILED, OK, HandlerCalls, reap_abandoned
from mldserver.api.testing import SHARD_END, make_records

from ..handlers import Noop
from ..harness import running
from .serving import dead_letters


async def test_failing_batch_is_retried_then_bisected_and_the_record_that_fails_alone_dead_lettered(tmp_path):
    attempts = []

    class Flaky(mldserver.Handler):
        async def process_records(self, batch, checkpointer):
            attempts.append([r.sequence_number for r in batch.records])
            if batch.records[0].sequence_number == "10":
                raise ValueError("bad order")
            await checkpointer.checkpoint()

    async with running(tmp_path, Flaky, handler_retries=2) as (_, _, daemon):
        shard = await daemon.shard("shardId-1")
        await shard.process_records(make_records(10, 2, partition_key="cust-{i}"))
        await shard.process_records(make_records(12, 1))
        await shard.lease_lost()
        assert await shard.close() == 0
    assert attempts == [["10", "11"]] * 3 + [["10"], ["11"], ["12"]]  # retried, then each half once
    letters = dead_letters(tmp_path, "shardId-1")
    assert [(d["sequence_number"], d["partition_key"]) for d in letters] == [("10", "cust-0")]
    assert letters[0]["error"] == "ValueError: bad order" and letters[0]["attempts"] == 4
    assert base64.b64decode(letters[0]["data"]) == b"10101010"
    assert daemon.checkpoints["shardId-1"] == ("12", 0)


async def test_execution_timeout_counts_as_a_failure(tmp_path):
    class Slow(mldserver.Handler):
        async def process_records(self, batch, checkpointer):
            await asyncio.sleep(10)

    async with running(tmp_path, Slow, execution_timeout=0.1, handler_retries=1) as (_, _, daemon):
        shard = await daemon.shard("s")
        await shard.process_records(make_records(1, 1))
        await shard.lease_lost()
        await shard.close()
    [letter] = dead_letters(tmp_path, "s")
    assert "execution_timeout" in letter["error"]


async def test_checkpoint_error_escaping_the_handler_ends_the_action_without_retry(tmp_path):
    calls = []

    class Strict(mldserver.Handler):
        async def process_records(self, batch, checkpointer):
            calls.append(1)
            await checkpointer.checkpoint("99999", 0)  # beyond what was delivered

    async with running(tmp_path, Strict) as (_, _, daemon):
        shard = await daemon.shard("s")
        await shard.process_records(make_records(1, 1))
        await shard.lease_lost()
        await shard.close()
    assert calls == [1]
    assert shard.checkpoint_requests == [("99999", 0)]
    assert dead_letters(tmp_path, "s") == []


async def test_a_factory_failing_at_start_up_is_refused_and_one_failing_later_dead_letters_but_answers(tmp_path):
    def broken(context):
        raise RuntimeError("cannot connect to the database")

    with pytest.raises(ConfigError, match=r"broken\(context\) failed at start-up: RuntimeError: cannot connect"):
        async with running(tmp_path, broken):
            pass

    made = []

    def factory(context):  # fine at start-up, then the database goes away
        made.append(context)
        if len(made) > 1:
            raise RuntimeError("cannot connect to the database")
        return Noop(context)

    async with running(tmp_path, factory) as (_, _, daemon):
        shard = await daemon.shard("s")
        await shard.process_records(make_records(1, 2))
        await shard.shard_ended()
        await shard.close()
    assert len(dead_letters(tmp_path, "s")) == 2
    assert daemon.checkpoints["s"] == SHARD_END


# -- with plain objects ----------------------------------------------------------


def calls_for(handler_class, retries=2, timeout=5.0):
    calls = HandlerCalls(handler_class, None, retries=retries, timeout=timeout,
                         backoff=Backoff(first=0.001, cap=0.001), log=get_logger("test.calls"))
    assert calls.create() is None
    return calls


def a_batch():
    records = [Record({"sequenceNumber": str(seq), "data": "eA=="}) for seq in (1, 2)]
    return Batch(records, 0, ShardInfo("s", None, None))


async def test_the_outcome_carries_the_rows_of_the_attempt_that_succeeded():
    attempts = []

    class FailsOnce(mldserver.Handler):
        async def process_records(self, batch, checkpointer):
            for record in batch.records:
                batch.emit(record, {"seq": record.sequence_number, "attempt": len(attempts)})
            attempts.append(1)
            if len(attempts) == 1:
                raise RuntimeError("flaky")

    batch = a_batch()
    outcome = await calls_for(FailsOnce).call("process_records", batch, lambda: None, collect_rows=True)
    assert (outcome.result, outcome.ok, outcome.error) == (OK, True, None)
    assert [(e.record.sequence_number, e.row["attempt"]) for e in outcome.rows] == [("1", 1), ("2", 1)]
    assert batch.rows is None  # the batch no longer collects once the call is over


async def test_every_attempt_failing_gives_the_last_error_and_no_rows():
    class Broken(mldserver.Handler):
        async def process_records(self, batch, checkpointer):
            batch.emit(batch.records[0], {"k": 1})
            raise ValueError("bad order")

    outcome = await calls_for(Broken, retries=1).call("process_records", a_batch(), lambda: None, collect_rows=True)
    assert (outcome.result, outcome.ok, outcome.error, outcome.rows) == (FAILED, False, "ValueError: bad order", None)


async def test_a_checkpoint_error_ends_the_call_at_once_keeping_what_was_emitted():
    tries = []

    class Throttled(mldserver.Handler):
        async def process_records(self, batch, checkpointer):
            tries.append(1)
            batch.emit(batch.records[0], {"k": 1})
            raise CheckpointError("ThrottlingException", "1", 0)

    outcome = await calls_for(Throttled).call("process_records", a_batch(), lambda: None, collect_rows=True)
    assert (outcome.result, outcome.ok, outcome.error) == (CHECKPOINT_FAILED, True, "ThrottlingException")
    assert [e.row for e in outcome.rows] == [{"k": 1}] and tries == [1]


async def test_a_call_past_the_time_out_fails_and_each_attempt_gets_a_fresh_checkpointer():
    given = []

    class Slow(mldserver.Handler):
        async def shutdown_requested(self, checkpointer):
            given.append(checkpointer)
            await asyncio.sleep(10)

    handed = iter(["first", "second"])
    calls = calls_for(Slow, retries=1, timeout=0.01)
    outcome = await calls.call("shutdown_requested", None, lambda: next(handed))
    assert outcome.result == FAILED and "execution_timeout" in outcome.error
    assert given == ["first", "second"]
    assert calls.take_stats() == {"timeout_count": 2} and calls.take_stats() == {}  # each attempt, taken once


async def test_without_a_handler_every_call_fails_without_running():
    def factory(context):
        raise RuntimeError("cannot connect to the database")

    calls = HandlerCalls(factory, None, retries=2, timeout=1.0, backoff=Backoff(first=0.001, cap=0.001),
                         log=get_logger("test.calls"))
    assert calls.create() == "RuntimeError: cannot connect to the database"
    outcome = await calls.call("lease_lost", None, lambda: None)
    assert (outcome.result, outcome.error) == (FAILED, "no handler (its creation failed)")


# -- issue 10: each call in its own task -------------------------------------------------


async def test_a_cancelled_error_out_of_the_handler_is_a_failure_and_retried():
    attempts = []

    class InnerCancelled(mldserver.Handler):
        async def process_records(self, batch, checkpointer):
            attempts.append(1)
            if len(attempts) == 1:
                raise asyncio.CancelledError()

    outcome = await calls_for(InnerCancelled).call("process_records", a_batch(), lambda: None, collect_rows=True)
    assert outcome.result == OK and len(attempts) == 2


async def test_a_handler_swallowing_its_cancellation_is_abandoned_not_retried_and_reaped():
    calls_made, swallowed = [], []

    class Swallow(mldserver.Handler):
        async def process_records(self, batch, checkpointer):
            calls_made.append(1)
            while True:
                try:
                    await asyncio.sleep(3600)
                except asyncio.CancelledError:
                    swallowed.append(1)

    calls = calls_for(Swallow, retries=2, timeout=0.05)
    calls.grace = 0.05
    outcome = await calls.call("process_records", a_batch(), lambda: None)
    assert outcome.result == FAILED and "abandoned" in outcome.error
    assert calls_made == [1] and swallowed
    assert await reap_abandoned(0.05) == 1
    assert await reap_abandoned(0.05) == 0


async def test_a_callback_that_is_not_async_is_refused_at_load_and_at_creation():
    class Sync(mldserver.Handler):
        def process_records(self, batch, checkpointer):  # type: ignore[override]
            pass

    with pytest.raises(ConfigError, match="process_records .*async def"):
        check_class(Sync)
    calls = HandlerCalls(lambda context: Sync(context), None, retries=2, timeout=1.0,
                         backoff=Backoff(first=0.001, cap=0.001), log=get_logger("test.calls"))
    assert "process_records" in calls.create()
    assert (await calls.call("process_records", a_batch(), lambda: None)).result == FAILED


async def test_abort_cancels_the_call_under_way_and_calls_nothing_more():
    started = asyncio.Event()

    class Slow(mldserver.Handler):
        async def process_records(self, batch, checkpointer):
            started.set()
            await asyncio.sleep(3600)

    calls = calls_for(Slow, retries=2, timeout=60.0)
    call = asyncio.ensure_future(calls.call("process_records", a_batch(), lambda: None))
    await started.wait()
    calls.abort("stopping")
    outcome = await call
    assert outcome.result == FAILED and "stopping" in outcome.error
    assert (await calls.call("initialize", None, lambda: None)).error == "not called: stopping"
