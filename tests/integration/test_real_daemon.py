"""The real KCL 3.x MultiLangDaemon, end to end, started as users start it: ``mldserver
run`` (the server, then the daemon as its supervised child, its executableName set to
the server's relay whatever the file says).

kinesis-local, DynamoDB Local and the Java daemon run on loopback (components.py).
One long test (the daemon takes a minute to take its first leases), in the order a
deployment lives through:

1. a 2-shard stream with plain records and KPL aggregates: the handler sees every
   record with the right data, partition key and (sequence, sub-sequence) position;
2. a split of shard 1: the parent gets shardEnded, SHARD_END is stored in the lease
   table, and the children are then processed;
3. SIGTERM to ``mldserver run``: the daemon is stopped first, so every live shard
   gets shutdownRequested, then leaseLost, each answered, and its last position is
   stored in the lease table; the daemon exits cleanly, then the server, exit 0;
4. a restart: each shard resumes after its stored checkpoint (inside an aggregate,
   at the next user record) and nothing already checkpointed is delivered again;
5. the daemon child killed: ``mldserver run`` logs why and exits 1.

The server runs the Spark pipeline (embedded Spark, parquet sink, 1 s windows): every
record is in the committed output exactly once, and a shard checkpoints only what the
sink committed.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import time
from pathlib import Path

import pyarrow.dataset as ds
import pytest
from aws_kinesis_agg.aggregator import RecordAggregator

from ..conftest import DATA
from .components import DynamoDBLocal, KinesisLocal, Run, wait_for, write_properties

pytestmark = [pytest.mark.realdaemon, pytest.mark.spark]  # the pipeline runs in embedded Spark

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


def after_split_shutdown(event: dict) -> bool:
    """KCL 3.1.3 after a split: its graceful shutdown also waits on the ended parent's
    consumer until shutdownGraceMillis runs out, then logs this error (and still exits
    cleanly, every live shard checkpointed): the daemon's, reported as it is."""
    return event["event"] == "daemon_error" and (
        "Encountered an error during shutdown" in event["line"]
        or event["line"].startswith("java.util.concurrent.TimeoutException"))


def positions(seen: Seen, shard: str) -> list[tuple[int, int]]:
    return [(int(seq), sub) for sh, seq, sub, _, _ in seen.records() if sh == shard]


@pytest.mark.timeout(900)
def test_real_daemon_end_to_end(tmp_path):
    kinesis = KinesisLocal(tmp_path)
    dynamodb = DynamoDBLocal(tmp_path)
    record_file = tmp_path / "seen.jsonl"
    out = tmp_path / "out"
    config = tmp_path / "mldserver.toml"
    config.write_text("window = 1.0\nwatermark_margin = 1.0\nidle_timeout = 10.0\ncheckpoint_interval = 0.0\n")
    properties = write_properties(tmp_path, APP, stream=STREAM, app=APP, kinesis=kinesis, dynamodb=dynamodb)
    serve_args = ("tests.integration.recording:Recording", properties, "--sink", f"parquet:{out}",
                  "--pipeline", "tests.integration.recording:pipeline", "--config", str(config))
    env = {"MLDSERVER_RECORD_FILE": str(record_file)}
    seen = Seen(record_file)
    runs: list[Run] = []
    try:
        kinesis.create_stream(STREAM, 2)
        # 1. plain records in both shards, KPL aggregates and a corrupt aggregate in shard 0.
        expected = put_plain(kinesis, "a", 12, [5, HALF + 5])
        expected += put_aggregate(kinesis, "a", 7, 1000)
        expected += put_raw_vector(kinesis, "agg_bad_md5", 77)
        expected += put_aggregate(kinesis, "b", 3, 2000)
        assert {e[0] for e in expected} == {"shardId-000000000000", "shardId-000000000001"}

        runs.append(Run(tmp_path, *serve_args, run=1, env=env))
        first = runs[0]
        (overridden,) = [e for e in first.events() if e["event"] == "executable_overridden"]
        assert overridden["was"] == "mldserver connect 127.0.0.1:1" and overridden["line"] == 1
        assert overridden["now"].endswith(f" connect 127.0.0.1:{first.port}")
        wait_seen(seen, expected, 240)
        delivered = seen.records()
        assert len(delivered) == len(set(delivered)), "a record was delivered twice"
        for shard in ("shardId-000000000000", "shardId-000000000001"):
            assert positions(seen, shard) == sorted(positions(seen, shard)), f"{shard} out of order"
        assert {e["shard_id"]: e["sequence_number"] for e in seen.events("initialize")} == {
            "shardId-000000000000": "TRIM_HORIZON", "shardId-000000000001": "TRIM_HORIZON"}
        wait_for(lambda: any(e["event"] == "daemon_lease_taken" for e in first.events()), 30,
                 "the daemon's lease taken in the server's log")

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

        # 3. SIGTERM to mldserver run: the daemon first (shutdownRequested, then leaseLost
        # for every live shard, the last position stored), then the server; exit 0.
        marker = len(seen.entries())
        daemon_log_at = first.daemon_log.stat().st_size
        started = time.monotonic()
        assert first.terminate(120) == 0, first.stderr_path.read_text()
        stop_s = time.monotonic() - started
        live = {"shardId-000000000000", *children}
        tail = seen.entries()[marker:]
        for shard in live:
            kinds = [e["event"] for e in tail if e["shard_id"] == shard and e["event"] != "checkpointed"]
            assert kinds[:2] == ["shutdown_requested", "lease_lost"], (shard, kinds)
            # KCL 3.1.3 after a split: its graceful-shutdown coordinator also waits on the
            # ended parent's consumer until shutdownGraceMillis runs out, and meanwhile may
            # take the leases again and start new children (initialize, empty batches).
            assert set(kinds[2:]) <= {"initialize", "shutdown_requested", "lease_lost"}, (shard, kinds)
        log = first.daemon_log.read_bytes()[daemon_log_at:].decode(errors="replace")
        for action in ("shutdownRequested", "leaseLost"):
            written = log.count(f"Writing {action[0].upper()}{action[1:]}Message to child")
            answered = log.count(f'Received response {{"action":"status","responseFor":"{action}"}}')
            assert written == answered > 0, (action, written, answered)
        stored = dynamodb.leases(APP)
        for shard in live:  # every record was committed before the SIGTERM: the last one is stored
            seq, sub = max(positions(seen, shard))
            assert stored[shard] == (str(seq), sub), (shard, stored[shard])
        order = [e["event"] for e in first.events()]
        assert order.index("daemon_stopping") < order.index("daemon_stopped") < order.index("shutting_down") \
            < order.index("stopped"), order
        (stopped,) = [e for e in first.events() if e["event"] == "daemon_stopped"]
        assert stopped["clean"] is True, stopped
        assert sum(1 for e in first.events() if e["event"] == "closed") >= 4  # every relay closed

        # 4. restart: resume after the stored checkpoints, nothing checkpointed comes again.
        marker = len(seen.entries())
        more = put_plain(kinesis, "d", 6, [7, lo + 20, hi - 20])
        more += put_aggregate(kinesis, "d", 4, 3000)
        runs.append(Run(tmp_path, *serve_args, run=2, env=env))
        second = runs[1]
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
        errors = [e for run in runs for e in run.events() if e["level"] == "error" and not after_split_shutdown(e)]
        assert not errors, errors[:3]
        assert "mldserver connect:" not in first.daemon_log.read_text(errors="replace")  # no relay complained

        # 5. the daemon dies under mldserver run: it logs why and exits 1.
        os.kill(second.daemon_pid, signal.SIGKILL)
        assert second.proc.wait(60) == 1
        (exited,) = [e for e in second.events() if e["event"] == "daemon_exited"]
        assert exited["returncode"] == -9, exited
        (crashed,) = [e for e in second.events() if e["event"] == "task_crashed"]
        assert crashed["task"] == "kcl-daemon" and "killed by SIGKILL" in crashed["error"], crashed
        assert "exited by itself" in second.stderr_path.read_text()
        print(f"mldserver run: stopped in {stop_s:.1f} s after SIGTERM")
    finally:
        for run in runs:
            run.terminate()
        dynamodb.terminate()
        kinesis.terminate()
