"""``mldserver bench --part changes``: what a ``ChangeHandler`` costs against a batch
``Handler`` doing the same decoding by hand, on the same DynamoDB stream records.

Both run in a server of their own (its own process, ``--workers`` as given, no sink),
fed over direct TCP by the fake daemon in lock-step (one batch, then its status), the
two servers taking turns for seven rounds (a shared machine's load falls on both),
batches of 1,000 changes of an orders table as the KCL's DynamoDB Streams adapter
delivers them (``NEW_AND_OLD_IMAGES``: 3 in 10 INSERT, 6 MODIFY, 1 REMOVE; an item of
8 attributes with decimals, a string set and a list of maps). Per record, both:

- ``by hand``: ``orjson.loads(record.data)``, check ``eventSource`` and ``eventName``,
  ``dynamodb_json.decode_item`` of the new image, add up ``amount`` and the lines;
- ``ChangeHandler``: ``on_update(doc, meta)`` / ``on_delete(meta)`` doing the same sums.

Reported: records/s of the median round (the ChangeHandler's as a ratio of by hand's;
the aim is at least 0.8x) and the CPU the server and its handler processes used per
record over all rounds (steadier than records/s where other work shares the cores).
"""

from __future__ import annotations

import asyncio
import base64
import os
import statistics
import time

import orjson

from ...api.changes import ChangeHandler
from ...api.dynamodb_json import decode_item
from ...api.handler import Handler
from ...api.testing import Shard
from .common import close_shards, cpu_s, descendants, open_shards, start_server

RECORDS = 1_000  # changes per batch
BY_HAND = "mldserver.ops.bench.changes:ByHand"
CHANGES = "mldserver.ops.bench.changes:Changes"


class ByHand(Handler):
    """A batch handler decoding the adapter's records itself."""

    total = 0
    lines = 0
    deletes = 0

    async def process_records(self, batch, checkpointer):
        for record in batch.records:
            change = orjson.loads(record.data)
            if change.get("eventSource") != "aws:dynamodb" or type(change.get("dynamodb")) is not dict:
                continue
            name = change.get("eventName")
            if name == "INSERT" or name == "MODIFY":
                image = change["dynamodb"].get("NewImage")
                doc = decode_item(image, "NewImage") if image else None
                if doc is not None:
                    self.total += doc["amount"]
                    self.lines += len(doc["lines"])
            elif name == "REMOVE":
                self.deletes += 1


class Changes(ChangeHandler):
    """The same sums, one callback per record."""

    total = 0
    lines = 0
    deletes = 0

    async def on_update(self, doc, meta):
        self.total += doc["amount"]
        self.lines += len(doc["lines"])

    async def on_delete(self, meta):
        self.deletes += 1


def change(i: int, created_ms: int) -> dict:
    name = "REMOVE" if i % 10 == 9 else ("INSERT" if i % 10 < 3 else "MODIFY")
    key = {"order_id": {"S": f"o-{i:08d}"}}
    image = {
        "order_id": {"S": f"o-{i:08d}"},
        "customer": {"S": f"c-{i % 977}"},
        "amount": {"N": f"{(i * 37) % 100_000 / 100:.2f}"},
        "qty": {"N": str(i % 7 + 1)},
        "status": {"S": "paid" if i % 2 else "open"},
        "tags": {"SS": ["web", "gift"] if i % 3 else ["app"]},
        "updated": {"N": str(created_ms)},
        "lines": {"L": [{"M": {"sku": {"S": f"sku-{j}"}, "price": {"N": f"{j + 0.99:.2f}"}, "n": {"N": "1"}}}
                        for j in range(i % 3 + 1)]},
    }
    stream: dict = {"ApproximateCreationDateTime": created_ms, "Keys": key, "SequenceNumber": f"{10**20 + i:021d}",
                    "SizeBytes": 300, "StreamViewType": "NEW_AND_OLD_IMAGES"}
    if name != "REMOVE":
        stream["NewImage"] = image
    if name != "INSERT":
        stream["OldImage"] = dict(image, status={"S": "open"})
    return {"awsRegion": "us-east-1", "dynamodb": stream, "eventID": f"{i:032x}", "eventName": name,
            "eventSource": "aws:dynamodb", "eventVersion": "1.1"}


def lines(batches: int) -> list[tuple[bytes, dict]]:
    """``batches`` processRecords lines of RECORDS changes each, in the adapter's form."""
    start = time.time_ns() // 1_000_000 - 86_400_000
    out = []
    for b in range(batches):
        recs = []
        for k in range(RECORDS):
            i = b * RECORDS + k
            c = change(i, start + i)
            seq = c["dynamodb"]["SequenceNumber"]
            recs.append({"action": "record", "data": base64.b64encode(orjson.dumps(c)).decode("ascii"),
                         "partitionKey": seq, "sequenceNumber": seq, "subSequenceNumber": 0,
                         "approximateArrivalTimestamp": start + i})
        line = orjson.dumps({"action": "processRecords", "records": recs, "millisBehindLatest": 0}) + b"\n"
        out.append((line, recs[-1]))
    return out


class Served:
    """One handler's server (its own process) and its shards, over direct TCP."""

    def __init__(self, handler: str) -> None:
        self.handler = handler
        self.server = None
        self.shards: list[Shard] = []
        self.records = 0
        self.cpu = 0.0  # seconds used by the server and its handler processes while measured
        self.rates: list[float] = []  # each round's records/s

    async def start(self, workers: int, shards: int, tmp: str) -> None:
        name = self.handler.rsplit(":", 1)[1]
        self.server, port = await start_server(os.path.join(tmp, f"state-changes-{name}-{workers}-{shards}"),
                                               handler=self.handler, workers=workers)
        self.shards.extend(await open_shards(port, shards))

    async def round(self, batch_lines: list[tuple[bytes, dict]]) -> None:
        """Every shard gets ``batch_lines``, concurrently, each in lock-step."""
        assert self.server is not None
        pids = descendants(self.server.pid)
        cpu = sum(cpu_s(p) for p in pids)

        async def one(shard: Shard) -> None:
            for line, last in batch_lines:
                await shard.process_line(line, last)

        started = time.perf_counter()
        await asyncio.gather(*(one(s) for s in self.shards))
        seconds = time.perf_counter() - started
        self.cpu += sum(cpu_s(p) for p in pids) - cpu
        n = RECORDS * len(batch_lines) * len(self.shards)
        self.records += n
        self.rates.append(n / seconds)

    @property
    def rate(self) -> float:
        """The median round's records/s."""
        return statistics.median(self.rates) if self.rates else 0.0

    @property
    def cpu_us(self) -> float:
        return self.cpu / self.records * 1e6 if self.records else 0.0

    async def stop(self) -> None:
        await close_shards(self.shards)
        if self.server is not None:
            self.server.terminate()
            self.server.wait(30)


def _in_process(batch_lines: list[tuple[bytes, dict]]) -> float:
    """records/s of the by-hand decoding alone, in this process (no server): the ceiling."""
    from ...api.records import Record

    handler = ByHand(None)
    records = [[Record(r) for r in orjson.loads(line)["records"]] for line, _ in batch_lines]
    started = time.perf_counter()
    for batch in records:
        for record in batch:
            change = orjson.loads(record.data)
            image = change["dynamodb"].get("NewImage")
            if image:
                doc = decode_item(image)
                handler.total += doc["amount"]
    return RECORDS * len(batch_lines) / (time.perf_counter() - started)


async def run(args, tmp: str) -> None:
    rounds = 1 if args.quick else 7
    per_round = 3 if args.quick else (args.batches or 20)
    shard_counts = [1] if args.quick else ([1, 2] if args.shards == [1, 32] else args.shards)
    everything = lines(per_round * (rounds + 1))
    warm, parts = everything[:per_round], [everything[per_round * (r + 1):per_round * (r + 2)] for r in range(rounds)]
    size = sum(len(line) for line, _ in everything) / (RECORDS * len(everything))
    print(f"\nchanges: a ChangeHandler vs a batch Handler decoding by hand; DynamoDB stream records in batches of "
          f"{RECORDS:,} ({size:.0f} B a record on the line), no sink; per shard {rounds} rounds of {per_round} "
          f"batches, the two servers taking turns; records/s of the median round, CPU (server and handler "
          f"processes) over all")
    print(f"  decoding alone, in one process: {_in_process(warm):,.0f} records/s")
    print(f"  {'--workers':>9} {'K':>3} {'variant':14} {'records/s':>11} {'vs by hand':>10} {'CPU us/rec':>10} "
          f"{'vs by hand':>10}")
    for w in args.workers:
        for k in shard_counts:
            hand, change = Served(BY_HAND), Served(CHANGES)
            try:
                for served in (hand, change):
                    await served.start(w, k, tmp)
                    await served.round(warm[:1])  # imports, first allocations
                    served.records, served.cpu, served.rates = 0, 0.0, []
                for r, part in enumerate(parts):
                    for served in ((hand, change) if r % 2 == 0 else (change, hand)):
                        await served.round(part)
            finally:
                await hand.stop()
                await change.stop()
            print(f"  {w:>9} {k:>3} {'by hand':14} {hand.rate:>11,.0f} {'':>10} {hand.cpu_us:>10.2f}")
            print(f"  {w:>9} {k:>3} {'ChangeHandler':14} {change.rate:>11,.0f} {change.rate / hand.rate:>9.2f}x "
                  f"{change.cpu_us:>10.2f} {hand.cpu_us / change.cpu_us if change.cpu_us else 0:>9.2f}x")
