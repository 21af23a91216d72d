"""Watermarks with a fake clock: last event time, caught up, idle, ended, split, merge."""

from __future__ import annotations

import math

from mldserver.coordinator.watermarks import Watermarks


def marks(children=None):
    children = children or {}
    return Watermarks(margin_ms=5_000, idle_timeout_ms=60_000, children_of=lambda s: children.get(s, ()))


def test_a_shard_stands_at_its_last_event_time_and_the_minimum_holds_everything():
    wm = marks()
    wm.open("A", 0)
    wm.open("B", 0)
    assert wm.minimum(0) == -math.inf  # B has not reported: nothing may close
    wm.batch("A", 10_000, caught_up=False, now=1)
    wm.batch("B", 7_000, caught_up=False, now=1)
    assert wm.minimum(1) == 7_000 and wm.holder(1) == "B"
    wm.batch("B", None, caught_up=False, now=2)  # a batch without rows changes nothing
    assert wm.minimum(2) == 7_000


def test_caught_up_shard_stands_at_the_wall_clock_minus_the_margin_even_when_empty():
    wm = marks()
    wm.open("A", 0)
    wm.batch("A", None, caught_up=True, now=100_000)  # callProcessRecordsEvenForEmptyRecordList
    assert wm.value("A") == 95_000
    wm.batch("A", 99_000, caught_up=True, now=100_500)
    assert wm.value("A") == 99_000  # its own rows are later than the clock's bound


def test_idle_shard_stops_holding_the_others_back():
    wm = marks()
    wm.open("A", 0)
    wm.open("B", 0)
    wm.batch("A", 50_000, caught_up=False, now=0)
    wm.batch("B", 1_000, caught_up=False, now=0)
    assert wm.minimum(60_000) == 1_000
    wm.batch("A", 80_000, caught_up=False, now=60_001)
    assert wm.minimum(60_001) == 80_000  # B silent for more than the idle timeout
    wm.batch("B", 2_000, caught_up=False, now=60_002)
    assert wm.minimum(60_002) == 2_000  # back as soon as it speaks


def test_no_holding_shard_lets_everything_close():
    wm = marks()
    wm.open("A", 0)
    assert wm.minimum(60_001) == math.inf


def test_ended_shard_holds_at_its_last_time_until_its_late_children_report():
    children = {"P": ["C1", "C2"]}
    wm = marks(children)
    for s in ("P", "X"):
        wm.open(s, 0)
    wm.batch("P", 10_000, caught_up=False, now=0)
    wm.batch("X", 90_000, caught_up=False, now=0)
    wm.ended("P", 1_000)
    assert wm.minimum(30_000) == 10_000  # no child yet
    wm.open("C1", 30_000)
    wm.batch("C1", 20_000, caught_up=False, now=30_000)
    assert wm.minimum(30_000) == 10_000  # C2 has not reported
    wm.open("C2", 40_000)
    wm.batch("C2", 25_000, caught_up=False, now=40_000)
    assert wm.minimum(40_000) == 20_000  # P released; the children hold now


def test_ended_shard_whose_children_never_come_here_stops_holding_after_the_idle_timeout():
    wm = marks({"P": ["C"]})  # C is leased by another worker
    wm.open("P", 0)
    wm.open("X", 0)
    wm.batch("P", 10_000, caught_up=False, now=0)
    wm.ended("P", 0)
    wm.batch("X", 50_000, caught_up=False, now=60_001)
    assert wm.minimum(60_001) == 50_000


def test_merge_child_releases_both_parents():
    wm = marks({"P1": ["C"], "P2": ["C"]})
    for s, t in (("P1", 1_000), ("P2", 2_000)):
        wm.open(s, 0)
        wm.batch(s, t, caught_up=False, now=0)
        wm.ended(s, 0)
    wm.open("C", 0)
    assert wm.minimum(0) == -math.inf  # C holds until it reports
    wm.batch("C", 3_000, caught_up=False, now=1)
    assert wm.minimum(1) == 3_000


def test_a_shard_is_live_while_known_here_not_ended_and_not_idle():
    wm = marks()
    assert not wm.tracks("A") and not wm.live("A", 0)
    wm.open("A", 0)
    assert wm.tracks("A") and wm.live("A", 60_000) and not wm.live("A", 60_001)  # idle after the timeout
    wm.ended("A", 1)
    assert wm.tracks("A") and not wm.live("A", 1) and wm.holds("A", 1)  # ended: holds, adds no rows
    wm.forget("A")
    assert not wm.tracks("A")


def test_a_shard_held_by_back_pressure_never_idles_and_its_idle_time_starts_at_release():
    wm = marks()
    for s, t in (("A", 10_000), ("B", 80_000)):
        wm.open(s, 0)
        wm.batch(s, last_time=t, caught_up=False, now=0)
    wm.hold("A")
    assert wm.minimum(600_000) == 10_000 and wm.holder(600_000) == "A"  # silent, but kept waiting
    wm.release("A", 600_000)
    wm.batch("B", last_time=90_000, caught_up=False, now=650_000)
    assert wm.minimum(660_000) == 10_000  # idle time counts from the release
    assert wm.minimum(660_001) == 90_000
    wm.hold("gone")  # a shard not known here (forgotten while it waited): nothing to hold
    wm.release("gone", 0)


def test_event_times_from_the_data_keep_a_caught_up_shard_at_what_its_rows_say():
    wm = marks()
    wm.open("A", 0)
    wm.open("B", 0)
    wm.batch("A", 1_000_000, caught_up=True, now=1_700_000_000_000, timed=True)  # a replay of old data, caught up
    wm.batch("B", 900_000, caught_up=False, now=1_700_000_000_000, timed=True)
    assert wm.value("A") == 1_000_000  # not the wall clock: B's rows at 950_000 are still to come
    assert wm.minimum(1_700_000_000_000) == 900_000
    wm.batch("A", None, caught_up=True, now=1_700_000_001_000)  # an empty poll, caught up
    assert wm.value("A") == 1_000_000


def test_once_data_times_are_seen_a_clock_a_shard_stood_at_no_longer_counts():
    wm = marks()
    wm.open("A", 0)
    wm.batch("A", None, caught_up=True, now=100_000)  # before any row: the clock's bound
    assert wm.value("A") == 95_000
    wm.batch("B", 2_000, caught_up=False, now=100_000, timed=True)  # another shard's rows carry data times
    assert wm.value("A") == -math.inf and wm.minimum(100_000) == -math.inf  # A has reported no row


def test_under_data_times_a_caught_up_shard_with_nothing_to_read_goes_idle():
    wm = marks()
    wm.open("A", 0)
    wm.open("B", 0)
    wm.batch("A", 5_000, caught_up=True, now=0, timed=True)
    wm.batch("B", 9_000, caught_up=False, now=0, timed=True)
    for now in range(1_000, 61_000, 1_000):  # polled every second, nothing new
        wm.batch("A", None, caught_up=True, now=now)
        wm.batch("B", 9_000 + now, caught_up=False, now=now, timed=True)
    assert wm.holder(60_000) == "A"  # quiet 60 s: not yet past the idle timeout
    wm.batch("B", 80_000, caught_up=False, now=60_001, timed=True)
    assert wm.holder(60_001) == "B" and not wm.holds("A", 60_001)


def test_arrival_times_keep_a_caught_up_empty_shard_at_the_clock_and_holding():
    wm = marks()
    wm.open("A", 0)
    for now in range(0, 200_000, 1_000):
        wm.batch("A", None, caught_up=True, now=now)
    assert wm.holds("A", 199_000) and wm.value("A") == 194_000


def test_a_shard_expected_here_holds_from_then_and_one_gone_quiet_holds_again():
    wm = marks({"P": ["C"]})
    wm.batch("A", 50_000, caught_up=False, now=0)
    wm.expect("B", 1_000)  # B's lease taken here: it holds before its first batch
    assert wm.minimum(1_000) == -math.inf and wm.holder(1_000) == "B"
    wm.batch("B", 40_000, caught_up=False, now=2_000)
    wm.expect("B", 3_000)  # already holding: nothing changes
    assert wm.minimum(3_000) == 40_000
    assert wm.minimum(70_000) == math.inf  # both quiet past the idle timeout
    wm.expect("B", 70_000)  # its lease taken here again: it holds again, from its own watermark
    assert wm.holding("B", 70_000) and wm.minimum(70_000) == 40_000
    wm.batch("P", 10_000, caught_up=False, now=70_000)
    wm.ended("P", 70_000)
    wm.expect("P", 70_001)  # an ended shard is not made to hold again
    assert wm.shards["P"].ended
