"""amazon_kclpy processors behind the server, unchanged, with the strict fake daemon:
amazon_kclpy's own sample app as the installed package puts it, v1 and v2 processors
seeing every record once, in order, with exact bytes and their shutdown reasons, and
what mldserver's rules add (a processor stopped past ``execution_timeout``, failures
retried then dead-lettered, ``emit``, pause, resume, reload, status and metrics)."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
from datetime import datetime
from pathlib import Path

import aiohttp
import pytest

from mldserver.api.testing import SHARD_END, FakeDaemon, make_records

from ..harness import eventually, relay_command, running
from ..helpers import FakeClock
from ..pool.serving import MemorySink, dead_letters, events

SAMPLE = "samples.sample_kclpy_app:RecordProcessor"
SEQ = 49590338271490256608559692538361571095921575989136588898  # a real sequence number's size
T0 = 1476889707000


def seen(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


async def get(url: str) -> tuple[int, str]:
    async with aiohttp.ClientSession() as session, session.get(url) as resp:
        return resp.status, await resp.text()


async def post(url: str) -> tuple[int, str]:
    async with aiohttp.ClientSession() as session, session.post(url) as resp:
        return resp.status, await resp.text()


def output(server, shard_id: str) -> list[tuple[str, str]]:
    return [(e["stream"], e["line"]) for e in server.events()
            if e["event"] == "handler_output" and e.get("shard_id") == shard_id]


async def test_the_sample_app_as_installed_runs_behind_the_server_and_a_throttled_shard_holds_only_itself(serve):
    import samples.sample_kclpy_app as sample

    assert "site-packages" in sample.__file__  # amazon_kclpy's own, where kclpy-ext put it: not a copy
    server = serve(SAMPLE, "--workers", "2")
    admin = await eventually(lambda: server.admin_url, what="admin_listening logged")
    throttle = {"shardId-000000000000"}  # its first checkpoint is refused once

    def errors(shard, seq, sub):
        if shard.shard_id in throttle:
            throttle.discard(shard.shard_id)
            return "ThrottlingException"
        return None

    daemon = FakeDaemon(relay_command(server.port), errors=errors)
    a, b, c = [await daemon.shard(f"shardId-{i:012d}") for i in range(3)]
    _, body = await get(f"{admin}/status")
    pid = {s["shard_id"]: s["handler_process"] for s in json.loads(body)["shards"]}
    assert pid[a.shard_id] == pid[c.shard_id] != pid[b.shard_id]  # c beside a in its process, b in the other

    # The first batch of each shard is checkpointed at its largest sequence number; a's
    # is refused (ThrottlingException): the sample prints, sleeps 5 s and checkpoints again.
    slow = asyncio.ensure_future(a.process_records(make_records(SEQ, 50)))
    await eventually(lambda: a.checkpoint_requests, what="a's first checkpoint")
    for shard in (b, c):  # meanwhile the other shards go on, in a's process and in the other
        await shard.process_records(make_records(SEQ, 20))
        await shard.process_records(make_records(SEQ + 20, 20))  # (the sample checkpoints every 30 s)
    assert not slow.done(), "the throttled shard's sleep held the others"
    assert b.checkpoint_requests == c.checkpoint_requests == [(str(SEQ + 19), 0)]
    await asyncio.wait_for(slow, 30)
    assert a.checkpoint_requests == [(str(SEQ + 49), 0)] * 2
    assert daemon.checkpoints[a.shard_id] == (str(SEQ + 49), 0)

    await a.shard_ended()  # the sample's shard_ended: checkpoint() with no argument, SHARD_END
    assert a.checkpoint_requests[-1] == (None, None) and daemon.checkpoints[a.shard_id] == SHARD_END
    assert daemon.stuck == set()
    await b.lease_lost()
    await c.shutdown_requested()  # the sample checkpoints all delivered
    await c.lease_lost()
    assert daemon.checkpoints[c.shard_id] == (str(SEQ + 39), 0)
    for shard in (a, b, c):
        assert await shard.close() == 0
        # one status for every action (the fake daemon exits on any other answer), and not
        # a byte of what the sample printed reached the daemon: no junk line, no stderr
        assert shard.child.skipped == [] and bytes(shard.child.stderr) == b""
    assert [a.actions, b.actions] == [["initialize", "processRecords", "shardEnded"],
                                      ["initialize", "processRecords", "processRecords", "leaseLost"]]

    # What it printed is in the server's log, with its shard.
    await eventually(lambda: ("stderr", "Shutdown has been requested, checkpointing.") in output(server, c.shard_id),
                     what="c's output logged")
    printed = output(server, a.shard_id)
    assert ("stdout", "Was throttled while checkpointing, will attempt again in 5 seconds") in printed
    assert ("stderr", "Shard has ended checkpointing") in printed
    assert any(line.startswith(f"Record (Partition Key: pk0, Sequence Number: {SEQ}, Subsequence Number: 0, "
                               "Data Size: 8") for _, line in printed)
    assert ("stderr", "Lease has been lost") in output(server, b.shard_id)


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("processor", ["V1Processor", "V2Processor"])
async def test_v1_and_v2_processors_see_every_record_once_in_order_with_exact_bytes_and_their_shutdown_reasons(
        tmp_path, monkeypatch, processor, workers):
    path = tmp_path / "seen.jsonl"
    monkeypatch.setenv("MLDSERVER_KCLPY_SEEN", str(path))
    sent: dict[str, list[dict]] = {}
    async with running(tmp_path, f"tests.kclpy_handlers:{processor}", workers=workers) as (_, _, daemon):
        ended, lost = await daemon.shard("shardId-000000000001"), await daemon.shard("shardId-000000000002")
        for n, size in enumerate((1, 7, 300)):
            for shard in (ended, lost):
                records = make_records(SEQ + 1000 * n, size, data=lambda seq: os.urandom(seq % 50) + b"\xff\x00",
                                       partition_key="k\u2028{i}\u00e9", approximate_arrival_timestamp=T0 + n)
                sent.setdefault(shard.shard_id, []).extend(records)
                await shard.process_records(records, millis_behind_latest=n)
                assert daemon.checkpoints[shard.shard_id] == (records[-1]["sequenceNumber"], 0)
        await ended.shard_ended()
        await lost.lease_lost()
        for shard in (ended, lost):
            assert await shard.close() == 0
    assert daemon.checkpoints[ended.shard_id] == SHARD_END

    entries = seen(path)
    for shard_id, records in sent.items():
        mine = [e for e in entries if e["shard_id"] == shard_id]
        assert [e["event"] for e in mine] == ["initialize", "records", "records", "records", "shutdown"]
        got = [r for e in mine if e["event"] == "records" for r in e["records"]]
        assert [(r["sequence_number"], r["sub_sequence_number"], r["partition_key"], r["data"]) for r in got] == \
               [(r["sequenceNumber"], 0, r["partitionKey"], r["data"]) for r in records]
        assert [r["binary_data"] for r in got] == [r["data"] for r in records]  # the bytes, base64 again
        if processor == "V2Processor":
            assert mine[0]["sequence_number"] == "TRIM_HORIZON" and mine[0]["sub_sequence_number"] == 0
            assert {r["type"] for r in got} == {"Record"}  # amazon_kclpy.messages.Record's subclass
            assert [r["arrival"] for r in got] == [datetime.fromtimestamp(r["approximateArrivalTimestamp"] / 1000.0)
                                                   .isoformat() for r in records]
            assert [e["millis_behind_latest"] for e in mine if e["event"] == "records"] == [0, 1, 2]
        assert len({e["thread"] for e in mine}) == 1 and mine[0]["thread"] == f"kclpy {shard_id}"
    ending = {e["shard_id"]: (e["reason"], e["checkpoint_error"]) for e in entries if e["event"] == "shutdown"}
    assert ending == {ended.shard_id: ("TERMINATE", None),
                      lost.shard_id: ("ZOMBIE", "Checkpointing is not allowed when the lease is lost")}


@pytest.mark.parametrize("how, workers, stopped", [("spin", 2, "cancelled"), ("spin", 0, None),
                                                   ("sleep", 2, "killed"), ("raise", 2, None), ("raise", 0, None)])
async def test_a_processor_that_spins_sleeps_or_raises_is_stopped_retried_and_dead_lettered_while_others_go_on(
        tmp_path, monkeypatch, caplog, how, workers, stopped):
    caplog.set_level(logging.INFO, logger="mldserver")
    monkeypatch.setenv("MLDSERVER_KCLPY_SEEN", str(tmp_path / "seen.jsonl"))
    async with running(tmp_path, "tests.kclpy_handlers:Poisoned", workers=workers, execution_timeout=0.5,
                       handler_retries=1) as (_, _, daemon):
        poisoned, calm = await daemon.shard("shardId-000000000001"), await daemon.shard("shardId-000000000002")
        bad = make_records(100, 3, data=lambda seq: how.encode())
        task = asyncio.ensure_future(poisoned.process_records(bad))
        done = 0
        while not task.done() and done < 200:  # the other shard's batches are answered meanwhile
            await calm.process_records(make_records(1000 + 10 * done, 2))
            done += 1
        assert done >= (2 if how != "raise" else 1)
        await asyncio.wait_for(task, 30)
        await poisoned.process_records(make_records(200, 2))  # the shard goes on after its dead letter
        assert daemon.checkpoints[poisoned.shard_id] == ("201", 0)
        for shard in (poisoned, calm):
            await shard.lease_lost()
            assert await shard.close() == 0
    assert [letter["sequence_number"] for letter in dead_letters(tmp_path, poisoned.shard_id)] == ["100", "101", "102"]
    # its 2 attempts, then its bisection: each half, and each half of a half that failed;
    # past execution_timeout (a half timing out) the failing half is dead-lettered whole
    halves = 4 if how == "raise" else 2
    # (the poisoned shard's: on a loaded machine the calm one's batch may itself pass 0.5 s)
    failed = [f for f in events(caplog, "handler_failed")
              if f["callback"] == "process_records" and f["shard_id"] == poisoned.shard_id]
    assert len(failed) == 2 + halves
    if how == "raise":
        assert all(f["error"] == "ValueError: a bad record" for f in failed)
    else:
        assert all("execution_timeout" in f["error"] for f in failed)
    if stopped is not None:  # in a handler process: stopped alone, its stack logged
        timed_out = [t for t in events(caplog, "handler_timed_out") if t.get("shard_id") == poisoned.shard_id]
        assert [t["stopped"] for t in timed_out] == [stopped] * (2 + halves)
        if stopped == "cancelled":  # (ProcessorStopped raised in the processor's own loop)
            assert all("while True" in t["stack"] and "ProcessorStopped" in t["stack"] for t in timed_out)


async def test_a_kept_checkpointer_checkpoints_in_a_later_action_as_under_kclprocess(tmp_path, monkeypatch):
    path = tmp_path / "seen.jsonl"
    monkeypatch.setenv("MLDSERVER_KCLPY_SEEN", str(path))
    async with running(tmp_path, "tests.kclpy_handlers:Kept", workers=2) as (_, _, daemon):
        shard = await daemon.shard("shardId-000000000001")
        await shard.process_records(make_records(1, 3))
        assert shard.checkpoint_requests == []
        await shard.process_records(make_records(4, 3))
        assert shard.checkpoint_requests == [(None, None)] and daemon.checkpoints[shard.shard_id] == ("6", 0)
        await shard.lease_lost()
        assert await shard.close() == 0
    assert [e["same"] for e in seen(path) if e["event"] == "kept"] == [True]  # one checkpointer per shard


async def test_emit_is_the_two_line_change_that_gives_a_processor_windows(tmp_path):
    sink = MemorySink()
    async with running(tmp_path, "tests.kclpy_handlers:Emits", sink=sink, clock=FakeClock(T0 + 3_600_000),
                       window=60.0, checkpoint_interval=0.0) as (_, _, daemon):
        shard = await daemon.shard("shardId-000000000001")
        await shard.process_records(make_records(1, 4, data_bytes=5, approximate_arrival_timestamp=T0),
                                    millis_behind_latest=0)
        await eventually(lambda: len(sink.rows) == 4, what="the rows committed")
        assert shard.shard_id not in daemon.checkpoints  # (nothing stored before the sink committed)
        await shard.process_records([], millis_behind_latest=0)  # the next action carries the checkpoint
        assert daemon.checkpoints[shard.shard_id] == ("4", 0)
        await shard.lease_lost()
        assert await shard.close() == 0
    assert sorted(sink.rows, key=lambda r: r["key"]) == [{"key": f"pk{i}", "size": 5} for i in range(4)]


async def test_pause_resume_reload_status_and_metrics_work_with_a_processor(serve, tmp_path):
    path = tmp_path / "seen.jsonl"
    server = serve("tests.kclpy_handlers:V2Processor", "--workers", "2", env={"MLDSERVER_KCLPY_SEEN": str(path)})
    admin = await eventually(lambda: server.admin_url, what="admin_listening logged")
    daemon = FakeDaemon(relay_command(server.port))
    shard = await daemon.shard("shardId-000000000001")
    await shard.process_records(make_records(1, 5))

    status, body = await post(f"{admin}/pause")
    assert status == 200 and json.loads(body) == {"paused": True, "changed": True}
    waiting = asyncio.ensure_future(shard.process_records(make_records(6, 5)))
    await eventually(lambda: any(e["event"] == "paused_action" for e in server.events()), what="the batch held")
    assert not waiting.done() and len([e for e in seen(path) if e["event"] == "records"]) == 1
    await post(f"{admin}/resume")
    await asyncio.wait_for(waiting, 10)
    assert daemon.checkpoints[shard.shard_id] == ("10", 0)

    status, _ = await post(f"{admin}/reload")
    assert status == 200
    await shard.process_records(make_records(11, 5))  # a fresh instance in a new process, from the checkpoint
    initialized = [e for e in seen(path) if e["event"] == "initialize"]
    assert [e["sequence_number"] for e in initialized] == ["TRIM_HORIZON", "10"]
    assert initialized[0]["pid"] != initialized[1]["pid"]

    _, body = await get(f"{admin}/status")
    (row,) = json.loads(body)["shards"]
    assert row["shard_id"] == shard.shard_id and row["records"] == 15 and row["handler_process"] == initialized[1]["pid"]
    _, metrics = await get(f"{admin}/metrics")
    assert f'mldserver_records_total{{shard_id="{shard.shard_id}"}} 15.0' in metrics
    assert 'mldserver_handler_calls_total{callback="process_records",outcome="success"} 3.0' in metrics
    await shard.lease_lost()
    assert await shard.close() == 0
