"""Session windows and amended windows as users run them: ``mldserver serve`` (a real
process, its relay, handler processes) with the file sink, driven by the fake daemon,
rows given their event times from the data (``tests.handlers:DataTimes``)."""

from __future__ import annotations

import random

import orjson

from mldserver.api.testing import FakeDaemon, make_records

from .coordinator.test_sessions import sessions_by_duckdb
from .harness import ServerProcess, eventually, relay_command

BASE = 1_700_000_000_000  # event times: a day in 2023, nothing to do with the wall clock


def records(first_seq, events):
    """Daemon records, each event's JSON its data: what DataTimes emits with its own time."""
    return make_records(first_seq, len(events), data=lambda seq: orjson.dumps(events[seq - first_seq]))


def rows_in(out):
    return [orjson.loads(line) for path in sorted(out.glob("*.jsonl")) for line in path.read_text().splitlines()]


async def test_sessions_through_the_cli_equal_duckdbs(tmp_path):
    rng = random.Random(7)
    shards = {"shardId-000000000001": [], "shardId-000000000002": []}
    t = BASE
    for seq in range(1, 301):
        t += rng.choice([rng.randrange(0, 5_000)] * 5 + [rng.randrange(40_000, 120_000)])
        shards[rng.choice(sorted(shards))].append({"carrier": rng.choice("ABCD"), "delay": seq, "t": t})
    out = tmp_path / "out"
    server = ServerProcess("tests.handlers:DataTimes", tmp_path, "--session", "30", "--session-key", "carrier",
                           "--sink", f"file:{out}", "--workers", "2")
    try:
        daemon = FakeDaemon(relay_command(server.port))
        opened = {s: await daemon.shard(s) for s in shards}
        for shard_id, events in shards.items():
            for i in range(0, len(events), 25):
                await opened[shard_id].process_records(records(i + 1, events[i : i + 25]), millis_behind_latest=0)
        end = [{"carrier": "end", "delay": 0, "t": t + 10**9}]  # far on: every session closes
        for shard_id, shard in opened.items():
            await shard.process_records(records(len(shards[shard_id]) + 1, end), millis_behind_latest=0)
        await eventually(lambda: len([r for r in rows_in(out) if r["carrier"] != "end"]) >= 300, timeout=60,
                         what="every row in a committed session")
        for shard in opened.values():
            await shard.close()
    finally:
        assert server.stop() == 0
    got = [r for r in rows_in(out) if r["carrier"] != "end"]
    assert len(got) == 300 and len({r["delay"] for r in got}) == 300  # none twice
    sessions: dict[tuple[str, int, int], list[int]] = {}
    for r in got:
        assert r["window_start"] <= r["t"] < r["window_end"]
        sessions.setdefault((r["carrier"], r["window_start"], r["window_end"]), []).append(r["delay"])
    data = {s: [(e["t"], e["delay"], e["carrier"], float(e["delay"])) for e in events] for s, events in shards.items()}
    assert {k: (len(v), float(sum(v))) for k, v in sessions.items()} == sessions_by_duckdb(data)


async def test_a_late_row_within_the_allowed_lateness_amends_its_window_through_the_cli(tmp_path):
    """Shard 2 goes quiet past idle_timeout, so shard 1 alone closes [0, 60 s); shard 2
    then brings a row for that window: the window's file is replaced, the row in it."""
    config = tmp_path / "mldserver.toml"
    config.write_text("idle_timeout = 1.0\ncheckpoint_interval = 0.0\n")
    out = tmp_path / "out"
    server = ServerProcess("tests.handlers:DataTimes", tmp_path, "--config", str(config), "--allowed-lateness", "600",
                           "--sink", f"file:{out}", "--window", "60")
    try:
        daemon = FakeDaemon(relay_command(server.port))
        one = await daemon.shard("shardId-000000000001")
        two = await daemon.shard("shardId-000000000002")
        await two.process_records(records(1, [{"carrier": "B", "delay": 1, "t": BASE + 1_000}]), millis_behind_latest=0)
        await one.process_records(records(1, [{"carrier": "A", "delay": 2, "t": BASE + 2_000},
                                              {"carrier": "A", "delay": 3, "t": BASE + 70_000}]), millis_behind_latest=0)
        window = BASE - BASE % 60_000
        first = out / f"{window}-{window + 60_000}.jsonl"
        await eventually(lambda: first.exists(), timeout=30, what="the first window, shard 2 idle")
        assert sorted(orjson.loads(line)["delay"] for line in first.read_text().splitlines()) == [1, 2]
        await two.process_records(records(2, [{"carrier": "B", "delay": 4, "t": BASE + 30_000}]),
                                  millis_behind_latest=0)  # late: its window closed; within the lateness
        await one.process_records(records(3, [{"carrier": "A", "delay": 5, "t": BASE + 130_000}]),
                                  millis_behind_latest=0)
        await eventually(lambda: 4 in [orjson.loads(line)["delay"] for line in first.read_text().splitlines()],
                         timeout=30, what="the window amended with the late row")
        for shard in (one, two):
            await shard.close()
    finally:
        assert server.stop() == 0
    assert sorted(orjson.loads(line)["delay"] for line in first.read_text().splitlines()) == [1, 2, 4]
    assert not list(out.glob("*.late.jsonl")) and len(list(out.glob(f"{window}-*"))) == 1  # replaced, not beside
    log = [orjson.loads(line) for line in server.log_path.read_text().splitlines()]
    assert any(e["event"] == "window_committed" and e.get("version") == 2 for e in log)


async def test_rows_out_of_order_within_max_out_of_orderness_land_in_their_own_windows_through_the_cli(tmp_path):
    """Each shard's rows come up to 20 s out of event-time order; with
    --max-out-of-orderness 30 every row is in its own window's file, none late."""
    rng = random.Random(11)
    shards = {"shardId-000000000001": [], "shardId-000000000002": []}
    for shard_id, events in shards.items():
        t = BASE
        for seq in range(1, 201):
            t += rng.randrange(0, 3_000)
            events.append({"carrier": shard_id[-1], "delay": len(events) + 1000 * int(shard_id[-1]),
                           "t": t - rng.choice([0, rng.randrange(0, 20_000)])})
    out = tmp_path / "out"
    server = ServerProcess("tests.handlers:DataTimes", tmp_path, "--max-out-of-orderness", "30",
                           "--sink", f"file:{out}", "--window", "60")
    try:
        daemon = FakeDaemon(relay_command(server.port))
        opened = {s: await daemon.shard(s) for s in shards}
        for i in range(0, 200, 20):
            for shard_id, events in shards.items():
                await opened[shard_id].process_records(records(i + 1, events[i : i + 20]), millis_behind_latest=0)
        end = [{"carrier": "end", "delay": 0, "t": BASE + 10**9}]  # far on: every window closes
        for shard_id, shard in opened.items():
            await shard.process_records(records(201, end), millis_behind_latest=0)
        await eventually(lambda: len([r for r in rows_in(out) if r["carrier"] != "end"]) >= 400, timeout=60,
                         what="every row in a committed window")
        for shard in opened.values():
            await shard.close()
    finally:
        assert server.stop() == 0
    assert not list(out.glob("*.late.jsonl"))
    got = {}
    for path in out.glob("*.jsonl"):
        start, end_ = map(int, path.stem.split("-"))
        for r in (orjson.loads(line) for line in path.read_text().splitlines()):
            assert start <= r["t"] < end_ or r["carrier"] == "end"
            got[r["delay"]] = r["t"]
    assert sorted(d for d in got if d) == sorted(e["delay"] for events in shards.values() for e in events)


async def test_an_amendment_lands_once_across_a_sigkill_between_the_first_commit_and_it(tmp_path):
    """parquet: (Spark): window [0, 60 s) commits with shard 1's rows alone (shard 2
    idle), the server is SIGKILLed, a new one reads both shards again from their
    checkpoints (none past the window: it is not final), and shard 2 brings a row for it
    within the allowed lateness: the window's output holds each of its rows once."""
    import pyarrow.dataset as ds

    config = tmp_path / "mldserver.toml"
    config.write_text("idle_timeout = 1.0\ncheckpoint_interval = 0.0\n")
    out = tmp_path / "out"
    args = ("--config", str(config), "--allowed-lateness", "600", "--sink", f"parquet:{out}", "--window", "60")
    window = BASE - BASE % 60_000
    entry = out / "_commits" / f"{window}-{window + 60_000}.json"
    first = {"shardId-000000000001": [{"carrier": "A", "delay": 2, "t": BASE + 2_000},
                                      {"carrier": "A", "delay": 3, "t": BASE + 70_000}],
             "shardId-000000000002": [{"carrier": "B", "delay": 1, "t": BASE + 1_000}]}
    server = ServerProcess("tests.handlers:DataTimes", tmp_path, *args)
    daemon = FakeDaemon(relay_command(server.port))
    shards = {s: await daemon.shard(s) for s in sorted(first)}
    for shard_id in reversed(sorted(first)):
        await shards[shard_id].process_records(records(1, first[shard_id]), millis_behind_latest=0)
    await eventually(entry.exists, timeout=120, what="the window's first commit (shard 2 idle)")
    server.proc.kill()  # SIGKILL
    server.proc.wait()
    for shard in shards.values():
        await shard.child.kill()

    server = ServerProcess("tests.handlers:DataTimes", tmp_path, *args)
    try:
        again = FakeDaemon(relay_command(server.port))
        again.checkpoints.update(daemon.checkpoints)
        assert not any(isinstance(c, tuple) and int(c[0]) >= 1 for c in again.checkpoints.values()), \
            "a shard checkpointed past a window not final"
        shards = {s: await again.shard(s) for s in sorted(first)}
        for shard_id in sorted(first):  # read again from the start
            await shards[shard_id].process_records(records(1, first[shard_id]), millis_behind_latest=0)
        await shards["shardId-000000000002"].process_records(
            records(2, [{"carrier": "B", "delay": 4, "t": BASE + 30_000}]), millis_behind_latest=0)  # late, within
        await shards["shardId-000000000001"].process_records(
            records(3, [{"carrier": "A", "delay": 5, "t": BASE + 130_000}]), millis_behind_latest=0)

        def delays():
            while True:
                try:
                    table = ds.dataset(out / f"window={window}-{window + 60_000}", format="parquet").to_table()
                except FileNotFoundError:  # listed just before the amendment swapped the folder: read again
                    continue
                if "delay" in table.column_names:  # (none: the old folder listed as it was being removed)
                    return sorted(table.column("delay").to_pylist())

        await eventually(lambda: 4 in delays(), timeout=120, what="the window amended with the late row")
        for shard in shards.values():
            await shard.close()
    finally:
        assert server.stop() == 0
    assert delays() == [1, 2, 4]  # each once
    assert orjson.loads(entry.read_bytes()).get("version", 1) >= 2
