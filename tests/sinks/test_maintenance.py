"""Table maintenance against a real Iceberg table (pyiceberg, a SQLite catalog in a
temporary folder): orphan files (a commit's files that no snapshot names, as a lost
conflict leaves them) removed once old enough, nothing a snapshot names touched, old
snapshots expired; by hand (``mldserver table maintain``) and on the server's schedule."""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import time

import pyarrow as pa
import pyarrow.parquet as pq

from mldserver.sinks.maintenance import maintain, referenced

from ..harness import MLDSERVER, ROOT
from .test_iceberg import TABLE, catalog, sink, table_rows, window


def orphan(tmp_path, name: str, age_s: float) -> str:
    """A data file in the table's data folder that no commit names (what a commit that
    lost its conflict leaves), ``age_s`` seconds old."""
    table = catalog(tmp_path).load_table(TABLE)
    path = f"{table.location().removeprefix('file://')}/data/{name}.parquet"
    pq.write_table(pa.table({"shard_id": ["s9"], "seq": [999]}), path)
    past = time.time() - age_s
    os.utime(path, (past, past))
    return path


async def committed(tmp_path, windows: int, **changes):
    a = await sink(tmp_path, **changes)
    for i in range(windows):
        await a.commit(window(i * 10, {"s0": [2 * i + 1, 2 * i + 2]}))
    return a


async def test_maintenance_removes_old_orphans_keeps_young_ones_and_everything_a_snapshot_names(tmp_path):
    await committed(tmp_path, 6, table_snapshots_kept=5)
    old, young = orphan(tmp_path, "lost-conflict", 7200), orphan(tmp_path, "under-way", 5)
    table = catalog(tmp_path).load_table(TABLE)
    named_before = set(referenced(table))
    assert len(table.metadata.snapshots) == 6  # commits expire from 2 x kept (10) on

    dry = maintain(table, keep=2, older_than=3600, dry_run=True)
    assert (dry.orphans, dry.young, dry.expired) == (1, 1, 0) and dry.deleted[0].endswith("lost-conflict.parquet")
    assert os.path.exists(old)

    report = maintain(table, keep=2, older_than=3600)
    # the old orphan goes; the young one stays, and so (for now) do the files only the
    # four expired snapshots named (their manifest lists): young too
    assert (report.orphans, report.expired) == (1, 4) and report.young >= 2
    assert not os.path.exists(old) and os.path.exists(young)
    table = catalog(tmp_path).load_table(TABLE)
    assert len(table.metadata.snapshots) == 2
    assert table_rows(tmp_path) == [("s0", n) for n in range(1, 13)]  # every row still read
    for location in set(referenced(table)):  # nothing the table names was removed
        assert os.path.exists(location.removeprefix("file://")), location
    # The expired snapshots' own manifest lists are orphans now: gone once old enough.
    later = maintain(table, keep=2, older_than=3600, now=time.time() + 7200)
    assert (later.orphans, later.young) == (report.young, 0)
    gone = {p for p in named_before if not os.path.exists(p.removeprefix("file://"))}
    assert gone and not set(referenced(table)) & gone  # only what the expired snapshots alone named
    assert table_rows(tmp_path) == [("s0", n) for n in range(1, 13)]


async def test_mldserver_table_maintain_says_what_it_removed_and_dry_run_removes_nothing(tmp_path):
    await committed(tmp_path, 3)
    old = orphan(tmp_path, "lost-conflict", 7200)
    config = tmp_path / "mldserver.toml"
    config.write_text(f'sink = "iceberg:{tmp_path / "lake"}"\nstream = "orders"\nstate_dir = "{tmp_path / "state"}"\n')

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([MLDSERVER, "table", "maintain", "--config", str(config), *args], cwd=ROOT,
                              env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=120)

    dry = run("--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "1 orphans would be removed" in dry.stdout and "lost-conflict.parquet" in dry.stdout
    assert os.path.exists(old)
    done = run()
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("table mldserver.windows: expired 0 snapshots;") and "1 orphans removed" in done.stdout
    assert not os.path.exists(old)
    assert table_rows(tmp_path) == [("s0", n) for n in range(1, 7)]
    wrong = subprocess.run([MLDSERVER, "table", "maintain", "--sink", f"file:{tmp_path}"], cwd=ROOT,
                           capture_output=True, text=True, timeout=60)
    assert wrong.returncode == 2 and "no table sink" in wrong.stderr


async def test_a_server_maintains_its_table_every_interval_after_a_commit(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="mldserver")
    a = await committed(tmp_path, 1, table_maintenance_interval=60.0, table_orphan_age=60.0)
    old = orphan(tmp_path, "lost-conflict", 7200)
    await a.commit(window(100, {"s0": [50]}))  # within the interval: nothing runs
    assert os.path.exists(old) and a._maintaining is None
    a._maintained_at -= 61  # an interval passed
    await a.commit(window(110, {"s0": [51]}))
    await asyncio.wait_for(a._maintaining, 30)
    assert not os.path.exists(old)
    done = [r for r in caplog.records if r.getMessage() == "table_maintained"]
    assert len(done) == 1 and done[0].fields["orphans"] == 1
