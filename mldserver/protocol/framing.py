"""Line framing of the MultiLangDaemon protocol: bytes in, whole lines out.

The daemon writes one JSON object per line, ended by ``\\n`` (``\\r\\n`` on Windows).
Lines are split on the byte ``\\n`` only: never on U+2028 and friends, which the
daemon sends raw inside partition keys. One trailing ``\\r`` is stripped, blank lines
are skipped, and a line may be tens of megabytes (10,000 records of 1 KiB is about
15.6 MB), so the only limit is ``max_line_size``, far above asyncio's 64 KiB::

    >>> buf = LineBuffer()
    >>> buf.feed(b'{"action":"leaseLost"}\\r\\n\\n{"act')
    >>> buf.next_line()
    b'{"action":"leaseLost"}'
    >>> buf.next_line() is None
    True

Bytes can also be written in place, the way an ``asyncio.BufferedProtocol`` reads a
socket (``shard.pieces``): ``get_buffer`` lends the free end of the line being
assembled, ``buffer_updated`` says how much was written there. A line of megabytes is
then written once, by the kernel, and handed out as the very buffer it was written
into (a ``bytearray``, cut to the line): no copy at all. Lines of up to ``SMALL``
bytes are handed out as ``bytes``; so is a line that did not start its buffer::

    >>> buf = LineBuffer()
    >>> view = buf.get_buffer(-1)          # the next read goes here
    >>> view[:3] = b"ok\\n"; del view
    >>> buf.buffer_updated(3)
    >>> buf.next_line()
    b'ok'

A line longer than ``max_line_size`` raises :class:`LineTooLong` once, with its first
``PREFIX`` bytes (enough for its action name). The caller may then take the whole line
in pieces with ``overflow()`` (each call hands out what arrived since the last and
says whether the line has ended), so it can be kept without being held in memory;
what ``overflow()`` does not take is discarded by ``next_line()`` up to the line's
``\\n``, so the following lines still frame::

    >>> buf = LineBuffer(8)
    >>> buf.feed(b'{"action":"x","y":1')
    >>> buf.next_line()
    Traceback (most recent call last):
    ...
    mldserver.protocol.framing.LineTooLong: ...
    >>> buf.feed(b'2}\\n{}\\n')
    >>> buf.overflow()
    (b'{"action":"x","y":12}', True)
"""

from __future__ import annotations

import ctypes

from .errors import ProtocolError

DEFAULT_MAX_LINE_SIZE = 256 * 1024 * 1024
PREFIX = 1024  # bytes of an over-long line handed out with LineTooLong
SMALL = 4096  # a line up to this long is copied out as bytes; a longer one leaves in its buffer
LEND = 1 << 18  # the most ``get_buffer`` lends at once (a quarter MiB: one read's worth)
MIN_BUFFER = 1 << 16  # the least a fresh buffer holds
MIN_READ = 1 << 14  # ``get_buffer`` lends at least this much (a buffer with less free moves)
SLACK = 1 << 16  # a line that outgrows a fresh buffer moves to one the last long line's size and this much more

try:  # a bytearray of n bytes, not zeroed first (they are all written before they are read)
    _uninitialised = ctypes.pythonapi.PyByteArray_FromStringAndSize
    _uninitialised.restype = ctypes.py_object
    _uninitialised.argtypes = (ctypes.c_char_p, ctypes.c_ssize_t)
except AttributeError:  # pragma: no cover  (not CPython)
    _uninitialised = None


def _bytearray(n: int) -> bytearray:
    return _uninitialised(None, n) if _uninitialised is not None else bytearray(n)


class LineTooLong(ProtocolError):
    """A line grew past ``max_line_size`` bytes; ``prefix`` holds its first bytes."""

    def __init__(self, size: int, limit: int, prefix: bytes) -> None:
        super().__init__(
            f"a line from the daemon exceeds {limit} bytes (max_line_size); "
            f"it was dead-lettered whole and answered; raise max_line_size if batches are really this large"
        )
        self.size = size
        self.limit = limit
        self.prefix = prefix


class LineBuffer:
    """Accumulates bytes and hands out complete lines, without the line end.

    The bytes are held in one buffer, ``_buf[_start:_end]``: a line of megabytes is
    written into it once (by ``feed``, or in place by the kernel: ``get_buffer``) and
    leaves as that buffer, after one move of its first bytes from a small buffer to
    one the size of the last long line (``_room``)."""

    __slots__ = ("_buf", "_start", "_end", "_scan", "_size_hint", "_skipping", "_skipped", "max_line_size", "eof")

    def __init__(self, max_line_size: int = DEFAULT_MAX_LINE_SIZE) -> None:
        self._buf: bytearray | None = None  # made when bytes first come
        self._start = 0  # the first byte not handed out
        self._end = 0  # the end of what was written
        self._scan = 0  # where to look for the next b"\n" (none before it since _start)
        self._size_hint = MIN_BUFFER  # where a line outgrowing a fresh buffer moves (the last long line fits)
        self._skipping = False  # inside an over-long line, dropping bytes to its end
        self._skipped = 0
        self.max_line_size = max_line_size
        self.eof = False

    # -- input ---------------------------------------------------------------------

    def feed(self, data: bytes) -> None:
        """Add bytes; ``b""`` marks the end of input."""
        if not data:
            self.eof = True
            return
        n = len(data)
        self._room(n)
        self._buf[self._end : self._end + n] = data  # type: ignore[index]
        self._end += n

    def get_buffer(self, sizehint: int = -1) -> memoryview:
        """The free end of the buffer, up to ``LEND`` bytes, for the next read to write
        into (``asyncio.BufferedProtocol.get_buffer``); then ``buffer_updated``. Let go
        of it before anything else is called."""
        self._room(MIN_READ)
        end = self._end
        return memoryview(self._buf)[end : end + min(len(self._buf) - end, LEND)]  # type: ignore[arg-type]

    def buffer_updated(self, nbytes: int) -> None:
        """``nbytes`` were written at the start of what ``get_buffer`` lent."""
        self._end += nbytes

    def _room(self, n: int) -> None:
        """At least ``n`` free bytes at the end of the buffer. A fresh buffer is small
        (``MIN_BUFFER``: an idle shard, or one that sends short lines, holds no more);
        a line that outgrows it moves once, to one the size of the last long line
        (``_size_hint``), and a line longer still to one twice as large each time. A
        buffer whose bytes were mostly handed out (short lines, or an over-long line's
        ``overflow``) moves what it holds to the front of one the same size."""
        buf = self._buf
        if buf is not None and len(buf) - self._end >= n:
            return
        held = self._end - self._start
        if buf is None:
            size = max(MIN_BUFFER, n)
        elif held + n <= len(buf) // 2:  # mostly handed out already: what is held moves to the front
            size = len(buf)
        else:
            size = max(self._size_hint, 2 * len(buf), held + n)
        fresh = _bytearray(size)
        if held:
            fresh[:held] = memoryview(buf)[self._start : self._end]  # type: ignore[index]
        self._buf, self._scan, self._start, self._end = fresh, self._scan - self._start, 0, held

    @property
    def pending(self) -> int:
        """Bytes held that do not yet form a complete line."""
        return self._end - self._start

    # -- lines ---------------------------------------------------------------------

    def _find(self) -> int:
        """Where the first line end is in the buffer; -1 when none has arrived."""
        if self._buf is None:
            return -1
        nl = self._buf.find(b"\n", self._scan, self._end)
        self._scan = self._end if nl < 0 else nl
        return nl

    def _take(self, nl: int) -> bytes | bytearray:
        """The bytes before the line end at ``nl``, without one ``\r`` before it; they
        and the line end leave the buffer. A long line that starts the buffer leaves
        as the buffer itself, cut to the line; what follows it moves to a fresh one."""
        buf, start = self._buf, self._start
        assert buf is not None
        end = nl - 1 if nl > start and buf[nl - 1] == 13 else nl
        if end - start <= SMALL or start:
            line: bytes | bytearray = bytes(memoryview(buf)[start:end])
            self._drop(nl)
            return line
        rest = self._end - nl - 1
        self._size_hint = max(end + SLACK, MIN_BUFFER)
        self._buf, self._start, self._end, self._scan = None, 0, 0, 0
        if rest:
            self._room(rest)
            self._buf[:rest] = memoryview(buf)[nl + 1 : nl + 1 + rest]  # type: ignore[index]
            self._end = rest
        del buf[end:]  # cut to the line: no copy
        return buf

    def _drop(self, nl: int) -> None:
        """Everything up to the line end at ``nl`` leaves the buffer (all handed out:
        the buffer is reused from its start)."""
        self._start = self._scan = nl + 1
        if self._start == self._end:
            self._start = self._end = self._scan = 0

    def next_line(self) -> bytes | bytearray | None:
        """Return the next non-blank line, or None until more data arrives.

        Raises LineTooLong when the current line passes ``max_line_size``.
        """
        while True:
            nl = self._find()
            if nl < 0:
                if self._skipping:
                    self._skipped += self.pending
                    self._start = self._end = self._scan = 0
                elif self.pending > self.max_line_size:
                    self._start_skipping()
                return None
            if self._skipping:
                self._drop(nl)
                self._skipping = False
                continue
            if nl - self._start > self.max_line_size:
                self._start_skipping(nl - self._start)
            line = self._take(nl)
            if line and not line.isspace():
                return line

    def peek(self, n: int) -> bytes:
        """The first ``n`` bytes held (of the line not yet whole)."""
        if self._buf is None:
            return b""
        return bytes(memoryview(self._buf)[self._start : min(self._start + n, self._end)])

    @property
    def overflowing(self) -> bool:
        """Inside an over-long line (its end not yet taken)."""
        return self._skipping

    def overflow(self) -> tuple[bytes, bool]:
        """The over-long line's bytes that arrived since the last call (the first call
        starts at the line's first byte), and whether the line has ended (its end is
        not included, nor a ``\r`` before it)."""
        if not self._skipping:
            return b"", True
        nl = self._find()
        if nl < 0:
            buf, start, end = self._buf, self._start, self._end
            if buf is None or end == start:
                return b"", False
            keep = 1 if buf[end - 1] == 13 else 0  # maybe the \r of the line end
            chunk = bytes(memoryview(buf)[start : end - keep])
            self._start, self._scan = end - keep, end - keep
            if not keep:
                self._start = self._end = self._scan = 0
            self._skipped += len(chunk)
            return chunk, False
        chunk = self._take(nl)
        self._skipping = False
        return bytes(chunk) if isinstance(chunk, bytearray) else chunk, True

    def _start_skipping(self, size: int | None = None) -> None:
        """Enter the over-long line (``size``: its length, if its ``\n`` arrived)."""
        prefix = self.peek(PREFIX)
        self._skipping = True
        self._skipped = 0
        self._scan = self._start
        raise LineTooLong(self.pending if size is None else size, self.max_line_size, prefix)
