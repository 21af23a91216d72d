"""A source's lease against DynamoDB Local: the table made on first use, one holder at
a time (a second contender waits while the first renews), a released lease taken at
once, an unrenewed one taken over after its period with the positions last written,
a stolen one detected as lost (and its positions write refused), --reset-positions
refused while the lease is live."""

from __future__ import annotations

import asyncio
import itertools
import logging

import pytest

from mldserver.base.positions import Position
from mldserver.errors import ConfigError
from mldserver.sources.lease import LeaseLost, SourceLease
from mldserver.sources.positions import SHARD_END, SavedPositions

from ..harness import eventually

# Short for a test, long against DynamoDB Local's answers on a loaded machine: a holder
# that gets no answer within what is left of a period loses its lease, as it must (a
# CI run on two busy cores once took longer than the 0.4 s a 0.6 s period left).
PERIOD = 2.0
SOURCE = "dynamodb:orders"
_tables = itertools.count(1)


@pytest.fixture
async def leases(aws):
    """``leases(n)``: n contenders (servers) for one source's lease on a fresh table."""
    opened: list[SourceLease] = []
    table = f"leases-{next(_tables)}"

    async def open_(n: int, period: float = PERIOD) -> list[SourceLease]:
        out = [SourceLease(table, SOURCE, period_s=period) for _ in range(n)]
        for lease in out:
            await lease.__aenter__()
            opened.append(lease)
        return out

    open_.table = table  # type: ignore[attr-defined]
    yield open_
    for lease in opened:
        await lease.__aexit__(None, None, None)


def item(aws, table: str) -> dict:
    return aws.client.get_item(TableName=table, Key={"pk": {"S": SOURCE}}, ConsistentRead=True).get("Item") or {}


def counter(aws, table: str) -> int:
    return int(item(aws, table).get("counter", {}).get("N", 0))


class Kept:
    """A holder's renewals, as a server runs them (``keep`` in a task of its own)."""

    def __init__(self, lease: SourceLease) -> None:
        self.task = asyncio.create_task(lease.keep())

    async def stop(self) -> None:
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)


async def test_the_table_is_made_on_first_use_and_the_first_contender_holds_the_lease(aws, leases, caplog):
    caplog.set_level(logging.INFO, logger="mldserver")
    [a] = await leases(1)
    described = aws.client.describe_table(TableName=leases.table)["Table"]
    assert described["KeySchema"] == [{"AttributeName": "pk", "KeyType": "HASH"}]
    assert await a.acquire(asyncio.Event()) is None  # no positions yet
    assert a.state == "holding" and item(aws, leases.table)["owner"]["S"] == a.owner
    assert a.status() == {"table": leases.table, "lease": "holding", "holder": a.owner}
    [acquired] = [r.fields for r in caplog.records if r.getMessage() == "source_lease_acquired"]
    assert acquired["source"] == SOURCE and acquired["owner"] == a.owner

    kept = Kept(a)
    first = counter(aws, leases.table)
    await eventually(lambda: counter(aws, leases.table) >= first + 3, 30, what="three renewals")
    assert a.state == "holding"
    await kept.stop()


async def test_a_second_contender_waits_while_the_first_renews_and_takes_it_at_once_when_released(aws, leases, caplog):
    caplog.set_level(logging.INFO, logger="mldserver")
    a, b = await leases(2)
    await a.acquire(asyncio.Event())
    kept = Kept(a)
    waiting = asyncio.create_task(b.acquire(asyncio.Event()))
    first = counter(aws, leases.table)
    # four periods' worth of renewals: b, seeing the counter move, never takes it
    await eventually(lambda: counter(aws, leases.table) >= first + 12, 60, what="twelve renewals")
    assert not waiting.done() and b.state == "waiting" and b.status()["holder"] == a.owner
    [waited] = [r.fields for r in caplog.records if r.getMessage() == "source_lease_waiting"]
    assert waited["holder"] == a.owner

    await kept.stop()
    await a.release()
    assert a.state == "released" and "owner" not in item(aws, leases.table)
    await asyncio.wait_for(waiting, PERIOD)  # its next look (a third of a period) finds it free
    assert b.state == "holding" and item(aws, leases.table)["owner"]["S"] == b.owner
    assert "source_lease_released" in [r.getMessage() for r in caplog.records]


async def test_an_unrenewed_lease_is_taken_over_after_its_period_with_the_positions_last_written(aws, leases):
    a, b = await leases(2)
    await a.acquire(asyncio.Event())
    saved = SavedPositions.decode(SOURCE, None, write=a.write_positions)
    await saved.set_stream("arn:stream")
    await saved.store("shardId-1", Position.parse("000000000000000000017", 0))
    await saved.store("shardId-0", SHARD_END)
    # a dies: no renewal from here on
    loop = asyncio.get_running_loop()
    started = loop.time()
    data = await asyncio.wait_for(b.acquire(asyncio.Event()), 10 * PERIOD)
    took = loop.time() - started
    assert PERIOD <= took <= 2 * PERIOD, took  # one period unmoved, seen within a third of one
    resumed = SavedPositions.decode(SOURCE, data, write=b.write_positions)
    assert resumed.stream == "arn:stream"
    assert resumed.get("shardId-1") == Position.parse("000000000000000000017", 0) and resumed.ended("shardId-0")

    # a, back from its pause, finds the lease gone at its first write or renewal
    with pytest.raises(LeaseLost, match=b.owner):
        await saved.store("shardId-1", Position.parse("000000000000000000018", 0))
    assert a.state == "lost" and a.lost.is_set()
    assert SavedPositions.decode(SOURCE, (await b.read())["positions"]["S"].encode(),
                                 write=b.write_positions).get("shardId-1") == Position.parse("000000000000000000017", 0)


async def test_a_stolen_lease_is_detected_as_lost_at_the_next_renewal(aws, leases, caplog):
    caplog.set_level(logging.INFO, logger="mldserver")
    [a] = await leases(1)
    await a.acquire(asyncio.Event())
    kept = Kept(a)
    aws.client.update_item(TableName=leases.table, Key={"pk": {"S": SOURCE}},
                           UpdateExpression="SET #o = :thief", ExpressionAttributeNames={"#o": "owner"},
                           ExpressionAttributeValues={":thief": {"S": "thief:1:0"}})
    await asyncio.wait_for(kept.task, 2 * PERIOD)  # keep returns once it sees it lost
    assert a.state == "lost" and a.lost.is_set() and a.holder == "thief:1:0"
    [lost] = [r.fields for r in caplog.records if r.getMessage() == "source_lease_lost"]
    assert "thief:1:0" in lost["reason"] and lost["source"] == SOURCE
    with pytest.raises(LeaseLost):
        await a.write_positions(b'{"source": "dynamodb:orders", "stream": null, "shards": {}}')
    assert "positions" not in item(aws, leases.table)
    await a.release()  # nothing to let go: the thief's lease stays
    assert item(aws, leases.table)["owner"]["S"] == "thief:1:0"


async def test_of_two_standbys_one_takes_the_lease(aws, leases):
    a, b, c = await leases(3)
    await a.acquire(asyncio.Event())
    await a.release()
    stop = asyncio.Event()
    tasks = [asyncio.create_task(x.acquire(stop)) for x in (b, c)]
    done, pending = await asyncio.wait(tasks, timeout=5 * PERIOD, return_when=asyncio.FIRST_COMPLETED)
    assert len(done) == 1
    stop.set()  # the other stops waiting: LeaseLost
    [other] = pending
    with pytest.raises(LeaseLost):
        await other
    holders = [x for x in (b, c) if x.state == "holding"]
    assert len(holders) == 1 and item(aws, leases.table)["owner"]["S"] == holders[0].owner


async def test_reset_positions_is_refused_while_the_lease_is_live_and_done_once_released(aws, leases):
    a, b = await leases(2)
    await a.acquire(asyncio.Event())
    assert not await b.reset_positions()  # none to reset
    await a.write_positions(b'{"source": "dynamodb:orders", "stream": null, "shards": {}}')
    with pytest.raises(ConfigError, match=rf"read by {a.owner}.*stop that server first"):
        await b.reset_positions()
    await a.release()
    assert await b.reset_positions()
    assert "positions" not in item(aws, leases.table) and not await b.reset_positions()


async def test_a_table_keyed_otherwise_is_refused(aws):
    aws.client.create_table(TableName="not-leases", BillingMode="PAY_PER_REQUEST",
                            AttributeDefinitions=[{"AttributeName": "id", "AttributeType": "S"}],
                            KeySchema=[{"AttributeName": "id", "KeyType": "HASH"}])
    with pytest.raises(ConfigError, match="not-leases: not a lease table"):
        async with SourceLease("not-leases", SOURCE):
            pass
