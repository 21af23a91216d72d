"""Many machines, from the docs alone: three ``mldserver serve`` processes with one config
file (``sink = "iceberg:"``, a ``[table_catalog]`` of type ``sql`` whose ``uri`` is a
real PostgreSQL server's, with a password, and whose ``warehouse`` is a bucket on a real
S3-compatible server, moto's), driven through the relay by fake daemons that share one
lease table. Both servers are started by the test on loopback
(``integration/components.py``), as scripts/setup --test installs them.

Shards move between the servers and one server is SIGKILLed mid-run and restarted; at
the end a second reader, pyiceberg's own catalog opened under the configured catalog
name, finds every record's row exactly once. ``mldserver check`` reaches the catalog and
writes to the warehouse, ``mldserver table maintain`` runs, maintenance an hour on
removes from the bucket what conflicts and the SIGKILL left there and nothing else, and
neither the database's password nor the S3 secret is in anything any server, check or
maintain printed or logged."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

import boto3
import pytest
from pyiceberg.catalog import load_catalog

from mldserver.api.testing import FakeDaemon
from mldserver.base.config import Settings
from mldserver.sinks.iceberg import server_id
from mldserver.sinks.maintenance import maintain

from ..harness import MLDSERVER, ROOT, eventually, log_events, relay_command
from ..integration.components import AWS
from ..test_pipeline import CONFIG, Stream, until_killed

pytestmark = pytest.mark.slow  # a PostgreSQL server, an S3 server and four server processes

PASSTHROUGH = "handlers.passthrough:Passthrough"
CATALOG = "lake"  # [table_catalog] name: the name other engines give the catalog
SECRET_ACCESS_KEY = "s3-secret-" + os.urandom(12).hex()
ENV = {"AWS_ACCESS_KEY_ID": "local", "AWS_SECRET_ACCESS_KEY": "local", "AWS_DEFAULT_REGION": "us-east-1"}


def catalog_properties(postgresql, moto_s3) -> dict[str, str]:
    return {
        "type": "sql",
        "uri": postgresql.uri,
        "warehouse": "s3://lake/warehouse",
        "s3.endpoint": moto_s3.endpoint,
        "s3.access-key-id": "AKIAMLDSERVERTEST",
        "s3.secret-access-key": SECRET_ACCESS_KEY,
        "s3.region": "us-east-1",
    }


def write_config(tmp_path: Path, postgresql, moto_s3) -> Path:
    """The one file every server reads, as the docs' "many machines" block writes it."""
    path = tmp_path / "mldserver.toml"
    properties = {"name": CATALOG, **catalog_properties(postgresql, moto_s3)}
    catalog = "".join(f'"{k}" = "{v}"\n' for k, v in properties.items())
    path.write_text(
        f'handler = "{PASSTHROUGH}"\n'
        'stream = "orders"\n'
        'sink = "iceberg:"\n'
        'aws_region = "us-east-1"\n'
        f'aws_endpoint_url = "{moto_s3.endpoint}"\n'  # lineage: moto's Kinesis, on the same server
        + CONFIG
        + "[table_catalog]\n" + catalog
    )
    return path


class Lake:
    """The table as another engine sees it: pyiceberg's catalog opened under the
    configured catalog name, on the same PostgreSQL and bucket."""

    def __init__(self, postgresql, moto_s3) -> None:
        self.catalog = load_catalog(CATALOG, **catalog_properties(postgresql, moto_s3))

    def table(self):
        from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError

        try:
            return self.catalog.load_table(("mldserver", "windows"))
        except (NoSuchTableError, NoSuchNamespaceError):
            return None

    def rows(self) -> Counter:
        """(shard, sequence number) of every row in the current snapshot, counted."""
        table = self.table()
        if table is None or table.current_snapshot() is None:
            return Counter()
        arrow = table.scan(selected_fields=("shard_id", "sequence_number")).to_arrow()
        return Counter(zip(arrow.column("shard_id").to_pylist(), arrow.column("sequence_number").to_pylist()))

    def close(self) -> None:
        self.catalog.engine.dispose()


def rows_committed(server) -> int:
    return sum(e["rows"] for e in server.events() if e["event"] == "window_committed")


def mldserver(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([MLDSERVER, *args], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT), **ENV},
                          capture_output=True, text=True, timeout=120)


@pytest.fixture
def lake(postgresql, moto_s3):
    lake = Lake(postgresql, moto_s3)
    yield lake
    lake.close()


async def test_three_servers_on_postgresql_and_s3_commit_every_record_once(serve, tmp_path, postgresql, moto_s3,
                                                                          lake):
    started = time.monotonic()
    boto3.client("kinesis", endpoint_url=moto_s3.endpoint, **AWS).create_stream(StreamName="orders", ShardCount=1)
    config = write_config(tmp_path, postgresql, moto_s3)
    args = ("--config", str(config))
    model = Stream()
    ids = sorted(model.records)[:3]  # three shards (the split is test_iceberg_servers.py's)

    # a and b named by --server-id; c by the default (its host and state dir)
    a = serve(PASSTHROUGH, *args, "--state-dir", str(tmp_path / "a"), "--server-id", "server-a", env=ENV)
    b = serve(PASSTHROUGH, *args, "--state-dir", str(tmp_path / "b"), "--server-id", "server-b", env=ENV)
    c = serve(PASSTHROUGH, *args, "--state-dir", str(tmp_path / "c"), env=ENV)
    on_a, on_b, on_c = (FakeDaemon(relay_command(s.port)) for s in (a, b, c))
    on_b.checkpoints = on_c.checkpoints = on_a.checkpoints  # one lease table

    on_a_shards = {i: await on_a.shard(i) for i in ids[:2]}
    on_b_shards = {ids[2]: await on_b.shard(ids[2])}
    await asyncio.gather(*(model.feed(s, batches=4) for s in [*on_a_shards.values(), *on_b_shards.values()]))
    await eventually(lambda: rows_committed(a) and rows_committed(b), timeout=60, interval=0.25,
                     what="a first commit from servers a and b")

    # Rebalancing, both alive: shard 1's lease goes from a to c, which starts from the
    # checkpoint and learns from the table what a committed since; then a hears it lost it.
    moved = ids[1]
    model.resume(moved, on_a.checkpoints.get(moved))
    on_c_shards = {moved: await on_c.shard(moved)}
    await model.feed(on_c_shards[moved], batches=3)
    lost = on_a_shards.pop(moved)
    await lost.lease_lost()
    await lost.close()

    # b is SIGKILLed mid-stream, once it committed again while being fed (its last
    # windows are still open: the shard is behind, so its watermark holds them)
    before = rows_committed(b)
    feeder = asyncio.ensure_future(model.feed(on_b_shards[ids[2]]))
    await eventually(lambda: rows_committed(b) > before, timeout=60, interval=0.05,
                     what="server b committing while it is fed")
    os.kill(b.proc.pid, signal.SIGKILL)
    await until_killed(feeder)
    await on_b_shards[ids[2]].child.kill()
    b.proc.wait()
    await on_b.close()

    # b restarts (same state dir, same --server-id) and takes its shard back from the
    # checkpoint, and shard 0 from a as well
    b = serve(PASSTHROUGH, *args, "--state-dir", str(tmp_path / "b"), "--server-id", "server-b", env=ENV)
    on_b = FakeDaemon(relay_command(b.port))
    on_b.checkpoints = on_a.checkpoints
    model.resume(ids[2], on_b.checkpoints.get(ids[2]))
    on_b_shards = {ids[2]: await on_b.shard(ids[2])}
    await model.feed(on_a_shards[ids[0]], batches=2)
    model.resume(ids[0], on_a.checkpoints.get(ids[0]))
    on_b_shards[ids[0]] = await on_b.shard(ids[0])
    lost = on_a_shards.pop(ids[0])
    await lost.lease_lost()
    await lost.close()

    await asyncio.gather(model.finish(on_b_shards), model.finish(on_c_shards))
    put = {(shard_id, r["sequenceNumber"]) for shard_id in ids for r in model.records[shard_id]}
    await eventually(lambda: put <= set(lake.rows()), timeout=120, interval=0.5, what="every record in the table")
    counts = lake.rows()
    assert set(counts) == put and max(counts.values()) == 1, counts.most_common(3)  # exactly once
    await model.shut_down(on_b, on_b_shards)
    await model.shut_down(on_c, on_c_shards)
    await on_a.close()

    table = lake.table()
    # each server's last commit, in the table's properties (its snapshots may have expired)
    servers = {k.removeprefix("mldserver.server/") for k in table.properties if k.startswith("mldserver.server/")}
    assert servers - {"server-a", "server-b"} == {server_id(Settings(state_dir=str(tmp_path / "c")))}, servers
    assert table.location().startswith("s3://lake/warehouse/")
    other = load_catalog("mldserver", **catalog_properties(postgresql, moto_s3))  # the default name: not ours
    assert not other.table_exists(("mldserver", "windows"))
    other.engine.dispose()
    assert any(k.startswith("warehouse/") and k.endswith(".parquet") for k in moto_s3.keys("lake"))

    check = mldserver("check", "--config", str(config))
    assert check.returncode == 0, check.stdout + check.stderr
    sink = next(line for line in check.stdout.splitlines() if line.startswith("sink"))
    assert "catalog reached" in sink and "table mldserver.windows," in sink, sink
    assert "warehouse s3://lake/warehouse/mldserver/windows writable" in sink, sink

    maintained = mldserver("table", "maintain", "--config", str(config))
    assert maintained.returncode == 0, maintained.stdout + maintained.stderr
    assert maintained.stdout.startswith("table mldserver.windows: expired "), maintained.stdout
    # an hour on: what the conflicts and the SIGKILL left in the bucket goes, and only that
    report = maintain(lake.table(), keep=16, older_than=3600.0, now=time.time() + 7200)
    assert report.young == 0 and all(p.startswith("s3://lake/warehouse/mldserver/windows/") for p in report.deleted)
    counts = lake.rows()
    assert set(counts) == put and max(counts.values()) == 1

    outputs = {str(p): p.read_text(errors="replace") for p in tmp_path.glob("server-*.log")}
    outputs.update({str(p): p.read_text(errors="replace") for p in tmp_path.glob("server-*.stderr")})
    outputs.update(check=check.stdout + check.stderr, maintain=maintained.stdout + maintained.stderr)
    assert len([p for p in outputs if p.endswith(".log")]) == 4  # a, b, c and b again
    for secret in (postgresql.password, SECRET_ACCESS_KEY):
        assert not [name for name, text in outputs.items() if secret in text], "a secret was printed"
    assert any(f"mldserver:***@127.0.0.1:{postgresql.port}" in text for text in outputs.values())  # starred
    events = [e for path in tmp_path.glob("server-*.log") for e in log_events(path)]
    skipped = sum(e["rows"] for e in events if e["event"] in ("rows_already_committed", "window_already_committed"))
    conflicts = sum(e["event"] == "table_commit_conflict" for e in events)
    print(f"\n{len(put)} rows, each once ({skipped} offered again and left out); {conflicts} commit conflicts; "
          f"{len(table.snapshots())} snapshots kept; {maintained.stdout.strip()}; an hour on, {report.orphans} "
          f"orphans removed of {report.files} files; {time.monotonic() - started:.1f} s")


@pytest.mark.spark
async def test_a_pipeline_into_a_table_on_s3_writes_its_files_into_the_bucket_each_record_once(
        serve, tmp_path, postgresql, moto_s3, lake):
    """With --pipeline the Spark process writes a window's output on this machine (it has
    no S3 client of its own); the sink copies the files into the table's bucket with the
    catalog's own S3 settings and commits them there: every row once, every data file
    the table names in the bucket, none left behind locally."""
    kinesis = boto3.client("kinesis", endpoint_url=moto_s3.endpoint, **AWS)
    if "orders" not in kinesis.list_streams()["StreamNames"]:  # (the module's other test may have made it)
        kinesis.create_stream(StreamName="orders", ShardCount=1)
    config = write_config(tmp_path, postgresql, moto_s3)
    state = tmp_path / "spark-server"
    server = serve(PASSTHROUGH, "--config", str(config), "--state-dir", str(state), "--server-id", "with-spark",
                   "--pipeline", "mldserver.spark.pipeline:identity", env=ENV)
    model = Stream()
    ids = sorted(model.records)[3:5]  # shards the other test in this module did not use
    daemon = FakeDaemon(relay_command(server.port))
    shards = {i: await daemon.shard(i) for i in ids}
    await model.finish(shards)
    put = {(shard_id, r["sequenceNumber"]) for shard_id in ids for r in model.records[shard_id]}
    await eventually(lambda: put <= set(lake.rows()), timeout=300, interval=0.5, what="every record in the table")
    assert all(n == 1 for key, n in lake.rows().items() if key in put)
    await model.shut_down(daemon, shards)
    server.stop()

    table = lake.table()
    files = [task.file.file_path for task in table.scan().plan_files()]
    spark_files = [f for f in files if "/data/spark-" in f]
    assert spark_files and all(f.startswith("s3://lake/warehouse/") for f in spark_files), files
    keys = set(moto_s3.keys("lake"))
    assert all(f.removeprefix("s3://lake/") in keys for f in spark_files)
    left = [p for p in (state / "spark").rglob("*.parquet")]
    assert not left, left  # the local copies are gone once uploaded
