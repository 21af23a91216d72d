"""Many machines with the real parts, in one test: three ``mldserver run`` servers, each
with its own real KCL daemon, on one 6-shard kinesis-local stream (DynamoDB Local holds
the daemons' lease table), committing into one Iceberg table whose catalog is a real
PostgreSQL server and whose warehouse is a bucket on an S3-compatible server (moto's),
the same config file on every server (``sink = "iceberg:"`` and a ``[table_catalog]``).
``bench --part scale``'s quick run drives it (``mldserver.ops.bench.scale``): servers
join one by one, one that is not the KCL's leader is SIGKILLed, then starts again on its
state dir, while records are put throughout. Each time the leases settle over the live
servers, and every record put is in the table exactly once. A second engine reads the
table back: DuckDB over the data files the table's current snapshot names, fetched from
the bucket with pyarrow's own S3 client, finds the same rows."""

from __future__ import annotations

from collections import Counter

import duckdb
import pyarrow.parquet as pq
import pytest

from mldserver.ops.bench.scale import run_scale

pytestmark = [pytest.mark.realdaemon, pytest.mark.slow]


@pytest.mark.timeout(1800)
async def test_three_run_servers_on_postgresql_and_s3_settle_after_joins_a_sigkill_and_a_restart_each_record_once(
        tmp_path, postgresql, moto_s3):
    from pyarrow import fs

    catalog = {"name": "lake", "type": "sql", "uri": postgresql.uri, "warehouse": "s3://lake/warehouse",
               "s3.endpoint": moto_s3.endpoint, "s3.access-key-id": "AKIAMLDSERVERTEST",
               "s3.secret-access-key": "s3-secret-scale", "s3.region": "us-east-1"}
    scale = await run_scale(tmp_path, quick=True, table_catalog=catalog)
    print("\n".join(scale.table()))  # shown with a failure
    failed = [f"{c.name}: {c.detail}" for c in scale.checks() if not c.ok]
    assert not failed, " | ".join(failed)
    assert [p.name for p in scale.phases] == ["1 server", "2 servers", "3 servers", "SIGKILL, not leader",
                                              "it restarts"]
    assert all(int(n) > 0 for n in scale.phases[2].leases.split("/")), "each of three servers held a lease"
    committed_by = {name for name, events in scale.events.items()
                    if any(e["event"] == "window_committed" and e["rows"] for e in events)}
    assert committed_by == {"server-1", "server-2", "server-3"}

    from pyiceberg.catalog import load_catalog

    properties = {k: v for k, v in catalog.items() if k != "name"}
    table = load_catalog("lake", **properties).load_table(("mldserver", "windows"))
    s3 = fs.S3FileSystem(endpoint_override=moto_s3.endpoint, scheme="http", access_key="AKIAMLDSERVERTEST",
                         secret_key="s3-secret-scale", region="us-east-1")
    con = duckdb.connect()
    seen: Counter = Counter()
    for task in table.scan().plan_files():
        path = task.file.file_path.removeprefix("s3://")
        with s3.open_input_file(path) as f:
            data = pq.read_table(f, columns=["shard_id", "sequence_number"])  # noqa: F841 (DuckDB reads it by name)
        seen.update(con.execute("SELECT shard_id, sequence_number FROM data").fetchall())
    assert seen == scale.rows and set(seen) == scale.put
