"""Timers across a SIGKILL of the server (the real CLI, handler processes): 10,000
timers created across 4 shards, some replaced and some cancelled in the call that
created them; the server is killed while they fire and started again on the same
state dir. Every live timer fires at least once, with its latest context, never
before its time; no cancelled timer fires; the timers fired twice are counted and
are no more than could be in flight at the kill (``scheduler.MAX_IN_FLIGHT``).

Then the same with the DynamoDB store (DynamoDB Local, started here) and two servers
sharing its table, two shards each: one is killed while they fire, the other fires
everything, the dead one's claims once they expire."""

from __future__ import annotations

import asyncio
import collections
import urllib.request
from pathlib import Path

import pytest

from mldserver.testing import FakeDaemon
from mldserver.timers.scheduler import MAX_IN_FLIGHT

from ..conftest import ServerProcess, relay_command
from ..helpers import eventually
from ..integration.components import AWS, DynamoDBLocal
from .serving import HANDLER, fired_lines, records

SHARDS, PER_SHARD, PER_BATCH = 4, 2_500, 250


def metric(server: ServerProcess, name: str) -> float | None:
    url = server.admin_url
    if url is None:
        return None
    for line in urllib.request.urlopen(url + "/metrics", timeout=5).read().decode().splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return None


def script(s: int) -> tuple[list[list[list]], dict[str, int], set[str]]:
    """Shard ``s``'s records (one op list each), the live timers' latest versions and
    the cancelled ones. Every timer is due 2 to 12 s after its creation: firing
    spreads out and runs on after the last create. The callback writes its line, then
    takes 0.2 s: those under way at the kill fire again after it."""
    ops, live, cancelled = [], {}, set()
    for i in range(PER_SHARD):
        ref = f"s{s}-{i:04}"
        delay = 2 + (i % 100) / 10
        record = [["create_in", ref, delay, {"ref": ref, "v": 1}, "lingering"]]
        if i % 5 == 1:
            record.append(["create_in", ref, delay, {"ref": ref, "v": 2}, "lingering"])
        if i % 5 == 2:
            record.append(["cancel", ref, "lingering"])
            cancelled.add(ref)
        else:
            live[ref] = 2 if i % 5 == 1 else 1
        ops.append(record)
    return ops, live, cancelled


def check(lines: list[dict], live: dict[str, int], cancelled: set[str], in_flight: int) -> int:
    """What at least once means here; the number of duplicates."""
    fires = collections.Counter(line["ref"] for line in lines)
    assert not set(fires) & cancelled, "a cancelled timer fired"
    assert set(fires) == set(live)
    latest = {line["ref"]: line["v"] for line in lines}
    assert latest == live, "a timer fired with a context it no longer had"
    assert all(line["v"] == live[line["ref"]] for line in lines)  # a replaced one never fired with v1
    assert all(line["fired_at"] >= line["at"] for line in lines), "a timer fired before its time"
    duplicates = sum(fires.values()) - len(fires)
    assert duplicates <= in_flight
    return duplicates


async def drive(daemon: FakeDaemon, shard_numbers: range, live: dict, cancelled: set,
                per_batch: int = PER_BATCH) -> None:
    async def one(s: int) -> None:
        ops, shard_live, shard_cancelled = script(s)
        live.update(shard_live)
        cancelled.update(shard_cancelled)
        shard = await daemon.shard(f"shardId-{s:012d}")
        for first in range(0, PER_SHARD, per_batch):
            await shard.process_records(records(first + 1, ops[first : first + per_batch]))
        await shard.lease_lost()
        assert await shard.close() == 0

    await asyncio.gather(*(one(s) for s in shard_numbers))
    assert all(daemon.checkpoints[f"shardId-{s:012d}"] == (str(PER_SHARD), 0) for s in shard_numbers)


async def test_timers_fire_at_least_once_across_a_sigkill_while_firing(tmp_path):
    fired = tmp_path / "fired.jsonl"
    env = {"MLDSERVER_TEST_FIRED": str(fired)}
    server = ServerProcess(HANDLER, tmp_path, "--workers", "2", env=env)
    live: dict[str, int] = {}
    cancelled: set[str] = set()
    await drive(FakeDaemon(relay_command(server.port)), range(SHARDS), live, cancelled)
    assert len(live) == 8_000 and len(cancelled) == 2_000

    # Killed while they fire: some fired, most not yet.
    await eventually(lambda: len(fired_lines(fired)) >= len(live) // 4, 120, what="a quarter fired")
    server.proc.kill()
    server.proc.wait()
    before = fired_lines(fired)
    assert len(before) < len(live), "every timer fired before the kill: nothing left to test"

    again = ServerProcess(HANDLER, tmp_path, "--workers", "2", env=env)
    try:
        await eventually(lambda: {line["ref"] for line in fired_lines(fired)} >= set(live), 180,
                         what="every live timer fired", interval=0.2)
        await eventually(lambda: metric(again, "mldserver_pending_timers") == 0, 60, what="the store emptied")
    finally:
        assert again.stop() == 0
    lines = fired_lines(fired)
    duplicates = check(lines, live, cancelled, MAX_IN_FLIGHT)
    print(f"fired before the kill: {len(before)}, after: {len(lines) - len(before)}, duplicates: {duplicates}")
    fires = collections.Counter(line["ref"] for line in lines)
    assert {line["ref"] for line in lines[len(before):]} & {line["ref"] for line in before} == {
        ref for ref, n in fires.items() if n > 1}  # a duplicate is one fired before the kill and again after


@pytest.fixture
def dynamodb(tmp_path):
    local = DynamoDBLocal(tmp_path)
    yield local
    local.terminate()


async def test_two_servers_sharing_a_dynamodb_table_lose_nothing_when_one_is_killed(tmp_path, dynamodb):
    fired = tmp_path / "fired.jsonl"
    env = {"MLDSERVER_TEST_FIRED": str(fired), "AWS_ENDPOINT_URL_DYNAMODB": dynamodb.endpoint,
           "AWS_ACCESS_KEY_ID": AWS["aws_access_key_id"], "AWS_SECRET_ACCESS_KEY": AWS["aws_secret_access_key"],
           "AWS_DEFAULT_REGION": AWS["region_name"]}
    # A short execution_timeout: a dead server's claims expire 10 s after it (and small
    # batches, each far within it: a create is a DynamoDB Local round trip).
    flags = ("--workers", "2", "--timer-store", "dynamodb:shared-timers", "--execution-timeout", "5")
    servers = []
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        servers.append(ServerProcess(HANDLER, tmp_path / name, *flags, env=env))
    a, b = servers
    live: dict[str, int] = {}
    cancelled: set[str] = set()
    try:
        await asyncio.gather(drive(FakeDaemon(relay_command(a.port)), range(0, 2), live, cancelled, 20),
                             drive(FakeDaemon(relay_command(b.port)), range(2, 4), live, cancelled, 20))
        fired_by = lambda server: sum(1 for line in fired_lines(fired) if line["pid"] in children(server))  # noqa: E731
        await eventually(lambda: fired_by(a) >= 200, 180, what="server a firing", interval=0.2)
        a.proc.kill()  # with claims in flight
        a.proc.wait()
        await eventually(lambda: {line["ref"] for line in fired_lines(fired)} >= set(live), 300,
                         what="every live timer fired", interval=0.5)
        await eventually(lambda: dynamodb.client.scan(TableName="shared-timers", Select="COUNT",
                                                      ConsistentRead=True)["Count"] == 0, 120,
                         what="the table emptied", interval=0.5)
    finally:
        for server in servers:
            server.stop()
    lines = fired_lines(fired)
    duplicates = check(lines, live, cancelled, MAX_IN_FLIGHT)
    by_server = collections.Counter("a" if line["pid"] in children(a) else "b" for line in lines)
    print(f"fired by a (killed): {by_server['a']}, by b: {by_server['b']}, duplicates: {duplicates}")
    assert by_server["a"] and by_server["b"]  # both fired: the table is shared


def children(server: ServerProcess) -> set[int]:
    """The pids of the server's handler processes, from its log."""
    pids = set()
    for event in server.events():
        if event["event"] == "listening":
            pids.update(event.get("workers") or ())
        elif event["event"] == "handler_process_started":
            pids.add(event["pid"])
    return pids
