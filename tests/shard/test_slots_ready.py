"""A batch waits for the downstream's ``ready`` (back-pressure) before it takes a slot
and before more than its first bytes are read: the rest stays with the sender."""

from __future__ import annotations

import asyncio

import orjson

from mldserver.base.logs import EventLogger
from mldserver.shard.pieces import LineReader
from mldserver.protocol import Connection, ProcessRecords, State
from mldserver.protocol.framing import LEND
from mldserver.shard.slots import Slots, Wire

from mldserver.api.testing import make_records


class Writer:
    def close(self) -> None:
        pass


async def test_a_batch_is_not_read_past_its_first_piece_until_ready():
    reader = LineReader()
    conn = Connection(lines=reader.lines)
    conn.state = State.READY  # (initialized): between actions
    gate = asyncio.Event()
    slots = Slots(8)
    wire = Wire(reader, Writer(), conn, slots, EventLogger("test"), running=lambda: None,
                on_bad_line=None, ready=gate.wait)  # type: ignore[arg-type]
    line = orjson.dumps({"action": "processRecords", "records": make_records(1, 4000, 200),
                         "millisBehindLatest": 0}) + b"\n"
    assert len(line) > 4 * LEND
    reader.feed_data(line)
    reader.feed_eof()
    event = asyncio.create_task(wire.next_event())
    while not (conn.buffered or event.done()):  # its first bytes are read, and name a batch
        await asyncio.sleep(0)
    for _ in range(50):
        await asyncio.sleep(0)
    assert not event.done() and conn.buffered <= LEND and not slots.holders
    gate.set()
    got = await asyncio.wait_for(event, 5)
    assert isinstance(got, ProcessRecords) and len(got.records) == 4000 and wire in slots.holders


async def test_a_batch_waiting_for_a_slot_keeps_all_but_one_read_in_the_kernel():
    """Every slot held: the next shard's batch waits, and the server reads no further
    than the read that brought its first bytes (at most ``LEND``, 256 KiB): the rest
    of its 8 MB stays in the socket's buffers and with the sender, not in memory."""
    from mldserver.shard import pieces
    from mldserver.server.listeners import STREAM_LIMIT

    from ..harness import eventually

    slots = Slots(1)
    holder = object()
    await slots.acquire(holder, asyncio.Event())  # type: ignore[arg-type]  (another shard's batch)
    wires: list = []
    events: list = []

    async def connected(reader, writer):
        conn = Connection(lines=reader.lines)
        conn.state = State.READY
        wire = Wire(reader, writer, conn, slots, EventLogger("test"), running=lambda: None,
                    on_bad_line=None)  # type: ignore[arg-type]
        wires.append(wire)
        try:
            events.append(await wire.next_event())
        finally:
            writer.close()

    server = await pieces.serve_tcp(connected, "127.0.0.1", 0, STREAM_LIMIT)
    port = server.sockets[0].getsockname()[1]
    _, writer = await asyncio.open_connection("127.0.0.1", port)
    line = orjson.dumps({"action": "processRecords", "records": make_records(1, 20_000, 300),
                         "millisBehindLatest": 0}) + b"\n"
    assert len(line) > 8 << 20
    writer.write(line)
    try:
        await eventually(lambda: wires and wires[0].reader._paused, what="the waiting batch's reading paused")
        wire = wires[0]
        for _ in range(20):  # what was in flight lands; nothing more is read
            await asyncio.sleep(0.01)
        assert 0 < wire.conn.buffered <= LEND and not slots._sem._value
        slots.release(holder)  # type: ignore[arg-type]
        await eventually(lambda: events, what="the whole batch read, once it took the slot")
        assert len(events[0].records) == 20_000 and wire in slots.holders
    finally:
        writer.transport.abort()  # (closed at once, whatever it still had to send)
        for wire in wires:
            wire.writer.transport.abort()
        server.close()
