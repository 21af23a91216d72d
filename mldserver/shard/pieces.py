"""Readers that do not copy: pieces as the transport delivered them, or lines written in place.

asyncio's ``StreamReader`` appends every piece it is fed to one buffer and copies what
``read`` returns out of it (twice, in Python 3.11: a slice, then ``bytes``). For the
daemon's lines and the frames to a handler process, megabytes a batch, those copies
were most of what the server and the handler processes did with the bytes (and each
buffer past 1 MiB was pages fresh from the kernel: ``pool/malloc.py``). ``PieceReader``
keeps the pieces as they came (uvloop delivers ``bytes`` of up to 256 KiB) and
``read(n)`` returns the next one whole when it fits, so a line or a frame body is
copied once, where its pieces are joined (``LineBuffer``, ``spark.frames``)::

    reader = PieceReader(limit=1 << 18)       # reading pauses past twice ``limit`` held
    await loop.create_server(lambda: asyncio.StreamReaderProtocol(reader, on_connect), ...)
    piece = await reader.read(1 << 18)        # b"" at the end
    reader.unread                             # bytes received, not yet read
    reader.hold(True)                         # read no more from the socket for now

``read`` and ``readexactly`` are all it serves (what the server and the handler
processes use for frames); the line-oriented methods raise ``NotImplementedError``.

A shard's connection reads in place instead (``LineReader``): the transport is an
``asyncio.BufferedProtocol`` that writes each read into the free end of the line being
assembled (``protocol.LineBuffer.get_buffer``), so a line of megabytes is written once,
by the kernel, and leaves as the buffer it was written into: neither uvloop's copy of
each read into ``bytes`` nor the join of the pieces (a fifth of the server's time at 32
shards of 1 KiB records, under ``perf``)::

    async def connected(reader: LineReader, writer):
        conn = Connection(lines=reader.lines)  # its lines are the bytes the reader received
        while (n := await reader.receive()):   # bytes that arrived since the last call
            ...                                # conn.next_event() until NEED_DATA
        conn.receive_data(b"")                 # 0: the end of input

``serve_tcp`` and ``serve_unix`` start servers whose connections read so; ``serve_socket``
serves one connected socket the same way (a source's end of a socket pair,
``mldserver.sources``).
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any, Awaitable, Callable

from ..protocol.framing import LineBuffer

Connected = Callable[[Any, asyncio.StreamWriter], Awaitable[None]]


class _Holding(asyncio.StreamReader):
    """What both readers share: bytes received and not yet read (``unread``), reading
    paused past twice ``limit`` of them, and ``hold``."""

    def __init__(self, limit: int = 1 << 16, loop: asyncio.AbstractEventLoop | None = None) -> None:
        super().__init__(limit=limit, loop=loop)
        self._held = 0
        self._holding = False  # ``hold``: read nothing more for now

    @property
    def unread(self) -> int:
        """Bytes received and not read yet."""
        return self._held

    def _received(self, n: int) -> None:
        self._held += n
        self._wakeup_waiter()
        if self._holding or self._held > 2 * self._limit:
            self._pause()

    def hold(self, holding: bool) -> None:
        """``True``: nothing more is read from the socket for now (what arrives stays
        in the kernel); ``False``: reading goes on as before. A shard waiting for an
        in-flight slot holds so: of its batch, only what one read brought (up to 256
        KiB with uvloop) is in memory, not twice ``limit``."""
        self._holding = holding
        if holding:
            self._pause()
        else:
            self._maybe_resume_transport()

    def _pause(self) -> None:
        if self._transport is not None and not self._paused:
            try:
                self._transport.pause_reading()
            except NotImplementedError:  # a transport that cannot pause: hold it all
                self._transport = None
            else:
                self._paused = True

    def _maybe_resume_transport(self) -> None:
        if self._paused and not self._holding and self._held <= self._limit:
            self._paused = False
            self._transport.resume_reading()

    def at_eof(self) -> bool:
        return self._eof and not self._held


class PieceReader(_Holding):
    def __init__(self, limit: int = 1 << 16, loop: asyncio.AbstractEventLoop | None = None) -> None:
        super().__init__(limit=limit, loop=loop)
        self._pieces: deque[bytes] = deque()

    def feed_data(self, data: bytes) -> None:
        assert not self._eof, "feed_data after feed_eof"
        if not data:
            return
        self._pieces.append(bytes(data))  # bytes already (uvloop, asyncio): not copied
        self._received(len(data))

    async def read(self, n: int = -1) -> bytes:
        """Up to ``n`` bytes (all of them to the end when ``n`` < 0): the next piece
        as it came when it fits, else its first ``n`` bytes; b"" at the end."""
        if self._exception is not None:
            raise self._exception
        if n == 0:
            return b""
        if n < 0:
            pieces = []
            while piece := await self.read(self._limit):
                pieces.append(piece)
            return b"".join(pieces)
        if not self._held and not self._eof:
            await self._wait_for_data("read")
        if not self._pieces:
            return b""
        piece = self._pieces[0]
        if len(piece) <= n:
            self._pieces.popleft()
        else:
            self._pieces[0] = piece[n:]
            piece = piece[:n]
        self._held -= len(piece)
        self._maybe_resume_transport()
        return piece

    async def readexactly(self, n: int) -> bytes:
        pieces, got = [], 0
        while got < n:
            piece = await self.read(n - got)
            if not piece:
                raise asyncio.IncompleteReadError(b"".join(pieces), n)
            pieces.append(piece)
            got += len(piece)
        return pieces[0] if len(pieces) == 1 else b"".join(pieces)

    async def readline(self) -> bytes:
        raise NotImplementedError("PieceReader serves read and readexactly")

    async def readuntil(self, separator: bytes = b"\n") -> bytes:
        raise NotImplementedError("PieceReader serves read and readexactly")


class LineReader(_Holding):
    """A shard connection's reader: what arrives is written in place into ``lines``
    (by ``InPlace``, or ``feed_data`` for a transport that is not buffered), and
    ``receive`` says how much did."""

    def __init__(self, limit: int = 1 << 16, loop: asyncio.AbstractEventLoop | None = None) -> None:
        super().__init__(limit=limit, loop=loop)
        self.lines = LineBuffer()

    def feed_data(self, data: bytes) -> None:
        assert not self._eof, "feed_data after feed_eof"
        if data:
            self.lines.feed(data)
            self._received(len(data))

    async def receive(self) -> int:
        """Wait for bytes: how many arrived (into ``lines``) since the last call; 0 at the end."""
        if self._exception is not None:
            raise self._exception
        if not self._held and not self._eof:
            await self._wait_for_data("receive")
        n, self._held = self._held, 0
        self._maybe_resume_transport()
        return n

    async def read(self, n: int = -1) -> bytes:
        raise NotImplementedError("a LineReader's bytes are in its lines: receive() says how many came")

    readexactly = readline = readuntil = read  # type: ignore[assignment]


class InPlace(asyncio.BufferedProtocol):
    """``asyncio.StreamReaderProtocol`` (the connection, its writer, ``connected``'s
    task), with each read written in place into the ``LineReader``'s lines."""

    def __init__(self, reader: LineReader, connected: Connected) -> None:
        self._reader = reader
        self._streams = asyncio.StreamReaderProtocol(reader, connected)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._streams.connection_made(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self._streams.connection_lost(exc)

    def pause_writing(self) -> None:
        self._streams.pause_writing()

    def resume_writing(self) -> None:
        self._streams.resume_writing()

    def eof_received(self) -> bool | None:
        return self._streams.eof_received()

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._reader.lines.get_buffer(sizehint)

    def buffer_updated(self, nbytes: int) -> None:
        self._reader.lines.buffer_updated(nbytes)
        self._reader._received(nbytes)


def _factory(connected: Connected, limit: int) -> Callable[[], InPlace]:
    def protocol() -> InPlace:
        return InPlace(LineReader(limit=limit), connected)

    return protocol


async def serve_tcp(connected: Connected, host: str, port: int, limit: int, **kwargs: Any) -> asyncio.Server:
    """``asyncio.start_server``, each connection read in place by a ``LineReader``."""
    return await asyncio.get_running_loop().create_server(_factory(connected, limit), host, port, **kwargs)


async def serve_unix(connected: Connected, path: str, limit: int, **kwargs: Any) -> asyncio.Server:
    """``asyncio.start_unix_server``, each connection read in place by a ``LineReader``."""
    return await asyncio.get_running_loop().create_unix_server(_factory(connected, limit), path, **kwargs)


async def serve_socket(connected: Connected, sock: Any, limit: int) -> None:
    """Serve one connected unix socket (one end of a ``socket.socketpair()``) as if a
    unix server had accepted it: ``connected`` runs in a task of its own."""
    await asyncio.get_running_loop().create_unix_connection(_factory(connected, limit), sock=sock)
