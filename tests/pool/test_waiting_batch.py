"""A batch whose shard waits out back-pressure for its status (the sink behind) keeps
its rows, not its line: the line (megabytes at 10,000 records) goes with the shard's
in-flight slot (``ProcessRecords.let_go``). With a sink behind at 32 shards, the server
held every shard's line while 8 slots were in use: 21 lines of 3 MB at peak in
``bench --part coordinator``, against 8 without a sink."""

from __future__ import annotations

import asyncio
import gc
import logging

from mldserver.api.testing import make_records
from mldserver.protocol.events import ProcessRecords
from mldserver.protocol.lazy import LazyRecords

from ..harness import eventually, running
from .serving import T0, MemorySink, events, pooled


class Gated(MemorySink):
    """A sink whose commits wait for ``gate``."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()

    async def commit(self, window) -> None:
        await self.gate.wait()
        await super().commit(window)


def lines_held(marker: bytes) -> list[object]:
    """The batches alive in this process that still hold a line with ``marker`` in it."""
    return [o for o in gc.get_objects() if type(o) in (ProcessRecords, LazyRecords) and marker in o.line]


async def test_a_batch_waiting_for_the_sink_holds_its_rows_not_its_line(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="mldserver")
    sink = Gated()
    async with running(tmp_path, **{**pooled("Emit", workers=1), "sink": sink}) as (server, _, daemon):
        shard = await daemon.shard("shardId-000000000000")
        # Caught up, on a clock an hour on: each batch closes its minute's window.
        await shard.process_records(make_records(1, 1_000, 64, approximate_arrival_timestamp=T0), 0)
        waiting = asyncio.create_task(
            shard.process_records(make_records(2_000, 1_000, 64, partition_key="waiting-{i}",
                                               approximate_arrival_timestamp=T0 + 61_000), 0))
        try:
            await eventually(lambda: any(e["reason"] == "sink_behind" for e in events(caplog, "backpressure")),
                             what="the second batch waiting behind the first window's commit")
            assert not waiting.done()
            assert lines_held(b'"waiting-999"') == []  # its rows wait in the coordinator; its line is gone
        finally:
            sink.gate.set()
        await asyncio.wait_for(waiting, 30)
        await eventually(lambda: len(sink.rows) == 2_000, what="both windows committed")
        assert sorted(int(r["seq"]) for r in sink.rows) == [*range(1, 1_001), *range(2_000, 3_000)]
        await shard.lease_lost()
        assert await shard.close() == 0
