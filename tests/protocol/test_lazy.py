"""A processRecords line read lazily (handler processes read the records) means the
same as the line read whole: the same records, the same millisBehindLatest, the same
errors for what the daemon should never send."""

from __future__ import annotations

import json
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mldserver.base.positions import Position
from mldserver.protocol import ProcessRecords, RemoteProtocolError
from mldserver.protocol.lazy import LazyRecords
from mldserver.protocol.messages import decode
from mldserver.api.records import Record
from mldserver.shard.batches import LineRecords, decode_records


def record(i: int, **fields) -> dict:
    return {"action": "record", "data": "bWVvdw==", "partitionKey": f"pk-{i}", "sequenceNumber": str(100 + i),
            "subSequenceNumber": 0, "approximateArrivalTimestamp": 1476889707000 + i, **fields}


def line_of(records, mbl=0, **extra) -> bytes:
    return json.dumps({"action": "processRecords", "records": records, "millisBehindLatest": mbl, **extra},
                      ensure_ascii=False).encode() + b"\n"


def both(line: bytes):
    """The eager and the lazy decoding of ``line``: each an event or the error's text."""
    out = []
    for lazy in (False, True):
        try:
            event = decode(line, lazy)
        except RemoteProtocolError as exc:
            out.append(("error", str(exc), exc.action))
            continue
        if isinstance(event, ProcessRecords):
            out.append(("batch", list(event.records), event.millis_behind_latest, type(event.records).__name__))
        else:
            out.append(("other", event))
    return out


def test_a_batch_read_lazily_has_the_records_and_millis_behind_latest_of_the_line():
    line = line_of([record(i) for i in range(5)], mbl=1234)
    event = decode(line, lazy=True)
    assert isinstance(event.records, LazyRecords)
    assert len(event.records) == 5 and event.millis_behind_latest == 1234
    assert event.records.last() == record(4)
    assert event.records._list is None  # nothing made into dicts yet
    assert list(event.records) == [record(i) for i in range(5)]
    assert event.line == line


@pytest.mark.parametrize(
    "line",
    [
        line_of([record(0)], mbl=True),  # a bool where an integer belongs
        line_of([record(0)], mbl="5"),
        line_of([record(0)], mbl=2**70),  # beyond 64 bits: simdjson refuses it; the eager path reads it
        line_of("not a list"),
        line_of(None),
        line_of([]),
        line_of([record(0), 5, [1, {"a": 2}], None]),  # records that are not objects
        line_of([record(0, data=None, partitionKey=None)]),
        line_of([record(0, extra={"nested": [1, 2, {"deep": True}]})]),
        line_of([record(0, partitionKey="snow \u2603 \U0001f600 \"quoted\" \\ back")]),
        b'{"action":"processRecords","records":[{"data":"\xff\xfe","sequenceNumber":"1"}],"millisBehindLatest":0}\n',
        b'{"action":"processRecords","records":[{"sequenceNumber":"1"}],"millisBehindLatest":0',  # not JSON
        b'{"action":"processRecords","records":[],"action":"initialize","shardId":"s"}\n',  # a second action key
        b'{"action":"processRecords", "records" : [ ] , "millisBehindLatest" : 7 }\n',
    ],
)
def test_lazy_and_eager_decoding_agree_on_odd_lines(line):
    eager, lazy = both(line)
    assert eager[:3] == lazy[:3]


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.fixed_dictionaries(
                {"sequenceNumber": st.one_of(st.from_regex(r"\A[0-9]{1,60}\Z"), st.none(), st.integers(0, 2**62)),
                 "subSequenceNumber": st.one_of(st.none(), st.integers(0, 2**40), st.booleans()),
                 "data": st.one_of(st.none(), st.text(max_size=20)),
                 "partitionKey": st.text(max_size=10)}),
            st.integers(), st.none(), st.text(max_size=5),
        ),
        max_size=8,
    ),
    st.one_of(st.none(), st.integers(-5, 2**62), st.booleans(), st.text(max_size=3)),
)
def test_lazy_and_eager_decoding_agree_on_any_batch(records, mbl):
    eager, lazy = both(line_of(records, mbl=mbl))
    assert eager[:3] == lazy[:3]


def test_decode_records_keeps_a_lazy_batch_lazy_and_its_records_read_as_the_eager_ones():
    raws = [record(i, subSequenceNumber=i % 3) for i in range(6)]
    line = line_of(raws)
    eager, _ = decode_records(raws, deaggregate_kpl=False, positions=True)
    for positions in (False, True):
        records, bad = decode_records(decode(line, lazy=True).records, deaggregate_kpl=False, positions=positions)
        assert bad == [] and isinstance(records, LineRecords) and len(records) == 6
        assert records[-1].position == Position.parse("105", 2)
        for mine, theirs in zip(records, eager):
            assert isinstance(mine, Record)
            assert (mine.data, mine.partition_key, mine.sequence_number, mine.sub_sequence_number,
                    mine.approximate_arrival_timestamp, mine.position, mine.to_json()) == (
                theirs.data, theirs.partition_key, theirs.sequence_number, theirs.sub_sequence_number,
                theirs.approximate_arrival_timestamp, theirs.position, theirs.to_json())


def test_a_lazy_batch_with_a_malformed_record_is_decoded_as_the_eager_one():
    raws = [record(0), record(1, sequenceNumber="LATEST"), record(2)]
    lazy = decode(line_of(raws), lazy=True).records
    mine, bad = decode_records(lazy, deaggregate_kpl=False, positions=True)
    theirs, their_bad = decode_records(raws, deaggregate_kpl=False, positions=True)
    assert [r.to_json() for r in mine] == [r.to_json() for r in theirs] == [record(0), record(2)]
    assert bad == their_bad and bad[0].raws == [record(1, sequenceNumber="LATEST")]
    bad_last = [record(0), {"sequenceNumber": None}]
    lazy = decode(line_of(bad_last), lazy=True).records
    records, bad = decode_records(lazy, deaggregate_kpl=False, positions=False)
    assert records == [] and bad[0].raws == bad_last


def test_records_read_from_a_line_stay_valid_while_more_lines_than_pooled_parsers_are_parsed(monkeypatch):
    from mldserver.protocol import lazy

    monkeypatch.setattr(lazy, "_local", threading.local())
    kept = []
    for n in range(lazy.POOLED_PARSERS + 3):  # every parser's document still referred to
        records = LazyRecords.parse(line_of([record(n), record(n + 1)]), keep=True)
        kept.append(list(records.objects()))
    assert [[r["partitionKey"] for r in objects] for objects in kept] == [
        [f"pk-{n}", f"pk-{n + 1}"] for n in range(lazy.POOLED_PARSERS + 3)]
    assert len(lazy._local.parsers) == lazy.POOLED_PARSERS


def test_a_parser_is_reused_once_nothing_refers_to_its_document(monkeypatch):
    import simdjson

    from mldserver.protocol import lazy

    made = []

    class Counting(simdjson.Parser):
        def __init__(self, *args, **kwargs):
            made.append(1)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(lazy, "_local", threading.local())
    monkeypatch.setattr(lazy.simdjson, "Parser", Counting)
    for n in range(5):
        records = LazyRecords.parse(line_of([record(n)]), keep=True)
        assert records.obj(0)["sequenceNumber"] == str(100 + n)
        records.release()
    assert made == [1]


def test_each_thread_parses_with_parsers_of_its_own(monkeypatch):
    from concurrent.futures import ThreadPoolExecutor

    from mldserver.protocol import lazy

    monkeypatch.setattr(lazy, "_local", threading.local())
    here = LazyRecords.parse(line_of([record(1)]), keep=True)
    with ThreadPoolExecutor(1) as pool:
        there = pool.submit(lambda: LazyRecords.parse(line_of([record(2)]), keep=True)).result()
    assert len(lazy._local.parsers) == 1  # this thread's: the other thread made its own
    assert here.obj(0)["partitionKey"] == "pk-1" and there.obj(0)["partitionKey"] == "pk-2"
