"""Ordering: per-shard FIFO, clamps, duplicates, lineage, late rows, the merge key.
Plain objects, no event loop: the clock is a number passed in."""

from __future__ import annotations

import numpy as np
import orjson

from mldserver.coordinator.merge import seal
from mldserver.coordinator.ordering import Ordering
from mldserver.base.positions import Position
from mldserver.rows.batch import Item, RowBatch

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
    return flat(o.add(shard_id, items, last(items), now=0))


def flat(pieces):
    """The rows ``Ordering.add`` kept, one by one across its pieces."""
    return [item for piece in pieces for item in piece]


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


def test_a_childs_rows_held_for_its_parents_are_what_holds_children_answers():
    lineage = Lineage({"child": ("parent",)})
    o = ordering(lineage)
    lineage.open.add("parent")
    add(o, "parent", 1, [1000], "parent")
    assert not o.holds_children(["child", "never-here"])
    add(o, "child", 50, [500], "child")
    assert o.holds_children(["child"]) and not o.holds_children(["parent"])
    lineage.open.discard("parent")
    assert o.release(now=0) == ["child"] and not o.holds_children(["child"])
    assert "never-here" not in o.shards  # asking keeps nothing of a shard


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
    kept = flat(o.add("A", items, last(items), now=4000))
    assert [r.time for r in kept] == [4000, 5000, 5000]


# -- the columns: a batch as the handler emitted it ------------------------------------


def emitted(positions, order, time=1000, tag=""):
    """A batch whose records are ``positions`` and whose rows came from the records at
    ``order`` (indexes), as a handler process hands them over; all at ``time``."""
    lines = [orjson.dumps({"seq": str(positions[i].seq), "tag": tag}) + b"\n" for i in order]
    offsets = np.cumsum([0] + [len(line) for line in lines])
    return RowBatch(np.full(len(order), time, dtype=np.int64), np.array(order), positions, b"".join(lines), offsets)


def test_duplicates_among_rows_out_of_record_order_are_dropped_by_position():
    o = ordering()
    o.delivered("A", ((None, Position.parse("11")),))  # a checkpoint at 11: 10 and 11 were delivered
    records = [Position.parse(str(s)) for s in (10, 11, 12, 13)]
    kept = flat(o.add("A", emitted(records, [2, 0, 3, 1]), records[-1], now=0))
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


def test_a_batch_within_one_window_is_cut_from_its_queue_without_a_copy():
    o = ordering()
    batch = rows(1, [1000, 2000, 3000], "A")
    o.add("A", batch, last(batch), now=0)
    [window] = o.close(until=MINUTE)
    [part] = window.parts["A"]
    assert part.body is batch.body and len(part) == 3


def test_a_batch_spanning_windows_comes_apart_in_one_piece_a_window_each_in_buffers_of_its_own():
    o = ordering()
    batch = rows(1, [1000, 61_000, 62_000, 125_000], "A")
    pieces = o.add("A", batch, last(batch), now=0)
    assert [p.times.tolist() for p in pieces] == [[1000], [61_000, 62_000], [125_000]]
    assert [[r.position.seq for r in p] for p in pieces] == [[1], [2, 3], [4]]
    assert [p.row(0) for p in pieces] == [batch.row(0), batch.row(1), batch.row(3)]
    # nothing of the batch is held by a piece: a window's commit lets go of its rows
    original = [np.frombuffer(batch.body, np.uint8), batch.offsets, batch.times, batch.records]
    for piece in pieces:
        for column in (piece.body, piece.offsets, piece.times, piece.records):
            assert not any(np.shares_memory(np.asarray(column), o) for o in original)
    assert sum(p.held_bytes() for p in pieces) < 2 * batch.held_bytes()
    [first, second] = o.close(until=2 * MINUTE)
    assert [first.parts["A"][0], second.parts["A"][0]] == pieces[:2]  # cut as they are


def test_a_dropped_shard_leaves_the_windows_and_comes_back_with_only_its_committed_rows_duplicates():
    ordering = Ordering(window_ms=MINUTE, blocks=lambda p, now: False, parents_of=lambda s: ())
    a, b = rows(1, [1_000, 70_000], "a"), rows(100, [2_000, 3_000], "b")
    ordering.add("A", a, last(a), now=0)
    ordering.add("B", b, last(b), now=0)
    assert ordering.drop("B", ((None, Position.parse("100")),)) == 2
    [first, second] = ordering.close(until=float("inf"))
    assert contents(first) + contents(second) == [("a", 1), ("a", 2)]
    again = rows(100, [2_000, 3_000], "b")  # delivered again after the lease came back
    kept = flat(ordering.add("B", again, last(again), now=0))
    assert [r.position.seq for r in kept] == [101] and ordering.duplicates == 1


def test_late_rows_alone_are_handed_over_once_the_next_window_is_past_the_watermark():
    ordering = Ordering(window_ms=MINUTE, blocks=lambda p, now: False, parents_of=lambda s: ())
    ordering.add("A", rows(1, [1_000]), Position.parse("1"), now=0)
    assert len(ordering.close(until=MINUTE)) == 1
    moved = rows(100, [2_000, 3_000])  # a lease moved here: rows older than what closed
    ordering.add("B", moved, last(moved), now=0)
    assert ordering.close(until=MINUTE + 59_999) == []  # the next window may still get rows
    [window] = ordering.close(until=2 * MINUTE)  # no row came: the late rows go alone
    assert (window.start, window.end, window.late_rows, len(window)) == (MINUTE, 2 * MINUTE, 2, 2)


def test_a_reading_starts_above_its_checkpoint_or_at_its_first_record_and_its_rows_are_its_interval():
    o = ordering()
    o.opened("A", Position.parse("99"), buffered=False)
    add(o, "A", 100, [1_000] * 51)
    assert o.reading("A") == (Position(99, 1, "99"), None)  # its rows wait for their window
    o.opened("B", "LATEST", buffered=False)
    add(o, "B", 100, [1_000, 1_000])
    assert o.reading("B")[0] == Position.parse("100")
    o.close(until=float("inf"))
    assert o.reading("A") == (Position(99, 1, "99"), Position.parse("150"))  # all in windows: it covers that far
    # read again from below where it started: the rows below are new, those above duplicates
    o.opened("A", Position.parse("49"), buffered=False)
    kept = add(o, "A", 50, [2_000] * 111)
    assert [r.position.seq for r in kept] == [*range(50, 100), *range(151, 161)] and o.duplicates == 51
    assert o.reading("A")[0] == Position(49, 1, "49")


def test_a_reading_continues_the_one_whose_rows_are_here_only_from_within_or_right_after_what_it_delivered():
    o = ordering()
    o.opened("A", Position.parse("99"), buffered=False)
    add(o, "A", 100, [1_000] * 51)
    apart = {c: o.apart("A", c) for c in (Position.parse("99"), Position.parse("120"), Position.parse("150"),
                                          Position.parse("49"), Position.parse("151"), "TRIM_HORIZON", None)}
    assert [c for c, a in apart.items() if not a] == [Position.parse("99"), Position.parse("120"),
                                                      Position.parse("150")]
    o.opened("A", Position.parse("120"), buffered=True)  # (a daemon restarted at its checkpoint)
    assert o.reading("A")[0] == Position(99, 1, "99")  # one reading: its start stays
    assert not o.apart("B", "LATEST")  # nothing read here


def test_a_reading_that_continued_another_and_delivered_nothing_is_still_told_apart_from_one_past_a_gap():
    o = ordering()
    o.opened("A", Position.parse("99"), buffered=False)
    add(o, "A", 100, [1_000] * 51)
    o.opened("A", Position.parse("120"), buffered=True)  # a daemon restart; then another before any batch
    assert o.apart("A", Position.parse("200")) and not o.apart("A", Position.parse("150"))
