"""The native scan of a processRecords line for its sequence numbers (``_scan.c``,
``LazyRecords.sequence_numbers``) gives the positions pysimdjson's columns give
(``Position.batch``), or None and leaves the line to them: never other positions. The
arrival times it reads in the same pass are the columns' too, or say "read it again"
(``ODD_TIME``): never another time."""

from __future__ import annotations

import json
from array import array

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mldserver import native
from mldserver.rows.batch import NO_TIME, ODD_TIME
from mldserver.base.positions import Position, Positions
from mldserver.protocol import _scan, lazy as lazy_module
from mldserver.protocol.lazy import LazyRecords
from mldserver.shard.batches import LineRecords, decode_records

from .test_lazy import line_of, record


@pytest.fixture(autouse=True)
def native_scan(monkeypatch):
    """These are the native scan's tests: with ``MLDSERVER_NO_EXTENSIONS`` set,
    ``LazyRecords`` reads the columns instead (checked here), so the scan is put back by
    hand and tested all the same (it is built: ``_scan`` imported above)."""
    if not native.native_allowed():
        assert lazy_module._sequence_numbers is None, "MLDSERVER_NO_EXTENSIONS is set, yet lazy.py uses _scan"
        monkeypatch.setattr(lazy_module, "_sequence_numbers", _scan.sequence_numbers)


def scanned(line: bytes) -> list[Position] | None:
    lazy = LazyRecords.parse(line)
    assert lazy is not None
    found = lazy.sequence_numbers()
    if found is None:
        return None
    positions = Positions.scanned(*found[:3])
    return None if positions is None else list(positions)


def same_in_one_pass(line: bytes) -> None:
    """The check reading the positions in its own pass (``head(line, True)``, a sink
    downstream) says of the line what it says alone, and of its positions and arrival
    times what the scan's pass says; ``LazyRecords.parse(positions=True)`` hands that on."""
    both, alone = _scan.head(line, True), _scan.head(line)
    assert (both is None) == (alone is None)
    if both is not None:
        assert both[:4] == alone and both[4] == _scan.sequence_numbers(line)
        if lazy_module._head is not None:
            assert LazyRecords.parse(line, positions=True).sequence_numbers() == both[4]


def columns(line: bytes) -> list[Position | None]:
    lazy = LazyRecords.parse(line, keep=True)
    return list(Position.batch(*lazy.columns("sequenceNumber", "subSequenceNumber")))


def test_the_native_scan_is_built_and_reads_the_usual_batch():
    raws = [record(i) for i in range(3)] + [record(3, sequenceNumber="49590338271490256608559692538361571095921575989136588898",
                                                   subSequenceNumber=None)]
    lazy = LazyRecords.parse(line_of(raws))
    joined, n, ends, arrivals = lazy.sequence_numbers()  # None here would mean setup.py did not build _scan
    assert (joined[:9], n) == ("100101102", 4) and ends is not None
    assert array("q", arrivals).tolist() == [r["approximateArrivalTimestamp"] for r in raws]
    assert scanned(line_of(raws)) == columns(line_of(raws))
    assert scanned(line_of([record(i) for i in range(3)])) == [Position.parse(str(100 + i)) for i in range(3)]
    assert LazyRecords.parse(line_of([record(0)])).sequence_numbers()[:3] == ("100", 1, None)
    assert scanned(b'{"action":"processRecords","records":[],"millisBehindLatest":0}') == []


def test_a_batch_out_of_the_usual_is_left_to_the_columns():
    usual = record(0)
    unusual = (
        [usual, record(1, subSequenceNumber=2)],  # a KPL sub-record
        [usual, record(1, subSequenceNumber=False)],
        [usual, record(1, subSequenceNumber="0")],
        [usual, record(1, sequenceNumber="12x")],
        [usual, record(1, sequenceNumber="")],
        [usual, record(1, sequenceNumber=101)],
        [usual, record(1, sequenceNumber=None)],
        [usual, {"data": "bWVvdw=="}],  # no sequence number
        [usual, {}],
        [usual, 5],  # not an object
        [usual, ["101"]],
    )
    for raws in unusual:
        assert scanned(line_of(raws)) is None, raws
    lines = (
        # a key written with an escape: simdjson reads it as the key it names
        b'{"action":"processRecords","records":[{"sequence\\u004eumber":"2","sequenceNumber":"1"}],'
        b'"millisBehindLatest":0}',
        # a key twice in a record: simdjson's get takes the first, orjson the last
        b'{"action":"processRecords","records":[{"sequenceNumber":"1","sequenceNumber":"2"}],"millisBehindLatest":0}',
        b'{"action":"processRecords","records":[{"sequenceNumber":"1","subSequenceNumber":0,'
        b'"subSequenceNumber":3}],"millisBehindLatest":0}',
    )
    for line in lines:
        assert scanned(line) is None, line
    for line in (*lines, *(line_of(raws) for raws in unusual)):
        same_in_one_pass(line)
    assert LazyRecords.parse(line_of([usual], extra=1)).sequence_numbers() is not None
    assert Positions.scanned("1" * 5000, 1, None) is None  # past int's digits: Position.batch says so


def test_values_that_look_like_keys_and_nested_values_are_skipped():
    tricky = record(0, partitionKey='"sequenceNumber":"666"', data='x\\"sequenceNumber\\":\\"7\\"\\\\',
                    extra={"sequenceNumber": "5", "records": [{"sequenceNumber": "9"}]})
    line = (b'{"action":"processRecords","meta":{"records":[{"sequenceNumber":"9"}]},"records":'
            + json.dumps([tricky, record(1)]).encode() + b',"millisBehindLatest":0}')
    assert scanned(line) == columns(line) == [Position.parse("100"), Position.parse("101")]
    spaced = b'{ "action" : "processRecords" , "records" : [ { "sequenceNumber" : "7" , "subSequenceNumber" : null } ,' \
             b'\n{"subSequenceNumber": 0 ,"sequenceNumber":"08"} ] , "millisBehindLatest" : 0 }'
    assert scanned(spaced) == columns(spaced) == [Position.parse("7"), Position.parse("08")]
    # keys that begin as the usual ones do (which the scan compares whole) are other keys
    near = (b'{"action":"processRecords","records":[{"actions":"x","sequenceNumbers":"5","sequenceNumber":"1",'
            b'"subSequenceNumber0":7,"dataX":"a","approximateArrivalTimestamps":9}],"millisBehindLatest":0}')
    assert scanned(near) == columns(near) == [Position.parse("1")]
    for one in (line, spaced, near):
        same_in_one_pass(one)
    assert array("q", LazyRecords.parse(near).sequence_numbers()[3]).tolist() == [NO_TIME]
    assert scanned(b'{"action":"processRecords","records":[{"sequenceNumbe":"5"}],"millisBehindLatest":0}') is None


def test_a_first_record_unlike_the_others_sizes_the_outputs_wrong_and_they_grow():
    # The outputs are sized from the first record: here a long one with a short number,
    # then many short ones with long numbers (more records and digits than it said).
    first = '{"data":"%s","sequenceNumber":"7","approximateArrivalTimestamp":1}' % ("QUJD" * 500)
    rest = ['{"sequenceNumber":"%d","approximateArrivalTimestamp":%d}' % (10**59 + i, i) for i in range(3000)]
    line = ('{"action":"processRecords","records":[' + ",".join([first, *rest]) + '],"millisBehindLatest":0}').encode()
    assert scanned(line) == columns(line) and len(columns(line)) == 3001
    same_in_one_pass(line)
    assert array("q", LazyRecords.parse(line).sequence_numbers()[3]).tolist() == [1, *range(3000)]


def test_a_cut_or_broken_line_is_never_read_past_its_end():
    from mldserver.protocol._scan import sequence_numbers

    line = line_of([record(i, partitionKey='p\\"k') for i in range(3)])
    for i in range(len(line)):
        found = sequence_numbers(line[:i])
        assert found is None or found[1] <= 3
        if i < len(line.rstrip()):
            assert _scan.head(line[:i], True) is None  # (not a whole line: never read as one)
    for junk in (b"", b"{", b'{"records"', b'{"records":[{"sequenceNumber":"1', b'"', b"\\", b"[" * 100):
        assert sequence_numbers(junk) is None
    assert sequence_numbers(memoryview(line)) == sequence_numbers(bytearray(line)) == sequence_numbers(line)


_digits = st.from_regex(r"\A[0-9]{1,60}\Z")
_odd_seq = st.one_of(st.none(), st.integers(0, 2**62), st.text(max_size=4))
_odd_sub = st.one_of(st.integers(1, 5), st.booleans(), st.just(0.0), st.just(-0.0), st.just("0"))
_arrival = st.one_of(st.integers(0, 2**53), st.integers(-5, 5), st.integers(10**16, 10**20), st.none(),
                     st.floats(allow_nan=False, allow_infinity=False), st.booleans(), st.text(max_size=3))
_nested = st.recursive(st.none() | st.text(max_size=3), lambda inner: st.lists(inner, max_size=3)
                       | st.dictionaries(st.sampled_from(["sequenceNumber", "records", "a"]), inner, max_size=2))


def _member(key: str, value: object, escape: bool, spaced: bool = False) -> str:
    name = key[:-1] + f"\\u{ord(key[-1]):04x}" if escape else key  # (the same key, written otherwise)
    space = " " if spaced else ""  # before the colon and after the value
    return f'"{name}"{space}:{json.dumps(value, ensure_ascii=False)}{space}'


# Keys that begin as a record's usual keys do (the scan compares those whole) and are not them.
_near_keys = st.sampled_from(["actio", "actions", "dataX", "partitionKey2", "sequenceNumbers", "sequenceNumbe",
                              "subSequenceNumberX", "approximateArrival", "approximateArrivalTimestamps"])


@st.composite
def lines(draw) -> bytes:
    """Lines of usual records (in any key order, with other fields, text that looks
    like keys, keys that begin as the usual ones do, a space before the colons and
    after the values), each now and then made unusual: a record not an object, a
    sequence number or sub-sequence number of another kind, a key twice, a key escaped."""
    def odd() -> bool:
        return draw(st.integers(0, 39)) == 17  # (not 0: hypothesis draws its bounds often)

    records = []
    for _ in range(draw(st.integers(0, 8))):
        if odd():
            records.append(json.dumps(draw(st.one_of(st.integers(), st.none(), st.text(max_size=3)))))
            continue
        members = [("sequenceNumber", draw(_odd_seq) if odd() else draw(_digits))]
        sub = draw(st.sampled_from(["absent", 0, None]))
        if sub != "absent":
            members.append(("subSequenceNumber", draw(_odd_sub) if odd() else sub))
        if draw(st.booleans()):
            members.append(("data", draw(st.text(max_size=12))))
        if draw(st.booleans()):
            members.append(("partitionKey", draw(st.sampled_from(['"sequenceNumber":"1"', "\\", '\\"', "k"]))))
        if draw(st.integers(0, 4)) == 0:
            members.append(("nested", draw(_nested)))
        if draw(st.integers(0, 3)) != 0:
            members.append(("approximateArrivalTimestamp", draw(_arrival)))
        if draw(st.booleans()):
            members.append(("action", draw(st.sampled_from(["record", "", 7]))))
        if draw(st.integers(0, 3)) == 0:
            members.append((draw(_near_keys), draw(st.one_of(st.text(max_size=3), _digits))))
        members = draw(st.permutations(members))
        if odd():
            members.append(draw(st.sampled_from(members)))  # a key twice
        escaped = draw(st.sampled_from([k for k, _ in members])) if draw(st.integers(0, 29)) == 17 else None
        spaced = draw(st.integers(0, 9)) == 3  # a space before each colon and after each value
        records.append("{" + ",".join(_member(k, v, k == escaped, spaced) for k, v in members) + "}")
    ws = draw(st.sampled_from(["", " ", "\n "]))
    return (f'{{"action":"processRecords",{ws}"records":{ws}[{ws}' + f",{ws}".join(records)
            + f'{ws}],"millisBehindLatest":0}}').encode()


@settings(max_examples=400, deadline=None)
@given(lines())
def test_the_scan_and_the_columns_agree_on_any_line(line):
    same_in_one_pass(line)
    if LazyRecords.parse(line) is None:  # (a key twice in a record is still a line lazy.py reads)
        return
    found = scanned(line)
    if found is not None:
        assert found == columns(line)
        arrivals = array("q", LazyRecords.parse(line).sequence_numbers()[3])
        for at, given in zip(arrivals, LazyRecords.parse(line, keep=True).column("approximateArrivalTimestamp")):
            if at == NO_TIME:
                assert given is None
            elif at == ODD_TIME:  # read again the usual way: anything but a plain integer, or a huge one
                assert given is not None and not (type(given) is int and 0 <= given < 10**17)
            else:
                assert type(given) is int and given == at


def test_decode_records_takes_the_scanned_positions_for_a_sink():
    raws = [record(i) for i in range(5)]
    lazy = LazyRecords.parse(line_of(raws), keep=True)
    records, bad = decode_records(lazy, deaggregate_kpl=False, positions=True)
    assert bad == [] and isinstance(records, LineRecords)
    eager, _ = decode_records(raws, deaggregate_kpl=False, positions=True)
    assert isinstance(records.positions, Positions) and list(records.positions) == [r.position for r in eager]


# Strings long enough for the scan's sixteen-byte steps (SSE2) and for its long-string
# path (memchr past 64 bytes), quotes and backslashes anywhere in them: at a step's last
# byte, an escape pair split across two steps, an escaped quote after a long plain run.
_plain = st.builds(lambda n, rest: "a/é0"[n % 4] * n + rest, st.integers(0, 150),
                   st.text(alphabet=st.sampled_from(["a", "é", "/", "0"]), max_size=8))
_long_text = st.one_of(
    st.text(alphabet=st.sampled_from(['"', "\\", "a", "é", "\n", "/", "0"]), max_size=80),
    st.lists(st.tuples(_plain, st.sampled_from(['"', "\\", "\n", "\\\"", ""])), max_size=4).map(
        lambda runs: "".join(run + special for run, special in runs)),
)


@st.composite
def long_string_lines(draw) -> bytes:
    records = []
    for i in range(draw(st.integers(1, 5))):
        members = {"data": draw(_long_text), "partitionKey": draw(_long_text),
                   "sequenceNumber": draw(st.from_regex(r"\A[0-9]{1,60}\Z")), "approximateArrivalTimestamp": i}
        if draw(st.booleans()):
            members["pad"] = "x" * draw(st.integers(0, 40))  # shifts where the next strings start
        records.append(json.dumps(dict(draw(st.permutations(list(members.items())))), ensure_ascii=False))
    return ('{"action":"processRecords","records":[' + ",".join(records) + '],"millisBehindLatest":0}').encode()


@settings(max_examples=300, deadline=None)
@given(long_string_lines(), st.integers(0, 10_000))
def test_long_strings_with_escapes_anywhere_scan_as_the_columns_read_them_and_a_cut_batch_is_refused(line, cut):
    assert scanned(line) == columns(line)
    same_in_one_pass(line)
    from mldserver.pool._b64 import datas
    from mldserver.protocol._scan import sequence_numbers

    short = line[: cut % len(line)]  # the scan never reads past a line's end, wherever it is cut
    if len(short) <= line.rindex(b"]"):  # cut inside the records: not read (past them, the rest is not looked at)
        assert sequence_numbers(short) is None and datas(short) is None


def test_the_native_parts_allocate_nothing_from_python_while_the_gil_is_let_go():
    """The scan and the gather run without the GIL, while the server's other threads
    allocate: pymalloc's allocator then corrupts the heap (segfaults far away, seen at
    32 shards with a sink). Python's debug allocator aborts the process on any such call,
    so both run under it here, over enough records to grow every buffer."""
    import subprocess
    import sys

    script = (
        "import numpy as np\n"
        "from mldserver.protocol._scan import sequence_numbers\n"
        "from mldserver.coordinator._gather import gather\n"
        "line = (b'{\"action\":\"processRecords\",\"records\":[' + b','.join(\n"
        "    b'{\"data\":\"bWVvdw==\",\"sequenceNumber\":\"%d\",\"approximateArrivalTimestamp\":%d}' % (10**20 + i, i)\n"
        "    for i in range(5000)) + b']}')\n"
        "found = sequence_numbers(line)\n"
        "assert found[1] == 5000, found[1]\n"
        "out = bytearray(16)\n"
        "assert gather(out, [b'0123456789abcdef'], np.array([0, 0]), np.array([8, 0]), np.array([16, 8])) == 16\n"
        "assert bytes(out) == b'89abcdef01234567'\n"
    )
    run = subprocess.run([sys.executable, "-c", script], env={**__import__("os").environ, "PYTHONMALLOC": "debug"},
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
