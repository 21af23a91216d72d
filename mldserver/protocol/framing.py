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

A line longer than ``max_line_size`` raises :class:`LineTooLong` once; the rest of
that line is then discarded up to its ``\\n`` so the following lines still frame.
"""

from __future__ import annotations

from .errors import ProtocolError

DEFAULT_MAX_LINE_SIZE = 256 * 1024 * 1024


class LineTooLong(ProtocolError):
    """A line grew past ``max_line_size`` bytes; ``prefix`` holds its first bytes."""

    def __init__(self, size: int, limit: int, prefix: bytes) -> None:
        super().__init__(
            f"a line from the daemon exceeds {limit} bytes (max_line_size); "
            f"it was skipped; raise max_line_size if batches are really this large"
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
                self._start_skipping()
                continue
            end = nl - 1 if nl > 0 and buf[nl - 1] == 0x0D else nl
            with memoryview(buf) as view:
                line = bytes(view[:end])
            del buf[: nl + 1]
            self._scan = 0
            if not buf:  # drop a multi-megabyte allocation between batches
                self._buf = buf = bytearray()
            if line.strip():
                return line

    def _start_skipping(self) -> None:
        prefix = bytes(self._buf[:200])
        size = len(self._buf)
        self._skipping = True
        self._skipped = 0
        raise LineTooLong(size, self.max_line_size, prefix)
