"""The pool tests' server (``pooled``: ``harness.running``'s arguments for a handler
in ``tests.pool_handlers``), a sink that keeps what it is given, and the fake daemon
driving many shards."""

from __future__ import annotations

import asyncio
import json

import orjson

from mldserver.base.handoff import Committed
from mldserver.api.testing import FakeDaemon, make_records

from ..helpers import FakeClock

T0 = 1476889707000


class MemorySink:
    """Keeps every committed row (decoded)."""

    def __init__(self) -> None:
        self.rows: list[dict] = []

    async def start(self) -> Committed:
        return Committed()

    async def commit(self, window) -> None:
        self.rows.extend(orjson.loads(r) for r in window.rows)


def pooled(handler: str, *, sink: bool = True, **overrides) -> dict:
    """``harness.running``'s arguments for ``tests.pool_handlers:HANDLER``: a
    ``MemorySink`` (unless ``sink=False``) and one-minute windows on a clock an hour past
    the records' time (``T0``); ``overrides`` are settings::

        async with running(tmp_path, **pooled("Emit", workers=1)) as (server, sink, daemon):
    """
    return {"handler": f"tests.pool_handlers:{handler}", "sink": MemorySink() if sink else None,
            "clock": FakeClock(T0 + 3_600_000), "window": 60.0, **overrides}


def events(caplog, name):
    return [r.fields for r in caplog.records if r.name.startswith("mldserver") and r.getMessage() == name]


def dead_letters(tmp_path, shard_id):
    path = tmp_path / "state" / "dead-letters" / f"{shard_id}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def batch(shard: int, n: int, first: int, poison: bool = False, at: int = T0):
    records = make_records(first, 5, partition_key=f"s{shard}-{n}-{{i}}", approximate_arrival_timestamp=at)
    if poison:
        records[2]["partitionKey"] = "poison"
    return records


async def drive(daemon: FakeDaemon, shards: int, batches: int, poisoned: dict[int, set[int]] | None = None,
                rtts: dict[int, list[float]] | None = None, last: bool = True):
    """``shards`` shards, all initialized first, then ``batches`` batches of 5 records
    each, concurrently; shard ``s``'s batch ``n`` is poisoned if ``n in poisoned[s]``.
    A last batch ten minutes later (sequence numbers 9xxx) closes every window before
    it (each batch has a window of its own; no shard is caught up, so a window closes
    once every shard is past it). Returns the shards."""
    poisoned = poisoned or {}
    loop = asyncio.get_running_loop()
    shards = await asyncio.gather(*(daemon.shard(f"shardId-{s:012d}") for s in range(shards)))

    async def one(s: int, shard):
        for n in range(batches):
            started = loop.time()
            await shard.process_records(batch(s, n, 1000 * (n + 1), n in poisoned.get(s, ()), at=T0 + n * 60_000),
                                        millis_behind_latest=1000)
            if rtts is not None:
                rtts.setdefault(s, []).append(loop.time() - started)

    await asyncio.gather(*(one(s, shard) for s, shard in enumerate(shards)))
    if not last:
        return shards
    await asyncio.gather(*(shard.process_records(batch(s, 99, 99_000, at=T0 + 600 * 60_000), millis_behind_latest=1000)
                           for s, shard in enumerate(shards)))
    return shards


def expected(shards: int, batches: int, skip: dict[int, set[int]] | None = None) -> set[tuple[str, str]]:
    """(shard id, sequence number) of every row ``drive`` should bring to the sink."""
    skip = skip or {}
    out = set()
    for s in range(shards):
        for n in range(batches):
            if n in skip.get(s, ()):
                continue
            out |= {(f"shardId-{s:012d}", str(1000 * (n + 1) + i)) for i in range(5)}
    return out


def seen(sink: MemorySink) -> set[tuple[str, str]]:
    return {(r["shard"], r["seq"]) for r in sink.rows}

