"""The rows a batch's handler emits, kept as they are emitted (``api.emitted``): JSON
lines written at once, their records and times beside them; a row that is not JSON set
aside with why; a failed attempt's rows taken back; a given-up record's rows dropped."""

from __future__ import annotations

import orjson
import pytest

from mldserver.api.emitted import Emitted, EmittedRows
from mldserver.api.records import Record


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
