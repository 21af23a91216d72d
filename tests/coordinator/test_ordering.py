"""Ordering: per-shard FIFO, clamps, duplicates, lineage, late rows, the merge key.
Plain objects, no event loop: the clock is a number passed in."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import orjson
import pytest

from mldserver.coordinator import ordering as ordering_module
from mldserver.coordinator.ordering import Item, Ordering, RowBatch, seal
from mldserver.positions import Position

MINUTE = 60_000


def rows(first_seq: int, times: list[int | None], tag: str = "") -> RowBatch:
    return RowBatch.of(
        Item(t, Position.parse(str(first_seq + i)), orjson.dumps({"seq": str(first_seq + i), "tag": tag}))
        for i, t in enumerate(times)
    )


def last(batch):
    return batch.position(-1)


class Lineage:
    """Parents known up front, as ListShards would tell them; ``open`` = can still add rows."""

    def __init__(self, parents=None):
        self.parents = parents or {}
        self.open: set[str] = set()

    def parents_of(self, shard_id):
        return self.parents.get(shard_id, ())


def ordering(lineage=None, window_ms=MINUTE):
    lineage = lineage or Lineage()
    return Ordering(window_ms=window_ms, blocks=lambda s, now: s in lineage.open, parents_of=lineage.parents_of)


def add(o, shard_id, first_seq, times, tag=""):
    items = rows(first_seq, times, tag)
    return o.add(shard_id, items, last(items), now=0)


def contents(closed):
    window, _ = seal(closed)
    return [(orjson.loads(r)["tag"], int(orjson.loads(r)["seq"])) for r in window.rows]


def test_bloop_worked_example_parent_before_children_with_equal_timestamps():
    # Bloop's example: S0 splits into S1 and S2; all records carry the same timestamp.
    lineage = Lineage({"S1": ("S0",), "S2": ("S0",)})
    o = ordering(lineage)
    lineage.open.add("S0")
    add(o, "S0", 1, [1000, 1000, 1000], "S0")
    lineage.open.discard("S0")  # S0 ended
    add(o, "S1", 10, [1000, 1000], "S1")
    add(o, "S2", 20, [1000, 1000], "S2")
    [window] = o.close(until=MINUTE)
    assert contents(window) == [("S0", 1), ("S0", 2), ("S0", 3), ("S1", 10), ("S1", 11), ("S2", 20), ("S2", 21)]


def test_shard_whose_timestamps_go_backwards_keeps_its_order_and_counts_clamps():
    o = ordering()
    add(o, "A", 1, [5000, 3000, 4000, 6000], "A")
    add(o, "B", 100, [3500, 5500], "B")
    [window] = o.close(until=MINUTE)
    # A's rows at 3000 and 4000 took 5000: A stays in its own order, B merges around it.
    assert contents(window) == [("B", 100), ("A", 1), ("A", 2), ("A", 3), ("B", 101), ("A", 4)]
    assert o.clamped == 2


def test_child_records_arriving_while_parent_still_buffers_rows_wait_for_the_parent():
    lineage = Lineage({"child": ("parent",)})
    o = ordering(lineage)
    lineage.open.add("parent")
    add(o, "parent", 1, [1000, 2000], "parent")
    add(o, "child", 50, [500, 1500], "child")  # earlier times, while the parent is still open
    assert o.release(now=0) == []
    add(o, "parent", 3, [2500], "parent")
    lineage.open.discard("parent")
    assert o.release(now=0) == ["child"]
    [window] = o.close(until=MINUTE)
    assert contents(window) == [("parent", 1), ("parent", 2), ("parent", 3), ("child", 50), ("child", 51)]
    assert o.clamped == 2  # both child rows moved up to the parent's last time


def test_a_parent_blocks_its_child_as_of_the_now_it_is_asked_with():
    lineage = Lineage({"child": ("parent",)})
    asked = []

    def blocks(parent, now):
        asked.append((parent, now))
        return now < 10_000  # the parent holds until its idle timeout, at 10 s

    o = Ordering(window_ms=MINUTE, blocks=blocks, parents_of=lineage.parents_of)
    items = rows(50, [500])
    o.add("child", items, last(items), now=9_000)
    assert o.release(now=9_999) == []
    assert o.release(now=10_000) == ["child"]
    assert asked == [("parent", 9_000), ("parent", 9_999), ("parent", 10_000)]


def test_child_whose_id_sorts_before_its_parent_still_follows_it_at_equal_times():
    lineage = Lineage({"a-child": ("z-parent",)})
    o = ordering(lineage)
    add(o, "z-parent", 1, [1000], "parent")
    add(o, "a-child", 10, [1000], "child")
    [window] = o.close(until=MINUTE)
    assert contents(window) == [("parent", 1), ("child", 10)]


def test_merge_child_waits_for_both_parents():
    lineage = Lineage({"C": ("P1", "P2")})
    o = ordering(lineage)
    lineage.open |= {"P1", "P2"}
    add(o, "P1", 1, [1000], "P1")
    add(o, "P2", 100, [3000], "P2")
    add(o, "C", 200, [2000], "C")
    lineage.open.discard("P1")
    assert o.release(now=0) == []
    lineage.open.discard("P2")
    assert o.release(now=0) == ["C"]
    [window] = o.close(until=MINUTE)
    assert contents(window) == [("P1", 1), ("P2", 100), ("C", 200)]


def test_redelivered_records_after_a_daemon_restart_are_dropped_and_counted():
    o = ordering()
    add(o, "A", 1, [1000, 1001, 1002], "first")
    kept = add(o, "A", 2, [1001, 1002, 1003, 1004], "again")  # resumed from a checkpoint at 1
    assert [r.position.seq for r in kept] == [4, 5]
    assert o.duplicates == 2
    [window] = o.close(until=MINUTE)
    assert contents(window) == [("first", 1), ("first", 2), ("first", 3), ("again", 4), ("again", 5)]


def test_records_without_rows_still_count_as_delivered():
    o = ordering()
    o.add("A", RowBatch.empty(), Position.parse("7"), now=0)  # a batch whose rows the handler filtered out
    kept = add(o, "A", 7, [1000, 1001], "x")
    assert [r.position.seq for r in kept] == [8] and o.duplicates == 1


def test_merge_key_breaks_ties_by_shard_id_then_sequence_number_as_integer():
    o = ordering()
    add(o, "B", 10**30, [1000], "B")
    add(o, "A", 9, [1000, 1000], "A")
    add(o, "A2", 10, [999], "A2")
    [window] = o.close(until=MINUTE)
    assert contents(window) == [("A2", 10), ("A", 9), ("A", 10), ("B", 10**30)]


def test_late_rows_go_to_the_next_window_flagged_and_counted():
    o = ordering()
    add(o, "A", 1, [10_000, 70_000], "A")
    [first] = o.close(until=MINUTE)
    assert contents(first) == [("A", 1)]
    add(o, "B", 1, [20_000, 30_000], "B")  # its window has closed
    assert o.late_rows == 2
    assert o.close(until=MINUTE + 30_000) == []  # late rows wait for the next window
    [second] = o.close(until=2 * MINUTE)
    assert (second.start, second.late_rows) == (MINUTE, 2)
    assert contents(second) == [("B", 1), ("B", 2), ("A", 2)]


def test_late_rows_are_handed_over_alone_when_every_shard_is_idle():
    o = ordering()
    add(o, "A", 1, [10_000], "A")
    o.close(until=MINUTE)
    add(o, "B", 1, [20_000], "B")
    [window] = o.close(until=float("inf"))
    assert window.late_rows == 1 and contents(window) == [("B", 1)]
    assert window.start == MINUTE  # its own id: the window after the one closed


def test_windows_close_in_order_only_when_the_watermark_passes_their_end():
    o = ordering()
    add(o, "A", 1, [0, 59_999, 60_000, 125_000], "A")
    assert o.close(until=59_999) == []
    closed = o.close(until=120_000)
    assert [(w.start, w.end, len(w)) for w in closed] == [(0, MINUTE, 2), (MINUTE, 2 * MINUTE, 1)]
    assert o.buffered_windows() == 1


def test_rows_without_event_time_take_the_shards_last_time_or_now():
    o = ordering()
    items = rows(1, [None, 5000, None])
    kept = o.add("A", items, last(items), now=4000)
    assert [r.time for r in kept] == [4000, 5000, 5000]


def test_seal_records_each_shards_highest_position():
    o = ordering()
    add(o, "A", 5, [1000, 2000])
    add(o, "B", 1, [1500])
    [closed] = o.close(until=MINUTE)
    window, counts = seal(closed)
    assert counts == {"A": 2, "B": 1}
    assert window.positions == {"A": Position(6, 0, "6"), "B": Position(1, 0, "1")}
    assert (window.start, window.end, window.late_rows, len(window)) == (0, MINUTE, 0, 3)
    assert all(type(row) is bytes for row in window.rows)


# -- the columns: a batch as the handler emitted it ------------------------------------


def emitted(positions, order, time=1000, tag=""):
    """A batch whose records are ``positions`` and whose rows came from the records at
    ``order`` (indexes), as a handler process hands them over; all at ``time``."""
    lines = [orjson.dumps({"seq": str(positions[i].seq), "tag": tag}) + b"\n" for i in order]
    offsets = np.cumsum([0] + [len(line) for line in lines])
    return RowBatch(np.full(len(order), time, dtype=np.int64), np.array(order), positions, b"".join(lines), offsets)


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
    sealed, counts = seal(window)
    assert [(orjson.loads(r)["tag"], int(orjson.loads(r)["seq"])) for r in sealed.rows] == [
        ("A", 10), ("A", 10), ("A", 11), ("A", 12), ("A0", 99), ("B", 5)]
    assert sealed.positions["A"] == Position(12, 0, "12") and closed_positions is records
    assert counts == {"A": 4, "A0": 1, "B": 1}


def test_duplicates_among_rows_out_of_record_order_are_dropped_by_position():
    o = ordering()
    o.delivered("A", Position.parse("11"))  # a checkpoint at 11: 10 and 11 were delivered
    records = [Position.parse(str(s)) for s in (10, 11, 12, 13)]
    kept = o.add("A", emitted(records, [2, 0, 3, 1]), records[-1], now=0)
    assert [r.position.seq for r in kept] == [12, 13] and o.duplicates == 2


def test_a_batch_split_by_a_closed_window_hands_its_late_rows_with_its_next_window():
    o = ordering()
    add(o, "A", 1, [10_000], "A")
    o.close(until=MINUTE)
    add(o, "B", 1, [50_000, 55_000, 70_000], "B")  # two late rows, one on time, in one batch
    assert o.late_rows == 2
    [window] = o.close(until=2 * MINUTE)
    assert (window.start, window.late_rows) == (MINUTE, 2)
    assert contents(window) == [("B", 1), ("B", 2), ("B", 3)]


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


def test_each_shards_rows_are_cut_from_its_queue_without_a_copy():
    o = ordering()
    batch = rows(1, [1000, 61_000, 62_000], "A")
    o.add("A", batch, last(batch), now=0)
    [first] = o.close(until=MINUTE)
    [part] = first.parts["A"]
    assert part.body is batch.body and len(part) == 1
    [rest] = o.shards["A"].queue
    assert rest.body is batch.body and rest.times.tolist() == [61_000, 62_000]


def loaded_after(script: str, *modules: str) -> list[str]:
    """Which of ``modules`` a fresh interpreter has loaded once ``script`` ran."""
    script += f"\nimport sys\nprint(','.join(m for m in {modules!r} if m in sys.modules))\n"
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    return [m for m in out.strip().split(",") if m]


def test_a_server_without_a_sink_and_the_handler_processes_never_load_numpy():
    # Every batch goes through encode_rows, rows or none; numpy is some 12 MiB a process.
    script = ("import mldserver.server, mldserver.pool.child\n"
              "from mldserver.shard.batches import encode_rows\n"
              "rows, bad = encode_rows(())\n"
              "assert len(rows) == 0 and bad == []\n")
    assert loaded_after(script, "numpy", "pyarrow") == []


@pytest.mark.parametrize("block", [1, 2, 5, 1 << 16])
def test_interleaved_rows_are_gathered_in_merged_order_whatever_the_block_of_rows_taken_at_once(
        monkeypatch, block):
    monkeypatch.setattr(ordering_module, "TAKE_BLOCK", block)
    o = ordering()
    for shard_id in ("C", "A", "B"):
        add(o, shard_id, 1, [1000, 2000, 2000, 3000], shard_id)
    records = [Position.parse(str(s)) for s in (10, 11, 12)]
    o.add("D", emitted(records, [2, 0, 1], time=2000, tag="D"), records[-1], now=0)  # out of record order
    [closed] = o.close(until=MINUTE)
    assert contents(closed) == [("A", 1), ("B", 1), ("C", 1), ("A", 2), ("A", 3), ("B", 2), ("B", 3), ("C", 2),
                                ("C", 3), ("D", 10), ("D", 11), ("D", 12), ("A", 4), ("B", 4), ("C", 4)]


def test_gathering_a_window_of_interleaved_shards_never_loads_pandas():
    # pyarrow imports pandas when first handed a numpy array (0.2 s on the first commit, 30 MiB).
    script = ("from mldserver.coordinator.ordering import Item, Ordering, RowBatch, seal\n"
              "from mldserver.positions import Position\n"
              "o = Ordering(window_ms=60_000, blocks=lambda s, now: False, parents_of=lambda s: ())\n"
              "for shard_id in 'AB':\n"
              "    rows = RowBatch.of(Item(1000 + i, Position.parse(str(i)), b'{}') for i in range(3))\n"
              "    o.add(shard_id, rows, rows.position(-1), now=0)\n"
              "[closed] = o.close(until=60_000)\n"
              "window, _ = seal(closed)\n"
              "assert bytes(window.rows.buffer()) == b'{}\\n' * 6\n")
    assert loaded_after(script, "pandas") == []


def test_a_dropped_shard_leaves_the_windows_and_comes_back_with_only_its_committed_rows_duplicates():
    ordering = Ordering(window_ms=MINUTE, blocks=lambda p, now: False, parents_of=lambda s: ())
    a, b = rows(1, [1_000, 70_000], "a"), rows(100, [2_000, 3_000], "b")
    ordering.add("A", a, last(a), now=0)
    ordering.add("B", b, last(b), now=0)
    assert ordering.drop("B", high=Position.parse("100")) == 2
    [first, second] = ordering.close(until=float("inf"))
    assert contents(first) + contents(second) == [("a", 1), ("a", 2)]
    again = rows(100, [2_000, 3_000], "b")  # delivered again after the lease came back
    kept = ordering.add("B", again, last(again), now=0)
    assert [r.position.seq for r in kept] == [101] and ordering.duplicates == 1


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


def test_late_rows_alone_are_handed_over_once_the_next_window_is_past_the_watermark():
    ordering = Ordering(window_ms=MINUTE, blocks=lambda p, now: False, parents_of=lambda s: ())
    ordering.add("A", rows(1, [1_000]), Position.parse("1"), now=0)
    assert len(ordering.close(until=MINUTE)) == 1
    moved = rows(100, [2_000, 3_000])  # a lease moved here: rows older than what closed
    ordering.add("B", moved, last(moved), now=0)
    assert ordering.close(until=MINUTE + 59_999) == []  # the next window may still get rows
    [window] = ordering.close(until=2 * MINUTE)  # no row came: the late rows go alone
    assert (window.start, window.end, window.late_rows, len(window)) == (MINUTE, 2 * MINUTE, 2, 2)
