"""PieceReader: the pieces a transport delivered, handed out as they came."""

from __future__ import annotations

import asyncio

import pytest

from mldserver.shard import pieces
from mldserver.shard.pieces import LineReader, PieceReader


async def test_a_piece_that_fits_is_handed_out_as_it_came_and_a_larger_one_is_cut():
    reader = PieceReader(limit=16)
    first, second = b"a" * 10, b"b" * 30
    reader.feed_data(first)
    reader.feed_data(second)
    assert reader.unread == 40
    assert await reader.read(64) is first
    assert await reader.read(12) == b"b" * 12 and reader.unread == 18
    reader.feed_eof()
    assert await reader.read(64) == b"b" * 18
    assert await reader.read(64) == b"" and reader.at_eof()


async def test_readexactly_gathers_pieces_and_says_how_much_came_before_the_end():
    reader = PieceReader()
    for piece in (b"he", b"llo wor", b"ld"):
        reader.feed_data(piece)
    assert await reader.readexactly(5) == b"hello"
    reader.feed_eof()
    with pytest.raises(asyncio.IncompleteReadError) as cut:
        await reader.readexactly(10)
    assert cut.value.partial == b" world"


async def test_a_read_waits_for_data_and_an_error_is_raised_to_the_reader():
    reader = PieceReader()
    waiting = asyncio.ensure_future(reader.read(8))
    await asyncio.sleep(0)
    assert not waiting.done()
    reader.feed_data(b"late")
    assert await waiting == b"late"
    reader.set_exception(ConnectionResetError("gone"))
    with pytest.raises(ConnectionResetError):
        await reader.read(8)


class Transport(asyncio.ReadTransport):
    """A transport that only says whether its reader paused it."""

    paused = False

    def pause_reading(self):
        self.paused = True

    def resume_reading(self):
        self.paused = False


async def test_reading_pauses_past_twice_the_limit_held_and_resumes_once_read_down():
    reader, transport = PieceReader(limit=10), Transport()
    reader.set_transport(transport)
    reader.feed_data(b"x" * 15)
    assert not transport.paused
    reader.feed_data(b"y" * 15)
    assert transport.paused
    await reader.read(15)
    assert transport.paused  # 15 still held: more than the limit
    await reader.read(5)
    assert not transport.paused


async def test_a_holding_reader_pauses_after_each_piece_and_a_read_lets_one_more_in():
    reader, transport = PieceReader(limit=1 << 10), Transport()
    reader.set_transport(transport)
    reader.hold(True)
    assert transport.paused  # at once, nothing held yet
    waiting = asyncio.ensure_future(reader.read(64))
    await asyncio.sleep(0)
    assert not transport.paused  # a read with nothing held lets the next piece in
    reader.feed_data(b"first")
    assert transport.paused and await waiting == b"first"  # ... and only that one
    reader.feed_data(b"late")  # (what a transport had read already still lands)
    assert await reader.read(64) == b"late" and transport.paused  # held: still paused
    reader.hold(False)
    assert not transport.paused  # nothing held: reading goes on


async def test_a_server_whose_connections_read_in_place_serves_lines_of_megabytes_uncopied():
    """Each read is written where the line ends up: a line of megabytes leaves as the
    buffer the transport wrote into (never copied), and the end of input is 0."""
    got: asyncio.Future[list] = asyncio.get_running_loop().create_future()
    lent: list[int] = []

    async def connected(reader, writer):
        assert isinstance(reader, LineReader)
        lines = []
        try:
            while n := await reader.receive():
                assert reader.unread == 0 < n
                lent.append(id(reader.lines._buf))  # the buffer the reads went to
                while (line := reader.lines.next_line()) is not None:
                    lines.append(line)
            got.set_result(lines)
        except Exception as exc:  # (the test fails, not hangs)
            got.set_exception(exc)
        finally:
            writer.close()

    server = await pieces.serve_tcp(connected, "127.0.0.1", 0, 1 << 18)
    port = server.sockets[0].getsockname()[1]
    _, writer = await asyncio.open_connection("127.0.0.1", port)
    line = bytes(range(14, 256)) * 13_000  # 3 MB, no line end in it
    writer.write(line + b"\n" + line[:1000] + b"\r\n" + line + b"\n")
    await writer.drain()
    writer.close()
    lines = await asyncio.wait_for(got, 30)
    assert lines == [line, line[:1000], line]
    assert type(lines[0]) is bytearray and id(lines[0]) in lent  # the buffer the kernel wrote into
    assert type(lines[1]) is bytes  # a short line is copied out
    server.close()
    await server.wait_closed()
