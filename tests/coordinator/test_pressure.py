"""Pressure, as a table: for each case (what is buffered and committing, where the
shard stands), who waits and why. Pure: no loop, no clock."""

from __future__ import annotations

import math

import pytest

from mldserver.coordinator.pressure import HIGH_WATER, Load, Place, Reason, runs_ahead, should_wait

CAP_ROWS, CAP_BYTES = 1_000, 1 << 30
CALM = Load(rows=10, bytes=10, max_rows=CAP_ROWS, max_bytes=CAP_BYTES)
FULL_ROWS = Load(rows=int(CAP_ROWS * HIGH_WATER) + 1, bytes=0, max_rows=CAP_ROWS, max_bytes=CAP_BYTES)
FULL_BYTES = Load(rows=0, bytes=int(CAP_BYTES * HIGH_WATER) + 1, max_rows=CAP_ROWS, max_bytes=CAP_BYTES)
AT_MARK = Load(rows=int(CAP_ROWS * HIGH_WATER), bytes=int(CAP_BYTES * HIGH_WATER), max_rows=CAP_ROWS,
               max_bytes=CAP_BYTES)
SINK_BEHIND = Load(rows=10, bytes=10, max_rows=CAP_ROWS, max_bytes=CAP_BYTES, waiting=1, committing=True)
SEALED_IDLE = Load(rows=10, bytes=10, max_rows=CAP_ROWS, max_bytes=CAP_BYTES, waiting=2, committing=False)
COMMITTING_ALONE = Load(rows=10, bytes=10, max_rows=CAP_ROWS, max_bytes=CAP_BYTES, waiting=0, committing=True)

# The global watermark is in [60_000, 120_000); B holds it at 61_000.
AHEAD = Place(holder="B", watermark=130_000, window_end=120_000, parent_of_held=False)
HOLDER = Place(holder="A", watermark=61_000, window_end=120_000, parent_of_held=False)
SHORT_OF_END = Place(holder="B", watermark=119_999, window_end=120_000, parent_of_held=False)
AT_END = Place(holder="B", watermark=120_000, window_end=120_000, parent_of_held=False)
PARENT = Place(holder="B", watermark=130_000, window_end=120_000, parent_of_held=True)
NO_HOLDER = Place(holder=None, watermark=130_000, window_end=-math.inf, parent_of_held=False)
UNREPORTED_HOLDER = Place(holder="B", watermark=130_000, window_end=-math.inf, parent_of_held=False)

TABLE = [
    # load, place of A, why A waits
    (CALM, AHEAD, None),
    (CALM, HOLDER, None),
    (AT_MARK, AHEAD, None),  # at the mark is not past it
    (FULL_ROWS, AHEAD, Reason.BUFFERED_CAP),
    (FULL_BYTES, AHEAD, Reason.BUFFERED_CAP),
    (FULL_ROWS, HOLDER, None),  # the holder never waits for memory
    (FULL_ROWS, SHORT_OF_END, None),  # the window in front needs it
    (FULL_ROWS, AT_END, Reason.BUFFERED_CAP),  # past the end (an end is in the next window)
    (FULL_ROWS, PARENT, None),  # a child waits on it
    (FULL_ROWS, NO_HOLDER, Reason.BUFFERED_CAP),  # nothing holds: every shard runs ahead
    (FULL_ROWS, UNREPORTED_HOLDER, Reason.BUFFERED_CAP),
    (SINK_BEHIND, AHEAD, Reason.SINK_BEHIND),
    (SINK_BEHIND, HOLDER, Reason.SINK_BEHIND),  # the window in front commits without it
    (SINK_BEHIND, PARENT, Reason.SINK_BEHIND),
    (SEALED_IDLE, AHEAD, None),  # sealed, but nothing commits in front: the next pass takes it
    (COMMITTING_ALONE, AHEAD, None),  # a commit with nothing behind it holds nobody
]


@pytest.mark.parametrize("load, place, reason", TABLE)
def test_who_waits_and_why(load, place, reason):
    assert should_wait("A", load, lambda: place) == reason


def test_the_place_is_read_only_when_memory_is_past_the_mark():
    def place():
        raise AssertionError("read")

    assert should_wait("A", CALM, place) is None
    assert should_wait("A", SINK_BEHIND, place) is Reason.SINK_BEHIND


def test_the_sink_behind_outranks_the_cap():
    full_and_behind = Load(rows=CAP_ROWS, bytes=0, max_rows=CAP_ROWS, max_bytes=CAP_BYTES, waiting=1,
                           committing=True)
    assert should_wait("A", full_and_behind, lambda: AHEAD) is Reason.SINK_BEHIND


def test_a_shard_runs_ahead_only_past_the_window_in_front_and_with_no_child_waiting():
    assert runs_ahead("A", AHEAD)
    assert not runs_ahead("A", HOLDER) and not runs_ahead("A", SHORT_OF_END) and not runs_ahead("A", PARENT)
    assert runs_ahead("A", AT_END)
