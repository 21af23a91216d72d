"""Hopping windows, session windows and amended windows (allowed_lateness) through the parquet sink (Spark, with its commit log): equal to
DuckDB's hopping windows over the same rows, exactly once across a restart between
commits, the restarted coordinator reading the commit log (its last window's end, each
shard's committed position) and the daemon delivering again from each checkpoint."""

from __future__ import annotations

import orjson
import pyarrow.dataset as ds
import pytest

from mldserver.base.config import Settings
from mldserver.base.deadletters import DeadLetters
from mldserver.sinks.parquet import SparkSink
from mldserver.spark.process import SparkProcess

from ..coordinator import test_amends as amends, test_sessions as sessions
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


async def test_an_amended_window_is_replaced_exactly_once_across_a_restart(tmp_path):
    """A stop between windows' first commits and their amendments: read again, each
    window not final is handed over again, whole, and Spark's output replaces it."""
    data = amends.stream(2)
    batches = amends.batches_of(data, 2)
    clock = FakeClock(1_790_000_000_000)
    out = tmp_path / "out"
    settings = Settings(handler="x:y", state_dir=str(tmp_path / "state"), window=amends.SIZE / 1000,
                        allowed_lateness=600.0, sink=f"parquet:{out}")
    spark = SparkProcess(settings, sink_dir=out)
    await spark.start()
    try:
        sink = SparkSink(settings, spark, out, DeadLetters(tmp_path / "dead-letters"))
        safe, _, amended = await amends.deliver(tmp_path, batches, clock, stop_after=8, sink=sink)
        again = [(shard_id, kept) for shard_id, rows in batches
                 if (kept := [r for r in rows if safe[shard_id] is None or r[1] > safe[shard_id].seq])]
        sink = SparkSink(settings, spark, out, DeadLetters(tmp_path / "dead-letters"))
        _, late, amended_after = await amends.deliver(tmp_path, again, clock, sink=sink)
    finally:
        await spark.stop()
    assert amended + amended_after > 0 and late == 0
    written = {tuple(map(int, w.name.removeprefix("window=").split("-"))):
               ds.dataset(w, format="parquet").to_table().to_pylist()
               for w in out.iterdir() if w.name.startswith("window=")}
    assert amends.each_row_once_in_its_window(written) == amends.expected_windows(data)
    versions = [orjson.loads(p.read_bytes()).get("version") for p in (out / "_commits").glob("[0-9]*.json")]
    assert max(versions) >= 2  # some window was replaced
