"""The real KCL 3.x MultiLangDaemon, end to end through the relay and the server.

kinesis-local, DynamoDB Local and the Java daemon run on loopback (REAL-MLD.md).
One long test, in the order a deployment lives through:

1. a 2-shard stream with plain records and KPL aggregates: the handler sees every
   record with the right data, partition key and (sequence, sub-sequence) position;
2. a split of shard 1: the parent gets shardEnded, SHARD_END is stored in the lease
   table, and the children are then processed;
3. SIGTERM to the daemon: every live shard gets shutdownRequested, then leaseLost,
   each answered (the daemon exits cleanly, every relay exits);
4. a restart: each shard resumes after its stored checkpoint (inside an aggregate,
   at the next user record) and nothing already checkpointed is delivered again.

The server runs the Spark pipeline (embedded Spark, parquet sink, 1 s windows): every
record is in the committed output exactly once, and a shard checkpoints only what the
sink committed.
"""

from __future__ import annotations

import base64
import json
import signal
import time
from pathlib import Path

import pyarrow.dataset as ds
import pytest
from aws_kinesis_agg.aggregator import RecordAggregator

from ..conftest import MLDSERVER, DATA, ServerProcess
from .components import DynamoDBLocal, KinesisLocal, MultiLangDaemon, wait_for

pytestmark = pytest.mark.realdaemon

STREAM, APP = "orders", "mldserver-it"
HALF = 2**127  # shard 0 of a 2-shard stream covers hash keys below this


class Seen:
    """What the recording handler wrote, parsed."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def entries(self) -> list[dict]:
        if not self.path.exists():
            return []
        return [json.loads(line) for line in self.path.read_text().splitlines() if line.strip()]

    def records(self, since: int = 0) -> list[tuple]:
        return [
            (e["shard_id"], r["sequence_number"], r["sub_sequence_number"], r["partition_key"], r["data"])
            for e in self.entries()[since:] if e["event"] == "records" for r in e["records"]
        ]

    def events(self, kind: str, since: int = 0) -> list[dict]:
        return [e for e in self.entries()[since:] if e["event"] == kind]


def put_plain(kinesis: KinesisLocal, prefix: str, count: int, hash_keys: list[int]) -> list[tuple]:
    """Put records spread over hash_keys; return the (shard, seq, 0, pk, data_b64) expected."""
    entries = [{"Data": f"{prefix}-{i}-\u00e9".encode(), "PartitionKey": f"{prefix}-pk-{i}",
                "ExplicitHashKey": str(hash_keys[i % len(hash_keys)])} for i in range(count)]
    result = kinesis.client.put_records(StreamName=STREAM, Records=entries)
    assert not result.get("FailedRecordCount")
    return [(r["ShardId"], r["SequenceNumber"], 0, e["PartitionKey"], base64.b64encode(e["Data"]).decode())
            for e, r in zip(entries, result["Records"])]


def put_aggregate(kinesis: KinesisLocal, prefix: str, count: int, hash_key: int) -> list[tuple]:
    """One KPL aggregate of ``count`` user records, all hashing inside one shard."""
    agg = RecordAggregator()
    users = []
    for i in range(count):
        pk, data = f"{prefix}-agg-{i}", f"{prefix}-agg-data-{i}".encode()
        agg.add_user_record(pk, data, explicit_hash_key=str(hash_key + i))
        users.append((pk, data))
    pk, ehk, blob = agg.clear_and_get().get_contents()
    r = kinesis.client.put_record(StreamName=STREAM, Data=blob, PartitionKey=pk, ExplicitHashKey=ehk)
    return [(r["ShardId"], r["SequenceNumber"], i, upk, base64.b64encode(d).decode()) for i, (upk, d) in enumerate(users)]


def put_raw_vector(kinesis: KinesisLocal, name: str, hash_key: int) -> list[tuple]:
    """A kpl-vectors.json record that is not a valid aggregate: delivered unchanged."""
    vector = next(v for v in json.loads((DATA / "kpl-vectors.json").read_text())["vectors"] if v["name"] == name)
    data = base64.b64decode(vector["kinesis_record"]["data_b64"])
    pk = vector["kinesis_record"]["partition_key"]
    r = kinesis.client.put_record(StreamName=STREAM, Data=data, PartitionKey=pk, ExplicitHashKey=str(hash_key))
    return [(r["ShardId"], r["SequenceNumber"], 0, pk, vector["kinesis_record"]["data_b64"])]


def committed(out: Path) -> list[tuple]:
    """Every row in the committed Spark output (window partitions; ``_`` names skipped)."""
    if not out.exists() or not any(p.name.startswith("window=") for p in out.iterdir()):
        return []
    rows = ds.dataset(out, format="parquet", partitioning="hive").to_table().to_pylist()
    return [(r["shard_id"], r["sequence_number"], r["sub_sequence_number"], r["partition_key"], r["data"])
            for r in rows]


def sink_records(out: Path) -> set[tuple]:
    return set(committed(out))


def wait_committed(out: Path, expected: list[tuple], timeout: float) -> None:
    want = set(expected)
    wait_for(lambda: want <= sink_records(out), timeout,
             f"{len(want)} records in the sink (missing {len(want - sink_records(out))})", interval=1)


def wait_seen(seen: Seen, expected: list[tuple], timeout: float, since: int = 0) -> None:
    want = set(expected)
    wait_for(lambda: want <= set(seen.records(since)), timeout,
             f"{len(want)} records at the handler (missing {len(want - set(seen.records(since)))})", interval=1)


def test_real_daemon_end_to_end(tmp_path):
    kinesis = KinesisLocal(tmp_path)
    dynamodb = DynamoDBLocal(tmp_path)
    record_file = tmp_path / "seen.jsonl"
    out = tmp_path / "out"
    config = tmp_path / "mldserver.toml"
    config.write_text("window = 1.0\nwatermark_margin = 1.0\nidle_timeout = 10.0\ncheckpoint_interval = 0.0\n")
    server = ServerProcess("tests.integration.recording:Recording", tmp_path, "--sink", f"parquet:{out}",
                           "--pipeline", "tests.integration.recording:pipeline",
                           "--config", str(config), env={"MLDSERVER_RECORD_FILE": str(record_file)})
    seen = Seen(record_file)
    executable = f"{MLDSERVER} connect 127.0.0.1:{server.port}"
    daemons: list[MultiLangDaemon] = []
    try:
        kinesis.create_stream(STREAM, 2)
        # 1. plain records in both shards, KPL aggregates and a corrupt aggregate in shard 0.
        expected = put_plain(kinesis, "a", 12, [5, HALF + 5])
        expected += put_aggregate(kinesis, "a", 7, 1000)
        expected += put_raw_vector(kinesis, "agg_bad_md5", 77)
        expected += put_aggregate(kinesis, "b", 3, 2000)
        assert {e[0] for e in expected} == {"shardId-000000000000", "shardId-000000000001"}

        daemons.append(MultiLangDaemon(tmp_path, executable=executable, stream=STREAM, app=APP,
                                       kinesis=kinesis, dynamodb=dynamodb, run=1))
        wait_seen(seen, expected, 240)
        delivered = seen.records()
        assert len(delivered) == len(set(delivered)), "a record was delivered twice"
        for shard in ("shardId-000000000000", "shardId-000000000001"):
            positions = [(int(s), sub) for sh, s, sub, _, _ in delivered if sh == shard]
            assert positions == sorted(positions), f"{shard} out of order"
        assert {e["shard_id"]: e["sequence_number"] for e in seen.events("initialize")} == {
            "shardId-000000000000": "TRIM_HORIZON", "shardId-000000000001": "TRIM_HORIZON"}

        # 2. split shard 1: shardEnded, SHARD_END stored, then the children get records.
        parent = kinesis.shards(STREAM)["shardId-000000000001"]
        lo, hi = (int(parent["HashKeyRange"][k]) for k in ("StartingHashKey", "EndingHashKey"))
        mid = (lo + hi) // 2
        kinesis.client.split_shard(StreamName=STREAM, ShardToSplit="shardId-000000000001",
                                   NewStartingHashKey=str(mid))
        children = sorted(s for s, d in kinesis.shards(STREAM).items() if d.get("ParentShardId") == "shardId-000000000001")
        assert len(children) == 2
        after_split = put_plain(kinesis, "c", 8, [lo + 10, hi - 10])
        assert {e[0] for e in after_split} == set(children)
        wait_for(lambda: seen.events("shard_ended"), 120, "shardEnded on the parent", interval=1)
        assert [e["shard_id"] for e in seen.events("shard_ended")] == ["shardId-000000000001"]
        wait_for(lambda: dynamodb.leases(APP).get("shardId-000000000001", (None,))[0] == "SHARD_END", 30,
                 "SHARD_END in the lease table", interval=1)
        wait_seen(seen, after_split, 180)
        expected += after_split
        wait_committed(out, expected, 60)

        # 3. SIGTERM: shutdownRequested then leaseLost for every live shard.
        marker = len(seen.entries())
        daemons[0].proc.send_signal(signal.SIGTERM)
        assert daemons[0].proc.wait(90) in (0, 143)  # 143: the JVM ran its shutdown hooks on SIGTERM
        live = {"shardId-000000000000", *children}
        tail = seen.entries()[marker:]
        for shard in live:
            kinds = [e["event"] for e in tail if e["shard_id"] == shard and e["event"] != "checkpointed"]
            assert kinds[:2] == ["shutdown_requested", "lease_lost"], (shard, kinds)
            # KCL 3.1.3 after a split: its graceful-shutdown coordinator also waits on the
            # ended parent's consumer until shutdownGraceMillis runs out, and meanwhile may
            # take the leases again and start new children (initialize, empty batches).
            assert set(kinds[2:]) <= {"initialize", "shutdown_requested", "lease_lost"}, (shard, kinds)
        log = daemons[0].log.read_text(errors="replace")
        for action in ("shutdownRequested", "leaseLost", "shardEnded"):
            written = log.count(f"Writing {action[0].upper()}{action[1:]}Message to child")
            answered = log.count(f'Received response {{"action":"status","responseFor":"{action}"}}')
            assert written == answered > 0, (action, written, answered)
        stored = dynamodb.leases(APP)
        wait_for(lambda: sum(1 for e in server.events() if e["event"] == "closed") >= 4, 30, "relays closed")

        # 4. restart: resume after the stored checkpoints, nothing checkpointed comes again.
        marker = len(seen.entries())
        more = put_plain(kinesis, "d", 6, [7, lo + 20, hi - 20])
        more += put_aggregate(kinesis, "d", 4, 3000)
        daemons.append(MultiLangDaemon(tmp_path, executable=executable, stream=STREAM, app=APP,
                                       kinesis=kinesis, dynamodb=dynamodb, run=2))
        wait_seen(seen, more, 300, since=marker)
        wait_committed(out, expected + more, 60)
        resumed = {e["shard_id"]: (e["sequence_number"], e["sub_sequence_number"])
                   for e in seen.events("initialize", since=marker)}
        for shard in live:
            assert resumed[shard] == stored[shard], shard
        assert "shardId-000000000001" not in resumed  # ended shards are not leased again
        again = set(seen.records(marker)) & set(expected)
        assert not again, f"delivered again after the restart: {sorted(again)[:3]}"
        rows = committed(out)
        assert len(rows) == len(set(rows)) == len(set(expected + more)), "committed output is not exactly once"

        errors = [e for e in server.events() if e["level"] == "error"]
        assert not errors, errors[:3]
        daemon_logs = "".join(d.log.read_text(errors="replace") for d in daemons)
        assert "mldserver connect:" not in daemon_logs  # no relay complained on stderr
    finally:
        for daemon in daemons:
            daemon.terminate()
        server.stop()
        dynamodb.terminate()
        kinesis.terminate()
