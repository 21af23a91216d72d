"""Rows: a batch's rows as columns (``RowBatch``), sliced, searched and joined without
an object per row; and a module light enough for a handler process."""

from __future__ import annotations

import subprocess
import sys

import numpy as np

from mldserver.base.positions import Position
from mldserver.rows.batch import NO_TIME, Item, RowBatch, concat_lines

from .helpers import resident_kib


def loaded_after(script: str, *modules: str) -> list[str]:
    """Which of ``modules`` a fresh interpreter has loaded once ``script`` ran."""
    script += f"\nimport sys\nprint(','.join(m for m in {modules!r} if m in sys.modules))\n"
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    return [m for m in out.strip().split(",") if m]


def at(seq: int) -> Position:
    return Position(seq, 0, str(seq))


def docstrings_batch() -> RowBatch:
    """The module docstring's batch: records 7, 8 and 9; a row for 7 at 1_500, two for 9
    with no time given."""
    return RowBatch(np.array([1_500, NO_TIME, NO_TIME]), np.array([0, 2, 2]), [at(7), at(8), at(9)],
                    b'{"k":1}\n{"k":2}\n{"k":3}\n', np.array([0, 8, 16, 24]))


def test_the_docstrings_batch_reads_as_it_says():
    rows = docstrings_batch()
    assert rows.ordered and len(rows) == 3 and rows.nbytes() == 24
    assert (rows.row(0), rows.position(1), rows.lowest()) == (b'{"k":1}', at(9), at(7))
    assert list(rows) == [Item(1_500, at(7), b'{"k":1}'), Item(None, at(9), b'{"k":2}'), Item(None, at(9), b'{"k":3}')]
    tail = rows[1:3]
    assert tail.body is rows.body and tail.positions is rows.positions
    assert [r.data for r in tail] == [b'{"k":2}', b'{"k":3}']
    above = rows.above(at(8))
    assert above.body is rows.body and [r.position for r in above] == [at(9), at(9)]


def test_rows_given_one_by_one_come_back_as_they_were_given():
    items = [Item(1_000, at(3), b'{"a":1}'), Item(None, at(4), b'{"a":2}'), Item(2_000, at(4), b'[]')]
    rows = RowBatch.of(items)
    assert list(rows) == items and rows.positions == [at(3), at(4), at(4)] and rows.ordered
    assert rows.times.tolist() == [1_000, NO_TIME, 2_000]


def test_rows_emitted_out_of_record_order_keep_their_positions_sorted_and_are_searched_by_copy():
    rows = RowBatch.of([Item(1, at(9), b"9"), Item(2, at(7), b"7"), Item(3, at(8), b"8")])
    assert not rows.ordered and rows.positions == [at(7), at(8), at(9)] and rows.lowest() == at(7)
    above = rows.above(at(7))
    assert [(r.time, r.position, r.data) for r in above] == [(1, at(9), b"9"), (3, at(8), b"8")]
    assert above.body is not rows.body


def test_batches_are_joined_into_one_with_their_positions_one_after_another():
    first, second = RowBatch.of([Item(1, at(1), b"a")]), RowBatch.of([Item(2, at(2), b"bb"), Item(3, at(3), b"c")])
    joined = RowBatch.concat([first, second[1:]])
    assert [(r.time, r.position, r.data) for r in joined] == [(1, at(1), b"a"), (3, at(3), b"c")]
    body, offsets = concat_lines([first, second[1:]])
    assert bytes(body) == b"a\nc\n" and offsets.tolist() == [0, 2, 4]
    assert RowBatch.concat([first]) is first and len(RowBatch.concat([])) == 0


def test_importing_rows_loads_neither_the_coordinator_nor_numpy():
    # A handler process imports it (pool.frames): it must stay as light as positions.
    script = "import mldserver.rows.batch, mldserver.pool.child\n"
    assert loaded_after(script, "mldserver.coordinator", "numpy") == []


def test_a_server_without_a_sink_and_the_handler_processes_never_load_numpy():
    # Every batch goes through encode_rows, rows or none; numpy is some 12 MiB a process.
    script = ("import mldserver.server.server, mldserver.pool.child\n"
              "from mldserver.shard.batches import encode_rows\n"
              "rows, bad = encode_rows(None)\n"
              "assert len(rows) == 0 and bad == []\n")
    assert loaded_after(script, "numpy", "pyarrow") == []


def test_held_bytes_is_the_memory_a_batch_from_a_handler_process_really_holds():
    """As the coordinator keeps one: the frame's body (columns, then JSON lines) read
    in place, its own offsets and clamped times, the positions' texts (tracemalloc sees
    numpy's buffers too)."""
    import tracemalloc

    import orjson

    from mldserver.pool.frames import decode_rows

    n = 10_000
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        texts = [str(10**40 + i) for i in range(n)]
        lines = b"".join(orjson.dumps({"seq": t, "data": "x" * 200}) + b"\n" for t in texts)
        ends = np.cumsum([len(orjson.dumps({"seq": t, "data": "x" * 200})) + 1 for t in texts], dtype=np.uint64)
        body = (np.arange(n, dtype=np.uint32).tobytes() + np.arange(n, dtype=np.int64).tobytes()
                + ends.tobytes() + lines)
        del lines, ends
        columns = decode_rows(n, body)
        del body
        offsets = np.zeros(n + 1, dtype=np.int64)
        offsets[1:] = np.frombuffer(columns.ends, dtype=np.uint64)
        rows = RowBatch(np.frombuffer(columns.times, dtype=np.int64).astype(np.int64),
                        np.frombuffer(columns.records, dtype=np.uint32), Position.batch(texts, [0] * n),
                        columns.lines, offsets)
        del columns, texts, offsets
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert 0.9 * held <= rows.held_bytes() <= 1.1 * held, (rows.held_bytes(), held)
    assert rows[5:].held_bytes() == rows.held_bytes()  # a slice holds the same buffers


def test_a_batch_on_loan_is_cut_where_it_lies_and_each_piece_gives_its_part_back():
    """A handler process's rows, read in its rows arena (``rows/loans.py``), cut at two
    windows' ends: the pieces read the same memory (nothing copied), each holds and gives
    back its own part of the loan, and the parts make up the whole; rows not on loan
    are copied."""
    import gc
    import mmap

    from mldserver.rows.loans import lend

    seqs = [str(10**30 + i) for i in range(50)]
    lines = [b'{"i":%d,"pad":"%s"}\n' % (i, b"x" * i) for i in range(50)]
    body = np.arange(50, dtype=np.int64).tobytes() + b"".join(lines)  # columns, then the JSON lines
    memory = mmap.mmap(-1, 1 << 16)
    memory[4096 : 4096 + len(body)] = body
    given: list[tuple[int, int]] = []
    size = -(-len(body) // 64) * 64
    loan = lend(memory, 4096, size, given.append)
    offsets = np.cumsum([0] + list(map(len, lines)))
    rows = RowBatch(np.arange(50, dtype=np.int64) * 10, np.arange(50), Position.batch(seqs, [0] * 50),
                    memoryview(loan[: len(body)])[400:], offsets)
    expected = [list(rows[i:j]) for i, j in ((0, 10), (10, 30), (30, 50))]
    pieces = rows.cut([10, 30])
    assert [list(piece) for piece in pieces] == expected
    assert all(np.shares_memory(np.frombuffer(piece.body, dtype=np.uint8), loan) for piece in pieces)
    parts = [400 + int(offsets[10]), int(offsets[30] - offsets[10]), size - 400 - int(offsets[30])]
    assert [piece.body.nbytes for piece in pieces] == parts  # each holds its part, the first the columns too
    assert sum(parts) == size and rows.held_bytes() >= size
    assert all(part <= piece.held_bytes() < part + 8_000 for piece, part in zip(pieces, parts))  # + columns, positions
    assert [piece.position(0) for piece in pieces] == [rows.position(0), rows.position(10), rows.position(30)]
    del loan, rows
    gc.collect()
    assert given == []  # the pieces hold it
    middle = pieces.pop(1)
    del middle
    assert given == [(4096 + parts[0], parts[1])]
    pieces.clear()
    assert sorted(given) == [(4096, parts[0]), (4096 + parts[0], parts[1]), (4096 + parts[0] + parts[1], parts[2])]
    own = docstrings_batch()
    copied = own.cut([1])
    assert [list(piece) for piece in copied] == [list(own[:1]), list(own[1:])]
    assert not any(np.shares_memory(np.frombuffer(piece.body, dtype=np.uint8), np.frombuffer(own.body, dtype=np.uint8))
                   for piece in copied)


def test_rows_spilled_to_a_file_read_back_as_they_were_and_hold_no_memory(tmp_path):
    from mldserver.coordinator.spill import Spill

    spill = Spill(tmp_path)
    seqs = [str(10**55 + i) for i in range(50)]
    lines = [b'{"i":%d}\n' % i for i in range(50)]
    rows = RowBatch(np.arange(50, dtype=np.int64) * 10, np.arange(50), Position.batch(seqs, [0] * 50),
                    b"".join(lines), np.cumsum([0] + list(map(len, lines))))
    for piece in (rows[10:30], rows.compact(), rows[:1]):
        spilled = piece.spilled(spill.put)
        assert list(spilled) == list(piece) and spilled.times.tolist() == piece.times.tolist()
        assert spilled.held_bytes() == 0 < piece.held_bytes()
        assert spilled.position(len(piece) - 1) == piece.position(len(piece) - 1)
        assert spilled.lowest() == piece.lowest()
    assert list(tmp_path.iterdir()) == []  # unlinked at once: the file goes with its last batch
    odd = RowBatch.of([Item(5, Position(7, 1, "7"), b'{"kpl":1}'), Item(6, Position(7, 2, "7"), b'{"kpl":2}')])
    assert list(odd.spilled(spill.put)) == list(odd)  # positions that are tuples stay in memory
    mixed = RowBatch.of([Item(5, at(7), b"{}"), Item(6, at(800), b"[]")])
    assert list(mixed.spilled(spill.put)) == list(mixed)  # numbers of several widths


def test_spilled_rows_share_a_segment_file_and_a_batch_larger_than_one_gets_its_own(tmp_path, monkeypatch):
    import os

    from mldserver.coordinator import spill as spilling

    monkeypatch.setattr(spilling, "SEGMENT", 4096)
    spill = spilling.Spill(tmp_path)
    small = RowBatch.of([Item(1, at(i), b'"x"') for i in range(10)])
    big = RowBatch.of([Item(1, at(i), b'"%s"' % (b"y" * 100)) for i in range(100)])
    fds = len(os.listdir("/proc/self/fd"))
    kept = [small.spilled(spill.put) for _ in range(5)]
    assert len(os.listdir("/proc/self/fd")) == fds + 2  # one segment: its descriptor, its map's
    assert all(list(k) == list(small) for k in kept)
    large = big.spilled(spill.put)  # 12 kB: a segment of its own
    assert list(large) == list(big) and list(kept[0]) == list(small)
    spill.close()
    assert len(os.listdir("/proc/self/fd")) == fds + 2  # each map's: the segments live on in their rows
    assert list(large) == list(big)  # the maps outlive the writing
    del kept
    assert len(os.listdir("/proc/self/fd")) == fds + 1  # the first segment went with its last rows


def test_spilled_rows_once_read_let_their_pages_go_and_read_back_from_the_file(tmp_path):
    from mldserver.coordinator.spill import Spill

    spill = Spill(tmp_path)
    lines = [b'{"i":%d,"pad":"%s"}\n' % (i, b"x" * 500) for i in range(4_000)]  # 2 MB
    rows = RowBatch(np.arange(4_000, dtype=np.int64), np.arange(4_000), Position.batch([str(i) for i in range(4_000)], [0] * 4_000),
                    b"".join(lines), np.cumsum([0] + list(map(len, lines))))
    spilled, small = rows.spilled(spill.put), rows[:3].spilled(spill.put)  # one segment
    address = spilled.body.ctypes.data

    def resident() -> int:  # its segment's map, in KiB
        return resident_kib(lambda span, _: address in span)

    assert resident() == 0  # written, not read
    assert b"".join(bytes(row) + b"\n" for row in (spilled.row(i) for i in range(len(spilled)))) == b"".join(lines)
    assert resident() >= 2_000  # the reads brought the pages in
    spilled.page_out()
    assert resident() <= 4  # let go (a page it shares with the next batch at most)
    assert list(spilled) == list(rows) and list(small) == list(rows[:3])  # read back from the file
    rows.page_out()  # rows in memory: nothing to let go
    assert list(rows)[:1] == list(spilled)[:1]
