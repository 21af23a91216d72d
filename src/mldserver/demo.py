"""``mldserver demo``: the server on an example handler, driven by the fake daemon.

No AWS account, no Java: the fake daemon launches one relay per shard exactly as the
MultiLangDaemon would, feeds each shard batches of records, splits one shard (the
parent ends with SHARD_END, its two children start at TRIM_HORIZON), and shuts every
shard down. The server logs to ``<dir>/server.log`` (JSON lines) and keeps its state
under ``<dir>/state``; the summary at the end says what happened and how fast.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from pathlib import Path

from .config import Settings
from .handler import Handler
from .logs import configure
from .server import Server
from .testing import SHARD_END, FakeDaemon, make_records, relay_command

BATCH = 1000


class CountingHandler(Handler):
    """Counts records and bytes per shard, checkpoints after every batch."""

    totals: Counter = Counter()
    sizes: Counter = Counter()

    async def initialize(self, shard):
        self.shard_id = shard.shard_id

    async def process_records(self, batch, checkpointer):
        self.totals[self.shard_id] += len(batch.records)
        self.sizes[self.shard_id] += sum(len(r.data) for r in batch.records)
        if batch.records:
            last = batch.records[-1]
            await checkpointer.checkpoint(last.sequence_number, last.sub_sequence_number)


async def _drive(shard, first: int, count: int) -> None:
    for start in range(0, count, BATCH):
        n = min(BATCH, count - start)
        await shard.process_records(make_records(first + start, n, 100), millis_behind_latest=count - start - n)


async def run(shards: int, records: int, directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    configure("json", "info", str(directory / "server.log"))
    settings = Settings(handler="mldserver.demo:CountingHandler", port=0, state_dir=str(directory / "state"))
    CountingHandler.totals.clear()
    CountingHandler.sizes.clear()
    server = Server(settings, CountingHandler)
    await server.start()
    host, port = server.address
    print(f"server listening on {host}:{port}; relay: mldserver connect {host}:{port}")
    daemon = FakeDaemon(relay_command(host, port))
    per_shard = records // (shards + 1)  # the split's two children share one shard's part
    started = time.perf_counter()
    ids = [f"shardId-{i:012d}" for i in range(shards)]
    conversations = await asyncio.gather(*(daemon.shard(i) for i in ids))
    await asyncio.gather(*(_drive(s, 10**20 * (n + 1), per_shard) for n, s in enumerate(conversations)))
    print(f"{shards} shards: {per_shard * shards:,} records processed")

    parent = conversations[0]
    await parent.shard_ended()
    print(f"split {parent.shard_id}: checkpoint {daemon.checkpoints[parent.shard_id]}")
    children = await asyncio.gather(*(daemon.shard(f"shardId-{shards + i:012d}") for i in range(2)))
    half = (records - per_shard * shards) // 2
    await asyncio.gather(*(_drive(c, 10**20 * (shards + 2 + i), half) for i, c in enumerate(children)))
    print(f"children {', '.join(c.shard_id for c in children)}: {2 * half:,} records processed")

    live = conversations[1:] + list(children)
    await asyncio.gather(*(s.shutdown_requested() for s in live))
    await asyncio.gather(*(s.lease_lost() for s in live))
    await asyncio.gather(*(s.close() for s in [parent, *live]))
    elapsed = time.perf_counter() - started
    await server.shutdown()

    total = sum(CountingHandler.totals.values())
    print()
    print("summary")
    print(f"  records in          {total:,} over {len(CountingHandler.totals)} shards "
          f"({sum(CountingHandler.sizes.values()) / 1e6:.1f} MB)")
    print(f"  throughput          {total / elapsed:,.0f} records/s ({elapsed:.2f} s, through the relay)")
    print(f"  shard end           {parent.shard_id} -> {daemon.checkpoints[parent.shard_id]}")
    stored = sum(1 for v in daemon.checkpoints.values() if v != SHARD_END)
    print(f"  checkpoints stored  {stored} shards at their last record, 1 at SHARD_END")
    print(f"  server log          {directory / 'server.log'}")
    print(f"  state directory     {directory / 'state'}")


def main(args) -> None:
    import uvloop

    uvloop.run(run(args.shards, args.records, Path(args.dir)))
