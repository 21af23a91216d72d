"""``mldserver serve --source kinesis:STREAM``: the server reads a real Kinesis stream
itself (kinesis-local, its plain-HTTP endpoint) into a batch ``Handler`` in a handler
process, with no daemon: every record's exact bytes, in order per shard; KPL aggregates
as one record per user record (sub-sequence numbers 0, 1, ...); a stream split and then
merged mid-run read parents first (every record of a parent handled before any of its
children's), nothing lost, nothing twice; a SIGKILL and a restart resume after the saved
position (inside a KPL aggregate too); ``--from`` a time starts ``AT_TIMESTAMP`` and skips what came before it; a shard is read
at most 5 times a second. The time-outs are generous (this machine's two cores are
shared with other test runs: a server has been seen to take a minute to start)."""

from __future__ import annotations

import asyncio
import json
import os
import pickle
import signal
import time
import uuid
from datetime import datetime, timezone

import pytest
from aws_kinesis_agg.aggregator import RecordAggregator

import mldserver
from mldserver.sources.positions import positions_path

from ..handlers import CheckpointLast
from ..harness import ServerProcess, running
from .components import AWS, KinesisLocal, eventually, wait_for

pytestmark = pytest.mark.slow  # servers killed and restarted against an emulator, minutes in all

HANDLER = "tests.pool_handlers:RecordBatches"
HALF = 2**127  # the middle of the hash key range


@pytest.fixture
def env(kinesis, tmp_path):
    """The AWS configuration (kinesis-local's plain HTTP: aiobotocore speaks no HTTP/2) and
    where RecordBatches writes what it saw."""
    return {"AWS_ENDPOINT_URL_KINESIS": kinesis.endpoint, "AWS_ACCESS_KEY_ID": AWS["aws_access_key_id"],
            "AWS_SECRET_ACCESS_KEY": AWS["aws_secret_access_key"], "AWS_REGION": AWS["region_name"],
            "MLDSERVER_TEST_SEEN": str(tmp_path / "seen.pickle")}


@pytest.fixture
def config(tmp_path):
    path = tmp_path / "mldserver.toml"
    path.write_text("source_poll_interval = 0.2\nsource_discovery_interval = 2.0\n")
    return str(path)


def stream(kinesis: KinesisLocal, shards: int) -> str:
    name = f"clicks-{uuid.uuid4().hex[:8]}"
    kinesis.create_stream(name, shards)
    return name


def put(kinesis: KinesisLocal, name: str, n: int, tag: str, hash_keys=(0, HALF)) -> list[tuple]:
    """``n`` records of distinct bytes (not UTF-8 ones among them), spread over ``hash_keys``;
    (shard, sequence number, sub-sequence number, partition key, data) each, as put."""
    entries = [{"Data": f"{tag}-{i}-".encode() + bytes([0xff, 0x00, i % 256]), "PartitionKey": f"{tag}-{i}",
                "ExplicitHashKey": str(hash_keys[i % len(hash_keys)] + i)} for i in range(n)]
    out = []
    for entry in entries:  # one at a time: their order in a shard is the order put
        r = kinesis.client.put_record(StreamName=name, **entry)
        out.append((r["ShardId"], r["SequenceNumber"], 0, entry["PartitionKey"], entry["Data"]))
    return out


def seen(tmp_path) -> list[tuple]:
    """What the handler saw, in the order it handled it."""
    out = []
    path = tmp_path / "seen.pickle"
    if not path.exists():
        return out
    with open(path, "rb") as f:
        while True:
            try:
                e = pickle.load(f)
            except EOFError:
                return out
            out.append((e["shard"], e["seq"], e["sub"], e["key"], e["data"]))


def saved(tmp_path, name: str) -> dict:
    path = positions_path(tmp_path / "state", f"kinesis:{name}")
    return json.loads(path.read_text())["shards"] if path.exists() else {}


def per_shard(records: list[tuple]) -> dict[str, list[tuple]]:
    out: dict[str, list[tuple]] = {}
    for r in records:
        out.setdefault(r[0], []).append(r)
    return out


def events(server: ServerProcess, name: str) -> list[dict]:
    return [e for e in server.events() if e["event"] == name]


def test_records_put_reach_a_handler_with_their_exact_bytes_in_order_per_shard(kinesis, env, config, tmp_path,
                                                                                serve):
    name = stream(kinesis, 2)
    expected = put(kinesis, name, 60, "a")
    server = serve(HANDLER, "--source", f"kinesis:{name}", "--config", config, env=env)
    expected += put(kinesis, name, 10, "b")  # while it reads
    got = wait_for(lambda: len(s := seen(tmp_path)) >= len(expected) and s, 120, "every record handled")
    assert len(per_shard(expected)) == 2
    assert per_shard(got) == per_shard(expected)  # exact bytes and keys, in order per shard, each once
    last = {shard: [records[-1][1], 0] for shard, records in per_shard(expected).items()}
    wait_for(lambda: saved(tmp_path, name) == last, 60, "each shard's last position saved")
    assert {(e["shard_id"], e["start"]) for e in events(server, "source_shard_started")} == \
        {(shard, "TRIM_HORIZON") for shard in last}
    assert server.stop() == 0
    assert events(server, "source_stopped")


def test_kpl_aggregates_reach_the_handler_one_user_record_each(kinesis, env, config, tmp_path, serve):
    name = stream(kinesis, 1)
    expected = put(kinesis, name, 2, "plain")
    agg = RecordAggregator()
    users = [(f"agg-{i}", f"user-{i}-\u00e9".encode() + bytes([0x80, i])) for i in range(5)]
    for pk, data in users:
        agg.add_user_record(pk, data)
    pk, ehk, blob = agg.clear_and_get().get_contents()
    r = kinesis.client.put_record(StreamName=name, Data=blob, PartitionKey=pk, **({"ExplicitHashKey": ehk} if ehk else {}))
    expected += [(r["ShardId"], r["SequenceNumber"], i, upk, data) for i, (upk, data) in enumerate(users)]
    expected += put(kinesis, name, 1, "after")
    serve(HANDLER, "--source", f"kinesis:{name}", "--config", config, env=env)
    got = wait_for(lambda: len(s := seen(tmp_path)) >= len(expected) and s, 120, "every user record handled")
    assert got == expected
    wait_for(lambda: list(saved(tmp_path, name).values()) == [[expected[-1][1], 0]], 60, "the last position saved")


def test_a_split_then_a_merge_mid_run_are_read_parents_first(kinesis, env, tmp_path, serve):
    # A slow handler (0.7 s a batch) and shards listed every 0.3 s: the children are listed
    # while their parents still have batches in hand, so a child started early would show.
    config = tmp_path / "split.toml"
    config.write_text("source_poll_interval = 0.2\nsource_discovery_interval = 0.3\n")
    name = stream(kinesis, 1)
    [parent] = kinesis.shards(name)
    server = serve(HANDLER, "--source", f"kinesis:{name}", "--config", str(config),
                   env={**env, "MLDSERVER_TEST_DELAY": "0.7"})
    wait_for(lambda: events(server, "source_shard_started"), 60, "the first shard read")
    expected = put(kinesis, name, 20, "p")
    kinesis.client.split_shard(StreamName=name, ShardToSplit=parent, NewStartingHashKey=str(HALF))
    wait_for(lambda: len(kinesis.shards(name)) == 3, 60, "the split")
    children = sorted(set(kinesis.shards(name)) - {parent})
    expected += put(kinesis, name, 20, "c")  # half into each child
    assert {r[0] for r in expected[20:]} == set(children)
    wait_for(lambda: len(seen(tmp_path)) >= len(expected), 120, "the parent's and the children's records handled")

    expected += put(kinesis, name, 10, "d")  # the children's last records, in hand when the merge is listed
    kinesis.client.merge_shards(StreamName=name, ShardToMerge=children[0], AdjacentShardToMerge=children[1])
    wait_for(lambda: len(kinesis.shards(name)) == 4, 60, "the merge")
    [merged] = sorted(set(kinesis.shards(name)) - {parent, *children})
    expected += put(kinesis, name, 10, "m")
    assert {r[0] for r in expected[50:]} == {merged}
    got = wait_for(lambda: len(s := seen(tmp_path)) >= len(expected) and s, 120, "the merged shard's records handled")

    assert sorted(got) == sorted(expected) and len(got) == len(expected)  # nothing lost, nothing twice
    assert per_shard(got) == per_shard(expected)  # in order per shard
    index = {shard: [i for i, r in enumerate(got) if r[0] == shard] for shard in per_shard(got)}
    for child in children:
        assert max(index[parent]) < min(index[child])  # every record of the parent before any of its children's
        assert max(index[child]) < min(index[merged])  # both parents of a merge before it
    # and no child read before its parents were read to their end (SHARD_END saved)
    log = [(e["event"], e["shard_id"]) for e in server.events() if e["event"] in ("source_shard_started",
                                                                                 "source_shard_ended")]
    for shard, parents in [(children[0], [parent]), (children[1], [parent]), (merged, children)]:
        for p in parents:
            assert log.index(("source_shard_ended", p)) < log.index(("source_shard_started", shard)), log
    ended = {e["shard_id"]: e for e in events(server, "source_shard_ended")}
    assert set(ended) == {parent, *children}
    assert sorted(ended[parent]["children"]) == children and ended[children[0]]["children"] == [merged]
    started = {e["shard_id"]: e for e in events(server, "source_shard_started")}
    assert sorted(started[merged]["parents"]) == children and started[merged]["start"] == "TRIM_HORIZON"
    wait_for(lambda: all(saved(tmp_path, name).get(s) == "SHARD_END" for s in (parent, *children)), 30,
             "SHARD_END saved for the parents")
    assert server.stop() == 0


def test_a_restart_after_sigkill_resumes_after_the_saved_position(kinesis, env, config, tmp_path, serve):
    name = stream(kinesis, 1)
    expected = put(kinesis, name, 8, "before")
    first = serve(HANDLER, "--source", f"kinesis:{name}", "--config", config, env=env)
    wait_for(lambda: list(saved(tmp_path, name).values()) == [[expected[-1][1], 0]], 120, "the 8th record saved")
    first.proc.send_signal(signal.SIGKILL)
    first.proc.wait()

    expected += put(kinesis, name, 5, "after")
    second = serve(HANDLER, "--source", f"kinesis:{name}", "--config", config, env=env)
    got = wait_for(lambda: len(s := seen(tmp_path)) >= 13 and s, 120, "the 5 new records handled")
    [resumed] = events(second, "source_shard_started")
    assert resumed["start"] == "AT_SEQUENCE_NUMBER" and resumed["position"] == expected[7][1]
    wait_for(lambda: list(saved(tmp_path, name).values()) == [[expected[-1][1], 0]], 60, "the 13th record saved")
    assert second.stop() == 0
    assert seen(tmp_path) == got == expected  # each once, in order: nothing twice, nothing lost


def test_from_a_time_starts_at_timestamp_and_skips_what_came_before(kinesis, env, config, tmp_path, serve):
    name = stream(kinesis, 2)
    put(kinesis, name, 6, "old")
    since = time.time() + 0.2
    wait_for(lambda: time.time() >= since + 0.2, 10, "past the time", interval=0.05)
    expected = put(kinesis, name, 6, "new")
    stamp = datetime.fromtimestamp(since, timezone.utc).isoformat()
    server = serve(HANDLER, "--source", f"kinesis:{name}", "--from", stamp, "--config", config, env=env)
    got = wait_for(lambda: len(s := seen(tmp_path)) >= 6 and s, 120, "the records after the time")
    wait_for(lambda: len(saved(tmp_path, name)) == 2, 60, "both shards' positions saved")
    assert {e["start"] for e in events(server, "source_shard_started")} == {"AT_TIMESTAMP"}
    assert server.stop() == 0
    assert per_shard(seen(tmp_path)) == per_shard(expected) and len(got) == 6


async def test_a_shard_is_read_at_most_five_times_a_second(kinesis, tmp_path, monkeypatch):
    """Polling every 10 ms asked for, a shard's GetRecords are still 200 ms apart (the
    service's 5 reads a second per shard, shared by its readers)."""
    for key, value in {"AWS_ENDPOINT_URL_KINESIS": kinesis.endpoint, "AWS_ACCESS_KEY_ID": AWS["aws_access_key_id"],
                       "AWS_SECRET_ACCESS_KEY": AWS["aws_secret_access_key"],
                       "AWS_REGION": AWS["region_name"]}.items():
        monkeypatch.setenv(key, value)
    name = await asyncio.to_thread(stream, kinesis, 1)  # (its wait runs a loop of its own)
    async with running(tmp_path, CheckpointLast, workers=0, source=(f"kinesis:{name}",),
                       source_poll_interval=0.01) as (server, _, _):
        [reader] = server.sources
        calls: list[float] = []
        records = reader.streams.records

        async def counted(iterator):  # a spy on the service's GetRecords
            calls.append(time.monotonic())
            return await records(iterator)

        reader.streams.records = counted
        await eventually(lambda: len(calls) >= 8, 10, what="8 reads")
    gaps = [b - a for a, b in zip(calls, calls[1:])]
    assert min(gaps) >= 0.195, gaps


async def test_a_position_inside_a_kpl_aggregate_resumes_at_its_next_user_record(kinesis, tmp_path, monkeypatch):
    """Saved at user record 2 of an aggregate of 5: the next server reads the aggregate
    again (AT_SEQUENCE_NUMBER) and hands over user records 3 and 4, then what follows."""
    for key, value in {"AWS_ENDPOINT_URL_KINESIS": kinesis.endpoint, "AWS_ACCESS_KEY_ID": AWS["aws_access_key_id"],
                       "AWS_SECRET_ACCESS_KEY": AWS["aws_secret_access_key"],
                       "AWS_REGION": AWS["region_name"]}.items():
        monkeypatch.setenv(key, value)
    name = await asyncio.to_thread(stream, kinesis, 1)
    agg = RecordAggregator()
    for i in range(5):
        agg.add_user_record(f"u-{i}", f"user-{i}".encode())
    pk, _, blob = agg.clear_and_get().get_contents()
    r = await asyncio.to_thread(kinesis.client.put_record, StreamName=name, Data=blob, PartitionKey=pk)
    [after] = await asyncio.to_thread(put, kinesis, name, 1, "after")
    handled: list[tuple] = []

    class CheckpointsTheThird(mldserver.Handler):
        async def process_records(self, batch, checkpointer):
            handled.extend((rec.sequence_number, rec.sub_sequence_number, rec.data) for rec in batch.records)
            if len(handled) >= 3 and handled[2][1] == 2:
                await checkpointer.checkpoint(handled[2][0], 2)

        async def shutdown_requested(self, checkpointer):
            pass  # the saved position stays inside the aggregate

    async with running(tmp_path, CheckpointsTheThird, workers=0, source=(f"kinesis:{name}",),
                       source_poll_interval=0.05):
        await eventually(lambda: saved(tmp_path, name) == {"shardId-000000000000": [r["SequenceNumber"], 2]}, 30,
                         what="user record 2 saved")
    first, handled[:] = list(handled), []
    assert [h[1] for h in first] == [0, 1, 2, 3, 4, 0]

    async with running(tmp_path, CheckpointsTheThird, workers=0, source=(f"kinesis:{name}",),
                       source_poll_interval=0.05):
        await eventually(lambda: len(handled) >= 3, 60, what="the rest handled")
    assert handled == [(r["SequenceNumber"], 3, b"user-3"), (r["SequenceNumber"], 4, b"user-4"),
                       (after[1], 0, after[4])]


async def test_each_source_shards_lag_is_on_status_and_a_metric(kinesis, tmp_path, monkeypatch):
    """Kinesis's MillisBehindLatest of each shard's last page: on ``/status`` under
    ``sources`` (and ``mldserver status``), and as ``mldserver_source_millis_behind``."""
    from mldserver.ops.status import render
    from mldserver.server.admin import status_of

    for key, value in {"AWS_ENDPOINT_URL_KINESIS": kinesis.endpoint, "AWS_ACCESS_KEY_ID": AWS["aws_access_key_id"],
                       "AWS_SECRET_ACCESS_KEY": AWS["aws_secret_access_key"],
                       "AWS_REGION": AWS["region_name"]}.items():
        monkeypatch.setenv(key, value)
    name = await asyncio.to_thread(stream, kinesis, 2)
    await asyncio.to_thread(put, kinesis, name, 6, "lag")
    async with running(tmp_path, CheckpointLast, workers=0, source=(f"kinesis:{name}",),
                       source_poll_interval=0.05) as (server, _, _):
        await eventually(lambda: len(server.sources[0].lags()) == 2 and
                         None not in server.sources[0].lags().values(), 30, what="both shards read")
        [source] = status_of(server)["sources"]
        assert source["source"] == f"kinesis:{name}" and source["stream"].endswith(f":stream/{name}")
        assert [(s["shard_id"], s["lag_ms"]) for s in source["shards"]] == \
            [("shardId-000000000000", 0), ("shardId-000000000001", 0)]  # caught up
        registry = server.metrics.registry
        for shard_id in ("shardId-000000000000", "shardId-000000000001"):
            assert registry.get_sample_value("mldserver_source_millis_behind",
                                             {"source": f"kinesis:{name}", "shard_id": shard_id}) == 0
        assert f"kinesis:{name}  shardId-000000000001       0" in render(status_of(server))


def test_a_stream_deleted_and_created_again_is_read_from_its_start(kinesis, env, config, tmp_path, serve):
    """A stream created again under its name keeps its ARN and its shard ids, but none of
    the old stream's records: the saved positions are the old stream's (its creation
    time says so) and are dropped, and the new stream is read from its start."""
    name = stream(kinesis, 1)
    old = put(kinesis, name, 5, "old")
    first = serve(HANDLER, "--source", f"kinesis:{name}", "--config", config, env=env)
    wait_for(lambda: list(saved(tmp_path, name).values()) == [[old[-1][1], 0]], 120, "the old stream's last position")
    assert first.stop() == 0

    kinesis.client.delete_stream(StreamName=name)
    wait_for(lambda: name not in kinesis.client.list_streams()["StreamNames"], 60, "the stream deleted")
    kinesis.create_stream(name, 1)
    new = put(kinesis, name, 5, "new")
    second = serve(HANDLER, "--source", f"kinesis:{name}", "--config", config, env=env)
    got = wait_for(lambda: len(s := seen(tmp_path)) >= 10 and s, 120, "the new stream's records handled")
    [recreated] = events(second, "source_stream_recreated")
    assert recreated["shards"] == 1
    assert [e["start"] for e in events(second, "source_shard_started")] == ["TRIM_HORIZON"]
    wait_for(lambda: list(saved(tmp_path, name).values()) == [[new[-1][1], 0]], 60, "the new stream's last position")
    assert second.stop() == 0
    assert seen(tmp_path) == got == old + new  # the new stream's records each once, none skipped
