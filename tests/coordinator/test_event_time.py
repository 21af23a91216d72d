"""No row the stream still holds is ever late: a property of the whole coordinator
(watermarks, lineage, ordering), over random streams and random delivery.

A stream is written in event-time order, as a replay of historic data is (times years
before the wall clock): each row goes to one of the open shards, and between rows a
shard may split in two or two shards merge into one. Readers then deliver each shard
in batches, shards taking turns at random, some shards starting late, children only
once their parents have ended (as the daemon and ``--source`` do), any batch
reporting itself caught up or not, and the clock moving on. The server knows the
stream's shards as ``--source`` tells them (``Coordinator.expect``). Whatever the
timing, no row is late and each row is committed once, in the window of its own event
time."""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

import orjson
import uvloop
from hypothesis import HealthCheck, given, settings as hsettings, strategies as st

from mldserver.rows.batch import Item, RowBatch
from mldserver.base.config import Settings
from mldserver.base.positions import Position
from mldserver.coordinator import Coordinator
from mldserver.sinks.file import FileSink

from ..helpers import FakeClock

WINDOW_MS = 10_000
HISTORIC = 1_000_000_000_000  # 2001: the data's times; the clock is at 2026
NOW = 1_790_000_000_000


class Stream:
    """Shards, their parents, and each shard's rows (event time, sequence number)."""

    def __init__(self, first: int) -> None:
        self.parents: dict[str, tuple[str, ...]] = {}
        self.rows: dict[str, list[tuple[int, int]]] = {}
        self.open: list[str] = []
        self.seq = 0
        for _ in range(first):
            self._new(())

    def _new(self, parents: tuple[str, ...]) -> str:
        shard_id = f"shardId-{len(self.parents):012d}"
        self.parents[shard_id] = parents
        self.rows[shard_id] = []
        self.open.append(shard_id)
        return shard_id

    def put(self, shard_id: str, t: int) -> None:
        self.seq += 1
        self.rows[shard_id].append((t, self.seq))

    def split(self, shard_id: str) -> None:
        self.open.remove(shard_id)
        self._new((shard_id,))
        self._new((shard_id,))

    def merge(self, a: str, b: str) -> None:
        self.open.remove(a)
        self.open.remove(b)
        self._new((a, b))


@st.composite
def streams(draw):
    stream = Stream(draw(st.integers(1, 3)))
    t = HISTORIC
    for _ in range(draw(st.integers(1, 60))):
        op = draw(st.sampled_from(["put"] * 8 + ["split", "merge"]))
        if op == "split" and len(stream.parents) < 9:
            stream.split(draw(st.sampled_from(stream.open)))
        elif op == "merge" and len(stream.open) >= 2 and len(stream.parents) < 9:
            a, b = draw(st.lists(st.sampled_from(stream.open), min_size=2, max_size=2, unique=True))
            stream.merge(a, b)
        else:
            t += draw(st.integers(0, 7_000))
            stream.put(draw(st.sampled_from(stream.open)), t)
    return stream


def rows_of(shard_rows):
    batch = RowBatch.of(Item(t, Position(seq, 0, str(seq)), orjson.dumps({"seq": seq, "t": t}))
                        for t, seq in shard_rows)
    batch.timed = True  # the handler gave each row its time from the data
    return batch


async def deliver(stream: Stream, draw, directory: Path) -> Coordinator:
    clock = FakeClock(NOW)
    settings = Settings(window=WINDOW_MS / 1000, idle_timeout=86_400.0, watermark_margin=5.0,
                        state_dir=str(directory / "state"), sink=f"file:{directory / 'out'}")
    c = Coordinator(settings, FileSink(directory / "out"), clock=clock)
    await c.start()
    for shard_id in stream.parents:  # what --source lists: every shard, with its parents
        c.expect(shard_id, stream.parents[shard_id])
    closed = {p for parents in stream.parents.values() for p in parents}  # split or merged: they end
    left = {s: list(rows) for s, rows in stream.rows.items()}
    state = {s: "new" for s in stream.parents}
    try:
        while any(v != "done" for v in state.values()):
            ready = [s for s, v in state.items() if v == "reading"
                     or v == "new" and all(state[p] == "done" for p in stream.parents[s])]
            shard_id = draw(st.sampled_from(sorted(ready)))
            clock.advance(draw(st.integers(0, 3_000)))
            if state[shard_id] == "new":
                await c.open_shard(shard_id, None)
                state[shard_id] = "reading"
            elif left[shard_id]:
                n = draw(st.integers(1, len(left[shard_id])))
                batch, left[shard_id] = left[shard_id][:n], left[shard_id][n:]
                c.add_batch(shard_id, rows_of(batch), Position(batch[-1][1], 0, str(batch[-1][1])),
                            draw(st.sampled_from([0, 0, 5_000])))
            elif shard_id in closed:
                await c.shard_ended(shard_id)
                c.shard_closed(shard_id)
                state[shard_id] = "done"
            else:  # an open shard with nothing more: its reader polls, caught up
                c.add_batch(shard_id, RowBatch.empty(), None, 0)
                state[shard_id] = "done"
            if draw(st.booleans()):
                await c.step()
        clock.advance(86_400_001)  # every shard idle: every window closes
        await c.step()
    finally:
        await c.stop()
    return c


@hsettings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(streams(), st.data())
def test_no_row_the_stream_still_holds_is_ever_late(stream, data):
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        c = uvloop.run(deliver(stream, data.draw, directory))
        assert c.ordering.late_rows == 0 and c.ordering.clamped == 0
        committed = {}
        for path in (directory / "out").glob("*.jsonl"):
            start, end = map(int, path.stem.split("-"))
            for line in path.read_text().splitlines():
                row = orjson.loads(line)
                assert start <= row["t"] < end, (path.name, row)  # in the window of its own time
                assert row["seq"] not in committed, row  # once
                committed[row["seq"]] = row["t"]
        assert committed == {seq: t for rows in stream.rows.values() for t, seq in rows}
