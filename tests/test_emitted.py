"""The rows a batch's handler emits, kept as they are emitted (``rows.emitted``): JSON
lines written at once, their records and times beside them; a row that is not JSON set
aside with why; a failed attempt's rows taken back; a given-up record's rows dropped."""

from __future__ import annotations

import orjson
import pytest

from mldserver import native
from mldserver.rows import emitted
from mldserver.rows.emitted import Emitted, EmittedRows, PyCollector
from mldserver.api.records import Record


class PyEmittedRows(PyCollector):
    """The same rows over the collector in Python (a package built without a C compiler)."""

    __slots__ = ()


for _name, _value in vars(EmittedRows).items():  # everything EmittedRows adds to its collector
    if _name not in ("__module__", "__doc__", "__qualname__", "__slots__"):
        setattr(PyEmittedRows, _name, _value)


@pytest.fixture(params=["native", "python"], autouse=True)
def implementation(request, monkeypatch):
    """Every test against both collectors: the native one (``_emitted.c``) and Python's."""
    if request.param == "native" and not native.native_allowed():  # MLDSERVER_NO_EXTENSIONS: Python's, twice
        assert EmittedRows.__mro__[1] is PyCollector, "MLDSERVER_NO_EXTENSIONS is set, yet _emitted is used"
    elif request.param == "native":
        assert EmittedRows.__mro__[1] is not PyCollector, "the native collector was not built (setup.py)"
    else:
        monkeypatch.setattr(emitted, "EmittedRows", PyEmittedRows)
        monkeypatch.setitem(globals(), "EmittedRows", PyEmittedRows)


def records(n):
    return [Record({"sequenceNumber": str(100 + i), "approximateArrivalTimestamp": 1000 + i}) for i in range(n)]


def test_each_row_is_written_at_its_emit_as_one_json_line_beside_its_record_and_time():
    a, b = records(2)
    rows = EmittedRows()
    row = {"k": 1}
    rows.add(a, row, None)
    row["k"] = 2  # a row is what it was at its emit
    rows.add(b, row, 5)
    assert rows.lines() == b'{"k":1}\n{"k":2}\n' and rows.sizes == [8, 8]
    assert rows.records == [a, b] and rows.times == [None, 5] and len(rows) == 2
    assert list(rows) == [Emitted(a, {"k": 1}, None), Emitted(b, {"k": 2}, 5)] and rows[-1].row == {"k": 2}
    assert list(rows.each()) == [(b'{"k":1}\n', a, None), (b'{"k":2}\n', b, 5)]


def test_a_row_that_is_not_json_is_set_aside_with_its_record_and_why():
    a, b = records(2)
    rows = EmittedRows.of([(a, {"k": {1, 2}}, None), (b, {"k": 3}, None)])
    assert len(rows) == 1 and rows.lines() == b'{"k":3}\n'
    assert rows.bad == [(a, "row not JSON-encodable: Type is not JSON serializable: set")]


def test_truncate_takes_a_failed_attempts_rows_back_and_drop_a_given_up_records():
    a, b, c = records(3)
    rows = EmittedRows.of([(a, {"n": 0}, None), (b, {"n": 1}, None), (c, {"n": 2}, 7), (b, {"n": 3}, None)])
    mark = len(rows)
    rows.add(a, {"n": "retried"}, None)
    rows.truncate(mark)
    assert [orjson.loads(line) for line in rows.lines().splitlines()] == [{"n": 0}, {"n": 1}, {"n": 2}, {"n": 3}]
    rows.drop({id(b)})
    assert rows.lines() == b'{"n":0}\n{"n":2}\n' and rows.records == [a, c] and rows.times == [None, 7]
    rows.add(b, {"n": 4}, None)  # it goes on after a drop
    assert rows.sizes == [8, 8, 8] and rows[2] == Emitted(b, {"n": 4}, None)


def test_a_row_emitted_after_the_call_raises_saying_so():
    rows = EmittedRows()
    rows.add(None, {"k": 1}, None)
    rows.close()
    with pytest.raises(RuntimeError, match="batch.emit called after process_records returned"):
        rows.add(None, {"k": 2}, None)
    assert rows.lines() == b'{"k":1}\n'


def test_emit_takes_its_arguments_by_name_and_says_what_is_missing():
    a, = records(1)
    rows = EmittedRows()
    rows.add(record=a, row={"k": 1}, event_time_ms=5)
    rows.add(a, {"k": 2}, event_time_ms=None)
    assert rows.records == [a, a] and rows.times == [5, None] and rows.timed == 1
    with pytest.raises(TypeError, match="row"):
        rows.add(a)
    with pytest.raises(TypeError, match="unexpected keyword argument 'time'"):
        rows.add(a, {"k": 3}, time=5)
    assert len(rows) == 2


def test_while_the_rows_are_being_sent_none_is_added_or_taken_back():
    a, b = records(2)
    rows = EmittedRows.of([(a, {"k": 1}, None), (b, {"k": 2}, 9)])
    view = rows.view()
    assert bytes(view) == b'{"k":1}\n{"k":2}\n' and memoryview(rows.ends()).cast("Q").tolist() == [8, 16]
    with pytest.raises(BufferError):
        rows.add(a, {"k": 3})
    with pytest.raises(BufferError):
        rows.truncate(0)
    view.release()
    rows.add(a, {"k": 3})
    assert len(rows) == 3 and rows.sizes == [8, 8, 8]


def test_a_truncate_counts_the_timed_rows_again():
    a, = records(1)
    rows = EmittedRows.of([(a, {"k": 1}, 5), (a, {"k": 2}, None), (a, {"k": 3}, 7)])
    assert rows.timed == 2
    rows.truncate(2)
    assert rows.timed == 1 and rows.times == [5, None]
    rows.truncate(0)
    assert rows.timed == 0 and len(rows) == 0 and rows.lines() == b""


def test_one_for_one_says_whether_each_row_is_its_records_by_identity_and_place():
    a, b = records(2)
    rows = EmittedRows.of([(a, {"k": 1}, None), (b, {"k": 2}, None)])
    assert rows.one_for_one([a, b]) and rows.one_for_one((a, b))  # a passthrough's: each record's row, in order
    assert not rows.one_for_one([b, a])  # out of order
    assert not rows.one_for_one([a]) and not rows.one_for_one([a, b, a])  # more rows, or fewer
    assert not rows.one_for_one([a, Record(dict(b.raw))])  # the same content is not the record
    rows.truncate(1)
    assert rows.one_for_one([a])
