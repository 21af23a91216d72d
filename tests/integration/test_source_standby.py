"""A one-shard source over two servers, by shard leases: two ``mldserver serve --source
dynamodb:TABLE --lease-table L`` servers, each with a state dir of its own, against
DynamoDB Local. One holds the shard's lease and reads it, the other holds none
(``/status`` says which); the reader SIGKILLed, the other takes the shard over within
about one lease period and resumes from the position kept in the shard's lease item:
every change reaches a handler (at least once: nothing lost). Stopped cleanly instead,
the reader releases the lease and the other takes it at once, each change handled
exactly once. A reader whose lease is taken stops reading the shard (``leaseLost``)
and, the taker silent, takes it back after a period and reads on from the position kept."""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.request
import uuid

import pytest

from ..harness import MLDSERVER, ROOT
from .components import AWS, wait_for
from .test_dynamodb_changes import make_table, seen
from .test_dynamodb_source import kill, put, stream_sequence_numbers

pytestmark = pytest.mark.slow  # servers killed against an emulator

HANDLER = "tests.pool_handlers:RecordChanges"
PERIOD = 2.0


@pytest.fixture
def config(tmp_path):
    """Checkpoint every batch (a ChangeHandler's checkpoint_interval), poll often."""
    path = tmp_path / "mldserver.toml"
    path.write_text("checkpoint_interval = 0.0\nsource_poll_interval = 0.2\n")
    return str(path)


def env(dynamodb, tmp_path, name: str) -> dict[str, str]:
    """The AWS configuration (DynamoDB Local); server ``name``'s handlers record what they saw."""
    return {"AWS_ENDPOINT_URL_DYNAMODB": dynamodb.endpoint, "AWS_ACCESS_KEY_ID": AWS["aws_access_key_id"],
            "AWS_SECRET_ACCESS_KEY": AWS["aws_secret_access_key"], "AWS_REGION": AWS["region_name"],
            "MLDSERVER_TEST_SEEN": str(tmp_path / f"seen-{name}.pickle")}


def handled(tmp_path, name: str) -> list[int]:
    path = tmp_path / f"seen-{name}.pickle"
    return [e["doc"]["n"] for e in seen(path)] if path.exists() else []


def event(server, name: str) -> dict | None:
    return next((e for e in server.events() if e["event"] == name), None)


def lease_item(dynamodb, leases: str, table: str) -> dict:
    """The source's one shard lease item."""
    items = dynamodb.client.scan(TableName=leases, ConsistentRead=True)["Items"]
    return next((i for i in items if i.get("source", {}).get("S") == f"dynamodb:{table}"), {})


def kept_positions(dynamodb, leases: str, table: str) -> dict:
    item = lease_item(dynamodb, leases, table)
    if "checkpoint" not in item:
        return {}
    return {item["leaseKey"]["S"]: [item["checkpoint"]["S"], int(item["checkpointSubSequenceNumber"]["N"])]}


def owner(server) -> str:
    return event(server, "source_started")["owner"]


def held(server) -> list[str]:
    return source_status(server)["lease"]["held"]


def source_status(server) -> dict:
    with urllib.request.urlopen(f"{server.admin_url}/status", timeout=5) as reply:
        [source] = json.loads(reply.read())["sources"]
    return source


def two_servers(dynamodb, tmp_path, serve, config, table: str, leases: str):
    args = ("--source", f"dynamodb:{table}", "--lease-table", leases, "--lease-period", str(PERIOD),
            "--config", config)
    a = serve(HANDLER, *args, "--state-dir", str(tmp_path / "state-a"), env=env(dynamodb, tmp_path, "a"))
    wait_for(lambda: event(a, "source_shard_lease_taken"), 60, "the first server holding the shard's lease")
    b = serve(HANDLER, *args, "--state-dir", str(tmp_path / "state-b"), env=env(dynamodb, tmp_path, "b"))
    wait_for(lambda: source_status(b)["lease"]["shards"] == 1, 60, "the second server seeing the shard")
    assert held(b) == [] and lease_item(dynamodb, leases, table)["leaseOwner"]["S"] == owner(a)
    return a, b


def test_the_standby_takes_over_a_killed_reader_within_a_lease_period_and_nothing_is_lost(
        dynamodb, tmp_path, serve, config):
    table, leases = f"standby-{uuid.uuid4().hex[:8]}", f"leases-{uuid.uuid4().hex[:8]}"
    arn = make_table(dynamodb.client, table)
    put(dynamodb.client, table, 5)
    a, b = two_servers(dynamodb, tmp_path, serve, config, table, leases)
    assert len(held(a)) == 1 and held(b) == []
    shown = subprocess.run([MLDSERVER, "status", "--admin", a.admin_url], capture_output=True, text=True, timeout=60,
                           env={**os.environ, "PYTHONPATH": str(ROOT)})
    [line] = [line for line in shown.stdout.splitlines() if line.startswith("source ")]
    assert f"leases 1 of 1 shards in {leases}, 1 servers: {held(a)[0]}" in line, shown.stdout
    first = wait_for(lambda: len(s := stream_sequence_numbers(dynamodb, arn)) == 5 and s, 30, "5 records")
    wait_for(lambda: [first[-1], 0] in kept_positions(dynamodb, leases, table).values(), 60,
             "the 5th change's position kept in the lease table")
    assert handled(tmp_path, "a") == list(range(5)) and handled(tmp_path, "b") == []
    assert not (tmp_path / "state-a" / "sources").exists()  # the positions live in the lease table

    put(dynamodb.client, table, 3, first=5)  # a may handle some of these before it dies, or none
    kill(a)
    killed = time.monotonic()
    put(dynamodb.client, table, 3, first=8)
    acquired = wait_for(lambda: event(b, "source_shard_lease_taken"), 30, "the other taking the lease over")
    took = time.monotonic() - killed
    # its counter unmoved for one period, seen within a third of one (and a third at most since the
    # last renewal), plus this test's polling: about one period, on a loaded machine a little more
    assert took <= 2 * PERIOD + 1.0, took
    assert acquired["was"] == [owner(a)]

    wait_for(lambda: set(handled(tmp_path, "a")) | set(handled(tmp_path, "b")) >= set(range(11)), 60,
             "every change handled by one server or the other")
    resumed = wait_for(lambda: event(b, "source_shard_started"), 30, "the standby's shard started")
    assert resumed["start"] == "AFTER_SEQUENCE_NUMBER"
    assert int(resumed["position"]) >= int(first[-1])  # from the kept position, not from the trim horizon
    assert min(handled(tmp_path, "b")) >= 5
    assert len(held(b)) == 1
    everything = stream_sequence_numbers(dynamodb, arn)
    wait_for(lambda: [everything[-1], 0] in kept_positions(dynamodb, leases, table).values(), 30,
             "the last position kept")
    assert b.stop() == 0
    assert "leaseOwner" not in lease_item(dynamodb, leases, table)  # released at its clean stop


def test_a_clean_stop_hands_the_source_over_at_once_each_change_handled_once(dynamodb, tmp_path, serve, config):
    table, leases = f"handover-{uuid.uuid4().hex[:8]}", f"leases-{uuid.uuid4().hex[:8]}"
    make_table(dynamodb.client, table)
    put(dynamodb.client, table, 4)
    a, b = two_servers(dynamodb, tmp_path, serve, config, table, leases)
    wait_for(lambda: len(handled(tmp_path, "a")) >= 4, 60, "the first 4 changes handled")

    assert a.stop() == 0
    assert event(a, "source_shard_lease_released")["count"] == 1
    stopped = time.monotonic()
    acquired = wait_for(lambda: event(b, "source_shard_lease_taken"), 30, "the other taking the released lease")
    assert time.monotonic() - stopped <= PERIOD, "a released lease is taken at the other's next look"
    assert acquired["was"] == []
    put(dynamodb.client, table, 3, first=4)
    wait_for(lambda: len(handled(tmp_path, "b")) >= 3, 60, "the 3 new changes handled by the standby")
    assert b.stop() == 0
    assert handled(tmp_path, "a") == [0, 1, 2, 3] and handled(tmp_path, "b") == [4, 5, 6]  # each once


def test_a_reader_whose_lease_is_taken_lets_its_shard_go_and_takes_it_back_when_the_taker_is_silent(
        dynamodb, tmp_path, serve, config):
    table, leases = f"stolen-{uuid.uuid4().hex[:8]}", f"leases-{uuid.uuid4().hex[:8]}"
    arn = make_table(dynamodb.client, table)
    put(dynamodb.client, table, 3)
    a = serve(HANDLER, "--source", f"dynamodb:{table}", "--lease-table", leases, "--lease-period", str(PERIOD),
              "--config", config, env=env(dynamodb, tmp_path, "a"))
    first = wait_for(lambda: len(s := stream_sequence_numbers(dynamodb, arn)) == 3 and s, 30, "3 records")
    wait_for(lambda: [first[-1], 0] in kept_positions(dynamodb, leases, table).values(), 60,
             "the 3rd change's position kept")
    dynamodb.client.update_item(TableName=leases, Key={"pk": lease_item(dynamodb, leases, table)["pk"]},
                                UpdateExpression="SET leaseOwner = :thief, leaseCounter = leaseCounter + :one",
                                ExpressionAttributeValues={":thief": {"S": "thief:1:0"}, ":one": {"N": "1"}})
    lost = wait_for(lambda: event(a, "source_shard_lease_lost"), 30, "the lease seen lost")
    assert "thief:1:0" in lost["reason"] and lost["level"] == "warning"
    let_go = wait_for(lambda: next((e for e in a.events() if e["event"] == "source_shard_lease_lost"
                                    and e["level"] == "info"), None), 30, "the shard let go (leaseLost)")
    assert let_go["position"] == first[-1]
    put(dynamodb.client, table, 2, first=3)
    wait_for(lambda: len([e for e in a.events() if e["event"] == "source_shard_lease_taken"]) == 2, 30,
             "the lease taken back once the thief has not renewed it for a period")
    wait_for(lambda: set(handled(tmp_path, "a")) >= set(range(5)), 60, "the changes made meanwhile handled")
    assert handled(tmp_path, "a") == list(range(5))  # resumed after the kept position: nothing twice
    assert a.stop() == 0
