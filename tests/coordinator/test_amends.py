"""allowed_lateness: a window stays open to late rows after it closes; such a row amends
it (handed over again, whole, the sink replacing it), its shards checkpoint past it only
once it is final, and past the allowed lateness ``late_policy`` decides. Exactly once
across a restart between a window's first commit and its amendment."""

from __future__ import annotations

import random

import orjson
import pytest

from mldserver.rows.batch import Item, RowBatch
from mldserver.spark.commitlog import CommitLog
from mldserver.base.config import Settings, load
from mldserver.base.handoff import Committed, Window
from mldserver.base.positions import Position
from mldserver.coordinator.amends import Amends
from mldserver.coordinator.windows import WindowRows
from mldserver.errors import ConfigError

from ..helpers import FakeClock
from .test_coordinator import (a_closes_alone_then_b_comes_back, items, output, position, settings,  # noqa: F401
                               started)

SIZE = 60_000


def rows(first_seq, times):
    return items(first_seq, times)


def test_a_closed_window_is_kept_and_a_late_row_for_it_amends_it_until_it_is_final():
    amends = Amends(SIZE, lateness=120_000)
    [first] = amends.assemble([WindowRows(0, SIZE, {"A": [rows(1, [10_000])]})], until=61_000)
    assert (first.version, first.commits, first.final_until) == (1, {}, None)  # handed over, nothing committed
    assert len(amends.take("B", rows(100, [30_000, 50_000]))) == 0  # both amend [0, 60_000)
    [second] = amends.assemble([], until=70_000)
    assert (second.start, second.version, second.again) == (0, 2, 1)
    assert sorted(second.parts) == ["A", "B"] and sum(map(len, second.parts["B"])) == 2
    assert amends.assemble([], until=179_999) == []  # not final yet, nothing amended
    [third] = amends.assemble([WindowRows(120_000, 180_000, {"A": [rows(2, [130_000])]})], until=180_000)
    assert third.start == 120_000 and third.final_until == SIZE  # [0, 60_000) is final: this commits it
    assert {s: sum(map(len, r)) for s, r in third.commits.items()} == {"A": 1, "B": 2}
    late = amends.take("B", rows(200, [40_000, 125_000]))  # 40_000: final, late for good; 125_000 amends
    assert late.times.tolist() == [40_000]


def test_a_late_row_for_a_window_that_closed_with_no_rows_makes_it():
    amends = Amends(SIZE, lateness=120_000)
    amends.assemble([WindowRows(SIZE, 2 * SIZE, {"A": [rows(1, [70_000])]})], until=121_000)
    amends.take("B", rows(100, [5_000]))  # [0, 60_000) never closed: no rows then
    [made] = amends.assemble([], until=121_000)
    assert (made.start, made.version) == (0, 1)


def test_windows_made_final_while_none_is_handed_over_commit_with_the_next():
    amends = Amends(SIZE, lateness=60_000)
    amends.assemble([WindowRows(0, SIZE, {"A": [rows(1, [10_000])]})], until=60_000)
    assert amends.assemble([], until=500_000) == []
    [window] = amends.assemble([WindowRows(480_000, 540_000, {"A": [rows(2, [490_000])]})], until=540_000)
    assert window.final_until == SIZE and {s: sum(map(len, r)) for s, r in window.commits.items()} == {"A": 1}


@pytest.mark.parametrize("keep_late", [True, False])
def test_late_rows_beyond_the_lateness_are_in_every_version_under_next_and_in_the_first_only_otherwise(keep_late):
    amends = Amends(SIZE, lateness=120_000, keep_late=keep_late)
    closed = WindowRows(0, SIZE, {"A": [rows(1, [10_000])]}, late_rows=1, late={"B": [rows(100, [-500_000])]})
    [first] = amends.assemble([closed], until=61_000)
    assert first.late_rows == 1 and sum(map(len, first.late["B"])) == 1  # late_policy decides it there
    amends.take("C", rows(200, [20_000]))
    [second] = amends.assemble([], until=62_000)
    assert (second.version, second.late_rows, sum(len(r) for p in second.late.values() for r in p)) == (
        (2, 1, 1) if keep_late else (2, 0, 0))  # dropped or dead-lettered once, not at each version
    [third] = amends.assemble([WindowRows(SIZE * 3, SIZE * 4, {"A": [rows(2, [190_000])]})], until=240_000)
    assert {s: sum(map(len, r)) for s, r in third.commits.items()} == {"A": 1, "B": 1, "C": 1}  # committed all


def test_allowed_lateness_is_for_tumbling_windows_into_a_sink_a_table_without_a_pipeline():
    with pytest.raises(ConfigError, match="only when tumbling"):
        load(None, allowed_lateness=60.0, slide=10.0, sink="file:/tmp/x")
    with pytest.raises(ConfigError, match="no sink keeps them"):
        load(None, allowed_lateness=60.0)
    with pytest.raises(ConfigError, match="cannot be made again there yet"):
        load(None, allowed_lateness=60.0, sink="iceberg:/tmp/x", stream="s", pipeline="x:y")
    assert load(None, allowed_lateness=60.0, sink="file:/tmp/x").allowed_lateness == 60.0
    assert load(None, allowed_lateness=60.0, sink="iceberg:/tmp/x", stream="s").allowed_lateness == 60.0


async def amended_run(settings, tmp_path, policy="next"):
    """A closes [0, 60_000) alone (B idle); B comes back with a row at 30_000 (within
    the allowed lateness: it amends the window) and one at 130_000; A goes on to
    125_000, then to 300_000, which makes [0, 60_000) final."""
    clock = FakeClock(1_000)
    c = await started(settings.replace(late_policy=policy, idle_timeout=10.0, allowed_lateness=120.0), tmp_path, clock)
    try:
        def not_final():  # handed over, not final: nobody checkpoints past it
            assert c.safe_position("A") is None

        await a_closes_alone_then_b_comes_back(c, clock, tmp_path, not_final)
        assert output(tmp_path / "out") == {"0-60000.jsonl": [1, 100], "60000-120000.jsonl": [2]}  # replaced
        assert c.safe_position("B") is None and c.status().late_rows == 0
        c.add_batch("A", items(4, [300_000]), position(4), 100)
        c.add_batch("B", items(102, [301_000]), position(102), 100)
        await c.step()
        return c
    finally:
        await c.stop()


async def test_a_late_row_within_the_allowed_lateness_amends_its_window_and_checkpoints_once_final(settings, tmp_path):
    c = await amended_run(settings, tmp_path)
    assert output(tmp_path / "out") == {"0-60000.jsonl": [1, 100], "60000-120000.jsonl": [2],
                                        "120000-180000.jsonl": [3, 101]}
    assert c.safe_position("A") == position(3) and c.safe_position("B") == position(101)  # final up to 180_000
    assert c.committer.windows_committed == 3 and c.committer.rows_committed == 5  # the amendment counted once


class ReplacingSink:
    """JSON lines a window, with the real commit log (``spark/commitlog.py``) written after
    them: what the parquet sink does without Spark (tests/spark has it with Spark), an
    amended window (``version``) replacing what was written of it."""

    def __init__(self, directory) -> None:
        self.directory = directory
        self.log = CommitLog(directory)

    async def start(self) -> Committed:
        return self.log.read()

    async def commit(self, window: Window) -> None:
        done = self.log.entry(window.id)
        if done is not None and not window.version:
            return
        (self.directory / f"{window.id}.jsonl").write_bytes(bytes(window.rows.buffer()))
        entry = {"window": window.id, "start": window.start, "end": window.end, "rows": len(window),
                 "late": window.late_rows, "positions": {s: p.to_json() for s, p in window.positions.items()},
                 "output": {s: p.to_json() for s, p in window.output.items()}}
        if window.final_until is not None:
            entry["final"] = window.final_until
        self.log.append(entry)


def stream(seed, shards=3, rows=400):
    """Rows in event-time order to random shards; one shard goes quiet for a while (longer
    than idle_timeout) and comes back with the rows it held: late, within the lateness."""
    rng = random.Random(seed)
    t = 1_000_000_000_000
    out = {f"shard-{i}": [] for i in range(shards)}
    for seq in range(1, rows + 1):
        t += rng.randrange(0, 2_000)
        out[f"shard-{rng.randrange(shards)}"].append((t, seq, round(rng.uniform(1, 100), 2)))
    return out


def batches_of(data, seed):
    """Batches in turns; shard-0 holds back its batches for a stretch and then sends them."""
    rng = random.Random(seed)
    left = {s: list(r) for s, r in data.items()}
    out, held = [], []
    while any(left.values()):
        s = rng.choice([s for s in left if left[s]])
        n = rng.randint(1, 20)
        batch = (s, left[s][:n])
        left[s] = left[s][n:]
        if s == "shard-0" and len(out) % 40 < 20:
            held.append(batch)
        else:
            out.extend(held)
            held = []
            out.append(batch)
    return out + held


def rows_of(rows):
    batch = RowBatch.of(Item(t, Position(seq, 0, str(seq)), orjson.dumps({"seq": seq, "t": t, "amount": a}))
                        for t, seq, a in rows)
    batch.timed = True
    return batch


async def deliver(directory, batches, clock, stop_after=None, sink=None):
    """``batches`` in turn, 2 s apart (shard-0's held ones make it idle: idle_timeout 5 s);
    stop once ``stop_after`` windows are handed over (versions counted). Returns what each
    shard may checkpoint."""
    from mldserver.coordinator import Coordinator

    settings = Settings(window=SIZE / 1000, allowed_lateness=600.0, idle_timeout=5.0,
                        state_dir=str(directory / "state"), sink=f"file:{directory / 'out'}")
    c = Coordinator(settings, sink or ReplacingSink(directory / "out"), clock=clock)
    await c.start()
    handed = 0
    try:
        for shard_id in sorted({s for s, _ in batches}):
            await c.open_shard(shard_id, None)
        for shard_id, rows in batches:
            c.add_batch(shard_id, rows_of(rows), Position(rows[-1][1], 0, str(rows[-1][1])), 100)
            clock.advance(2_000)
            handed += await c.step()
            if stop_after is not None and handed >= stop_after:
                break
        else:
            clock.advance(600_001)
            for shard_id in sorted({s for s, _ in batches}):  # the last rows, far on: every window final
                c.add_batch(shard_id, rows_of([(2_000_000_000_000, 10**6 + len(shard_id), 0.0)]), None, 100)
            await c.step()
        return {s: c.safe_position(s) for s, _ in batches}, c.ordering.late_rows, c.ordering.panes.amended_rows
    finally:
        await c.stop()


@pytest.mark.parametrize("seed", range(6))
async def test_an_amended_window_is_written_once_with_every_row_across_a_restart(tmp_path, seed):
    data = stream(seed)
    batches = batches_of(data, seed)
    clock = FakeClock(1_790_000_000_000)
    (tmp_path / "out").mkdir()
    safe, _, amended = await deliver(tmp_path, batches, clock, stop_after=6 + seed)
    again = [(shard_id, kept) for shard_id, rows in batches
             if (kept := [r for r in rows if safe[shard_id] is None or r[1] > safe[shard_id].seq])]
    _, late, amended_after = await deliver(tmp_path, again, clock)
    assert amended + amended_after > 0 and late == 0  # rows came late, and every one amended its window
    written = {}
    for path in (tmp_path / "out").glob("*.jsonl"):
        written[tuple(map(int, path.stem.split("-")))] = [orjson.loads(line) for line in path.read_text().splitlines()]
    assert each_row_once_in_its_window(written) == expected_windows(data)


def each_row_once_in_its_window(written):
    """{(start, end): rows} -> {(start, end): sorted seqs}, each row in its window, none twice."""
    out = {}
    for (start, end), got in written.items():
        got = [r for r in got if r["seq"] < 10**6]  # (the last rows, far on, that make every window final)
        assert all(start <= r["t"] < end for r in got)
        if got:
            out[(start, end)] = sorted(r["seq"] for r in got)
    seqs = [s for window in out.values() for s in window]
    assert len(seqs) == len(set(seqs))
    return out


def expected_windows(data):
    expected = {}
    for t, seq, _ in (r for rows in data.values() for r in rows):
        expected.setdefault((t - t % SIZE, t - t % SIZE + SIZE), []).append(seq)
    return {w: sorted(seqs) for w, seqs in expected.items()}
