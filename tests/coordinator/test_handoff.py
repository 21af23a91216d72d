"""The window a sink gets: its rows as JSON lines, read whole, in ranges, or one by one."""

from __future__ import annotations

import pytest

from mldserver.base.handoff import JsonLines, Window


def test_rows_are_one_buffer_of_json_lines_read_whole_in_ranges_or_one_by_one():
    rows = JsonLines.of([b'{"k":1}', b'{"k":[2]}', b"{}"])
    assert bytes(rows.buffer()) == b'{"k":1}\n{"k":[2]}\n{}\n'
    assert bytes(rows.buffer(1, 3)) == b'{"k":[2]}\n{}\n' and bytes(rows.buffer(2, 2)) == b""
    assert (len(rows), rows[0], rows[-1], list(rows)) == (3, b'{"k":1}', b"{}", [b'{"k":1}', b'{"k":[2]}', b"{}"])
    with pytest.raises(IndexError):
        rows[3]


def test_the_buffer_is_made_once_on_first_use_by_whoever_reads_it():
    made = []

    def make():
        made.append(1)
        return b'{"a":1}\n{"b":2}\n', [0, 8, 16]

    rows = JsonLines(2, make)
    assert len(rows) == 2 and made == []  # the count is known before the rows are made
    assert rows[1] == b'{"b":2}' and bytes(rows.buffer()) == b'{"a":1}\n{"b":2}\n'
    assert made == [1]


def test_a_window_without_rows_has_an_empty_buffer():
    window = Window(0, 60_000)
    assert len(window) == 0 and bytes(window.rows.buffer()) == b"" and list(window.rows) == []
    assert window.id == "0-60000"
