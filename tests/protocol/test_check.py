"""The server's native check of a processRecords line (``_check.h``, ``_scan.head``):
a line it reads, pysimdjson reads too, with the same number of records, the same last
record and the same millisBehindLatest; anything else it leaves to pysimdjson (None),
never reading past the line's end. And the daemon's usual lines are read by it."""

from __future__ import annotations

import json
import random

import orjson
import pytest

from mldserver import native
from mldserver.protocol import _scan, lazy as lazy_module
from mldserver.protocol.lazy import LazyRecords

from .test_lazy import line_of, record

head = _scan.head  # built by setup.py (imported whatever MLDSERVER_NO_EXTENSIONS says)


def checked(line: bytes):
    """What the native check reads of ``line``: (records, the last one, millisBehindLatest), or None."""
    found = head(line)
    if found is None:
        return None
    n, start, end, mbl = found
    return n, (orjson.loads(line[start:end]) if n else None), mbl


def parsed(line: bytes, monkeypatch):
    """What pysimdjson reads of ``line`` (the path without the check), or None."""
    with monkeypatch.context() as m:
        m.setattr(lazy_module, "_head", None)
        records = LazyRecords.parse(line)
    if records is None:
        return None
    return len(records), records.last(), records.millis_behind_latest


def same(a, b) -> bool:
    """Equal, and of the same types all through (True is not 1, 1.0 is not 1)."""
    return repr(a) == repr(b)


def test_the_usual_line_is_read_by_the_check_as_pysimdjson_reads_it(monkeypatch):
    raws = [record(i) for i in range(5)]
    line = line_of(raws, mbl=1234)
    assert checked(line) == (5, raws[-1], 1234) and same(checked(line), parsed(line, monkeypatch))
    assert checked(line_of([], mbl=None)) == (0, None, None)
    assert checked(b'{"action":"processRecords","records":[]}') == (0, None, None)
    assert checked(b' {"action" : "processRecords" ,\t"records" : [ 1 , {"a":[]} ] }\r\n') == (2, {"a": []}, None)
    assert checked(line_of([record(0, partitionKey='"q" \\ / \t\n\b\f', nested=[[], {}, True, None, -5])]))
    assert head(memoryview(line)) == head(bytearray(line)) == head(line)
    if native.native_allowed():  # LazyRecords reads it so, and pysimdjson is not asked
        monkeypatch.setattr(lazy_module, "_parse", None)
        records = LazyRecords.parse(line)
        assert (len(records), records.last(), records.millis_behind_latest) == (5, raws[-1], 1234)


@pytest.mark.parametrize(
    "line",
    [
        line_of([record(0, partitionKey="é")]),  # a byte past ASCII
        line_of([record(0, partitionKey="\\u00e9")]).replace(b"\\\\u", b"\\u"),  # a \u escape
        line_of([record(0, x=1.5)]),  # a fraction
        line_of([record(0, x=10**18)]),  # 19 digits
        line_of([record(0)]).replace(b'"subSequenceNumber": 0', b'"subSequenceNumber": -0'),
        line_of([record(0)]).replace(b'"subSequenceNumber": 0', b'"subSequenceNumber": 1e3'),
        line_of([record(0)]).replace(b'"subSequenceNumber": 0', b'"subSequenceNumber": 01'),
        line_of([record(0)], mbl=True),
        line_of([record(0)], mbl="5"),
        line_of([record(0)], mbl=0.5),
        line_of("records"),  # not an array
        line_of([record(0)]).replace(b'"processRecords"', b'"processRecordz"'),
        b'{"action":"processRecords","records":[],"action":"processRecords"}',  # a key twice
        b'{"action":"processRecords","rec\\u006frds":[]}',  # a key escaped
        b'{"action":"processRecords","records":[],' + b",".join(b'"k%d":0' % i for i in range(15)) + b"}",
        b'{"action":"processRecords","records":[' + b"{}," * 9 + b"[" * 90 + b"]" * 90 + b"]}",  # nested too deep
        b'{"action":"processRecords","records":[1,]}',
        b'{"action":"processRecords","records":[1]} x',
        b'{"action":"processRecords","records":[1]}{}',
        b'{"action":"processRecords","records":["a\x01b"]}',  # a control byte
        b'{"action":"processRecords","records":["a\x7fb", nul]}',
        b'{"action":"processRecords","records":["\\x"]}',
        b'{"action":"processRecords"}',  # no records
        b'{"records":[]}',  # no action
        b"[]",
        b"",
    ],
)
def test_a_line_out_of_the_usual_is_left_to_pysimdjson(line):
    assert head(line) is None


def test_the_limits_are_where_they_are_said_to_be():
    start = b'{"action":"processRecords","records":['
    deep = b"[" * 63 + b"]" * 63  # in the records array (1 deep): 64 deep, the limit
    assert head(start + deep + b"]}") == (1, len(start), len(start) + len(deep), None)
    assert head(start + b"[" + deep + b"]]}") is None
    keys = b",".join(b'"k%d":0' % i for i in range(14))  # with action and records: 16 keys
    assert head(b'{"action":"processRecords","records":[],' + keys + b"}") == (0, -1, -1, None)
    assert checked(line_of([record(0, x=-(10**18 - 1), y=10**18 - 1)]))[1]["x"] == -(10**18 - 1)


def test_a_cut_line_is_never_read_past_its_end():
    line = line_of([record(i, partitionKey='p\\"k' + "x" * 70) for i in range(3)])
    for i in range(len(line) - 1):  # (the last byte is the line end: the line without it is whole)
        assert head(line[:i]) is None
        assert head(bytearray(line[:i])) is None


# The seeded campaign: lines the daemon could send and many it never would, each then
# broken at random; the check must never read a line pysimdjson refuses or reads otherwise.

_STRINGS = ["", "a", "bWVvdw==", "x" * 40, "y" * 200, 'q"q', "b\\s", "s/l", "t\tn\nr\r", "\b\f", "é", "\u2028",
            "\U0001f600", "\x00", "\x1f", "\x7f", "sequenceNumber", "}]"]
_NUMBERS = [0, 1, -1, 7, 10**17, 10**18 - 1, 10**18, -(10**18 - 1), 2**63, -(2**63), 2**64, 2**70, 1.5, -0.0,
            1e300, 0.1]
_KEYS = ["data", "partitionKey", "sequenceNumber", "subSequenceNumber", "approximateArrivalTimestamp", "action",
         "a", "data2", "é", 'k"', "k\\", "records", "millisBehindLatest"]


def _value(rng: random.Random, depth: int):
    kind = rng.randrange(10 if depth < 70 else 6)
    if kind < 3:
        return rng.choice(_STRINGS)
    if kind < 5:
        return rng.choice(_NUMBERS)
    if kind == 5:
        return rng.choice([True, False, None])
    if kind < 8:
        return [_value(rng, depth + 1) for _ in range(rng.randrange(3))]
    return {rng.choice(_KEYS): _value(rng, depth + 1) for _ in range(rng.randrange(3))}


def _usual(rng: random.Random, i: int) -> dict:
    return {"action": "record", "data": "A" * rng.randrange(300), "partitionKey": f"pk-{rng.randrange(99)}",
            "sequenceNumber": str(rng.randrange(10**56)), "subSequenceNumber": 0,
            "approximateArrivalTimestamp": 1_700_000_000_000 + i}


def _line(rng: random.Random) -> tuple[bytes, bool]:
    """A line, and whether it is a usual one (the check must read it)."""
    usual = rng.random() < 0.3
    if usual:
        records = [_usual(rng, i) for i in range(rng.randrange(6))]
        top = {"action": "processRecords", "records": records, "millisBehindLatest": rng.choice([0, 5, None])}
    else:
        records = [rng.choice([_usual(rng, i), _value(rng, 0)]) for i in range(rng.randrange(6))]
        top = {"action": "processRecords", "records": records}
        for _ in range(rng.randrange(3)):
            top[rng.choice(_KEYS + ["checkpoint", "k"])] = _value(rng, 1)
        if rng.random() < 0.1:
            top["records"] = [[_value(rng, 66)]]  # deep
    text = json.dumps(top, ensure_ascii=rng.random() < 0.5, separators=rng.choice([(",", ":"), (", ", ": ")]))
    if not usual and rng.random() < 0.1:  # a key twice
        text = text[:-1] + ', "action": "processRecords"}'
    return text.encode("utf-8", "surrogatepass"), usual


_JUNK = [b"{", b"}", b"[", b"]", b'"', b":", b",", b"\\", b" ", b"0", b"9", b"-", b".", b"e", b"n", b"t", b"u",
         b"\x00", b"\x1f", b"\x7f", b"\xc3", b"\xa9", b"\xff", b"\n", b"\r"]


def _broken(rng: random.Random, line: bytes) -> bytes:
    line = bytearray(line)
    for _ in range(rng.randrange(1, 4)):
        at = rng.randrange(len(line) + 1)
        how = rng.randrange(4)
        if how == 0 and at < len(line):
            line[at: at + 1] = rng.choice(_JUNK)
        elif how == 1:
            line[at:at] = rng.choice(_JUNK)
        elif how == 2:
            del line[at: at + rng.randrange(1, 4)]
        else:
            end = min(len(line), at + rng.randrange(1, 30))
            line[at:at] = line[at:end]
    return bytes(line)


@pytest.mark.parametrize("seed", range(6))
def test_the_check_never_reads_a_line_otherwise_than_pysimdjson(seed, monkeypatch):
    rng = random.Random(seed)
    read = usual_read = 0
    for _ in range(1500):
        line, usual = _line(rng)
        for candidate in (line, _broken(rng, line)):
            found = checked(candidate)
            if found is None:
                assert not (usual and candidate is line), f"a usual line not read by the check: {line[:300]!r}"
                continue
            reference = parsed(candidate, monkeypatch)
            assert reference is not None, f"read by the check, refused by pysimdjson: {candidate!r}"
            assert same(found, reference), candidate
            read += 1
            usual_read += usual
    assert read > usual_read > 300  # the campaign reads lines of every kind, not only the usual ones
