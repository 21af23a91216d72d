"""Event time from the data, through the real KCL daemon: a replay of historic records
(2013's, years before the wall clock) through ``mldserver run`` on a 4-shard
kinesis-local stream, one shard split mid-run and more records put on its children.
Every record is committed in the window of its own event time, none late, and the
per-window, per-carrier counts and sums equal DuckDB's over the same records.

What it guards: a caught-up shard no longer moves the watermark to the wall clock when
event times come from the data; ``run`` knows the stream's shards from the daemon's
properties, so a shard whose lease is taken later holds from the start; a split's
parent holds until its children report."""

from __future__ import annotations

import json
import random

import duckdb
import pytest

from .components import DynamoDBLocal, KinesisLocal, Run, wait_for, write_properties

pytestmark = [pytest.mark.realdaemon]

STREAM, APP = "flights", "mldserver-replay"
WINDOW_S = 600  # ten minutes of 2013
T0 = 1_357_000_000_000  # 2013-01-01
CARRIERS = ["AA", "DL", "UA", "WN", "B6"]


def records(rng: random.Random, start_ms: int, count: int) -> list[dict]:
    """Flights in event-time order, some 9 s apart."""
    out, t = [], start_ms
    for _ in range(count):
        t += rng.randrange(0, 18_000)
        out.append({"t": t, "carrier": rng.choice(CARRIERS), "delay": rng.randrange(-20, 200)})
    return out


def put(kinesis: KinesisLocal, batch: list[dict], rng: random.Random) -> None:
    for i in range(0, len(batch), 200):
        entries = [{"Data": json.dumps(r).encode(), "PartitionKey": f"pk-{rng.randrange(10**9)}"}
                   for r in batch[i:i + 200]]
        result = kinesis.client.put_records(StreamName=STREAM, Records=entries)
        assert not result.get("FailedRecordCount")


def by_duckdb(flights: list[dict]) -> dict[tuple, tuple]:
    con = duckdb.connect()
    con.execute("CREATE TABLE f (t BIGINT, carrier VARCHAR, delay BIGINT)")
    con.executemany("INSERT INTO f VALUES (?, ?, ?)", [(r["t"], r["carrier"], r["delay"]) for r in flights])
    size = WINDOW_S * 1000
    return {(start, start + size, carrier): (n, total) for start, carrier, n, total in con.execute(
        f"SELECT t // {size} * {size} AS start, carrier, count(*), sum(delay) FROM f GROUP BY start, carrier"
    ).fetchall()}


def committed(out) -> tuple[dict[tuple, tuple], int]:
    """Per window and carrier (count, sum of delay) from the file sink's windows, and
    how many rows there are in all."""
    result: dict[tuple, list] = {}
    rows = 0
    for path in out.glob("*.jsonl"):
        assert not path.name.endswith(".late.jsonl"), f"late rows: {path.name}"
        start, end = map(int, path.name.removesuffix(".jsonl").split("-"))
        for line in path.read_text().splitlines():
            row = json.loads(line)
            assert start <= row["t"] < end, (path.name, row)  # in the window of its own time
            n_total = result.setdefault((start, end, row["carrier"]), [0, 0])
            n_total[0] += 1
            n_total[1] += row["delay"]
            rows += 1
    return {k: tuple(v) for k, v in result.items()}, rows


@pytest.mark.timeout(900)
def test_a_historic_replay_with_a_split_commits_every_record_in_its_own_window(tmp_path):
    rng = random.Random(2013)
    kinesis = KinesisLocal(tmp_path)
    dynamodb = DynamoDBLocal(tmp_path)
    out = tmp_path / "out"
    config = tmp_path / "mldserver.toml"
    config.write_text(f"window = {WINDOW_S}.0\nidle_timeout = 60.0\ncheckpoint_interval = 0.0\n")
    properties = write_properties(tmp_path, APP, stream=STREAM, app=APP, kinesis=kinesis, dynamodb=dynamodb)
    run = None
    try:
        kinesis.create_stream(STREAM, 4)
        before = records(rng, T0, 1_200)  # some three hours of flights, before the server starts
        put(kinesis, before, rng)
        run = Run(tmp_path, "tests.handlers:DataTimes", properties, "--sink", f"file:{out}", "--config", str(config))
        wait_for(lambda: committed(out)[1] > 0, 300, "a first window committed", interval=1)

        # split shard 1 while the replay goes on; the rest of the day goes to every open shard
        parent = kinesis.shards(STREAM)["shardId-000000000001"]
        lo, hi = (int(parent["HashKeyRange"][k]) for k in ("StartingHashKey", "EndingHashKey"))
        kinesis.client.split_shard(StreamName=STREAM, ShardToSplit="shardId-000000000001",
                                   NewStartingHashKey=str((lo + hi) // 2))
        after = records(rng, before[-1]["t"], 800)
        put(kinesis, after, rng)
        flights = before + after
        expected = by_duckdb(flights)
        wait_for(lambda: committed(out)[1] >= len(flights), 400,
                 f"{len(flights)} rows committed (have {committed(out)[1]})", interval=2)
        windows, rows = committed(out)
        assert rows == len(flights)
        assert windows == expected
        events = run.events()
        assert sum(e.get("late", 0) for e in events if e["event"] == "window_committed") == 0
        assert any(e["event"] == "lineage" and e["shard_id"] != "shardId-000000000001" for e in events)
        assert run.terminate(120) == 0, run.stderr_path.read_text()
        [stopped] = [e for e in run.events() if e["event"] == "coordinator_stopped"]
        assert (stopped["late"], stopped["clamped"]) == (0, 0), stopped
    finally:
        if run is not None:
            run.terminate(120)
        kinesis.terminate()
        dynamodb.terminate()
