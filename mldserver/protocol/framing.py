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

from .errors import ProtocolError

DEFAULT_MAX_LINE_SIZE = 256 * 1024 * 1024
PREFIX = 1024  # bytes of an over-long line handed out with LineTooLong


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
    """Accumulates bytes and hands out complete lines, without the line end."""

    __slots__ = ("_buf", "_scan", "_skipping", "_skipped", "max_line_size", "eof")

    def __init__(self, max_line_size: int = DEFAULT_MAX_LINE_SIZE) -> None:
        self._buf = bytearray()
        self._scan = 0  # bytes of _buf already known to hold no b"\n"
        self._skipping = False  # inside an over-long line, dropping bytes to its end
        self._skipped = 0
        self.max_line_size = max_line_size
        self.eof = False

    def feed(self, data: bytes) -> None:
        """Add bytes; ``b""`` marks the end of input."""
        if not data:
            self.eof = True
            return
        self._buf += data

    @property
    def pending(self) -> int:
        """Bytes held that do not yet form a complete line."""
        return len(self._buf)

    def next_line(self) -> bytes | None:
        """Return the next non-blank line, or None until more data arrives.

        Raises LineTooLong when the current line passes ``max_line_size``.
        """
        buf = self._buf
        while True:
            nl = buf.find(b"\n", self._scan)
            if nl < 0:
                if self._skipping:
                    self._skipped += len(buf)
                    del buf[:]
                    self._scan = 0
                elif len(buf) > self.max_line_size:
                    self._start_skipping()
                else:
                    self._scan = len(buf)
                return None
            if self._skipping:
                del buf[: nl + 1]
                self._scan = 0
                self._skipping = False
                continue
            if nl > self.max_line_size:
                self._start_skipping(nl)
            end = nl - 1 if nl > 0 and buf[nl - 1] == 0x0D else nl
            with memoryview(buf) as view:
                line = bytes(view[:end])
            del buf[: nl + 1]
            self._scan = 0
            if not buf:  # drop a multi-megabyte allocation between batches
                self._buf = buf = bytearray()
            if line.strip():
                return line

    def peek(self, n: int) -> bytes:
        """The first ``n`` bytes held (of the line not yet whole)."""
        return bytes(self._buf[:n])

    @property
    def overflowing(self) -> bool:
        """Inside an over-long line (its end not yet taken)."""
        return self._skipping

    def overflow(self) -> tuple[bytes, bool]:
        """The over-long line's bytes that arrived since the last call (the first call
        starts at the line's first byte), and whether the line has ended (its end is
        not included, nor a ``\\r`` before it)."""
        if not self._skipping:
            return b"", True
        buf = self._buf
        nl = buf.find(b"\n")
        if nl < 0:
            keep = 1 if buf.endswith(b"\r") else 0  # maybe the \r of the line end
            chunk = bytes(buf[: len(buf) - keep])
            del buf[: len(buf) - keep]
            self._skipped += len(chunk)
            self._scan = 0
            return chunk, False
        end = nl - 1 if nl > 0 and buf[nl - 1] == 0x0D else nl
        chunk = bytes(buf[:end])
        del buf[: nl + 1]
        self._scan = 0
        self._skipping = False
        return chunk, True

    def _start_skipping(self, end: int | None = None) -> None:
        """Enter the over-long line (``end``: where its ``\\n`` is, if it arrived)."""
        buf = self._buf
        prefix = bytes(buf[:PREFIX])
        size = len(buf) if end is None else end
        self._skipping = True
        self._skipped = 0
        self._scan = 0
        raise LineTooLong(size, self.max_line_size, prefix)
