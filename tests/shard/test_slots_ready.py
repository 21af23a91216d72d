"""A batch waits for the downstream's ``ready`` (back-pressure) before it takes a slot
and before more than its first bytes are read: the rest stays with the sender."""

from __future__ import annotations

import asyncio

import orjson

from mldserver.base.logs import EventLogger
from mldserver.base.pieces import PieceReader
from mldserver.protocol import Connection, ProcessRecords, State
from mldserver.shard.slots import READ_CHUNK, Slots, Wire

from mldserver.api.testing import make_records


class Writer:
    def close(self) -> None:
        pass


async def test_a_batch_is_not_read_past_its_first_piece_until_ready():
    reader = PieceReader()
    conn = Connection()
    conn.state = State.READY  # (initialized): between actions
    gate = asyncio.Event()
    slots = Slots(8)
    wire = Wire(reader, Writer(), conn, slots, EventLogger("test"), running=lambda: None,
                on_bad_line=None, ready=gate.wait)  # type: ignore[arg-type]
    line = orjson.dumps({"action": "processRecords", "records": make_records(1, 4000, 200),
                         "millisBehindLatest": 0}) + b"\n"
    assert len(line) > 4 * READ_CHUNK
    reader.feed_data(line)
    reader.feed_eof()
    event = asyncio.create_task(wire.next_event())
    while not (conn.buffered or event.done()):  # its first bytes are read, and name a batch
        await asyncio.sleep(0)
    for _ in range(50):
        await asyncio.sleep(0)
    assert not event.done() and conn.buffered <= READ_CHUNK and not slots.holders
    gate.set()
    got = await asyncio.wait_for(event, 5)
    assert isinstance(got, ProcessRecords) and len(got.records) == 4000 and wire in slots.holders
