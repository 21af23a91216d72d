"""Two real KCL 3.x MultiLangDaemons with one application name (one lease table in
DynamoDB Local), each under its own ``mldserver run``, consume a 4-shard kinesis-local
stream into one Iceberg table (a SQLite catalog and its files in a temporary folder).

In the order a deployment lives through it:

1. worker a starts alone and takes every lease; records flow into the table;
2. worker b starts: the daemons rebalance, and some leases move to b while both stay
   alive (a gets shutdownRequested/leaseLost for them, b initializes them from the
   checkpoints and reads the table's positions);
3. mid-stream, worker a (its daemon and its server) is SIGKILLed: its leases move to b;
4. then a shard is split, and its children's records follow.

At the end every record put is in the table exactly once, each shard's rows are in
order within each commit's rows, and the commits name both servers. The table is read
by DuckDB over the data files its current snapshot names.
"""

from __future__ import annotations

import os
import signal
import threading
import time
import urllib.request
from pathlib import Path

import duckdb
import pytest
from pyiceberg.catalog.sql import SqlCatalog

from .components import DynamoDBLocal, KinesisLocal, Run, wait_for, write_properties

pytestmark = pytest.mark.realdaemon

STREAM, APP = "two-workers", "mldserver-two-workers"
QUARTER = 2**126  # shard i of a 4-shard stream covers hash keys from i * QUARTER
HANDLER = "handlers.passthrough:Passthrough"


def put(kinesis: KinesisLocal, prefix: str, count: int, hash_keys: list[int]) -> set[tuple[str, str]]:
    """Put records spread over hash_keys; the (shard, sequence number) of each."""
    entries = [{"Data": f"{prefix}-{i}".encode(), "PartitionKey": f"{prefix}-{i}",
                "ExplicitHashKey": str(hash_keys[i % len(hash_keys)])} for i in range(count)]
    result = kinesis.client.put_records(StreamName=STREAM, Records=entries)
    assert not result.get("FailedRecordCount")
    return {(r["ShardId"], r["SequenceNumber"]) for r in result["Records"]}


def owners(dynamodb: DynamoDBLocal) -> dict[str, str]:
    items = dynamodb.client.scan(TableName=APP, ConsistentRead=True)["Items"]
    return {i["leaseKey"]["S"]: i.get("leaseOwner", {}).get("S", "") for i in items}


def table(lake: Path):
    catalog = SqlCatalog("mldserver", uri=f"sqlite:///{lake}/catalog.db", warehouse=f"file://{lake}")
    return catalog.load_table(("mldserver", "windows"))


def files(lake: Path) -> list[str]:
    try:
        return [t.file.file_path.removeprefix("file://") for t in table(lake).scan().plan_files()]
    except Exception:  # no table yet
        return []


def rows(lake: Path) -> list[tuple[str, str]]:
    found = files(lake)
    if not found:
        return []
    return duckdb.sql(f"SELECT shard_id, sequence_number FROM read_parquet({found!r})").fetchall()


def status(runs: list[Run]) -> str:
    """Each live server's /status (its shards' watermarks, the coordinator's buffers)."""
    out = []
    for run in runs:
        if run.proc.poll() is not None:
            continue
        admin = next((e for e in run.events() if e["event"] == "admin_listening"), None)
        try:
            with urllib.request.urlopen(f"{admin['url'].rstrip('/')}/status", timeout=5) as reply:
                out.append(reply.read().decode())
        except Exception as exc:
            out.append(f"{run.log_path}: no status ({exc})")
    return "\n".join(out)


def wait_committed(lake: Path, expected: set, timeout: float, runs: list[Run]) -> None:
    try:
        wait_for(lambda: expected <= set(rows(lake)), timeout,
                 f"{len(expected)} records in the table (missing {len(expected - set(rows(lake)))})", interval=1)
    except TimeoutError as exc:
        missing = sorted(expected - set(rows(lake)))[:20]
        raise TimeoutError(f"{exc}; missing {missing}; servers: {status(runs)}") from None


@pytest.mark.timeout(1500)
def test_two_workers_commit_every_record_once_across_a_rebalance_a_sigkill_and_a_split(tmp_path):
    kinesis = KinesisLocal(tmp_path)
    dynamodb = DynamoDBLocal(tmp_path)
    lake = tmp_path / "lake"
    config = tmp_path / "mldserver.toml"
    config.write_text(
        "window = 1.0\nwatermark_margin = 1.0\nidle_timeout = 10.0\ncheckpoint_interval = 0.0\n"
        f'stream = "{STREAM}"\naws_region = "us-east-1"\naws_endpoint_url = "{kinesis.endpoint}"\n'
        "table_snapshots_kept = 100000\n"  # every commit stays readable: the test names their servers
    )
    properties = write_properties(tmp_path, APP, stream=STREAM, app=APP, kinesis=kinesis, dynamodb=dynamodb)
    args = (HANDLER, properties, "--sink", f"iceberg:{lake}", "--config", str(config), "--log-level", "debug")
    keys = [QUARTER * i + 7 for i in range(4)]
    runs: list[Run] = []
    stop = threading.Event()
    put_all: set[tuple[str, str]] = set()
    lock = threading.Lock()

    def producer(prefix: str) -> None:  # records keep coming while leases move
        n = 0
        while not stop.is_set():
            batch = put(kinesis, f"{prefix}{n}", 8, keys)
            with lock:
                put_all.update(batch)
            n += 1
            time.sleep(0.2)

    try:
        kinesis.create_stream(STREAM, 4)
        put_all.update(put(kinesis, "a", 40, keys))

        # 1. worker a alone takes every lease
        (tmp_path / "a").mkdir()
        runs.append(Run(tmp_path / "a", *args, run=1))
        a = runs[0]
        wait_for(lambda: len(owners(dynamodb)) == 4 and len(set(owners(dynamodb).values())) == 1, 240,
                 "worker a holding every lease", interval=1)
        worker_a = next(iter(owners(dynamodb).values()))
        wait_committed(lake, set(put_all), 120, runs)

        # 2. worker b starts: leases move to it by rebalancing, both alive
        feeding = threading.Thread(target=producer, args=("r",), daemon=True)
        feeding.start()
        (tmp_path / "b").mkdir()
        runs.append(Run(tmp_path / "b", *args, run=1))
        b = runs[1]
        wait_for(lambda: {o for o in owners(dynamodb).values() if o} - {worker_a}, 420,
                 "a lease moved to worker b by rebalancing", interval=2)
        moved = sorted(s for s, o in owners(dynamodb).items() if o and o != worker_a)
        wait_for(lambda: any(e["event"] == "committed_position_read" and e["shard_id"] in moved
                             for e in b.events()), 120, "worker b reading a moved shard's position", interval=1)
        with lock:
            so_far = set(put_all)
        wait_committed(lake, so_far, 180, runs)

        # 3. mid-stream, worker a is SIGKILLed (its daemon, then its server)
        os.kill(a.daemon_pid, signal.SIGKILL)
        os.kill(a.proc.pid, signal.SIGKILL)
        a.proc.wait()
        wait_for(lambda: set(owners(dynamodb).values()) - {worker_a, ""} and worker_a not in owners(dynamodb).values(),
                 420, "every lease of worker a taken by worker b", interval=2)
        stop.set()
        feeding.join()

        # 4. a shard splits; its children's records follow
        parent = "shardId-000000000002"
        kinesis.client.split_shard(StreamName=STREAM, ShardToSplit=parent,
                                   NewStartingHashKey=str(QUARTER * 2 + QUARTER // 2))
        children = sorted(s for s, d in kinesis.shards(STREAM).items() if d.get("ParentShardId") == parent)
        assert len(children) == 2
        after = put(kinesis, "s", 16, [QUARTER * 2 + 11, QUARTER * 2 + QUARTER // 2 + 11])
        assert {s for s, _ in after} == set(children)
        put_all.update(after)
        put_all.update(put(kinesis, "z", 12, [keys[0], keys[1], keys[3]]))
        wait_committed(lake, set(put_all), 300, runs)

        found = rows(lake)
        assert len(found) == len(set(found)) == len(put_all), "the table is not exactly once"
        assert set(found) == put_all
        for path in files(lake):  # within each commit's rows, each shard's in its own order
            in_file = duckdb.sql(f"SELECT shard_id, sequence_number FROM read_parquet('{path}')").fetchall()
            for shard in {s for s, _ in in_file}:
                seqs = [int(q) for s, q in in_file if s == shard]
                assert seqs == sorted(seqs), (path, shard)
        summaries = [s.summary.additional_properties for s in table(lake).snapshots()]
        servers = {s["mldserver.server"] for s in summaries}
        assert len(servers) == 2, servers  # the commits name both servers
        named = {k for k in table(lake).properties if k.startswith("mldserver.server/")}
        assert len(named) == 2, named
        skipped = sum(int(s["mldserver.skipped-rows"]) for s in summaries)
        print(f"two workers: {len(put_all)} records, {len(summaries)} commits, moved by rebalancing: {moved}, "
              f"rows already committed by the other server and left out: {skipped}")
    finally:
        stop.set()
        for run in runs:
            run.terminate()
        dynamodb.terminate()
        kinesis.terminate()
