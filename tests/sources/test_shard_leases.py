"""Shard leases against DynamoDB Local: a lone server takes every shard, a second one
steals its share one a cycle, a stolen lease is lost at the next renewal and its
position write refused, a dead server's leases are taken after a period, a released
one at once; children are leased only once their parents are read to their end; the
old per-source item's positions are taken as starting points once; --reset-positions
is refused while a lease is live; `mldserver positions --lease-table` reads the items."""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os
import subprocess

import pytest

from mldserver.base.positions import Position
from mldserver.errors import ConfigError
from mldserver.sources.positions import SHARD_END
from mldserver.sources.service import ListedShard
from mldserver.sources.shard_leases import LeaseNotHeld, ShardLeases

from ..harness import MLDSERVER, ROOT, eventually

PERIOD = 2.0
SOURCE = "kinesis:clicks"
ARN = "arn:aws:kinesis:us-east-1:000000000000:stream/clicks"
SHARDS = [ListedShard(f"shardId-00000000000{i}", (), False) for i in range(4)]
_tables = itertools.count(1)


@pytest.fixture
async def servers(aws):
    """``servers(n)``: n servers' leases of one source on a fresh table, bound and offered SHARDS."""
    opened: list[ShardLeases] = []
    table = f"shard-leases-{next(_tables)}"

    async def open_(n: int, shards=SHARDS, period_s: float = PERIOD) -> list[ShardLeases]:
        out = []
        for _ in range(n):
            lost: list[str] = []
            leases = ShardLeases(table, SOURCE, period_s=period_s, on_lost=lost.append)
            leases.lost = lost  # type: ignore[attr-defined]
            await leases.__aenter__()
            await leases.bind(ARN, None)
            leases.offer(shards)
            opened.append(leases)
            out.append(leases)
        return out

    open_.table = table  # type: ignore[attr-defined]
    yield open_
    for leases in opened:
        await leases.__aexit__(None, None, None)


def item(aws, table: str, shard_id: str) -> dict:
    return aws.client.get_item(TableName=table, Key={"pk": {"S": f"{SOURCE}/{shard_id}"}},
                               ConsistentRead=True).get("Item") or {}


async def test_a_second_server_steals_its_share_one_a_cycle_and_the_loser_stops(aws, servers, caplog):
    caplog.set_level(logging.INFO, logger="mldserver")
    [a] = await servers(1)
    await a.cycle()
    assert sorted(a.held) == [s.shard_id for s in SHARDS]
    first = item(aws, servers.table, "shardId-000000000000")
    assert first["leaseOwner"]["S"] == a.owner and first["leaseKey"]["S"] == "shardId-000000000000"
    assert first["source"]["S"] == SOURCE and first["stream"]["S"] == ARN
    assert int(first["leaseCounter"]["N"]) == 1 and first["ownerSwitchesSinceCheckpoint"]["N"] == "1"
    await a.store("shardId-000000000003", Position.parse("000000000000000000017", 2))

    [b] = await servers(1)
    await b.cycle()
    assert sorted(b.held) == ["shardId-000000000003"]  # one a cycle, the far end first
    assert b.get("shardId-000000000003") == Position.parse("000000000000000000017", 2)
    taken = [r.fields for r in caplog.records if r.getMessage() == "source_shard_lease_taken"][-1]
    assert taken["stolen"] == ["shardId-000000000003"] and taken["was"] == [a.owner]
    with pytest.raises(LeaseNotHeld):  # a's position write after the steal: refused
        await a.store("shardId-000000000003", Position.parse("000000000000000000018", 0))
    assert a.lost == ["shardId-000000000003"]
    await a.cycle()
    await b.cycle()
    assert sorted(b.held) == ["shardId-000000000002", "shardId-000000000003"] and b.servers == 2
    await a.cycle()
    assert sorted(a.held) == ["shardId-000000000000", "shardId-000000000001"]
    assert a.lost == ["shardId-000000000003", "shardId-000000000002"]  # seen at its renewal
    for leases in (a, b, a, b):  # settled
        await leases.cycle()
    assert len(a.held) == len(b.held) == 2
    assert item(aws, servers.table, "shardId-000000000003")["checkpoint"]["S"] == "000000000000000000017"
    assert a.status() == {"table": servers.table, "owner": a.owner, "held": sorted(a.held), "shards": 4,
                          "servers": 2}


async def test_a_dead_servers_leases_are_taken_after_a_period_and_released_ones_at_once(aws, servers):
    a, b = await servers(2)
    for leases in (a, b, a, b, a):
        await leases.cycle()
    assert len(a.held) == len(b.held) == 2
    loop = asyncio.get_running_loop()
    started = loop.time()  # a dies: no renewal from here on
    stop = asyncio.Event()
    running = asyncio.create_task(b.run(stop))
    await eventually(lambda: len(b.held) == 4, 10 * PERIOD, what="b holding all four")
    assert loop.time() - started >= PERIOD  # not before a's leases expired (how long after: the machine's load)
    stop.set()
    await running

    c, = await servers(1)
    await b.release_all()
    assert not b.held and "leaseOwner" not in item(aws, servers.table, "shardId-000000000000")
    await c.cycle()
    assert len(c.held) == 4  # released: free at once, the only live server


async def test_children_are_leased_only_once_their_parents_are_read_to_their_end(aws, servers):
    parent = ListedShard("shardId-000000000000", (), True)
    children = [ListedShard("shardId-000000000001", (parent.shard_id,), False),
                ListedShard("shardId-000000000002", (parent.shard_id,), False)]
    a, b = await servers(2, shards=[parent, *children])
    await a.cycle()
    await b.cycle()
    assert sorted(a.held) == [parent.shard_id] and not b.held
    assert item(aws, servers.table, children[0].shard_id)["parentShardId"]["SS"] == [parent.shard_id]
    await a.store(parent.shard_id, SHARD_END)  # the lease let go with it
    assert not a.held and "leaseOwner" not in item(aws, servers.table, parent.shard_id)
    await b.cycle()
    assert b.ended(parent.shard_id) and len(b.held) == 2  # b alone is live: both children
    await a.cycle()
    await b.cycle()
    await a.cycle()
    assert len(a.held) == len(b.held) == 1


async def test_the_old_per_source_items_positions_are_the_shards_starting_points(aws, servers):
    [probe] = await servers(1, shards=[])  # makes the table
    doc = {"source": SOURCE, "stream": ARN,
           "shards": {"shardId-000000000000": "SHARD_END", "shardId-000000000001": ["000000000000000000042", 0]}}
    aws.client.put_item(TableName=servers.table, Item={"pk": {"S": SOURCE}, "counter": {"N": "3"},
                                                       "positions": {"S": json.dumps(doc)}})
    [a] = await servers(1)
    await a.cycle()
    assert a.ended("shardId-000000000000") and a.get("shardId-000000000001") == Position.parse("000000000000000000042")
    assert sorted(a.held) == ["shardId-000000000001", "shardId-000000000002", "shardId-000000000003"]


async def test_reset_positions_is_refused_while_a_lease_is_live(aws, servers):
    # (a lease that stays live through the test: with PERIOD's 2 s, a loaded machine once
    # let it expire, nothing renewing it here, before the reset looked)
    [a] = await servers(1, period_s=600)
    await a.cycle()
    await a.store("shardId-000000000001", Position.parse("000000000000000000017"))
    async with ShardLeases(servers.table, SOURCE) as other:
        with pytest.raises(ConfigError, match=r"stop those servers first"):
            await other.reset_positions()
    await a.release_all()
    async with ShardLeases(servers.table, SOURCE) as other:
        assert await other.reset_positions()
        assert not await other.reset_positions()
    assert "checkpoint" not in item(aws, servers.table, "shardId-000000000001")


async def test_mldserver_positions_reads_the_lease_table(aws, servers):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}

    [a] = await servers(1)
    await a.cycle()
    await a.store("shardId-000000000001", Position.parse("000000000000000000017", 2))
    await a.store("shardId-000000000000", SHARD_END)
    args = [MLDSERVER, "positions", "--source", SOURCE, "--lease-table", servers.table]
    done = await asyncio.to_thread(subprocess.run, args, capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        f"{SOURCE}  stream {ARN}  (lease table {servers.table})",
        "  shardId-000000000000  SHARD_END (read to its end)",
        f"  shardId-000000000001  after 000000000000000000017 sub 2  (leased by {a.owner})",
        f"  shardId-000000000002  (no position yet)  (leased by {a.owner})",
        f"  shardId-000000000003  (no position yet)  (leased by {a.owner})"]
    done = await asyncio.to_thread(subprocess.run, [*args, "--json"], capture_output=True, text=True, timeout=60,
                                   env=env)
    doc = json.loads(done.stdout)
    assert doc["shards"]["shardId-000000000001"] == ["000000000000000000017", 2]
    assert doc["owners"]["shardId-000000000000"] is None and doc["table"] == servers.table
    other = await asyncio.to_thread(subprocess.run, [MLDSERVER, "positions", "--source", "kinesis:nothing",
                                                     "--lease-table", servers.table],
                                    capture_output=True, text=True, timeout=60, env=env)
    assert other.returncode == 1 and "no shard lease of kinesis:nothing" in other.stderr


async def test_the_items_of_shards_gone_from_the_stream_are_deleted_unless_another_server_holds_one(aws, servers):
    a, b = await servers(2)
    for leases in (a, b, a):
        await leases.cycle()
    mine, theirs = sorted(a.held)[0], sorted(b.held)[0]
    await a.store(mine, Position.parse("000000000000000000017"))
    await b.store(theirs, Position.parse("000000000000000000018"))
    await a.forget([mine, theirs])
    assert item(aws, servers.table, mine) == {} and mine not in a.held
    assert item(aws, servers.table, theirs)["leaseOwner"]["S"] == b.owner
