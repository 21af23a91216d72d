"""A handler process's records of a batch's line (``frames.records_from``: ``LineRecord``,
``LineData``): the first ``data`` read decodes every record's at once, from the line's
bytes in one native pass (``pool/_b64.c``'s ``datas``), and gives exactly what ``Record.data``
gives (its strict SIMD reading, else binascii's lenient one), raising where it raises.
After the call (``LineData.close``) the line may be reused: a record read then decodes the
usual way, from what pysimdjson copied."""

from __future__ import annotations

import base64
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mldserver import native
from mldserver.api import records as records_module
from mldserver.api.records import Record
from mldserver.api.testing import make_records
from mldserver.pool import frames
from mldserver.protocol.lazy import LazyRecords

from ..protocol.test_lazy import line_of


@pytest.fixture(autouse=True, scope="module")
def native_datas():
    """These are the native decoding's tests: with ``MLDSERVER_NO_EXTENSIONS`` set, a
    handler process's records are plain ``Record``s (checked here), so ``_b64.datas``
    is put back by hand and tested all the same (it is built)."""
    if native.native_allowed():
        yield
        return
    from mldserver.pool._b64 import datas

    assert frames._datas is None, "MLDSERVER_NO_EXTENSIONS is set, yet pool/frames.py uses _b64"
    assert type(frames.records_from(line_of(make_records(1, 1)), line=True)[0]) is Record
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(frames, "_datas", datas)
        yield


def outcome(record: Record) -> object:
    try:
        return record.data
    except Exception as exc:  # what the handler would see, for the usual reading too
        return type(exc)


def test_the_first_data_read_decodes_every_records_at_once_and_none_the_usual_way(monkeypatch):
    raws = make_records(1, 50, 100)
    records = frames.records_from(line_of(raws), line=True)
    assert all(type(r) is frames.LineRecord and r._data is None for r in records)

    def usual(b64):  # the usual reading, pybase64 per record: not wanted for plain base64
        raise AssertionError("decoded record by record")

    monkeypatch.setattr(records_module, "decode_data", usual)
    assert records[7].data == base64.b64decode(raws[7]["data"])
    assert [r._data for r in records] == [base64.b64decode(r["data"]) for r in raws]  # all, at once


def test_a_record_read_after_its_call_decodes_from_its_own_copy_not_the_reused_line():
    raws = make_records(1, 5, 40)
    body = bytearray(line_of(raws))
    records = frames.records_from(memoryview(body), line=True)
    frames.line_of(records).close()  # the call is over: the arena's region goes back
    body[:] = b"x" * len(body)  # and is written over by the next batch
    assert [r.data for r in records] == [base64.b64decode(r["data"]) for r in raws]


@pytest.mark.parametrize("kept", ["none", "one record", "the list"])
def test_a_line_is_copied_at_its_calls_end_only_when_a_record_outlives_the_call(kept):
    raws = make_records(1, 50, 40)
    body = bytearray(line_of(raws))
    records = frames.records_from(memoryview(body), line=True)
    records[3].data  # (every record's data decoded: none reads the line again)
    line = frames.line_of(records)
    keep = {"none": None, "one record": records[7], "the list": records}[kept]
    del records  # the call is over: the batch goes
    line.close()
    if kept == "none":
        assert line.body is None  # nothing copied: no record is left to read it
        return
    assert isinstance(line.body, bytes) and line.body == bytes(body)  # copied before the region goes back
    body[:] = b"x" * len(body)  # and is written over by the next batch
    record = keep if kept == "one record" else keep[7]
    assert record.partition_key == raws[7]["partitionKey"] and record.data == base64.b64decode(raws[7]["data"])


_b64 = st.binary(max_size=40).map(lambda b: base64.b64encode(b).decode())
_junk = st.one_of(
    st.text(alphabet="ABCab01+/=-_ \n\\\"é", max_size=12),  # outside the alphabet, misplaced padding
    _b64.map(lambda s: s[:-1]),  # cut short
    _b64.map(lambda s: s.replace("/", "\\/")),  # written with an escape (json.dumps keeps it)
    st.sampled_from(["QR==", "QUJ=", "QUI=", "=", "==", "A===", "Zg", "Zg=", "Zg==", "Zm9v", ""]),
)
# Long enough for the AVX2 steps (32 characters each, pool/_b64.c's quads32), whole or
# with one character put anywhere: outside the alphabet, padding, or another of it.
_long = st.binary(min_size=24, max_size=400).map(lambda b: base64.b64encode(b).decode())
_one_put = st.tuples(_long, st.integers(0, 1 << 20), st.sampled_from(list("=-_.:@[`{~*,A/+0\x7f"))).map(
    lambda t: t[0][: t[1] % len(t[0])] + t[2] + t[0][t[1] % len(t[0]) + 1 :])
_data = st.one_of(_b64, _b64, _long, _one_put, _junk, st.none(), st.integers(), st.booleans(), st.just("absent"))


@st.composite
def batches(draw) -> bytes:
    raws = []
    for i in range(draw(st.integers(0, 8))):
        if draw(st.integers(0, 30)) == 7:
            raws.append(draw(st.sampled_from(["a string", 5, None, ["data"]])))  # not an object
            continue
        members = [f'"sequenceNumber":"{i + 1}"']
        data = draw(_data)
        if data != "absent":
            members.append('"data":' + (json.dumps(data).replace("\\\\/", "\\/") if isinstance(data, str)
                                         else json.dumps(data)))
        if draw(st.integers(0, 9)) == 3:
            members.append('"data":"Zm9v"')  # a key twice: the first counts (pysimdjson's get)
        if draw(st.integers(0, 9)) == 4:
            members.append('"nested":{"data":"Zm9v"}')
        if draw(st.integers(0, 19)) == 5:
            members.append('"d\\u0061ta":"Zm9v"')  # a key written with an escape
        members = draw(st.permutations(members))
        raws.append("{" + ",".join(members) + "}")
    return ('{"action":"processRecords","records":[' + ",".join(
        r if isinstance(r, str) and r.startswith("{") else json.dumps(r) for r in raws)
        + '],"millisBehindLatest":0}').encode()


@settings(max_examples=400, deadline=None)
@given(batches())
def test_the_native_decoding_gives_what_the_usual_one_gives(line):
    lazy = LazyRecords.parse(line, keep=True)
    if lazy is None:
        return
    usual = [outcome(Record(raw)) for raw in lazy.objects()]  # Record.data on the same lazy objects
    records = frames.records_from(line, line=True)
    assert [outcome(r) for r in reversed(records)] == usual[::-1]  # the first read (the last record) decodes all


def test_the_32_character_steps_refuse_what_the_four_character_loop_refuses():
    """A seeded campaign on ``datas`` itself, the line's bytes as given (the property test
    above writes its lines with ``json.dumps``, which escapes every byte past ASCII): long
    plain base64 with one character put anywhere, raw UTF-8 among them, decodes exactly
    where strict, canonical base64 does, and is left to the usual reading (None) elsewhere."""
    import random

    from mldserver.pool._b64 import datas

    rng = random.Random(56)
    put = [*"=-_.:@[`{~*, A/+0z\x7f\x01", "é", "ÿ", "€", "\U0001f600"]
    for _ in range(3000):
        text = base64.b64encode(rng.randbytes(rng.randrange(0, 700))).decode()
        if text and rng.random() < 0.7:
            at = rng.randrange(len(text))
            text = text[:at] + rng.choice(put) + text[at + 1 :]
        try:
            strict = base64.b64decode(text, validate=True)
        except ValueError:  # (binascii.Error; past ASCII, a ValueError of its own)
            strict = None
        if strict is not None and base64.b64encode(strict).decode() != text:
            strict = None  # not canonical (its last bits, or a padding put where a character was)
        line = b'{"records":[{"data":"' + text.encode() + b'"}]}'
        assert datas(line) == [strict], text
