"""End to end with a sink: ``mldserver serve`` (a real process) with the passthrough
handler and the file sink, driven through the relay by the fake daemon: several
shards, a split, a SIGKILL of the server mid-stream, and a restart from which the fake
daemon resumes every shard at its stored checkpoint, as the KCL does."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import signal
import time

from mldserver.api.testing import SHARD_END, DaemonExit, FakeDaemon, Shard

from .harness import eventually, relay_command

BATCH = 100
CONFIG = """
window = 1.0
checkpoint_interval = 0.0
idle_timeout = 3.0
watermark_margin = 0.5
"""


def stream(first_seq: int, count: int, first_time: int) -> list[dict]:
    """A shard's records: one every 10 ms of event time, so a batch fills a window."""
    return [
        {
            "action": "record",
            "data": base64.b64encode(f"record {first_seq + i}".encode()).decode(),
            "partitionKey": f"pk-{i % 7}",
            "sequenceNumber": str(first_seq + i),
            "subSequenceNumber": 0,
            "approximateArrivalTimestamp": first_time + 10 * i,
        }
        for i in range(count)
    ]


class Stream:
    """What was put into each shard, and where each shard's reader stands."""

    def __init__(self) -> None:
        base = time.time_ns() // 1_000_000 - 3_600_000
        self.records = {
            "shardId-000000000000": stream(10**20, 600, base),
            "shardId-000000000001": stream(2 * 10**20, 1500, base + 3),
            "shardId-000000000002": stream(3 * 10**20, 1500, base + 7),
            # the split's children: their records come after the parent's last one
            "shardId-000000000003": stream(4 * 10**20, 900, base + 6_000),
            "shardId-000000000004": stream(5 * 10**20, 900, base + 6_005),
        }
        self.next = {shard_id: 0 for shard_id in self.records}

    def resume(self, shard_id: str, checkpoint) -> None:
        """After a restart: the reader starts right after the stored checkpoint."""
        if checkpoint is None:
            self.next[shard_id] = 0
        else:
            seqs = [int(r["sequenceNumber"]) for r in self.records[shard_id]]
            self.next[shard_id] = seqs.index(int(checkpoint[0])) + 1

    async def feed(self, shard: Shard, batches: int | None = None) -> None:
        records = self.records[shard.shard_id]
        while self.next[shard.shard_id] < len(records) and batches != 0:
            start = self.next[shard.shard_id]
            batch = records[start : start + BATCH]
            await shard.process_records(batch, millis_behind_latest=1000)
            self.next[shard.shard_id] = start + len(batch)
            batches = None if batches is None else batches - 1

    async def finish(self, shards: dict[str, Shard]) -> None:
        """Every shard fed to its end, then caught up (millisBehindLatest 0)."""
        await asyncio.gather(*(self.feed(s) for s in shards.values()))
        await asyncio.gather(*(s.process_records([], millis_behind_latest=0) for s in shards.values()))

    async def restart(self, checkpoints: dict, port: int) -> tuple[FakeDaemon, dict[str, Shard]]:
        """A new daemon resumes every shard not ended from its stored checkpoint, as
        the KCL does after a restart, and reads each to its end."""
        daemon = FakeDaemon(relay_command(port))
        daemon.checkpoints = dict(checkpoints)
        shards = {}
        for shard_id in sorted(self.records):
            if daemon.checkpoints.get(shard_id) == SHARD_END:
                continue
            self.resume(shard_id, daemon.checkpoints.get(shard_id))
            shards[shard_id] = await daemon.shard(shard_id)
        await self.finish(shards)
        return daemon, shards

    async def shut_down(self, daemon: FakeDaemon, shards: dict[str, Shard]) -> None:
        """shutdownRequested everywhere: each shard is checkpointed at its last record."""
        await asyncio.gather(*(s.shutdown_requested() for s in shards.values()))
        for shard_id, shard in shards.items():
            last = self.records[shard_id][-1]["sequenceNumber"]
            assert daemon.checkpoints[shard_id] == (last, 0), shard_id  # everything committed, checkpointed
            await shard.close()


async def until_killed(task) -> None:
    try:
        await task
    except (DaemonExit, BrokenPipeError, ConnectionResetError, TimeoutError):
        pass


def sink_rows(out) -> dict[str, list[dict]]:
    return {p.name: [json.loads(line) for line in p.read_text().splitlines()] for p in sorted(out.glob("*.jsonl"))}


async def test_every_record_reaches_the_sink_across_a_split_and_a_server_crash(serve, tmp_path):
    config = tmp_path / "mldserver.toml"
    config.write_text(CONFIG)
    out = tmp_path / "out"
    args = ("--sink", f"file:{out}", "--config", str(config), "--log-level", "debug")
    model = Stream()
    ids = sorted(model.records)

    server = serve("handlers.passthrough:Passthrough", *args)
    daemon = FakeDaemon(relay_command(server.port))
    parents = {i: await daemon.shard(i) for i in ids[:3]}
    await asyncio.gather(*(model.feed(s, batches=6) for s in parents.values()))
    await parents[ids[0]].shard_ended()  # the split: SHARD_END after the spool
    assert daemon.checkpoints[ids[0]] == SHARD_END
    children = {i: await daemon.shard(i) for i in ids[3:]}
    live = {**children, ids[1]: parents[ids[1]], ids[2]: parents[ids[2]]}
    await asyncio.gather(*(model.feed(s, batches=3) for s in live.values()))
    feeders = [asyncio.ensure_future(model.feed(s)) for s in live.values()]
    await asyncio.sleep(0.3)
    os.kill(server.proc.pid, signal.SIGKILL)  # mid-stream
    await asyncio.gather(*(until_killed(f) for f in feeders))
    for s in [*parents.values(), *children.values()]:
        await s.child.kill()
    server.proc.wait()
    assert any(isinstance(v, tuple) for v in daemon.checkpoints.values())  # progress was checkpointed

    server = serve("handlers.passthrough:Passthrough", *args)
    restarted, shards = await model.restart(daemon.checkpoints, server.port)

    put = {(r["sequenceNumber"]) for records in model.records.values() for r in records}

    def seen():
        return {row["sequence_number"] for rows in sink_rows(out).values() for row in rows}

    await eventually(lambda: put <= seen(), timeout=30, interval=0.2,
                     what=f"all {len(put)} records in the sink (missing {len(put - seen())} at the start)")
    for name, rows in sink_rows(out).items():
        keys = [(r["approximate_arrival_timestamp"], r["shard_id"], int(r["sequence_number"])) for r in rows]
        assert keys == sorted(keys), f"{name} holds rows out of order"
    for row in next(iter(sink_rows(out).values()))[:3]:
        record = model.records[row["shard_id"]][0]
        assert row["data"] == record["data"] or base64.b64decode(row["data"]).startswith(b"record ")

    await model.shut_down(restarted, shards)
    assert not list((tmp_path / "state" / "spool").glob("*.jsonl"))  # the parent's spool was committed, deleted
    events = [e["event"] for e in server.events()]
    assert "window_committed" in events
