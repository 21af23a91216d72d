"""The shared store against DynamoDB Local (started here, on loopback): the table made
on first use, what each write leaves, claims that exclude each other and expire, a
finish that a take-over or a replacement wins, and two schedulers sharing one table
with a fake clock: every timer fired once, a dead server's claims taken over."""

from __future__ import annotations

import asyncio
import itertools
import json

import pytest

from mldserver.base.backoff import Backoff
from mldserver.timers.dynamodb import DynamoStore
from mldserver.timers.firing import OK
from mldserver.timers.scheduler import Scheduler
from mldserver.timers.store import Timer

from ..harness import eventually
from ..helpers import FakeClock
from .test_scheduler import Recording

T0 = 1_763_719_200_000
CB = "tests.timer_handlers:fired"
_tables = itertools.count(1)




@pytest.fixture
async def stores(aws):
    """``stores(n)``: n stores (servers) on one fresh table, sharing a fake clock."""
    made = []
    clock = FakeClock(T0)

    async def open_(n: int, claim_ms: int = 10_000) -> list[DynamoStore]:
        table = f"timers-{next(_tables)}"
        out = []
        for _ in range(n):
            store = DynamoStore(table, claim_ms=claim_ms, clock=clock)
            await store.open()
            out.append(store)
        made.extend(out)
        return out

    open_.clock = clock
    yield open_
    for store in made:
        await store.close()


def t(ref: str, due: int, version: int = 1, **context) -> Timer:
    return Timer(CB, ref, due, json.dumps(context or {"ref": ref}).encode(), version)


async def test_the_table_is_made_on_first_use_and_keeps_what_is_put(stores, aws):
    [store] = await stores(1)
    await store.put([t("a", T0 + 10, version=1), t("b", T0 + 5), t("a", T0 + 20, version=2)])
    item = aws.client.get_item(TableName=store.table, Key={"pk": {"S": f"{CB}\na"}}, ConsistentRead=True)["Item"]
    assert (item["due_ms"]["N"], item["version"]["N"], item["reference"]["S"]) == (str(T0 + 20), "2", "a")
    assert [x.reference for x in await store.due(T0 + 100, 10)] == ["b", "a"]
    assert [x.reference for x in await store.due(T0 + 10, 10)] == ["b"]
    assert await store.delete(CB, "a") is True and await store.delete(CB, "a") is False
    again = DynamoStore(store.table)  # a second server on the same table: found, not made again
    await again.open()
    await again.close()


async def test_a_write_leaves_what_its_creates_and_cancels_in_order_leave(stores):
    [store] = await stores(1)
    await store.put([t("old", T0 + 1), t("kept", T0 + 2)])
    found = await store.write([t("a", T0 + 5), (CB, "a"),                      # created and cancelled
                               (CB, "old"), t("old", T0 + 9, version=2),       # cancelled, then created again
                               (CB, "never"), t("b", T0 + 6)])
    assert found == [True, True, False]
    assert [(x.reference, x.version) for x in await store.due(T0 + 100, 10)] == [
        ("kept", 1), ("b", 1), ("old", 2)]


async def test_a_table_of_another_shape_is_refused(stores, aws):
    aws.client.create_table(TableName="not-timers", BillingMode="PAY_PER_REQUEST",
                            AttributeDefinitions=[{"AttributeName": "id", "AttributeType": "S"}],
                            KeySchema=[{"AttributeName": "id", "KeyType": "HASH"}])
    store = DynamoStore("not-timers")
    with pytest.raises(ValueError, match="not a timer table"):
        await store.open()


async def test_one_claim_at_a_time_until_it_expires(stores):
    a, b = await stores(2, claim_ms=10_000)
    await a.put([t("x", T0)])
    [due] = await a.due(T0, 10)
    assert await a.claim([due], T0) == [due]
    assert await b.claim([due], T0 + 9_999) == []  # a's claim holds
    assert await b.claim([due], T0 + 10_001) == [due]  # a died: expired, taken over
    await a.finish([due], [], [])  # a comes back late: the take-over wins
    assert [x.reference for x in await b.due(T0 + 100_000, 10)] == ["x"]
    await b.finish([due], [], [])
    assert await b.due(T0 + 100_000, 10) == []


async def test_claimed_timers_are_not_read_by_the_others_while_the_claim_lives(stores):
    a, b = await stores(2)
    stores.clock.now = T0
    await a.put([t("x", T0), t("y", T0)])
    await a.claim([t("x", T0)], T0)
    assert [x.reference for x in await b.due(T0, 10)] == ["y"]
    stores.clock.now = T0 + 10_001
    assert [x.reference for x in await b.due(T0 + 10_001, 10)] == ["x", "y"]


async def test_a_replacement_made_while_firing_survives_the_finish(stores):
    [a] = await stores(1)
    await a.put([t("x", T0, version=1)])
    [fired] = await a.claim([t("x", T0, version=1)], T0)
    await a.put([t("x", T0 + 50, version=2, v=2)])  # replaced while its call runs
    assert await a.claim([t("x", T0, version=1)], T0) == []  # the old version is not there any more
    await a.finish([fired], [], [])
    [left] = await a.due(T0 + 100, 10)
    assert (left.version, json.loads(left.context)) == (2, {"v": 2})


async def test_retry_and_release_hand_the_claim_back(stores):
    a, b = await stores(2)
    await a.put([t("r", T0), t("l", T0)])
    claimed = await a.claim([t("r", T0), t("l", T0)], T0)
    await a.finish([], [claimed[0]._replace(due_ms=T0 + 500, attempts=1)], [claimed[1]])
    rows = {x.reference: x for x in await b.due(T0 + 1000, 10)}
    assert (rows["r"].due_ms, rows["r"].attempts, rows["l"].due_ms) == (T0 + 500, 1, T0)
    assert len(await b.claim(list(rows.values()), T0 + 1000)) == 2  # no claim left on either


async def test_two_schedulers_sharing_a_table_fire_each_timer_once(stores):
    clock = stores.clock
    firings = [Recording(), Recording()]
    a_store, b_store = await stores(2)
    a, b = (Scheduler(store, firing, attempts=3, backoff=Backoff(first=1.0, cap=1.0), context_size=1024, clock=clock)
            for store, firing in zip((a_store, b_store), firings))
    await asyncio.gather(*(a.create(t(f"r{i:03}", T0 + i)) for i in range(0, 200, 2)),
                         *(b.create(t(f"r{i:03}", T0 + i)) for i in range(1, 200, 2)))
    clock.advance(1_000)
    for _ in range(3):
        await asyncio.gather(a.step(), b.step())
        await asyncio.gather(a.drain(), b.drain())
    fired = [x.reference for f in firings for x in f.fired]
    assert sorted(fired) == [f"r{i:03}" for i in range(200)]  # each once, between them
    assert await a_store.due(clock.now + 10**6, 1000) == []


async def test_a_dead_schedulers_claims_are_taken_over(stores):
    clock = stores.clock
    dead, alive = Recording(), Recording()
    dead.gate = asyncio.Event()  # its calls never end: the server died under them
    a_store, b_store = await stores(2, claim_ms=30_000)
    a = Scheduler(a_store, dead, attempts=3, backoff=Backoff(), context_size=1024, clock=clock)
    b = Scheduler(b_store, alive, attempts=3, backoff=Backoff(), context_size=1024, clock=clock)
    await a.create_many([t(f"r{i}", T0) for i in range(20)])
    await a.step()  # a claims and "fires" all 20, then dies
    assert len(a.due.in_flight) == 20
    # its claims are conditional writes made by the firing tasks: b reads only once they hold
    await eventually(lambda: dead.waiting == 20, 30, what="a's 20 claims made and its calls started")
    await b.step()
    await b.drain()
    assert alive.fired == []  # a's claims live
    clock.advance(30_001)
    b.due.polled = -10**12  # read the table again now
    await b.step()
    await b.drain()
    assert sorted(x.reference for x in alive.fired) == sorted(f"r{i}" for i in range(20))
    assert await b_store.due(clock.now + 10**6, 100) == []
    dead.gate.set()  # a was only stalled: its calls end late, its finish changes nothing
    await a.drain()
    assert await b_store.due(clock.now + 10**6, 100) == [] and b.stats.success == 20
