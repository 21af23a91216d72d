"""Session windows: a key's rows less than a gap apart are one session, handed over
once the watermark passes its last row plus the gap, every row carrying its session's
``window_start`` and ``window_end``; through the coordinator, equal to DuckDB's
sessions over the same rows (a gaps-and-islands query), across a restart too."""

from __future__ import annotations

import random
import tempfile
from pathlib import Path
from typing import Any

import duckdb
import orjson
import pytest
import uvloop
from hypothesis import given, settings as hsettings, strategies as st

from mldserver.rows.batch import Item, RowBatch
from mldserver.spark.commitlog import CommitLog
from mldserver.base.config import Settings, load
from mldserver.base.handoff import Committed, Window
from mldserver.base.positions import Position
from mldserver.coordinator.sessions import Sessions
from mldserver.coordinator.windows import WindowRows
from mldserver.errors import ConfigError
from mldserver.sinks.file import FileSink

from ..helpers import FakeClock
from .test_panes import batches_of, deliver

GAP = 30_000
USERS = ["ann", "bob", "cy", "dee", "eve"]


def rows_of(rows):
    batch = RowBatch.of(Item(t, Position(seq, 0, str(seq)), orjson.dumps({"seq": seq, "t": t, "user": u, "amount": a}))
                        for t, seq, u, a in rows)
    batch.timed = True
    return batch


def pane(start, shard_rows, size=GAP):
    return WindowRows(start, start + size, {s: [rows_of(rows)] for s, rows in shard_rows.items()})


def test_a_keys_rows_less_than_a_gap_apart_are_one_session_handed_over_once_the_watermark_passes_its_end():
    sessions = Sessions(GAP, "user")
    first = pane(0, {"a": [(1_000, 1, "ann", 1.0), (12_000, 2, "bob", 2.0)], "b": [(20_000, 7, "ann", 3.0)]})
    assert sessions.assemble([first], until=30_000) == []  # ann's session ends at 50_000, bob's at 42_000
    [window] = sessions.assemble([], until=45_000)
    assert (window.kind, window.start, window.end, window.sessions.spans) == ("session", 12_000, 45_000,
                                                                              [(12_000, 42_000, False)])
    assert window.commits == {}  # the pane still holds ann's open session: nobody checkpoints past it
    second = pane(60_000, {"a": [(61_000, 3, "ann", 4.0)]})  # 41 s after ann's last row: a new session
    [window] = sessions.assemble([second], until=60_000)
    assert window.sessions.spans == [(1_000, 50_000, False)]
    assert {s: sum(map(len, rows)) for s, rows in window.commits.items()} == {"a": 2, "b": 1}  # the first pane
    assert sorted(s for s, _, _ in window.sessions.parts) == ["a", "b"]
    [window] = sessions.assemble([], until=10**12)
    assert window.sessions.spans == [(61_000, 91_000, False)] and not sessions.kept


def test_a_session_hands_over_its_rows_with_their_sessions_span_in_order():
    from mldserver.coordinator.merge import seal

    sessions = Sessions(GAP, "user")
    rows = pane(0, {"b": [(2_000, 9, "ann", 2.0)], "a": [(1_000, 1, "ann", 1.0), (3_000, 2, "bob", 5.0)]})
    [closed] = sessions.assemble([rows], until=10**12)
    window, commits = seal(closed)
    assert (window.kind, {s: sum(map(len, rows)) for s, rows in commits.items()}) == ("session", {"a": 2, "b": 1})
    assert [orjson.loads(r) for r in window.rows] == [
        {"window_start": 1_000, "window_end": 32_000, "seq": 1, "t": 1_000, "user": "ann", "amount": 1.0},
        {"window_start": 1_000, "window_end": 32_000, "seq": 9, "t": 2_000, "user": "ann", "amount": 2.0},
        {"window_start": 3_000, "window_end": 33_000, "seq": 2, "t": 3_000, "user": "bob", "amount": 5.0},
    ]
    assert window.output == {"a": Position(2, 0, "2"), "b": Position(9, 0, "9")}


def test_session_settings_are_checked_together():
    with pytest.raises(ConfigError, match="session_gap is set alone"):
        load(None, session_gap=30.0, sink="file:/tmp/x")
    with pytest.raises(ConfigError, match="one kind of window"):
        load(None, session_gap=30.0, session_key="user", slide=10.0, sink="file:/tmp/x")
    with pytest.raises(ConfigError, match="no sink keeps them"):
        load(None, session_gap=30.0, session_key="user")
    assert load(None, session_gap=30.0, session_key="user", sink="file:/tmp/x").session_key == "user"


def stream(seed, shards=3, rows=400):
    """Rows in event-time order, each of a random user to a random shard, in bursts
    with pauses, so that sessions start and end."""
    rng = random.Random(seed)
    out = {f"shard-{i}": [] for i in range(shards)}
    t = 1_000_000_000_000 + rng.randrange(GAP)
    for seq in range(1, rows + 1):
        t += rng.choice([rng.randrange(0, 3_000)] * 6 + [rng.randrange(20_000, 90_000)])
        out[f"shard-{rng.randrange(shards)}"].append((t, seq, rng.choice(USERS), round(rng.uniform(1, 100), 2)))
    return out


def sessions_by_duckdb(data, gap=GAP):
    rows = [(t, seq, u, a) for rows in data.values() for t, seq, u, a in rows]
    con = duckdb.connect()
    con.execute("CREATE TABLE r (t BIGINT, seq BIGINT, u VARCHAR, amount DOUBLE)")
    con.executemany("INSERT INTO r VALUES (?, ?, ?, ?)", rows)
    return {(u, start, end): (n, total) for u, start, end, n, total in con.execute(f"""
        WITH flagged AS (
            SELECT *, CASE WHEN t - lag(t) OVER (PARTITION BY u ORDER BY t, seq) >= {gap} THEN 1 ELSE 0 END AS new
            FROM r),
        numbered AS (
            SELECT *, sum(new) OVER (PARTITION BY u ORDER BY t, seq ROWS UNBOUNDED PRECEDING) AS session FROM flagged)
        SELECT u, min(t), max(t) + {gap}, count(*), round(sum(amount), 2) FROM numbered GROUP BY u, session
    """).fetchall()}


def committed_sessions(rows: list[dict[str, Any]]):
    assert len({r["seq"] for r in rows}) == len(rows)  # no row twice
    out: dict[tuple[str, int, int], list[float]] = {}
    for r in rows:
        assert r["window_start"] <= r["t"] < r["window_end"]
        out.setdefault((r["user"], r["window_start"], r["window_end"]), []).append(r["amount"])
    return {key: (len(amounts), round(sum(amounts), 2)) for key, amounts in out.items()}


def file_rows(directory):
    return [orjson.loads(line) for path in (directory / "out").glob("*.jsonl") for line in path.read_text().splitlines()]


async def run(directory, batches, clock, stop_after=None, sink=None, gap=GAP):
    """Deliver ``batches`` (shard, rows) in turn; stop (a restart) once ``stop_after``
    windows are committed. Returns what each shard may checkpoint at the stop."""
    settings = Settings(session_gap=gap / 1000, session_key="user", idle_timeout=600.0,
                        state_dir=str(directory / "state"), sink=f"file:{directory / 'out'}")
    return await deliver(settings, sink or FileSink(directory / "out"), batches, clock, rows_of, stop_after)


async def test_session_windows_equal_duckdbs(tmp_path):
    data = stream(5)
    await run(tmp_path, batches_of(data, 5), FakeClock(1_790_000_000_000))
    assert committed_sessions(file_rows(tmp_path)) == sessions_by_duckdb(data)


@hsettings(max_examples=25, deadline=None)
@given(st.integers(0, 10**6), st.sampled_from([5_000, 30_000, 60_000]), st.integers(1, 4))
def test_session_windows_equal_duckdbs_whatever_the_gap_and_the_delivery(seed, gap, shards):
    data = stream(seed, shards=shards, rows=200)
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        uvloop.run(run(directory, batches_of(data, seed), FakeClock(1_790_000_000_000), gap=gap))
        assert committed_sessions(file_rows(directory)) == sessions_by_duckdb(data, gap)


class LoggedSink:
    """JSON lines a window, with the real commit log (``spark/commitlog.py``) written after
    them: what the parquet sink does, without Spark (tests/spark has it with Spark)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.log = CommitLog(directory)

    async def start(self) -> Committed:
        return self.log.read()

    async def commit(self, window: Window) -> None:
        if self.log.has(window.id):
            return
        (self.directory / f"{window.id}.jsonl").write_bytes(bytes(window.rows.buffer()))
        self.log.append({"window": window.id, "start": window.start, "end": window.end, "rows": len(window),
                         "late": window.late_rows,
                         "positions": {s: p.to_json() for s, p in window.positions.items()},
                         "output": {s: p.to_json() for s, p in window.output.items()}})


@pytest.mark.parametrize("seed", range(6))
async def test_sessions_are_handed_over_exactly_once_across_a_restart(tmp_path, seed):
    data = stream(seed)
    batches = batches_of(data, seed)
    clock = FakeClock(1_790_000_000_000)
    out = tmp_path / "out"
    out.mkdir()
    safe = await run(tmp_path, batches, clock, stop_after=3 + seed, sink=LoggedSink(out))
    again = [(shard_id, kept) for shard_id, rows in batches
             if (kept := [r for r in rows if safe[shard_id] is None or r[1] > safe[shard_id].seq])]
    assert len(again) < len(batches)  # something was checkpointed before the stop
    await run(tmp_path, again, clock, sink=LoggedSink(out))
    assert committed_sessions(file_rows(tmp_path)) == sessions_by_duckdb(data)


def test_a_late_row_joins_its_keys_open_session_or_starts_a_late_one_of_its_own_that_late_policy_can_leave_out():
    sessions = Sessions(GAP, "user")
    sessions.assemble([pane(60_000, {"a": [(61_000, 1, "ann", 1.0)]})], until=90_000)
    late = WindowRows(90_000, 120_000, {"a": [rows_of([(95_000, 2, "ann", 2.0)])]},
                      late={"b": [rows_of([(50_000, 7, "ann", 3.0), (10_000, 8, "bob", 4.0)])]})
    [window] = sessions.assemble([late], until=200_000)
    # ann's late 50_000 joins her open session (61_000); 95_000 is a gap past it: a session of its own
    assert window.sessions.spans == [(10_000, 40_000, True), (50_000, 91_000, False), (95_000, 125_000, False)]
    assert window.late_rows == 1 and len(window) == 4
    [dropped] = window.drop_late()
    assert [row.position.seq for row in dropped] == [8] and len(window) == 3 and window.late_rows == 0
    assert {s: sum(map(len, rows)) for s, rows in window.commits.items()} == {"a": 2, "b": 2}  # all committed
