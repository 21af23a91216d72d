"""Timers across a SIGKILL of the server (the real CLI, handler processes): 10,000
timers created across 4 shards, some replaced and some cancelled in the call that
created them; the server is killed while they fire and started again on the same
state dir. Every live timer fires at least once, with its latest context, never
before its time; no cancelled timer fires; the timers fired twice are counted and
are no more than could be in flight at the kill (``scheduler.MAX_IN_FLIGHT``)."""

from __future__ import annotations

import asyncio
import collections
import urllib.request

from mldserver.testing import FakeDaemon
from mldserver.timers.scheduler import MAX_IN_FLIGHT

from ..conftest import ServerProcess, relay_command
from ..helpers import eventually
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


async def test_timers_fire_at_least_once_across_a_sigkill_while_firing(tmp_path):
    fired = tmp_path / "fired.jsonl"
    env = {"MLDSERVER_TEST_FIRED": str(fired)}
    server = ServerProcess(HANDLER, tmp_path, "--workers", "2", env=env)
    daemon = FakeDaemon(relay_command(server.port))
    live: dict[str, int] = {}
    cancelled: set[str] = set()

    async def drive(s: int) -> None:
        ops, shard_live, shard_cancelled = script(s)
        live.update(shard_live)
        cancelled.update(shard_cancelled)
        shard = await daemon.shard(f"shardId-{s:012d}")
        for first in range(0, PER_SHARD, PER_BATCH):
            await shard.process_records(records(first + 1, ops[first : first + PER_BATCH]))
        await shard.lease_lost()
        assert await shard.close() == 0

    await asyncio.gather(*(drive(s) for s in range(SHARDS)))
    assert all(daemon.checkpoints[f"shardId-{s:012d}"] == (str(PER_SHARD), 0) for s in range(SHARDS))
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
    fires = collections.Counter(line["ref"] for line in lines)
    assert not set(fires) & cancelled, "a cancelled timer fired"
    assert set(fires) == set(live)
    latest = {line["ref"]: line["v"] for line in lines}
    assert latest == live, "a timer fired with a context it no longer had"
    assert all(line["v"] == live[line["ref"]] for line in lines)  # a replaced one never fired with v1
    assert all(line["fired_at"] >= line["at"] for line in lines), "a timer fired before its time"
    duplicates = sum(fires.values()) - len(fires)
    print(f"fired before the kill: {len(before)}, after: {len(lines) - len(before)}, duplicates: {duplicates}")
    assert duplicates <= MAX_IN_FLIGHT
    assert {line["ref"] for line in lines[len(before):]} & {line["ref"] for line in before} == {
        ref for ref, n in fires.items() if n > 1}  # a duplicate is one fired before the kill and again after
