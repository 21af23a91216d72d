"""Hopping windows: panes kept until their last window, each window made of the panes
it spans, the oldest committed; through the coordinator and the file sink, equal to
DuckDB's hopping windows over the same rows, across a restart too."""

from __future__ import annotations

import random
import tempfile
from pathlib import Path

import duckdb
import orjson
import uvloop
from hypothesis import given, settings as hsettings, strategies as st

from mldserver.rows.batch import Item, RowBatch
from mldserver.base.config import Settings
from mldserver.base.positions import Position
from mldserver.coordinator import Coordinator
from mldserver.coordinator.ordering import WindowRows
from mldserver.coordinator.panes import Panes
from mldserver.sinks.file import FileSink

from ..helpers import FakeClock

SIZE, SLIDE = 60_000, 20_000


def pane(start, shard_rows):
    return WindowRows(start, start + SLIDE, {s: [rows_of(rows)] for s, rows in shard_rows.items()})


def rows_of(rows):
    batch = RowBatch.of(Item(t, Position(seq, 0, str(seq)), orjson.dumps({"seq": seq, "t": t, "amount": a}))
                        for t, seq, a in rows)
    batch.timed = True
    return batch


def test_a_window_is_handed_over_once_the_watermark_passes_its_end_and_commits_its_oldest_pane():
    panes = Panes(SIZE, SLIDE)
    first = pane(0, {"a": [(1_000, 1, 1.0)], "b": [(5_000, 7, 2.0)]})
    windows = panes.assemble([first], until=20_000)
    assert [(w.start, w.end, w.kind) for w in windows] == [(-40_000, 20_000, "hopping")]
    assert windows[0].commits == {}  # no pane leaves before its third window
    second = pane(20_000, {"a": [(25_000, 2, 3.0)]})
    windows = panes.assemble([second], until=59_999)
    assert [(w.start, w.end) for w in windows] == [(-20_000, 40_000)]
    windows = panes.assemble([], until=100_000)
    assert [(w.start, w.end) for w in windows] == [(0, 60_000), (20_000, 80_000)]
    assert {s: sum(map(len, r)) for s, r in windows[0].commits.items()} == {"a": 1, "b": 1}  # the first pane
    assert sorted(windows[0].parts) == ["a", "b"] and sum(map(len, windows[0].parts["a"])) == 2
    assert {s: sum(map(len, r)) for s, r in windows[1].commits.items()} == {"a": 1}
    assert not panes.kept and panes.assemble([], until=10**9) == []


def test_a_shard_whose_lease_is_lost_leaves_the_panes_kept():
    panes = Panes(SIZE, SLIDE)
    panes.assemble([pane(0, {"a": [(1_000, 1, 1.0)], "b": [(5_000, 7, 2.0)]})], until=20_000)
    assert panes.drop("b") == 1 and panes.drop("b") == 0
    windows = panes.assemble([], until=60_000)
    assert [(w.start, w.end) for w in windows] == [(-20_000, 40_000), (0, 60_000)]
    assert all(list(w.parts) == ["a"] for w in windows) and list(windows[-1].commits) == ["a"]


def test_after_a_restart_committed_windows_are_not_handed_over_again_and_their_newer_panes_are_read_again():
    panes = Panes(SIZE, SLIDE)
    assert panes.resume(60_000) == 20_000  # the pane [0, 20_000) was committed; [20_000, ...) comes again
    windows = panes.assemble([pane(20_000, {"a": [(21_000, 3, 1.0)]})], until=100_000)
    assert [(w.start, w.end) for w in windows] == [(20_000, 80_000)]


def stream(seed, shards=3, rows=600):
    """Rows in event-time order over some 20 minutes, each to a random shard."""
    rng = random.Random(seed)
    out = {f"shard-{i}": [] for i in range(shards)}
    t = 1_000_000_000_000 + rng.randrange(SLIDE)
    for seq in range(1, rows + 1):
        t += rng.randrange(0, 4_000)
        out[f"shard-{rng.randrange(shards)}"].append((t, seq, round(rng.uniform(1, 100), 2)))
    return out


async def run(directory, batches, clock, stop_after=None, sink=None, size=SIZE, slide=SLIDE):
    """Deliver ``batches`` (shard, rows) in turn; stop (a restart) once ``stop_after``
    windows are committed. Returns what each shard may checkpoint at the stop. The file
    sink, unless another is given."""
    settings = Settings(window=size / 1000, slide=slide / 1000, idle_timeout=600.0,
                        state_dir=str(directory / "state"), sink=f"file:{directory / 'out'}")
    return await deliver(settings, sink or FileSink(directory / "out"), batches, clock, rows_of, stop_after)


async def deliver(settings, sink, batches, clock, rows_of, stop_after=None):
    """A coordinator on ``settings`` and ``sink`` given ``batches`` (shard, rows: each
    made a RowBatch by ``rows_of``) in turn, half a second apart; stopped once
    ``stop_after`` windows are committed, or else once every window has closed (the
    shards idle). Returns what each shard may checkpoint at the stop."""
    c = Coordinator(settings, sink, clock=clock)
    await c.start()
    try:
        for shard_id in sorted({s for s, _ in batches}):
            await c.open_shard(shard_id, None)
        for shard_id, rows in batches:
            c.add_batch(shard_id, rows_of(rows), Position(rows[-1][1], 0, str(rows[-1][1])), 0)
            clock.advance(500)
            await c.step()
            if stop_after is not None and c.committer.windows_committed >= stop_after:
                break
        else:
            clock.advance(600_001)  # idle: every window closes
            await c.step()
        return {s: c.safe_position(s) for s, _ in batches}
    finally:
        await c.stop()


def batches_of(data, seed):
    rng = random.Random(seed)
    left = {s: list(rows) for s, rows in data.items()}
    out = []
    while any(left.values()):
        s = rng.choice([s for s in left if left[s]])
        n = rng.randint(1, 25)
        out.append((s, left[s][:n]))
        left[s] = left[s][n:]
    return out


def hopping_by_duckdb(data, size=SIZE, slide=SLIDE):
    rows = [(t, a) for rows in data.values() for t, _, a in rows]
    con = duckdb.connect()
    con.execute("CREATE TABLE r (t BIGINT, amount DOUBLE)")
    con.executemany("INSERT INTO r VALUES (?, ?)", rows)
    return {(start, start + size): (n, total) for start, n, total in con.execute(
        f"SELECT (t // {slide} - k) * {slide} AS start, count(*), round(sum(amount), 2) "
        f"FROM r CROSS JOIN range({size // slide}) AS k(k) GROUP BY start").fetchall()}


def committed_windows(directory):
    out = {}
    for path in (directory / "out").glob("*.jsonl"):
        start, end = map(int, path.stem.split("-"))
        rows = [orjson.loads(line) for line in path.read_text().splitlines()]
        assert all(start <= r["t"] < end for r in rows), path.name
        assert len({r["seq"] for r in rows}) == len(rows), path.name  # no row twice in a window
        out[(start, end)] = (len(rows), round(sum(r["amount"] for r in rows), 2))
    return out


async def test_hopping_windows_equal_duckdbs(tmp_path):
    data = stream(7)
    await run(tmp_path, batches_of(data, 7), FakeClock(1_790_000_000_000))
    assert committed_windows(tmp_path) == hopping_by_duckdb(data)


@hsettings(max_examples=25, deadline=None)
@given(st.integers(0, 10**6), st.sampled_from([(60_000, 20_000), (60_000, 10_000), (30_000, 15_000), (40_000, 5_000)]),
       st.integers(1, 4))
def test_hopping_windows_equal_duckdbs_whatever_the_sizes_and_the_delivery(seed, sizes, shards):
    size, slide = sizes
    data = stream(seed, shards=shards, rows=200)
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        uvloop.run(run(directory, batches_of(data, seed), FakeClock(1_790_000_000_000), size=size, slide=slide))
        assert committed_windows(directory) == hopping_by_duckdb(data, size, slide)
