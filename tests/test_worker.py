"""Worker policies (handler failures, time-outs, dead letters, shard end, bad lines,
isolation between shards, KCL 1.x dialect), driven by the fake daemon through the
real relay against a server running in the test's event loop."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json

import pytest

import mldserver
from mldserver.config import Settings
from mldserver.server import Server
from mldserver.testing import SHARD_END, Child, DaemonExit, FakeDaemon, errors_in_order, make_records

from .conftest import DATA, relay_command


@contextlib.asynccontextmanager
async def running(factory, tmp_path, **overrides):
    settings = Settings(handler="test", port=0, state_dir=str(tmp_path / "state"), handler_backoff=0.01,
                        checkpoint_backoff=0.01, **overrides)
    server = Server(settings, factory)
    await server.start()
    try:
        yield server, relay_command(server.address[1])
    finally:
        await server.shutdown()


def dead_letters(tmp_path, shard_id):
    path = tmp_path / "state" / "dead-letters" / f"{shard_id}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


class Recorder(mldserver.Handler):
    calls: list = []

    async def initialize(self, shard):
        self.calls.append(("initialize", shard.shard_id, shard.sequence_number))

    async def process_records(self, batch, checkpointer):
        self.calls.append(("process_records", [(r.sequence_number, r.sub_sequence_number, r.partition_key, r.data)
                                               for r in batch.records]))

    async def lease_lost(self):
        self.calls.append(("lease_lost",))


def recorder():
    calls = []
    return type("R", (Recorder,), {"calls": calls}), calls


async def test_failing_batch_is_retried_then_dead_lettered_with_its_data(tmp_path):
    attempts = []

    class Flaky(mldserver.Handler):
        async def process_records(self, batch, checkpointer):
            attempts.append(batch.records[0].sequence_number)
            if batch.records[0].sequence_number == "10":
                raise ValueError("bad order")
            await checkpointer.checkpoint()

    async with running(Flaky, tmp_path, handler_retries=2) as (_, cmd):
        daemon = FakeDaemon(cmd)
        shard = await daemon.shard("shardId-1")
        await shard.process_records(make_records(10, 2, partition_key="cust-{i}"))
        await shard.process_records(make_records(12, 1))
        await shard.lease_lost()
        assert await shard.close() == 0
    assert attempts == ["10", "10", "10", "12"]
    letters = dead_letters(tmp_path, "shardId-1")
    assert [(d["sequence_number"], d["partition_key"]) for d in letters] == [("10", "cust-0"), ("11", "cust-1")]
    assert letters[0]["error"] == "ValueError: bad order" and letters[0]["attempts"] == 3
    assert base64.b64decode(letters[0]["data"]) == b"10101010"
    assert daemon.checkpoints["shardId-1"] == ("12", 0)


async def test_execution_timeout_counts_as_a_failure(tmp_path):
    class Slow(mldserver.Handler):
        async def process_records(self, batch, checkpointer):
            await asyncio.sleep(10)

    async with running(Slow, tmp_path, execution_timeout=0.1, handler_retries=1) as (_, cmd):
        daemon = FakeDaemon(cmd)
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

    async with running(Strict, tmp_path) as (_, cmd):
        daemon = FakeDaemon(cmd)
        shard = await daemon.shard("s")
        await shard.process_records(make_records(1, 1))
        await shard.lease_lost()
        await shard.close()
    assert calls == [1]
    assert shard.checkpoint_requests == [("99999", 0)]
    assert dead_letters(tmp_path, "s") == []


@pytest.mark.parametrize("variant", ["does_nothing", "explicit_sequence", "raises"])
async def test_shard_end_stores_shard_end_whatever_the_handler_did(tmp_path, variant):
    class H(mldserver.Handler):
        async def shard_ended(self, checkpointer):
            if variant == "explicit_sequence":
                await checkpointer.checkpoint("2", 0)
            elif variant == "raises":
                raise RuntimeError("cleanup failed")

    async with running(H, tmp_path, handler_retries=0) as (_, cmd):
        daemon = FakeDaemon(cmd)
        shard = await daemon.shard("s")
        await shard.process_records(make_records(1, 2))
        await shard.shard_ended()
        await shard.close()
    assert daemon.checkpoints["s"] == SHARD_END
    assert shard.checkpoint_requests[-1] == (None, None)
    assert not daemon.stuck


async def test_shard_end_retries_throttling_until_stored(tmp_path):
    async with running(mldserver.Handler, tmp_path) as (_, cmd):
        daemon = FakeDaemon(cmd, errors=errors_in_order(["ThrottlingException"] * 8))
        shard = await daemon.shard("s")
        await shard.shard_ended()
        await shard.close()
    assert len(shard.checkpoint_requests) == 9
    assert daemon.checkpoints["s"] == SHARD_END


async def test_shard_end_gives_up_on_shutdown_exception_and_still_answers(tmp_path):
    async with running(mldserver.Handler, tmp_path) as (server, cmd):
        daemon = FakeDaemon(cmd, errors=lambda shard, seq, sub: "ShutdownException")
        shard = await daemon.shard("s")
        await shard.shard_ended()
        await shard.close()
    assert shard.checkpoint_requests == [(None, None)]
    assert daemon.stuck == {"s"}


async def test_bad_lines_are_logged_dead_lettered_and_the_conversation_goes_on(tmp_path, caplog):
    Rec, calls = recorder()
    async with running(Rec, tmp_path) as (_, cmd):
        daemon = FakeDaemon(cmd)
        shard = await daemon.shard("s")
        await shard.child.write(b"this is not json\n")
        await shard.child.write(b'{"action":"processRecords","records":{"not":"a list"}}\n')
        reply = await shard.child.read_message()
        assert reply == {"action": "status", "responseFor": "processRecords"}
        await shard.child.write(b'{"action":"processRecords","records":[{"data":"eA=="}]}\n')
        assert (await shard.child.read_message())["responseFor"] == "processRecords"
        await shard.process_records(make_records(5, 1))
        await shard.lease_lost()
        await shard.close()
    letters = dead_letters(tmp_path, "s")
    assert letters[0]["line"] == "this is not json"
    assert '"not":"a list"' in letters[1]["line"]
    assert letters[2]["reason"] == "malformed records" and letters[2]["data"] == "eA=="
    assert [c[0] for c in calls] == ["initialize", "process_records", "lease_lost"]


async def test_out_of_order_actions_are_answered_so_the_daemon_survives(tmp_path):
    Rec, calls = recorder()
    async with running(Rec, tmp_path) as (_, cmd):
        child = await Child.spawn(cmd)
        await child.send({"action": "processRecords", "records": make_records(1, 1), "millisBehindLatest": 0})
        assert await child.read_message() == {"action": "status", "responseFor": "processRecords"}
        daemon = FakeDaemon(cmd)
        shard = await daemon.shard("s")
        await shard.shutdown_requested()
        await shard.child.send({"action": "processRecords", "records": make_records(2, 1), "millisBehindLatest": 0})
        assert await shard.child.read_message() == {"action": "status", "responseFor": "processRecords"}
        await shard.lease_lost()
        await shard.close()
        await child.close_stdin()
        assert await child.wait_exit() == 0
    assert [c[0] for c in calls] == ["initialize", "lease_lost"]
    assert [d["line"][:40] for d in dead_letters(tmp_path, "s")] == [
        '{"action":"processRecords","records":[{"'
    ]


async def test_one_broken_connection_does_not_affect_another(tmp_path):
    class Fragile(mldserver.Handler):
        async def initialize(self, shard):
            self.shard_id = shard.shard_id

        async def process_records(self, batch, checkpointer):
            if self.shard_id == "bad":
                raise RuntimeError("boom")
            await checkpointer.checkpoint()

    async with running(Fragile, tmp_path, handler_retries=0) as (server, cmd):
        daemon = FakeDaemon(cmd)
        good, bad = await daemon.shard("good"), await daemon.shard("bad")
        for i in range(5):
            await asyncio.gather(good.process_records(make_records(10 * i + 1, 3)),
                                 bad.process_records(make_records(10 * i + 1, 3)))
            await bad.child.write(b"\x00\xff garbage\n")
        await bad.child.kill()  # the bad child dies mid-conversation
        await good.process_records(make_records(100, 1))
        await good.shard_ended()
        assert await good.close() == 0
    assert daemon.checkpoints["good"] == SHARD_END
    assert len(dead_letters(tmp_path, "bad")) == 5 * 3 + 5


async def test_handler_factory_failure_dead_letters_batches_but_answers(tmp_path):
    def factory(context):
        raise RuntimeError("cannot connect to the database")

    async with running(factory, tmp_path) as (_, cmd):
        daemon = FakeDaemon(cmd)
        shard = await daemon.shard("s")
        await shard.process_records(make_records(1, 2))
        await shard.shard_ended()
        await shard.close()
    assert len(dead_letters(tmp_path, "s")) == 2
    assert daemon.checkpoints["s"] == SHARD_END


async def test_unicode_partition_keys_survive_byte_exact(tmp_path):
    Rec, calls = recorder()
    key = "a\u2028b\u2029c\u0085d\U0001F600"
    async with running(Rec, tmp_path) as (_, cmd):
        daemon = FakeDaemon(cmd)
        shard = await daemon.shard("s")
        await shard.child.write(
            ('{"action":"processRecords","records":[{"data":"eA==","partitionKey":"' + key +
             '","sequenceNumber":"1","subSequenceNumber":0}],"millisBehindLatest":0}\n').encode()
        )
        assert (await shard.child.read_message())["responseFor"] == "processRecords"
        await shard.lease_lost()
        await shard.close()
    assert calls[1][1][0][2] == key


async def test_kcl1_daemon_gets_v1_checkpoints_and_deaggregated_records(tmp_path):
    vectors = {v["name"]: v for v in json.loads((DATA / "kpl-vectors.json").read_text())["vectors"]}
    Rec, calls = recorder()

    class CheckpointingRec(Rec):
        async def process_records(self, batch, checkpointer):
            await super().process_records(batch, checkpointer)
            await checkpointer.checkpoint(batch.records[-1].sequence_number)

    async with running(CheckpointingRec, tmp_path) as (_, cmd):
        daemon = FakeDaemon(cmd, v1=True)
        shard = await daemon.shard("s")
        records = [
            {"data": vectors[name]["kinesis_record"]["data_b64"], "partitionKey": vectors[name]["kinesis_record"]["partition_key"],
             "sequenceNumber": str(100 + i), "approximateArrivalTimestamp": 1}
            for i, name in enumerate(["agg_3_records", "agg_bad_md5", "agg_bad_partition_key_index"])
        ]
        await shard.process_records(records)
        await shard.shutdown("TERMINATE")
        await shard.close()
    seen = calls[1][1]
    assert [(s, sub, pk, d) for s, sub, pk, d in seen[:3]] == [
        ("100", 0, "alpha", b"one"), ("100", 1, "beta", b"two"), ("100", 2, "alpha", b"three")]
    assert seen[3][:3] == ("101", None, "alpha")  # corrupt aggregate passes through whole
    assert seen[3][3] == base64.b64decode(vectors["agg_bad_md5"]["kinesis_record"]["data_b64"])
    assert [s[:2] for s in seen[4:]] == [("102", 0)]
    assert shard.checkpoint_requests[0] == ("102", None)  # the v1 "checkpoint" form
    assert daemon.checkpoints["s"] == SHARD_END
    [letter] = dead_letters(tmp_path, "s")  # the partly expanded aggregate is kept whole
    assert letter["sequence_number"] == "102" and letter["reason"] == "invalid KPL aggregate"


async def test_shutdown_lets_a_busy_action_finish_and_send_its_status(tmp_path):
    started = asyncio.Event()

    class Slow(mldserver.Handler):
        async def process_records(self, batch, checkpointer):
            started.set()
            await asyncio.sleep(0.5)
            await checkpointer.checkpoint()

    settings_dir = tmp_path
    settings = Settings(handler="t", port=0, state_dir=str(settings_dir / "state"))
    server = Server(settings, Slow)
    await server.start()
    cmd = relay_command(server.address[1])
    daemon = FakeDaemon(cmd)
    busy, idle = await daemon.shard("busy"), await daemon.shard("idle")
    batch = asyncio.ensure_future(busy.process_records(make_records(1, 1)))
    await started.wait()
    await server.shutdown()
    await batch  # the status arrived: the daemon did not see EOF before it
    assert daemon.checkpoints["busy"] == ("1", 0)
    assert await busy.child.read_line(5) is None and await idle.child.read_line(5) is None
    assert await busy.close() == 0 and await idle.close() == 0


async def test_checkpoint_without_sub_sequence_uses_the_delivered_one(tmp_path):
    class H(mldserver.Handler):
        async def process_records(self, batch, checkpointer):
            await checkpointer.checkpoint(batch.records[-1].sequence_number)

    async with running(H, tmp_path) as (_, cmd):
        daemon = FakeDaemon(cmd)
        shard = await daemon.shard("s")
        records = make_records(7, 1) * 3
        for sub, r in enumerate(records):
            records[sub] = dict(r, subSequenceNumber=sub)
        await shard.process_records(records)
        await shard.lease_lost()
        await shard.close()
    assert shard.checkpoint_requests == [("7", 2)]


async def test_batches_in_flight_are_bounded_across_shards(tmp_path):
    running_now, most = 0, 0

    class Busy(mldserver.Handler):
        async def process_records(self, batch, checkpointer):
            nonlocal running_now, most
            running_now += 1
            most = max(most, running_now)
            await asyncio.sleep(0.05)
            await checkpointer.checkpoint()
            running_now -= 1

    async with running(Busy, tmp_path, max_batches_in_flight=2) as (_, cmd):
        daemon = FakeDaemon(cmd)
        shards = [await daemon.shard(f"s{i}") for i in range(5)]
        for rnd in range(3):
            await asyncio.gather(*(s.process_records(make_records(100 * rnd + 1, 50)) for s in shards))
        await asyncio.gather(*(s.lease_lost() for s in shards))
        for s in shards:
            await s.close()
    assert most == 2
    assert all(daemon.checkpoints[f"s{i}"] == ("250", 0) for i in range(5))


class EmitAndCheckpoint(mldserver.Handler):
    async def process_records(self, batch, checkpointer):
        for record in batch.records:
            batch.emit(record, {"seq": record.sequence_number})
        await checkpointer.checkpoint()  # "everything": the server keeps it to what is committed


async def test_with_a_sink_no_checkpoint_passes_rows_the_sink_has_not_committed(tmp_path):
    out = tmp_path / "out"
    async with running(EmitAndCheckpoint, tmp_path, sink=f"file:{out}", window=3600.0, checkpoint_interval=0.0,
                       idle_timeout=3600.0) as (server, cmd):
        daemon = FakeDaemon(cmd)
        shard = await daemon.shard("shardId-1")
        # Behind the stream's tip: the watermark stays at the rows' time, the window open.
        await shard.process_records(make_records(10, 3), millis_behind_latest=1000)
        await shard.shutdown_requested()
        assert "shardId-1" not in daemon.checkpoints  # the window is still open: nothing is safe
        assert server.coordinator.ledger.rows == 3
        await shard.shard_ended()  # the rows are spooled, so SHARD_END may be stored
        assert daemon.checkpoints["shardId-1"] == SHARD_END
        spooled = (tmp_path / "state" / "spool" / "shardId-1.jsonl").read_text().splitlines()
        assert len(spooled) == 4  # a header and the three rows
        await shard.close()


async def test_rows_emitted_by_a_failed_attempt_are_not_kept(tmp_path):
    attempts = []

    class FailsOnce(mldserver.Handler):
        async def process_records(self, batch, checkpointer):
            for record in batch.records:
                batch.emit(record, {"seq": record.sequence_number, "attempt": len(attempts)})
            attempts.append(1)
            if len(attempts) == 1:
                raise RuntimeError("flaky")

    async with running(FailsOnce, tmp_path, sink=f"file:{tmp_path / 'out'}", window=3600.0) as (server, cmd):
        daemon = FakeDaemon(cmd)
        shard = await daemon.shard("shardId-1")
        await shard.process_records(make_records(10, 2), millis_behind_latest=1000)  # window stays open
        rows = [r[6] for r in server.coordinator.ledger.uncommitted("shardId-1")]
        assert rows == [b'{"seq":"10","attempt":1}', b'{"seq":"11","attempt":1}']
        await shard.lease_lost()
        await shard.close()


async def test_a_row_that_is_not_json_dead_letters_its_record_and_keeps_the_others(tmp_path):
    class BytesRow(mldserver.Handler):
        async def process_records(self, batch, checkpointer):
            for record in batch.records:
                value = record.data if record.sequence_number == "11" else record.sequence_number
                batch.emit(record, {"value": value})

    async with running(BytesRow, tmp_path, sink=f"file:{tmp_path / 'out'}", window=3600.0) as (server, cmd):
        daemon = FakeDaemon(cmd)
        shard = await daemon.shard("shardId-1")
        await shard.process_records(make_records(10, 3), millis_behind_latest=1000)  # window stays open
        rows = [r[6] for r in server.coordinator.ledger.uncommitted("shardId-1")]
        assert rows == [b'{"value":"10"}', b'{"value":"12"}']
        [letter] = dead_letters(tmp_path, "shardId-1")
        assert letter["sequence_number"] == "11" and letter["reason"] == "bad row"
        assert "not JSON-encodable" in letter["error"] and base64.b64decode(letter["data"]) == b"11111111"
        await shard.lease_lost()
        await shard.close()
