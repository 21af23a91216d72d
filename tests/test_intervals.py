"""Committed intervals (``base.intervals``): merged where they overlap or touch, kept
short, read back from their JSON form."""

from __future__ import annotations

import random

import pytest

from mldserver.base.intervals import MAX_INTERVALS, after, covers, from_json, joined, spans, to_json, top, union
from mldserver.base.positions import Position


def p(seq, sub=0):
    return Position(seq, sub, str(seq))


def test_a_reading_after_a_checkpoint_covers_the_records_above_it_up_to_its_highest():
    c = joined((), after(p(99)), p(150))
    assert [covers(c, x) for x in (p(99), p(99, 1), p(100), p(150), p(150, 1), p(151))] == [
        False, True, True, True, False, False]
    assert top(c) == p(150) and top(()) is None


def test_a_reading_that_starts_at_a_checkpoint_inside_or_at_the_end_of_an_interval_merges_with_it():
    c = joined((), after(p(99)), p(150))
    assert joined(c, after(p(150)), p(200)) == ((after(p(99)), p(200)),)  # the checkpoint at its end
    assert joined(c, after(p(120)), p(200)) == ((after(p(99)), p(200)),)
    assert joined(c, after(p(49)), p(160)) == ((after(p(49)), p(160)),)  # from below: one again
    assert joined(c, after(p(151)), p(200)) == ((after(p(99)), p(150)), (after(p(151)), p(200)))  # 151: no one's
    assert joined(c, p(151), p(200)) == ((after(p(99)), p(150)), (p(151), p(200)))  # (150, 1) may be a record
    assert joined(c, p(150, 1), p(200)) == ((after(p(99)), p(200)),)  # a first record right above: touches
    assert joined(c, p(200), p(150)) == c  # above its high: nothing


def test_an_old_high_mark_covers_everything_below_it():
    c = joined((), None, p(150))
    assert covers(c, p(1)) and covers(c, p(150)) and not covers(c, p(151))
    assert joined(c, after(p(49)), p(160)) == ((None, p(160)),)


def test_the_list_stays_short_by_merging_the_lowest():
    c = ()
    for i in range(MAX_INTERVALS + 3):
        c = joined(c, p(i * 10), p(i * 10 + 5))
    assert len(c) == MAX_INTERVALS and c[0] == (p(0), p(35)) and c[-1] == (p(100), p(105))
    assert covers(c, p(7))  # a gap merged away counts as committed (the oldest positions)


def test_json_round_trips_and_refuses_what_is_not_intervals():
    c = ((None, p(5)), (after(p(49)), p(160)))
    assert to_json(c) == [[None, ["5", 0]], [["49", 1], ["160", 0]]]
    assert from_json(to_json(c)) == c
    with pytest.raises(ValueError):
        from_json([["5", 0]])
    with pytest.raises(ValueError):
        from_json({"low": None})


def test_spans_are_the_records_inside_an_interval():
    positions = [p(s) for s in (10, 20, 30, 40, 50)]
    assert spans(((after(p(15)), p(30)), (p(45), p(60))), positions) == [(1, 3), (4, 5)]
    assert spans(((None, p(5)),), positions) == []


@pytest.mark.parametrize("seed", range(20))
def test_joined_and_union_agree_with_sets_of_positions(seed):
    rng = random.Random(seed)
    c, covered = (), set()
    for _ in range(rng.randint(1, MAX_INTERVALS - 2)):  # (no merging of the lowest: the sets must agree)
        low = rng.randint(0, 200)
        high = rng.randint(low, 220)
        c = joined(c, after(p(low)), p(high))
        covered.update(range(low + 1, high + 1))
    assert {s for s in range(0, 230) if covers(c, p(s))} == covered
    assert union(c, c) == c and union((), c) == c and union(c, ()) == c
    assert all(c[i][1] < c[i + 1][0] for i in range(len(c) - 1))  # sorted, apart
