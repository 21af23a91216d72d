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

from itertools import repeat
from typing import Any, NamedTuple

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
        try:
            joined = "".join(sequence_numbers)
        except TypeError:  # some value is not a string
            joined = ""
        if (
            joined.isascii()
            and joined.encode("ascii").isdigit()  # bytes.isdigit is a byte table; str's walks Unicode
            and "" not in sequence_numbers
            and set(sub_sequence_numbers) <= _ZERO_SUBS
            and set(map(type, sub_sequence_numbers)) <= _SUB_TYPES  # not False, which equals 0
        ):
            try:
                seqs = list(map(int, sequence_numbers))
            except ValueError:  # past int's digit limit
                pass
            else:
                return list(map(_new, repeat(cls), zip(seqs, repeat(0), sequence_numbers)))
        return list(map(_parse, sequence_numbers, sub_sequence_numbers))

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
