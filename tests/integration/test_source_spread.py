"""A source's shards spread over servers by shard leases: ``mldserver serve --source
kinesis:S --lease-table T --sink iceberg:LAKE`` two, then three, on a 4-shard stream
(kinesis-local), the lease table in DynamoDB Local, one Iceberg table (a SQLite catalog
in one shared folder) the exactly-once output. Two servers read two shards each (their
``/status``); a third joins and takes a share (2, 1, 1); one SIGKILLed, its shards are
taken by the others after about a lease period, from the positions in the lease
items; every record put is in the table exactly once. A clean stop hands the shards
over at once (``source_shard_lease_released``). A shard split while two servers read
the stream: its children are read (on either server) only after the parent's
``SHARD_END`` is stored, and every record is in the table once."""

from __future__ import annotations

import json
import time
import urllib.request
import uuid
from collections import Counter
from pathlib import Path

import duckdb
import pytest
from pyiceberg.catalog.sql import SqlCatalog

from .components import AWS, wait_for
from .test_dynamodb_source import kill

pytestmark = pytest.mark.slow  # three servers and a kill against two emulators

HANDLER = "handlers.passthrough:Passthrough"
PERIOD = 2.0
QUARTER = 2**126


@pytest.fixture
def config(tmp_path):
    path = tmp_path / "mldserver.toml"
    path.write_text("window = 1.0\ncheckpoint_interval = 0.0\nidle_timeout = 3.0\nwatermark_margin = 0.5\n"
                    "source_poll_interval = 0.2\nsource_discovery_interval = 2.0\n")
    return str(path)


def env(kinesis, dynamodb) -> dict[str, str]:
    return {"AWS_ENDPOINT_URL_KINESIS": kinesis.endpoint, "AWS_ENDPOINT_URL_DYNAMODB": dynamodb.endpoint,
            "AWS_ACCESS_KEY_ID": AWS["aws_access_key_id"], "AWS_SECRET_ACCESS_KEY": AWS["aws_secret_access_key"],
            "AWS_REGION": AWS["region_name"]}


def put(kinesis, name: str, n: int, tag: str) -> set[tuple[str, str]]:
    """``n`` records over the four shards (a quarter of the hash key range each);
    (shard, sequence number) of each."""
    out = set()
    for i in range(n):
        r = kinesis.client.put_record(StreamName=name, Data=f"{tag}-{i}".encode(), PartitionKey=f"{tag}-{i}",
                                      ExplicitHashKey=str((i % 4) * QUARTER + i))
        out.add((r["ShardId"], r["SequenceNumber"]))
    return out


def committed(lake: Path) -> Counter:
    """(shard, sequence number) of every row in the table's current snapshot."""
    try:
        catalog = SqlCatalog("mldserver", uri=f"sqlite:///{lake}/catalog.db", warehouse=f"file://{lake}")
        files = [t.file.file_path.removeprefix("file://")
                 for t in catalog.load_table(("mldserver", "windows")).scan().plan_files()]
    except Exception:  # no table yet
        return Counter()
    if not files:
        return Counter()
    return Counter(duckdb.sql(f"SELECT shard_id, sequence_number FROM read_parquet({files!r})").fetchall())


def held(server) -> list[str] | None:
    """The shard leases the server holds, as its /status says (None: not answering)."""
    try:
        with urllib.request.urlopen(f"{server.admin_url}/status", timeout=5) as reply:
            [source] = json.loads(reply.read())["sources"]
    except (OSError, ValueError, TypeError):
        return None
    return (source["lease"] or {}).get("held")


def reading(server) -> set[str]:
    """The shards the server's status says it holds."""
    return set(held(server) or ())


def test_shards_spread_over_servers_rebalance_as_one_joins_and_one_dies_and_each_record_lands_once(
        kinesis, dynamodb, tmp_path, serve, config):
    name, leases, lake = f"spread-{uuid.uuid4().hex[:8]}", f"leases-{uuid.uuid4().hex[:8]}", tmp_path / "lake"
    kinesis.create_stream(name, 4)
    shards = {s["ShardId"] for s in kinesis.client.list_shards(StreamName=name)["Shards"]}
    assert len(shards) == 4
    expected = put(kinesis, name, 40, "first")

    def start(who: str):
        return serve(HANDLER, "--source", f"kinesis:{name}", "--lease-table", leases, "--lease-period", str(PERIOD),
                     "--sink", f"iceberg:{lake}", "--config", config, "--state-dir", str(tmp_path / f"state-{who}"),
                     "--server-id", who, env=env(kinesis, dynamodb))

    a = start("a")
    b = start("b")
    wait_for(lambda: len(reading(a)) == 2 and len(reading(b)) == 2, 120, "two shards read by each server")
    assert reading(a) | reading(b) == shards
    expected |= put(kinesis, name, 20, "two")

    c = start("c")
    wait_for(lambda: reading(c) and sorted(map(len, (reading(a), reading(b), reading(c)))) == [1, 1, 2]
             and reading(a) | reading(b) | reading(c) == shards, 120, "a third server taking its share (2, 1, 1)")
    assert all(e["was"] for e in c.events() if e["event"] == "source_shard_lease_taken")  # stolen, not free
    expected |= put(kinesis, name, 20, "three")
    wait_for(lambda: set(committed(lake)) >= expected, 120, "the records so far committed")

    victim = max((a, b, c), key=lambda s: len(reading(s)))
    orphaned = reading(victim)
    survivors = [s for s in (a, b, c) if s is not victim]
    kill(victim)
    killed = time.monotonic()
    expected |= put(kinesis, name, 20, "after-kill")
    wait_for(lambda: reading(survivors[0]) | reading(survivors[1]) == shards, 60,
             "the killed server's shards taken by the others")
    took = time.monotonic() - killed
    assert took <= 4 * PERIOD + 5.0, took  # expired after a period unmoved, seen within a third, plus polling
    assert sorted(map(len, map(reading, survivors))) == [2, 2]
    taken = [e for s in survivors for e in s.events() if e["event"] == "source_shard_lease_taken"
             and set(e["shards"]) & orphaned]
    assert taken
    expected |= put(kinesis, name, 20, "last")

    rows = wait_for(lambda: set(c := committed(lake)) >= expected and c, 180, "every record committed")
    assert set(rows) == expected and set(rows.values()) == {1}, "each record exactly once"

    first, second = survivors
    assert first.stop() == 0
    released = [e for e in first.events() if e["event"] == "source_shard_lease_released"]
    assert released and released[-1]["count"] == 2
    wait_for(lambda: reading(second) == shards, 30, "the stopped server's shards taken at once by the last one")
    assert second.stop() == 0


def test_a_split_parent_read_on_one_server_is_ended_before_its_children_are_read_on_any(
        kinesis, dynamodb, tmp_path, serve, config):
    name, leases, lake = f"split-{uuid.uuid4().hex[:8]}", f"leases-{uuid.uuid4().hex[:8]}", tmp_path / "lake"
    kinesis.create_stream(name, 2)
    [parent, _] = sorted(kinesis.shards(name))
    half = 2 * QUARTER
    expected = put(kinesis, name, 20, "before")

    def start(who: str):
        return serve(HANDLER, "--source", f"kinesis:{name}", "--lease-table", leases, "--lease-period", str(PERIOD),
                     "--sink", f"iceberg:{lake}", "--config", config, "--state-dir", str(tmp_path / f"state-{who}"),
                     "--server-id", who, env=env(kinesis, dynamodb))

    a, b = start("a"), start("b")
    wait_for(lambda: len(reading(a)) == 1 and len(reading(b)) == 1, 120, "one shard read by each server")
    kinesis.client.split_shard(StreamName=name, ShardToSplit=parent, NewStartingHashKey=str(QUARTER))
    wait_for(lambda: len(kinesis.shards(name)) == 4, 60, "the split")
    children = sorted(set(kinesis.shards(name)) - set(s for s, _ in expected))
    for i in range(20):  # into both children (and the other first shard)
        r = kinesis.client.put_record(StreamName=name, Data=f"after-{i}".encode(), PartitionKey=f"after-{i}",
                                      ExplicitHashKey=str([QUARTER // 2, QUARTER + 1, half + 1][i % 3] + i))
        expected.add((r["ShardId"], r["SequenceNumber"]))
    assert {s for s, _ in expected} >= set(children)

    rows = wait_for(lambda: set(c := committed(lake)) >= expected and c, 180, "every record committed")
    assert set(rows) == expected and set(rows.values()) == {1}, "each record exactly once"
    events = [e for s in (a, b) for e in s.events()]
    [ended] = [e for e in events if e["event"] == "source_shard_ended" and e["shard_id"] == parent]
    started = [e for e in events if e["event"] == "source_shard_started" and e["shard_id"] in children]
    assert {e["shard_id"] for e in started} == set(children)
    assert all(e["ts"] >= ended["ts"] for e in started), (ended, started)  # parents first, across servers
    for child in children:  # first read from its trim horizon (a later move: from its stored position)
        assert min((e for e in started if e["shard_id"] == child), key=lambda e: e["ts"])["start"] == "TRIM_HORIZON"
    wait_for(lambda: reading(a) | reading(b) == {*children, sorted(kinesis.shards(name))[1]}, 30,
             "the children and the other first shard leased, the parent no more")
    assert a.stop() == 0 and b.stop() == 0
