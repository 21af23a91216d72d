"""Rows to Arrow: inferred, declared, and rows that do not fit."""

from __future__ import annotations

import pyarrow as pa
import pytest

from mldserver.base.handoff import JsonLines
from mldserver.errors import ConfigError
from mldserver.sinks import schema


def test_schema_is_inferred_from_the_rows():
    table, rejected = schema.rows_to_table(JsonLines.of([b'{"k":1,"v":"a"}', b'{"k":2,"v":null}']), None)
    assert rejected == [] and table.schema == pa.schema([("k", pa.int64()), ("v", pa.string())])
    assert table.column("k").to_pylist() == [1, 2]


def test_rows_that_do_not_fit_a_fixed_schema_are_rejected_with_the_error_and_the_rest_kept():
    fixed = schema.declared({"k": "int64", "v": "string"})
    rows = [b'{"k":1,"v":"a"}', b'{"k":"two","v":"b"}', b'{"k":3,"extra":true}', b'{"k":4}']
    table, rejected = schema.rows_to_table(JsonLines.of(rows), fixed)
    assert table.column("k").to_pylist() == [1, 4] and table.schema == fixed
    assert [i for i, _ in rejected] == [1, 2]
    assert "k" in rejected[0][1] and "extra" in rejected[1][1]


def test_a_declared_type_that_arrow_does_not_know_is_a_config_error():
    with pytest.raises(ConfigError, match="field 'amount' has unknown type 'money'"):
        schema.declared({"amount": "money"})


def test_a_fixed_schema_survives_a_restart(tmp_path):
    fixed = schema.declared({"k": "int64", "t": "timestamp[ms]"})
    schema.save(fixed, tmp_path / "_schema.arrow")
    assert schema.load(tmp_path / "_schema.arrow") == fixed
    assert schema.load(tmp_path / "missing") is None


def test_rows_that_disagree_while_inferring_are_judged_by_the_first_row():
    table, rejected = schema.rows_to_table(JsonLines.of([b'{"k":1}', b'{"k":"one"}', b'{"k":2}']), None)
    assert table.column("k").to_pylist() == [1, 2] and [i for i, _ in rejected] == [1]


def test_a_window_with_a_schema_is_parsed_run_by_run_where_its_rows_lie(monkeypatch):
    """Runs as a sealed window gives them (``JsonLines.chunks``): each valid only until
    the next is asked for, small ones gathered, large ones parsed where they are. The
    table holds every row in order, and nothing of a run once the next is given."""
    monkeypatch.setattr(schema, "MIN_BLOCK", 64)
    rows = [b'{"k":%d,"v":"%s"}' % (i, b"x" * (i % 7)) for i in range(200)]
    lines = JsonLines.of(rows)
    whole = lines.buffer()
    runs = [(0, 1), (1, 3), (3, 40), (40, 41), (41, 200)]  # small, small, large, small, large
    scratch = bytearray(len(whole))
    parsed = []

    def chunks(start, stop, blocks):
        assert not blocks  # (runs of whole disk blocks are the file sink's)
        for a, b in runs:
            run = whole[lines._offsets[a]:lines._offsets[b]]
            scratch[: len(run)] = run  # one buffer reused, as merge's gathered blocks are
            yield memoryview(scratch)[: len(run)]
            scratch[: len(run)] = b"\0" * len(run)
            parsed.append(b)

    fixed = schema.declared({"k": "int64", "v": "string"})
    table, rejected = schema.rows_to_table(JsonLines(len(rows), lambda: (whole, lines._offsets), chunks), fixed)
    assert rejected == [] and parsed == [b for _, b in runs]
    assert table.column("k").to_pylist() == list(range(200))
    assert table.column("v").to_pylist() == ["x" * (i % 7) for i in range(200)]
    assert table.column("k").num_chunks > 1  # parsed a block at a time, not gathered whole
