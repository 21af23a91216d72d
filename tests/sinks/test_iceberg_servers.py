"""The table sink end to end: ``mldserver serve`` processes (the real CLI) sharing one
Iceberg table (a SQLite catalog in a temporary folder), driven through the relay by
fake daemons that share one lease table (their checkpoints). The stream's API is moto's
server on loopback (``stream`` names the stream; lineage asks it).

The table is read back by a second engine, DuckDB, over the data files the table's
current snapshot names, and compared with what the ``parquet:`` sink writes for the
same input (read with pyarrow, as a user's reader would)."""

from __future__ import annotations

import asyncio
import os
import signal
import urllib.request
from collections import Counter
from pathlib import Path

import boto3
import duckdb
import pyarrow.dataset as ds
import pytest
from moto.server import ThreadedMotoServer
from pyiceberg.catalog.sql import SqlCatalog

from mldserver.api.testing import FakeDaemon

from ..harness import eventually, relay_command
from ..integration.components import free_port
from ..test_pipeline import CONFIG, Stream, until_killed

PASSTHROUGH = "handlers.passthrough:Passthrough"
IDENTITY = "mldserver.spark.pipeline:identity"
AWS = {"AWS_ACCESS_KEY_ID": "local", "AWS_SECRET_ACCESS_KEY": "local", "AWS_DEFAULT_REGION": "us-east-1"}


@pytest.fixture
def kinesis():
    """moto's server with the stream ``orders``: what ``stream`` names."""
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    urllib.request.urlopen(urllib.request.Request(f"{endpoint}/moto-api/reset", method="POST"), timeout=10).close()
    boto3.client("kinesis", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="local",
                 aws_secret_access_key="local").create_stream(StreamName="orders", ShardCount=1)
    yield endpoint
    server.stop()


def config(tmp_path: Path, endpoint: str, idle_timeout: float = 3.0) -> str:
    path = tmp_path / "mldserver.toml"
    lines = [f'{k} = "{v}"' for k, v in {"stream": "orders", "aws_region": "us-east-1",
                                         "aws_endpoint_url": endpoint}.items()]
    base = CONFIG.replace("idle_timeout = 3.0", f"idle_timeout = {idle_timeout}")
    path.write_text(base + "\n".join(lines) + "\n")
    return str(path)


def table(lake: Path):
    catalog = SqlCatalog("mldserver", uri=f"sqlite:///{lake}/catalog.db", warehouse=f"file://{lake}")
    return catalog.load_table(("mldserver", "windows"))


def data_files(lake: Path) -> list[str]:
    """What the table's current snapshot names: pyiceberg's plan, no data read."""
    return [task.file.file_path.removeprefix("file://") for task in table(lake).scan().plan_files()]


def duckdb_rows(lake: Path, columns: str = "shard_id, sequence_number") -> list[tuple]:
    files = data_files(lake)
    if not files:
        return []
    return duckdb.sql(f"SELECT {columns} FROM read_parquet({files!r})").fetchall()


def committed(lake: Path) -> Counter:
    try:
        return Counter(duckdb_rows(lake))
    except Exception:  # no table yet
        return Counter()


def rows_committed(server) -> int:
    return sum(e["rows"] for e in server.events() if e["event"] == "window_committed")


def put_keys(model: Stream) -> set[tuple[str, str]]:
    return {(shard_id, r["sequenceNumber"]) for shard_id, records in model.records.items() for r in records}


async def test_two_servers_commit_every_record_once_across_a_lease_move_a_sigkill_and_a_split(serve, tmp_path,
                                                                                           kinesis):
    lake = tmp_path / "lake"
    args = ("--sink", f"iceberg:{lake}", "--config", config(tmp_path, kinesis))
    model = Stream()
    ids = sorted(model.records)
    a = serve(PASSTHROUGH, *args, "--state-dir", str(tmp_path / "a"), env=AWS)
    b = serve(PASSTHROUGH, *args, "--state-dir", str(tmp_path / "b"), env=AWS)
    on_a, on_b = FakeDaemon(relay_command(a.port)), FakeDaemon(relay_command(b.port))
    on_b.checkpoints = on_a.checkpoints  # one lease table

    mine = {i: await on_a.shard(i) for i in ids[:3]}
    await asyncio.gather(*(model.feed(s, batches=5) for s in mine.values()))
    await eventually(lambda: committed(lake), timeout=60, interval=0.25, what="a first commit from server a")

    # Rebalancing, both alive: shard 2's lease goes to b, which starts from a's checkpoint
    # and learns from the table what a committed since; then a hears it lost the lease.
    moved = ids[2]
    model.resume(moved, on_a.checkpoints.get(moved))
    taken = await on_b.shard(moved)
    await model.feed(taken, batches=3)
    lost = mine.pop(moved)
    await lost.lease_lost()
    await lost.close()

    # a is SIGKILLed mid-stream; b takes its leases from their checkpoints
    feeders = [asyncio.ensure_future(model.feed(s)) for s in mine.values()]
    await asyncio.sleep(0.3)
    os.kill(a.proc.pid, signal.SIGKILL)
    await asyncio.gather(*(until_killed(f) for f in feeders))
    for s in mine.values():
        await s.child.kill()
    a.proc.wait()
    shards = {moved: taken}
    for shard_id in ids[:2]:
        model.resume(shard_id, on_b.checkpoints.get(shard_id))
        shards[shard_id] = await on_b.shard(shard_id)
    # then shard 0 splits into 3 and 4
    await model.feed(shards[ids[0]])
    ended = shards.pop(ids[0])
    await ended.shard_ended()
    await ended.close()
    for child in ids[3:]:
        shards[child] = await on_b.shard(child)
    await model.finish(shards)

    put = put_keys(model)
    await eventually(lambda: put <= set(committed(lake)), timeout=90, interval=0.25, what="every record committed")
    counts = committed(lake)
    assert set(counts) == put and max(counts.values()) == 1  # exactly once, though records came twice

    servers = {s.summary.additional_properties["mldserver.server"] for s in table(lake).snapshots()}
    assert len(servers) == 2, servers  # the commits name both servers
    for path in data_files(lake):  # each commit's rows: each shard in its own order
        rows = duckdb.sql(f"SELECT shard_id, sequence_number FROM read_parquet('{path}')").fetchall()
        for shard_id in {s for s, _ in rows}:
            seqs = [int(q) for s, q in rows if s == shard_id]
            assert seqs == sorted(seqs), (path, shard_id)
    await model.shut_down(on_b, shards)


@pytest.mark.spark
async def test_the_table_has_the_parquet_sinks_schema_and_rows_with_and_without_spark(serve, tmp_path, kinesis):
    model = Stream()
    shard_ids = sorted(model.records)[:3]
    outputs = {
        "parquet": ("--sink", f"parquet:{tmp_path / 'parquet'}"),
        "iceberg": ("--sink", f"iceberg:{tmp_path / 'lake'}"),
        "iceberg+spark": ("--sink", f"iceberg:{tmp_path / 'lake-spark'}", "--pipeline", IDENTITY),
    }
    for name, sink in outputs.items():
        # no shard idles out: every row is in the window of its time on all three (none late)
        server = serve(PASSTHROUGH, *sink, "--config", config(tmp_path, kinesis, idle_timeout=600.0),
                       "--state-dir", str(tmp_path / f"state-{name}"), env=AWS)
        daemon = FakeDaemon(relay_command(server.port), timeout=120)
        for shard_id in shard_ids:
            model.resume(shard_id, None)
        shards = {i: await daemon.shard(i) for i in shard_ids}
        await model.finish(shards)
        total = sum(len(model.records[i]) for i in shard_ids)
        await eventually(lambda: rows_committed(server) == total, timeout=120, interval=0.25,
                         what=f"every row committed through {name}")
        await model.shut_down(daemon, shards)  # every shard checkpointed at its last record
        server.stop()

    parquet = ds.dataset(tmp_path / "parquet", format="parquet", partitioning="hive").to_table()
    for lake in (tmp_path / "lake", tmp_path / "lake-spark"):
        files = data_files(lake)
        relation = duckdb.sql(f"SELECT * FROM read_parquet({files!r})")
        assert [(n, str(t)) for n, t in zip(relation.columns, relation.types)] == [
            ("shard_id", "VARCHAR"), ("sequence_number", "VARCHAR"), ("sub_sequence_number", "BIGINT"),
            ("partition_key", "VARCHAR"), ("approximate_arrival_timestamp", "BIGINT"), ("data", "VARCHAR"),
            ("window", "VARCHAR")]
        assert relation.columns == parquet.column_names  # the same fields, window last as a partition column
        iceberg_schema = table(lake).schema().as_arrow()
        assert [f.name for f in iceberg_schema] == parquet.column_names
        mine = sorted(relation.fetchall())
        theirs = sorted(tuple(row.values()) for row in parquet.to_pylist())
        assert mine == theirs
