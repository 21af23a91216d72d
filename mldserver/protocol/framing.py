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
    """Accumulates bytes and hands out complete lines, without the line end.

    The pieces fed are kept as they came and joined once, into the line: a line of
    megabytes is copied once here (a growing buffer copied it twice, each time into
    pages fresh from the kernel: some 2 ms a 3 MB line, ``pool/malloc.py``)."""

    __slots__ = ("_parts", "_size", "_scan", "_skipping", "_skipped", "max_line_size", "eof")

    def __init__(self, max_line_size: int = DEFAULT_MAX_LINE_SIZE) -> None:
        self._parts: list[bytes] = []  # what was fed and not handed out, in order
        self._size = 0  # their bytes
        self._scan = 0  # parts known to hold no b"\n"
        self._skipping = False  # inside an over-long line, dropping bytes to its end
        self._skipped = 0
        self.max_line_size = max_line_size
        self.eof = False

    def feed(self, data: bytes) -> None:
        """Add bytes; ``b""`` marks the end of input."""
        if not data:
            self.eof = True
            return
        self._parts.append(bytes(data))
        self._size += len(data)

    @property
    def pending(self) -> int:
        """Bytes held that do not yet form a complete line."""
        return self._size

    def _find(self) -> tuple[int, int, int]:
        """Where the first line end is: (part, offset in it, bytes before it); (-1, -1, -1)
        when none has arrived."""
        parts = self._parts
        for i in range(self._scan, len(parts)):
            nl = parts[i].find(b"\n")
            if nl >= 0:
                return i, nl, sum(map(len, parts[:i])) + nl
        self._scan = len(parts)
        return -1, -1, -1

    def _take(self, i: int, nl: int) -> bytes:
        """The bytes before the line end at (part ``i``, offset ``nl``), without one
        ``\r`` before it; they and the line end leave the buffer."""
        parts = self._parts
        pieces = parts[:i]
        if nl:
            pieces.append(parts[i][:nl])  # parts are never empty: so neither is a piece
        if pieces and pieces[-1].endswith(b"\r"):
            pieces[-1] = pieces[-1][:-1]
        self._drop(i, nl)
        return pieces[0] if len(pieces) == 1 else b"".join(pieces)

    def _drop(self, i: int, nl: int) -> None:
        """Everything up to the line end at (part ``i``, offset ``nl``) leaves the buffer."""
        parts = self._parts
        rest = parts[i][nl + 1 :]
        self._parts = [rest, *parts[i + 1 :]] if rest else parts[i + 1 :]
        self._size = sum(map(len, self._parts))
        self._scan = 0

    def next_line(self) -> bytes | None:
        """Return the next non-blank line, or None until more data arrives.

        Raises LineTooLong when the current line passes ``max_line_size``.
        """
        while True:
            i, nl, at = self._find()
            if i < 0:
                if self._skipping:
                    self._skipped += self._size
                    self._parts, self._size, self._scan = [], 0, 0
                elif self._size > self.max_line_size:
                    self._start_skipping()
                return None
            if self._skipping:
                self._drop(i, nl)
                self._skipping = False
                continue
            if at > self.max_line_size:
                self._start_skipping(at)
            line = self._take(i, nl)
            if line.strip():
                return line

    def peek(self, n: int) -> bytes:
        """The first ``n`` bytes held (of the line not yet whole)."""
        out = b""
        for part in self._parts:
            if len(out) >= n:
                break
            out += part[: n - len(out)]
        return out

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
        i, nl, _ = self._find()
        if i < 0:
            held = b"".join(self._parts)
            keep = 1 if held.endswith(b"\r") else 0  # maybe the \r of the line end
            chunk = held[: len(held) - keep]
            self._parts = [held[len(held) - keep :]] if keep else []
            self._size, self._scan = keep, 0
            self._skipped += len(chunk)
            return chunk, False
        chunk = self._take(i, nl)
        self._skipping = False
        return chunk, True

    def _start_skipping(self, end: int | None = None) -> None:
        """Enter the over-long line (``end``: where its ``\n`` is, if it arrived)."""
        prefix = self.peek(PREFIX)
        size = self._size if end is None else end
        self._skipping = True
        self._skipped = 0
        self._scan = 0
        raise LineTooLong(size, self.max_line_size, prefix)
