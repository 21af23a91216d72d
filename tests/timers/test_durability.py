"""Timers across a SIGKILL of the server (the real CLI, handler processes): 10,000
timers created across 4 shards, some replaced and some cancelled in the call that
created them; the server is killed while they fire and started again on the same
state dir. Every live timer fires at least once, with its latest context, never
before its time; a cancelled or replaced one fires (with its old context) only if it
fell due before its cancel or replacement was committed (firing is at least once: a
slow batch, or one timed out and redone, commits them seconds after the create);
the timers fired twice are counted and are no more than could be in flight at the
kill (``scheduler.MAX_IN_FLIGHT``). The handler records each create and cancel as it
asks it and once it returned (committed); what is expected follows from those: a
record the server gave up on (dead-lettered: every attempt ran past
``execution_timeout`` under load) holds what its calls that returned say.

Then the same with the DynamoDB store (DynamoDB Local, started here) and two servers
sharing its table, two shards each: one is killed while they fire, the other fires
everything, the dead one's claims once they expire."""

from __future__ import annotations

import asyncio
import base64
import collections
import json
import urllib.request
from pathlib import Path

import pytest

from mldserver.api.testing import FakeDaemon
from mldserver.timers.scheduler import MAX_IN_FLIGHT

from ..harness import ServerProcess, eventually, relay_command
from ..integration.components import AWS, DynamoDBLocal
from .serving import HANDLER, call_lines, fired_lines, records

pytestmark = pytest.mark.slow  # 10,000 timers, servers SIGKILLed and restarted, a DynamoDB Local: minutes

SHARDS, PER_SHARD, PER_BATCH = 4, 2_500, 250

Version = tuple[str, int, float]  # what one create stored: its reference, "v" and due time (epoch seconds)


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


def version(context: dict) -> Version:
    return context["ref"], context["v"], context["at"]


def history(calls: list[dict]) -> dict[str, list[dict]]:
    """Each reference's creates and cancels in the order they were asked, each
    ``{"call", "context", "asked", "returned"}`` (``returned`` None: cut short, maybe
    committed)."""
    asked: dict[tuple[str, float], dict] = {}
    by_ref: dict[str, list[dict]] = collections.defaultdict(list)
    for line in calls:
        key = (line["ref"], line["asked"])
        if "returned" in line:
            asked[key]["returned"] = line["returned"]
        else:
            entry = asked[key] = {"call": line["call"], "context": line.get("context"), "asked": line["asked"],
                                  "returned": None}
            by_ref[line["ref"]].append(entry)
    return by_ref


def stored_until(by_ref: dict[str, list[dict]]) -> dict[Version, float | None]:
    """Every version created, and when the call that replaced or cancelled it had
    certainly been committed (the next call on its reference that returned; None: it
    is the live one). A version may fire only if it fell due before that: once the
    store has committed the change, no server claims (DynamoDB) or holds (SQLite) it."""
    until: dict[Version, float | None] = {}
    for ops in by_ref.values():
        for i, op in enumerate(ops):
            if op["call"] == "create":
                later = [o["returned"] for o in ops[i + 1 :] if o["returned"] is not None]
                until[version(op["context"])] = later[0] if later else None
    return until


def must_fire(by_ref: dict[str, list[dict]]) -> set[Version]:
    """The live timers: each reference whose last call is a create that returned (one
    cut short promised nothing, and may have replaced or cancelled the one before)."""
    return {version(ops[-1]["context"]) for ops in by_ref.values()
            if ops[-1]["call"] == "create" and ops[-1]["returned"] is not None}


def all_fired(fired: Path, versions: set[Version]) -> bool:
    return versions <= {version(line) for line in fired_lines(fired)}


def given_up(*servers: ServerProcess) -> set[str]:
    """The references of the records the servers dead-lettered (every attempt failed)."""
    refs = set()
    for server in servers:
        for path in (server.state_dir / "dead-letters").glob("shardId-*.jsonl"):
            for line in path.read_text().splitlines():
                refs.update(op[1] for op in json.loads(base64.b64decode(json.loads(line)["data"])))
    return refs


def check(lines: list[dict], calls: list[dict], live: dict[str, int], cancelled: set[str], dropped: set[str],
          in_flight: int) -> tuple[int, str]:
    """What at least once means here; the number of duplicates (a version fired more
    than once), and what fired of the cancelled and replaced versions. ``dropped``:
    the references of dead-lettered records, which end as their calls did, not as the
    script says."""
    by_ref = history(calls)
    assert set(by_ref) - dropped == (set(live) | cancelled) - dropped
    last = {ref: ops[-1] for ref, ops in by_ref.items() if ref not in dropped}
    assert all(op["returned"] is not None for op in last.values()), "a call of a record checkpointed never returned"
    assert {ref for ref, op in last.items() if op["call"] == "cancel"} == cancelled - dropped
    assert {ref: op["context"]["v"] for ref, op in last.items() if op["call"] == "create"} == {
        ref: v for ref, v in live.items() if ref not in dropped}
    until = stored_until(by_ref)
    fires = collections.Counter(version(line) for line in lines)
    assert set(fires) <= set(until), "a timer fired with a context no create stored"
    assert must_fire(by_ref) <= set(fires), "a live timer never fired with its latest context"
    assert all(line["fired_at"] >= line["at"] for line in lines), "a timer fired before its time"
    # A cancelled or replaced version fires only if it fell due before the change was
    # committed (its call returned): claimed (or taken from memory) before the commit, its
    # callback may still run after it ("a timer firing now may still finish its call"),
    # so it is the due time that is compared, not the time the callback ran.
    old = [line for line in lines if until[version(line)] is not None]
    late = [line for line in old if line["at"] >= until[version(line)]]
    late_cancelled = [line for line in late if line["ref"] in cancelled]
    assert not late_cancelled, f"a cancelled timer fired, due after its cancel was committed: {late_cancelled[:3]}"
    assert not late, f"a replaced timer fired with its old context, due after its replacement was committed: {late[:3]}"
    duplicates = sum(fires.values()) - len(fires)
    assert duplicates <= in_flight
    in_flight_then = sum(1 for line in old if line["fired_at"] > until[version(line)])
    margin = min((until[version(line)] - line["at"] for line in old), default=None)
    early = (f"old versions fired: {len(old)} ({sum(1 for line in old if line['ref'] in cancelled)} cancelled, "
             f"{in_flight_then} called after the change returned), least margin before the change: {margin}; "
             f"records dead-lettered: {len(dropped)}")
    return duplicates, early


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

    calls = call_lines(fired)
    wanted = must_fire(history(calls))
    again = ServerProcess(HANDLER, tmp_path, "--workers", "2", env=env)
    try:
        await eventually(lambda: all_fired(fired, wanted), 180, what="every live timer fired", interval=0.2)
        await eventually(lambda: metric(again, "mldserver_pending_timers") == 0, 60, what="the store emptied")
    finally:
        assert again.stop() == 0
    lines = fired_lines(fired)
    duplicates, early = check(lines, calls, live, cancelled, given_up(server), MAX_IN_FLIGHT)
    print(f"fired before the kill: {len(before)}, after: {len(lines) - len(before)}, duplicates: {duplicates}; "
          f"{early}; {redone(server)}")
    fires = collections.Counter(version(line) for line in lines)
    assert {version(line) for line in lines[len(before):]} & {version(line) for line in before} == {
        v for v, n in fires.items() if n > 1}  # a duplicate is one fired before the kill and again after


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
        calls = call_lines(fired)
        wanted = must_fire(history(calls))
        await eventually(lambda: all_fired(fired, wanted), 300, what="every live timer fired", interval=0.5)
        await eventually(lambda: dynamodb.client.scan(TableName="shared-timers", Select="COUNT",
                                                      ConsistentRead=True)["Count"] == 0, 120,
                         what="the table emptied", interval=0.5)
    finally:
        for server in servers:
            server.stop()
    lines = fired_lines(fired)
    duplicates, early = check(lines, calls, live, cancelled, given_up(a, b), MAX_IN_FLIGHT)
    by_server = collections.Counter("a" if line["pid"] in children(a) else "b" for line in lines)
    print(f"fired by a (killed): {by_server['a']}, by b: {by_server['b']}, duplicates: {duplicates}; {early}; "
          f"a: {redone(a)}; b: {redone(b)}")
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


def redone(server: ServerProcess) -> str:
    """The handler calls that timed out or failed (their batch redone), from its log."""
    events = collections.Counter(event["event"] for event in server.events())
    return ", ".join(f"{name} {events[name]}" for name in ("handler_timed_out", "handler_failed", "handler_redone"))
