"""A shard position: where a record sits in its shard, parsed once at the edge.

The daemon names a record by ``sequenceNumber`` (a string of 20 to 56+ digits, which
must never pass through a float) and, for a KPL sub-record, ``subSequenceNumber``.
``Position`` keeps both forms: ``seq`` as an int to compare, ``text`` as the daemon
wrote it (leading zeros and all) to send back in a checkpoint::

    p = Position.parse("49590338271490256608559692538361571095921575989136588898", 3)
    p.seq == 49590338271490256608559692538361571095921575989136588898; p.sub == 3
    p.text == "49590338271490256608559692538361571095921575989136588898"
    Position.parse("TRIM_HORIZON", None) is None      # a sentinel, not a position
    Position.parse("12x", 0) is None                   # not digits: a bad record
    p.to_json() == ["4959...8898", 3]                  # the spool's and commit log's form
    Position.from_json(["4959...8898", 3]) == p

It is a NamedTuple, so positions sort as plain tuples (by ``seq``, then ``sub``) at C
speed, and ``max()`` over positions is the highest. A missing sub-sequence number
counts as 0, as the KCL does.
"""

from __future__ import annotations

import operator
import sys
from array import array
from itertools import accumulate, islice, repeat
from typing import Any, Iterator, NamedTuple, Sequence, overload

_DIGITS = "0123456789"


class Position(NamedTuple):
    seq: int
    sub: int
    text: str

    @classmethod
    def parse(cls, sequence_number: Any, sub_sequence_number: Any = None) -> Position | None:
        """The position the daemon's values name, or None when they name none (a
        sentinel such as ``TRIM_HORIZON`` or ``SHARD_END``, a non-digit string, a
        non-string, a negative or non-integer sub-sequence number)."""
        return _parse(sequence_number, sub_sequence_number)

    @classmethod
    def parse_all(cls, sequence_numbers: list[Any], sub_sequence_numbers: list[Any]) -> list[Position | None]:
        """``parse`` over a batch, at a fraction of the cost when every value is good
        (the usual case): checked together, converted in C."""
        if _usual(sequence_numbers, sub_sequence_numbers) is not None:
            return list(map(_new, repeat(cls), zip(map(int, sequence_numbers), repeat(0), sequence_numbers)))
        return list(map(_parse, sequence_numbers, sub_sequence_numbers))

    @classmethod
    def batch(cls, sequence_numbers: list[Any], sub_sequence_numbers: list[Any]) -> Sequence[Position | None]:
        """``parse_all``'s answer for a batch, where each position is made only when
        read if every value is good in its usual form (``Positions``): whoever keeps a
        batch's rows (the coordinator) reads few of its positions."""
        joined = _usual(sequence_numbers, sub_sequence_numbers)
        if joined is not None:
            return Positions.of(sequence_numbers, joined)
        return cls.parse_all(sequence_numbers, sub_sequence_numbers)

    def to_json(self) -> list[Any]:
        return [self.text, self.sub]

    @classmethod
    def from_json(cls, value: Any) -> Position:
        """The inverse of ``to_json``; ValueError for anything else (a corrupt file)."""
        if isinstance(value, list) and len(value) == 2:
            position = cls.parse(value[0], value[1])
            if position is not None:
                return position
        raise ValueError(f"not a position: {value!r} (expected [\"<digits>\", <sub>])")

    def __repr__(self) -> str:
        return f"Position({self.text!r}, {self.sub})"


_new = tuple.__new__
_ZERO_SUBS = frozenset({0, None})  # what a record that is not a KPL sub-record carries
_SUB_TYPES = frozenset({int, type(None)})


def _usual(sequence_numbers: list[Any], sub_sequence_numbers: list[Any]) -> str | None:
    """The sequence numbers joined, if every one is a string of ASCII digits ``int``
    takes and every sub-sequence number is 0 or None; else None. Checked together, in C."""
    try:
        joined = "".join(sequence_numbers)
    except TypeError:  # some value is not a string
        return None
    limit = sys.get_int_max_str_digits() or len(joined)  # 0: no limit
    usual = (
        joined.isascii()
        and joined.encode("ascii").isdigit()  # bytes.isdigit is a byte table; str's walks Unicode
        and "" not in sequence_numbers
        and max(map(len, sequence_numbers)) <= limit
        and set(map(type, sub_sequence_numbers)) <= _SUB_TYPES  # not False, which equals 0; hashable
        and set(sub_sequence_numbers) <= _ZERO_SUBS
    )
    return joined if usual else None


class Positions(Sequence[Position]):
    """A batch's positions, every one checked (``Position.batch``), each made when
    read: the sequence numbers as the daemon wrote them, every sub-sequence number 0::

        positions = Position.batch(["100", "101", "102"], [None, None, 0])
        positions[-1] == Position(102, 0, "102"); len(positions) == 3
        bisect.bisect_right(positions, Position(100, 0, "100")) == 1   # a few made, not all
        positions.sliced(1, 3)         # Positions(2): "101", "102", in a string of their own

    They are kept as one string, the numbers joined: a 56-digit sequence number takes
    56 bytes, not the 113 of a string and its pointer of its own (the coordinator keeps
    a batch's positions until its rows commit, 10,000 of them a batch). ``width``: the
    numbers' one length (the usual batch), or 0 and ``ends`` says where each ends.
    """

    __slots__ = ("joined", "width", "ends")

    def __init__(self, joined: Any, width: int, ends: Any = None) -> None:
        self.joined = joined  # a str; or a file's ASCII bytes, mapped (``RowBatch.spilled``)
        self.width = width
        self.ends = ends  # with width 0: where each number starts, then len(joined) (an array)

    @classmethod
    def of(cls, texts: Sequence[str], joined: str | None = None) -> Positions:
        """``texts`` (checked: ASCII digits), and their join if already made."""
        if joined is None:
            joined = "".join(texts)
        widths = set(map(len, texts))
        if len(widths) == 1:
            return cls(joined, widths.pop())
        return cls(joined, 0, array("q", accumulate(map(len, texts), initial=0)))

    @classmethod
    def scanned(cls, joined: str, n: int, ends: bytes | None) -> Positions | None:
        """The native scan's answer (``protocol.lazy.LazyRecords.sequence_numbers``:
        ``n`` numbers of ASCII digits joined, and their ends where their widths differ),
        or None where ``int`` would refuse one (longer than
        ``sys.get_int_max_str_digits``: ``Position.batch`` says which)::

            Positions.scanned("100101", 2, None)[1] == Position(101, 0, "101")
        """
        if ends is None:
            width = len(joined) // n if n else 0
            positions, longest = cls(joined, width), width
        else:
            offsets = array("q")
            offsets.frombytes(ends)
            positions = cls(joined, 0, offsets)
            longest = max(map(operator.sub, islice(offsets, 1, None), offsets))
        limit = sys.get_int_max_str_digits()
        return None if limit and longest > limit else positions

    def __len__(self) -> int:
        if self.ends is None:
            return len(self.joined) // self.width if self.width else 0
        return len(self.ends) - 1

    def text(self, i: int) -> str:
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError("position index out of range")
        if self.ends is None:
            w = self.width
            text = self.joined[i * w : (i + 1) * w]
        else:
            text = self.joined[int(self.ends[i]) : int(self.ends[i + 1])]
        return text if type(text) is str else bytes(text).decode("ascii")  # a file's bytes (``RowBatch.spilled``)

    def texts(self) -> Iterator[str]:
        return map(self.text, range(len(self)))

    @overload
    def __getitem__(self, i: int) -> Position: ...

    @overload
    def __getitem__(self, i: slice) -> list[Position]: ...

    def __getitem__(self, i: int | slice) -> Position | list[Position]:
        if isinstance(i, slice):
            return [_made(self.text(j)) for j in range(*i.indices(len(self)))]
        return _made(self.text(i))

    def __iter__(self) -> Iterator[Position]:
        return map(_made, self.texts())

    def __contains__(self, value: object) -> bool:
        return isinstance(value, Position) and value.sub == 0 and value.text in self.texts()

    def sliced(self, start: int, stop: int) -> Positions:
        """Positions ``start`` to ``stop`` (not included), in a string of their own."""
        if self.ends is None:
            w = self.width
            joined, ends = self.joined[start * w : stop * w], None
        else:
            base = int(self.ends[start])
            joined = self.joined[base : int(self.ends[stop])]
            ends = array("q", (int(e) - base for e in self.ends[start : stop + 1]))
        return Positions(joined if type(joined) is str else bytes(joined).decode("ascii"), self.width, ends)

    def nbytes(self) -> int:
        """The memory these positions hold (none in a file, ``RowBatch.spilled``)."""
        if type(self.joined) is not str:
            return 0
        return sys.getsizeof(self.joined) + (0 if self.ends is None else self.ends.itemsize * len(self.ends))

    def __repr__(self) -> str:
        return f"Positions({len(self)})"


def _made(text: str) -> Position:
    return _new(Position, (int(text), 0, text))


def _parse(text: Any, sub: Any) -> Position | None:
    # On the hot path (every record a sink sees): ``str.isdigit`` walks 56 characters
    # through the Unicode tables (about 350 ns); ``int`` already refuses all but digits,
    # signs, underscores and surrounding spaces, which the ASCII and end checks rule out.
    if type(text) is not str or not text or not text.isascii() or "_" in text:
        return None
    if text[0] not in _DIGITS or text[-1] not in _DIGITS:
        return None
    try:
        seq = int(text)
    except ValueError:  # inner spaces, or past int's digit limit
        return None
    if sub is None:
        sub = 0
    elif type(sub) is not int or sub < 0:
        return None
    return _new(Position, (seq, sub, text))
