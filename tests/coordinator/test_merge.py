"""Merge: a closed window's rows in the merge key's order, sealed for a sink (their
JSON gathered in that order on first read, each row's shard and position, each
shard's highest). The windows are cut by a real ``Ordering``: plain objects, no loop."""

from __future__ import annotations

import orjson
import pytest

from mldserver import native
from mldserver.coordinator import merge
from mldserver.coordinator.merge import seal
from mldserver.coordinator.ordering import Ordering
from mldserver.base.positions import Position

from ..test_rows import loaded_after
from .test_ordering import MINUTE, add, contents, emitted, ordering, rows


def test_seal_records_each_shards_highest_position():
    o = ordering()
    add(o, "A", 5, [1000, 2000])
    add(o, "B", 1, [1500])
    [closed] = o.close(until=MINUTE)
    window, commits = seal(closed)
    assert {s: sum(map(len, rows)) for s, rows in commits.items()} == {"A": 2, "B": 1}
    assert window.positions == {"A": Position(6, 0, "6"), "B": Position(1, 0, "1")}
    assert (window.start, window.end, window.late_rows, len(window)) == (0, MINUTE, 0, 3)
    assert all(type(row) is bytes for row in window.rows)


def test_rows_emitted_out_of_record_order_merge_by_position_as_the_key_says():
    o = ordering()
    records = [Position.parse(str(s)) for s in (10, 11, 12)]
    batch = emitted(records, [2, 0, 1, 0], tag="A")  # record 10 emitted two rows: second and fourth
    assert not batch.ordered
    o.add("A", batch, records[-1], now=0)
    add(o, "B", 5, [1000], "B")
    add(o, "A0", 99, [1000], "A0")
    [window] = o.close(until=MINUTE)
    closed_positions = window.parts["A"][0].positions
    sealed, commits = seal(window)
    assert [(orjson.loads(r)["tag"], int(orjson.loads(r)["seq"])) for r in sealed.rows] == [
        ("A", 10), ("A", 10), ("A", 11), ("A", 12), ("A0", 99), ("B", 5)]
    assert sealed.positions["A"] == Position(12, 0, "12") and closed_positions is records
    assert {s: sum(map(len, rows)) for s, rows in commits.items()} == {"A": 4, "A0": 1, "B": 1}


def test_a_window_of_interleaved_shards_holds_their_rows_as_json_lines_in_merged_order():
    o = ordering()
    for shard_id in ("C", "A", "B"):  # the same event times on every shard
        add(o, shard_id, 1, [1000, 2000, 3000], shard_id)
    [closed] = o.close(until=MINUTE)
    window, _ = seal(closed)
    lines = bytes(window.rows.buffer())
    assert lines.endswith(b"\n") and lines.count(b"\n") == len(window) == 9
    assert [(orjson.loads(line)["tag"], int(orjson.loads(line)["seq"])) for line in lines.splitlines()] == [
        (s, seq) for seq in (1, 2, 3) for s in "ABC"]
    assert window.rows[-1] == orjson.dumps({"seq": "3", "tag": "C"})
    assert bytes(window.rows.buffer(3, 5)).splitlines() == [window.rows[3], window.rows[4]]


@pytest.fixture(params=["native", "pyarrow"])
def gathering(request, monkeypatch):
    """Rows gathered by ``_gather.c``, or by pyarrow where it was not built."""
    if request.param == "pyarrow":
        monkeypatch.setattr(merge, "native_gather", None)
    elif not native.native_allowed():  # MLDSERVER_NO_EXTENSIONS: pyarrow's, twice
        assert merge.native_gather is None, "MLDSERVER_NO_EXTENSIONS is set, yet _gather is used"
        return "pyarrow"
    else:
        assert merge.native_gather is not None, "mldserver.coordinator._gather was not built (setup.py)"
    return request.param


@pytest.mark.parametrize("block", [1, 2, 5, 1 << 16])
def test_interleaved_rows_are_gathered_in_merged_order_whatever_the_block_of_rows_taken_at_once(
        monkeypatch, block, gathering):
    monkeypatch.setattr(merge, "TAKE_BLOCK", block)
    o = ordering()
    for shard_id in ("C", "A", "B"):
        add(o, shard_id, 1, [1000, 2000, 2000, 3000], shard_id)
    records = [Position.parse(str(s)) for s in (10, 11, 12)]
    o.add("D", emitted(records, [2, 0, 1], time=2000, tag="D"), records[-1], now=0)  # out of record order
    [closed] = o.close(until=MINUTE)
    assert contents(closed) == [("A", 1), ("B", 1), ("C", 1), ("A", 2), ("A", 3), ("B", 2), ("B", 3), ("C", 2),
                                ("C", 3), ("D", 10), ("D", 11), ("D", 12), ("A", 4), ("B", 4), ("C", 4)]


def sealed(interleaved):
    """A window of three shards, their rows interleaved in time or one shard's after
    another's (two batches each, so in order it is several runs)."""
    o = ordering()
    for i, shard_id in enumerate("ABC"):
        base = 0 if interleaved else 10_000 * i
        add(o, shard_id, 1, [base + 1000, base + 2000, base + 3000], shard_id)
        add(o, shard_id, 4, [base + 4000, base + 5000], shard_id)
    [closed] = o.close(until=MINUTE)
    return seal(closed)[0]


@pytest.mark.parametrize("interleaved", [True, False])
@pytest.mark.parametrize("block", [1, 4, 1 << 16])
def test_chunks_are_the_rows_buffer_in_runs_without_gathering_the_window_whole(monkeypatch, interleaved, block,
                                                                               gathering):
    monkeypatch.setattr(merge, "TAKE_BLOCK", block)
    whole = bytes(sealed(interleaved).rows.buffer())
    offsets = [0] + [i + 1 for i, byte in enumerate(whole) if byte == ord("\n")]
    for start, stop in [(0, 15), (0, 1), (3, 11), (14, 15), (5, 5), (0, None)]:
        window = sealed(interleaved)
        chunks = [(type(chunk), bytes(chunk)) for chunk in window.rows.chunks(start, stop)]  # each valid until the next
        assert {kind for kind, _ in chunks} <= {memoryview}
        assert b"".join(chunk for _, chunk in chunks) == whole[offsets[start] : offsets[15 if stop is None else stop]]
        assert window.rows._make is not None  # never made whole
    if not interleaved:  # runs where the rows are: one per batch, nothing copied
        assert len(list(sealed(False).rows.chunks())) == 6


@pytest.mark.parametrize("block", [1, 4, 1 << 16])
def test_chunks_for_a_file_past_the_page_cache_are_whole_disk_blocks_where_the_disk_can_read_them(
        monkeypatch, block, gathering):
    # (base.direct writes such a run from where it is: gathered once, not copied again)
    import mmap

    import numpy as np

    monkeypatch.setattr(merge, "TAKE_BLOCK", block)
    monkeypatch.setattr(merge, "BLOCK", 32)  # a disk block of 32 bytes: rows cross its edges
    whole = bytes(sealed(True).rows.buffer())
    offsets = [0] + [i + 1 for i, byte in enumerate(whole) if byte == ord("\n")]
    addresses = set()
    for start, stop in [(0, 15), (0, 1), (3, 11), (14, 15), (0, None)]:
        runs = [(np.frombuffer(run, dtype=np.uint8).ctypes.data, bytes(run))
                for run in sealed(True).rows.chunks(start, stop, blocks=True)]  # each valid until the next
        assert b"".join(run for _, run in runs) == whole[offsets[start] : offsets[15 if stop is None else stop]]
        if gathering == "native":
            assert all(len(run) % 32 == 0 for _, run in runs[:-1]), [len(run) for _, run in runs]
            assert all(address % mmap.PAGESIZE == 0 for address, _ in runs)
            addresses |= {address for address, _ in runs}
    if gathering == "native" and block > 15:  # every window's rows in one block: one buffer, kept for the next
        assert len(addresses) == 1 and [spare.ctypes.data for spare in merge._aligned_spares] == list(addresses)


# A fresh interpreter's script: a window of two shards' interleaved rows, sealed (``window``).
INTERLEAVED_WINDOW = ("from mldserver.coordinator.merge import seal\n"
                      "from mldserver.coordinator.ordering import Ordering\n"
                      "from mldserver.base.positions import Position\n"
                      "from mldserver.rows.batch import Item, RowBatch\n"
                      "o = Ordering(window_ms=60_000, blocks=lambda s, now: False, parents_of=lambda s: ())\n"
                      "for shard_id in 'AB':\n"
                      "    rows = RowBatch.of(Item(1000 + i, Position.parse(str(i)), b'{}') for i in range(3))\n"
                      "    o.add(shard_id, rows, rows.position(-1), now=0)\n"
                      "[closed] = o.close(until=60_000)\n"
                      "window, _ = seal(closed)\n")


def test_gathering_a_window_of_interleaved_shards_never_loads_pandas():
    # pyarrow imports pandas when first handed a numpy array (0.2 s on the first commit, 30 MiB).
    script = INTERLEAVED_WINDOW + "assert bytes(window.rows.buffer()) == b'{}\\n' * 6\n"
    assert loaded_after(script, "pandas") == []


def test_a_file_sink_server_never_loads_pyarrow_where_the_gather_is_native(tmp_path):
    # pyarrow is some 30 MiB a server: the coordinator loads it only for the Python
    # gather (``_taken_by_arrow``), and the file sink not at all.
    out = tmp_path / "out"
    script = ("from pathlib import Path\n"
              "from mldserver.base.config import Settings\n"
              "from mldserver.coordinator.coordinator import Coordinator\n"
              "from mldserver.sinks.file import FileSink\n"
              f"sink = FileSink(Path({str(out)!r}))\n"
              f"Coordinator(Settings(state_dir={str(tmp_path / 'state')!r}), sink)\n"
              + INTERLEAVED_WINDOW + "sink._write(window)\n")
    assert loaded_after(script, "pyarrow") == ([] if merge.native_gather is not None else ["pyarrow"])
    assert [p.read_bytes() for p in out.glob("*.jsonl")] == [b"{}\n" * 6]


def test_seal_says_where_each_row_came_from():
    ordering = Ordering(window_ms=MINUTE, blocks=lambda p, now: False, parents_of=lambda s: ())
    ordering.add("B", rows(100, [2_000]), Position.parse("100"), now=0)
    ordering.add("A", rows(1, [1_000, 3_000]), Position.parse("2"), now=0)
    window, _ = seal(ordering.close(until=MINUTE)[0])
    assert [(s, p.seq) for s, p in window.sources] == [("A", 1), ("B", 100), ("A", 2)]
    assert len(window.sources) == 3


def test_seal_says_where_each_row_came_from_when_rows_were_emitted_out_of_record_order():
    o = ordering()
    records = [Position.parse(str(s)) for s in (10, 11, 12)]
    o.add("A", emitted(records, [2, 0, 1, 0]), records[-1], now=0)
    add(o, "B", 5, [1000])
    window, _ = seal(o.close(until=MINUTE)[0])
    assert [(s, p.seq) for s, p in window.sources] == [("A", 10), ("A", 10), ("A", 11), ("A", 12), ("B", 5)]
