"""max_out_of_orderness: rows out of event-time order within a shard, by less than it,
land in their own windows (none late, none moved); a shard stands at its largest time
minus it; exactly once across a restart, whether the shard is read again from its last
checkpoint or from the start, though its rows commit out of their own order."""

from __future__ import annotations

import random

import orjson
import pytest

from mldserver.base.config import Settings, load
from mldserver.base.positions import Position
from mldserver.coordinator.ordering import Ordering
from mldserver.errors import ConfigError

from ..helpers import FakeClock
from .test_amends import ReplacingSink, expected_windows, rows_of
from .test_panes import batches_of

SIZE = 60_000
DISORDER = 20_000


def stream(seed, shards=3, rows=500):
    """Each shard's rows (time, seq, amount) in sequence order, times out of order by less
    than DISORDER: a row's time is its shard's clock minus up to that."""
    rng = random.Random(seed)
    out = {}
    for i in range(shards):
        t = 1_000_000_000_000
        out[f"shard-{i}"] = []
        for n in range(rows):
            t += rng.randrange(0, 6_000)
            late_by = rng.choice([0, 0, rng.randrange(0, DISORDER)])
            out[f"shard-{i}"].append((t - late_by, i * 10**6 + n + 1, round(rng.uniform(1, 100), 2)))
    return out


def written(directory):
    """{(start, end): sorted seqs} of every window file, each row in its own window, none twice."""
    out = {}
    for path in directory.glob("*.jsonl"):
        start, end = map(int, path.stem.split("-"))
        got = [orjson.loads(line) for line in path.read_text().splitlines()]
        got = [r for r in got if r["seq"] < 10**8]  # (the last rows, far on, that close every window)
        assert all(start <= r["t"] < end for r in got), "a row in a window not its own"
        if got:
            out.setdefault((start, end), []).extend(r["seq"] for r in got)
    seqs = [s for window in out.values() for s in window]
    assert len(seqs) == len(set(seqs)), "a row written twice"
    return {w: sorted(seqs) for w, seqs in out.items()}


async def deliver(directory, batches, clock, stop_after=None, lose=None):
    """``batches`` in turn, 1 s apart; stop once ``stop_after`` windows committed (or with
    ``lose``, that shard's lease is lost then and it comes back, read again from its
    start). Returns what each shard may checkpoint, and the late rows."""
    from mldserver.coordinator import Coordinator

    settings = Settings(window=SIZE / 1000, max_out_of_orderness=DISORDER / 1000, state_dir=str(directory / "state"),
                        sink=f"file:{directory / 'out'}")
    c = Coordinator(settings, ReplacingSink(directory / "out"), clock=clock)
    await c.start()
    try:
        for shard_id in sorted({s for s, _ in batches}):
            await c.open_shard(shard_id, None)
        batches = list(batches)
        i = 0
        while i < len(batches):
            shard_id, rows = batches[i]
            i += 1
            c.add_batch(shard_id, rows_of(rows), Position(rows[-1][1], 0, str(rows[-1][1])), 100)
            clock.advance(1_000)
            await c.step()
            if stop_after is not None and c.committer.windows_committed >= stop_after:
                if lose is None:
                    break
                c.lease_lost(lose)  # and taken again at once: no window closes without it meanwhile
                await c.open_shard(lose, c.safe_position(lose))
                batches[i:i] = [(s, r) for s, r in batches[:i] if s == lose]  # its rows again, from the start
                stop_after = None
        else:
            for shard_id in sorted({s for s, _ in batches}):  # the last rows, far on: every window closes
                c.add_batch(shard_id, rows_of([(2_000_000_000_000, 10**8 + len(shard_id), 0.0)]), None, 100)
            await c.step()
        return {s: c.safe_position(s) for s, _ in batches}, c.ordering.late_rows
    finally:
        await c.stop()


def test_a_shard_stands_at_its_largest_time_minus_the_disorder_and_its_rows_keep_their_times():
    ordering = Ordering(window_ms=SIZE, disorder_ms=DISORDER, blocks=lambda p, now: False, parents_of=lambda s: ())
    pieces = ordering.add("s", rows_of([(70_000, 1, 0.0), (50_000, 2, 0.0), (130_000, 3, 0.0)]),
                          Position(3, 0, "3"), now=0)
    assert [p.times.tolist() for p in pieces] == [[50_000], [70_000], [130_000]]  # sorted, a piece a window
    assert ordering.progress("s", pieces) == 130_000 - DISORDER
    ordering.add("s", rows_of([(100_000, 4, 0.0), (119_999, 5, 0.0)]), Position(5, 0, "5"), now=0)
    [first, second] = ordering.close(until=120_000)
    assert (first.start, second.start) == (0, 60_000) and ordering.late_rows == 0
    assert sorted(int(t) for rows in second.parts["s"] for t in rows.times) == [70_000, 100_000, 119_999]
    assert first.below == {}  # row 1 is in the second window: no row at or below which all are committed yet
    assert second.below == {"s": Position(1, 0, "1")}  # row 3 is still open
    assert ordering.shards["s"].handed == Position(5, 0, "5")


@pytest.mark.parametrize("seed", range(6))
async def test_rows_out_of_order_by_less_than_the_disorder_each_land_in_their_own_window(tmp_path, seed):
    data = stream(seed)
    (tmp_path / "out").mkdir()
    _, late = await deliver(tmp_path, batches_of(data, seed), FakeClock(1_790_000_000_000))
    assert late == 0
    assert written(tmp_path / "out") == expected_windows(data)


@pytest.mark.parametrize("seed", range(8))
async def test_rows_out_of_order_are_committed_once_across_a_restart(tmp_path, seed):
    """Stopped mid-stream, then read again: from each shard's last checkpoint, or (one
    shard, as a daemon that never stored one would) from its start."""
    data = stream(seed)
    batches = batches_of(data, seed)
    clock = FakeClock(1_790_000_000_000)
    (tmp_path / "out").mkdir()
    safe, late = await deliver(tmp_path, batches, clock, stop_after=3 + seed % 8)
    from_start = f"shard-{seed % 3}"
    again = []
    for shard_id, rows in batches:
        checkpoint = None if shard_id == from_start else safe[shard_id]
        kept = [r for r in rows if checkpoint is None or r[1] > checkpoint.seq]
        if kept:
            again.append((shard_id, kept))
    _, late_after = await deliver(tmp_path, again, clock)
    assert late == late_after == 0
    assert written(tmp_path / "out") == expected_windows(data)


@pytest.mark.parametrize("seed", range(8))
async def test_rows_out_of_order_are_committed_once_when_a_lease_is_lost_and_comes_back(tmp_path, seed):
    data = stream(seed)
    (tmp_path / "out").mkdir()
    _, late = await deliver(tmp_path, batches_of(data, seed), FakeClock(1_790_000_000_000), stop_after=3 + seed,
                            lose=f"shard-{seed % 3}")
    assert late == 0
    assert written(tmp_path / "out") == expected_windows(data)


def test_max_out_of_orderness_is_for_tumbling_windows_into_a_file_or_parquet_sink(tmp_path):
    assert load(None, max_out_of_orderness=20.0, sink="file:out").max_out_of_orderness == 20.0
    for more in ({"slide": 10.0}, {"allowed_lateness": 60.0}, {"session_gap": 30.0, "session_key": "k"}):
        with pytest.raises(ConfigError, match="tumbling windows only"):
            load(None, max_out_of_orderness=20.0, sink="file:out", **more)
    with pytest.raises(ConfigError, match="no sink keeps them"):
        load(None, max_out_of_orderness=20.0)


class Recording(ReplacingSink):
    """The commit-log sink, each window's rows also kept (a row handed over twice shows)."""

    def __init__(self, directory) -> None:
        super().__init__(directory)
        self.seqs: list[int] = []

    async def commit(self, window) -> None:
        self.seqs.extend(orjson.loads(line)["seq"] for line in bytes(window.rows.buffer()).splitlines())
        await super().commit(window)


@pytest.mark.parametrize("seed", range(30))
async def test_a_campaign_of_restarts_and_lost_leases_read_again_from_any_checkpoint_commits_each_row_once(
        tmp_path, seed):
    """Rows out of order (some by more than the disorder), batches in random turns; now
    and then the server restarts or a shard's lease is lost and taken again, and the
    shard is read again from a checkpoint it stored at some time (any: the daemon's is
    not always the last)."""
    from mldserver.coordinator import Coordinator

    rng = random.Random(seed)
    data = {}
    for i in range(3):
        t, out = 1_000_000_000_000, []
        for n in range(150):
            t += rng.randrange(0, 6_000)
            late_by = rng.choice([0, 0, rng.randrange(0, DISORDER), rng.randrange(0, 90_000) if rng.random() < 0.1 else 0])
            out.append((t - late_by, i * 10**6 + n + 1, 1.0))
        data[f"shard-{i}"] = out
    settings = Settings(window=SIZE / 1000, max_out_of_orderness=DISORDER / 1000, state_dir=str(tmp_path / "state"),
                        sink=f"file:{tmp_path / 'out'}")
    (tmp_path / "out").mkdir()
    clock = FakeClock(1_790_000_000_000)
    seqs: list[int] = []
    cursor = {s: 0 for s in data}
    stored: dict[str, list[Position | None]] = {s: [None] for s in data}  # checkpoints, as the daemon stored them

    async def started():
        c = Coordinator(settings, Recording(tmp_path / "out"), clock=clock)
        await c.start()
        return c

    def read_from(shard_id):
        checkpoint = rng.choice(stored[shard_id])
        cursor[shard_id] = 0 if checkpoint is None else next(
            (i for i, (_, seq, _) in enumerate(data[shard_id]) if seq > checkpoint.seq), len(data[shard_id]))
        return checkpoint

    c = await started()
    for shard_id in data:
        await c.open_shard(shard_id, None)
    while any(cursor[s] < len(rows) for s, rows in data.items()):
        shard_id = rng.choice([s for s, rows in data.items() if cursor[s] < len(rows)])
        rows = data[shard_id][cursor[shard_id]:cursor[shard_id] + rng.randint(1, 12)]
        cursor[shard_id] += len(rows)
        c.add_batch(shard_id, rows_of(rows), Position(rows[-1][1], 0, str(rows[-1][1])), 100)
        clock.advance(1_000)
        await c.step()
        for s in data:
            safe = c.safe_position(s)
            if safe is not None and (stored[s][-1] is None or safe > stored[s][-1]):
                stored[s].append(safe)
        dice = rng.random()
        if dice < 0.03:  # a restart
            seqs += c.committer.sink.seqs
            await c.stop()
            c = await started()
            for s in data:
                read_from(s)
                await c.open_shard(s, None)
        elif dice < 0.06:  # a lease lost, and taken again
            s = rng.choice(sorted(data))
            c.lease_lost(s)
            await c.step()
            await c.open_shard(s, read_from(s))
    for shard_id in data:  # far on: every window closes
        c.add_batch(shard_id, rows_of([(2_000_000_000_000, 10**8 + int(shard_id[-1]), 0.0)]), None, 100)
    await c.step()
    seqs += c.committer.sink.seqs
    await c.stop()
    got = [seq for seq in seqs if seq < 10**8]
    assert sorted(got) == sorted(seq for rows in data.values() for _, seq, _ in rows)  # each once
