"""One poisoned record in a batch of 1,000, in a handler process and in the server's
loop: the record alone is retried, then dead-lettered with its data and the error;
the 999 others are committed; the shard is checkpointed past it, never before its
dead letter is written. A record without a position, with a sink, never reaches the
handler at all."""

from __future__ import annotations

import pytest

from mldserver.api.testing import make_records

from ..harness import eventually, running
from .serving import T0, dead_letters, pooled

SHARD = "shardId-000000000000"
N, POISON = 1000, 417


def records():
    out = make_records(10_000, N, approximate_arrival_timestamp=T0)
    out[POISON]["partitionKey"] = "poison"
    return out


def later():  # ten minutes on: closes the first batch's window
    return make_records(20_000, 5, approximate_arrival_timestamp=T0 + 600_000)


def callbacks(server, outcome):
    return server.metrics.registry.get_sample_value("mldserver_callbacks_total",
                                                    {"callback": "on_update", "outcome": outcome})


@pytest.mark.parametrize("workers", [2, 0])
@pytest.mark.parametrize("handler", ["Changes", "FailOne"])
async def test_one_poisoned_record_is_dead_lettered_and_the_other_999_are_committed(handler, workers, tmp_path):
    sent = records()
    async with running(tmp_path, **pooled(handler, workers=workers)) as (server, sink, daemon):
        shard = await daemon.shard(SHARD)
        await shard.process_records(sent, millis_behind_latest=1000)
        [letter] = dead_letters(tmp_path, SHARD)  # written before the batch's status
        await shard.process_records(later(), millis_behind_latest=1000)
        await eventually(lambda: len(sink.rows) >= N - 1, timeout=30, what="the first window committed")
        await shard.shutdown_requested()  # the server checkpoints what the sink committed
        await shard.lease_lost()
        assert await shard.close() == 0
        if handler == "Changes":
            attempts = server.settings.handler_retries + 1
            assert callbacks(server, "failure") == attempts
            assert callbacks(server, "success") == N - 1 + 5
        else:
            attempts = 1
    assert sorted(int(r["seq"]) for r in sink.rows) == [10_000 + i for i in range(N) if i != POISON]
    error = "RuntimeError: poisoned record" if handler == "Changes" else "ValueError: no such customer"
    assert (letter["reason"], letter["error"], letter["attempts"]) == ("record failed", error, attempts)
    assert (letter["sequence_number"], letter["partition_key"], letter["data"]) == \
        (sent[POISON]["sequenceNumber"], "poison", sent[POISON]["data"])
    assert daemon.checkpoints[SHARD] == (sent[-1]["sequenceNumber"], 0)  # past it: the whole first batch
    assert server.metrics.registry.get_sample_value("mldserver_dead_letters_total", {"kind": "record_failed"}) == 1


@pytest.mark.parametrize("workers", [2, 0])
async def test_without_a_sink_a_checkpoint_in_the_batch_stops_short_of_a_failed_record(workers, tmp_path):
    sent = records()
    async with running(tmp_path, **pooled("FailOne", sink=False, workers=workers)) as (server, _, daemon):
        shard = await daemon.shard(SHARD)
        await shard.process_records(sent)
        # FailOne asked for the last record; the record before the failed one was stored
        assert shard.checkpoint_requests == [(sent[POISON - 1]["sequenceNumber"], 0)]
        assert daemon.checkpoints[SHARD] == (sent[POISON - 1]["sequenceNumber"], 0)
        assert len(dead_letters(tmp_path, SHARD)) == 1
        nxt = make_records(11_000, 3)
        await shard.process_records(nxt)  # dead-lettered since: the next checkpoint passes it
        assert daemon.checkpoints[SHARD] == (nxt[-1]["sequenceNumber"], 0)
        await shard.lease_lost()
        assert await shard.close() == 0


async def test_a_records_retries_count_against_the_calls_execution_timeout(tmp_path):
    # the poisoned record's backoff outlasts the call's time-out: the call fails, is
    # bisected within the time-out's budget (its half without the poisoned record is
    # handled; past the budget, the half with it is dead-lettered whole: no record
    # twice, none lost)
    sent = records()
    async with running(tmp_path, **pooled("Changes", sink=False, workers=0, handler_backoff=2.0, execution_timeout=0.3,
                                          handler_retries=1)) as (server, _, daemon):
        shard = await daemon.shard(SHARD)
        await shard.process_records(sent)
        await shard.lease_lost()
        assert await shard.close() == 0
    letters = dead_letters(tmp_path, SHARD)
    assert [letter["sequence_number"] for letter in letters] == [r["sequenceNumber"] for r in sent[:N // 2]]
    assert POISON < N // 2 and {letter["reason"] for letter in letters} == {"record failed"}
    assert "execution_timeout" in letters[0]["error"]
    assert server.metrics.registry.get_sample_value("mldserver_handler_timeouts_total",
                                                    {"callback": "process_records"}) >= 3  # and the poisoned half


def calls_of(server, callback):
    return server.metrics.registry.get_sample_value("mldserver_handler_calls_total",
                                                    {"callback": callback, "outcome": "success"})


@pytest.mark.parametrize("workers", [2, 0])
async def test_with_a_sink_a_record_without_a_position_never_reaches_the_handler(workers, tmp_path):
    """A handler process parses the batch while the server reads its positions (a held
    call: ``pool/frames.py``), and is let call the handler only once every record has
    one: the record without one is dead-lettered, never handled, and the handler is
    called once, with the four others, whose rows are committed once each."""
    sent = make_records(10_000, 5, approximate_arrival_timestamp=T0)
    sent[2]["sequenceNumber"] = "10002x"
    async with running(tmp_path, **pooled("Emit", workers=workers)) as (server, sink, daemon):
        shard = await daemon.shard(SHARD)
        await shard.process_records(sent, millis_behind_latest=1000)
        [letter] = dead_letters(tmp_path, SHARD)  # written before the batch's status
        assert calls_of(server, "process_records") == 1
        await shard.process_records(later(), millis_behind_latest=1000)
        await eventually(lambda: len(sink.rows) >= 4, timeout=30, what="the first window committed")
        await shard.shutdown_requested()
        await shard.lease_lost()
        assert await shard.close() == 0
    assert sorted(r["seq"] for r in sink.rows) == ["10000", "10001", "10003", "10004"]
    assert (letter["reason"], letter["sequence_number"], letter["data"]) == \
        ("malformed records", "10002x", sent[2]["data"])
