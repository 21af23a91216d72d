"""Hopping and session windows through the parquet sink (Spark, with its commit log): equal to
DuckDB's hopping windows over the same rows, exactly once across a restart between
commits, the restarted coordinator reading the commit log (its last window's end, each
shard's committed position) and the daemon delivering again from each checkpoint."""

from __future__ import annotations

import pyarrow.dataset as ds
import pytest

from mldserver.base.config import Settings
from mldserver.base.deadletters import DeadLetters
from mldserver.sinks.parquet import SparkSink
from mldserver.spark.process import SparkProcess

from ..coordinator import test_sessions as sessions
from ..coordinator.test_panes import SIZE, SLIDE, batches_of, hopping_by_duckdb, run, stream
from ..helpers import FakeClock

pytestmark = pytest.mark.spark


def output_windows(out):
    result = {}
    for window in [p for p in out.iterdir() if p.name.startswith("window=")]:
        start, end = map(int, window.name.removeprefix("window=").split("-"))
        rows = ds.dataset(window, format="parquet").to_table().to_pylist()
        assert all(start <= r["t"] < end for r in rows), window.name
        assert len({r["seq"] for r in rows}) == len(rows), window.name  # no row twice
        result[(start, end)] = (len(rows), round(sum(r["amount"] for r in rows), 2))
    return result


async def test_hopping_windows_commit_exactly_once_across_a_restart(tmp_path):
    data = stream(11)
    batches = batches_of(data, 11)
    clock = FakeClock(1_790_000_000_000)
    out = tmp_path / "out"
    settings = Settings(handler="x:y", state_dir=str(tmp_path / "state"), window=SIZE / 1000, slide=SLIDE / 1000,
                        sink=f"parquet:{out}")
    spark = SparkProcess(settings, sink_dir=out)
    await spark.start()
    try:
        sink = SparkSink(settings, spark, out, DeadLetters(tmp_path / "dead-letters"))
        safe = await run(tmp_path, batches, clock, stop_after=8, sink=sink)
        again = [(shard_id, kept) for shard_id, rows in batches
                 if (kept := [r for r in rows if safe[shard_id] is None or r[1] > safe[shard_id].seq])]
        assert len(again) < len(batches)  # something was checkpointed before the stop
        sink = SparkSink(settings, spark, out, DeadLetters(tmp_path / "dead-letters"))
        await run(tmp_path, again, clock, sink=sink)
    finally:
        await spark.stop()
    assert output_windows(out) == hopping_by_duckdb(data)


async def test_session_windows_commit_exactly_once_across_a_restart(tmp_path):
    """Sessions still open at the stop hold their shards' checkpoints; read again, the
    sessions the commit log says were handed over are not handed over twice."""
    data = sessions.stream(3)
    batches = sessions.batches_of(data, 3)
    clock = FakeClock(1_790_000_000_000)
    out = tmp_path / "out"
    settings = Settings(handler="x:y", state_dir=str(tmp_path / "state"), session_gap=sessions.GAP / 1000,
                        session_key="user", sink=f"parquet:{out}")
    spark = SparkProcess(settings, sink_dir=out)
    await spark.start()
    try:
        sink = SparkSink(settings, spark, out, DeadLetters(tmp_path / "dead-letters"))
        safe = await sessions.run(tmp_path, batches, clock, stop_after=5, sink=sink)
        again = [(shard_id, kept) for shard_id, rows in batches
                 if (kept := [r for r in rows if safe[shard_id] is None or r[1] > safe[shard_id].seq])]
        assert len(again) < len(batches)  # something was checkpointed before the stop
        sink = SparkSink(settings, spark, out, DeadLetters(tmp_path / "dead-letters"))
        await sessions.run(tmp_path, again, clock, sink=sink)
    finally:
        await spark.stop()
    rows = [r for window in out.iterdir() if window.name.startswith("window=")
            for r in ds.dataset(window, format="parquet").to_table().to_pylist()]
    assert sessions.committed_sessions(rows) == sessions.sessions_by_duckdb(data)
