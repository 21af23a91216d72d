"""Windows: tumbling windows aligned to the epoch, as the module docstring shows them."""

from __future__ import annotations

import pytest

from mldserver.coordinator.windows import Tumbling


def test_a_time_falls_in_the_window_that_starts_at_or_before_it_and_ends_after_it():
    minute = Tumbling(60_000)
    assert (minute.start(61_500), minute.end(61_500)) == (60_000, 120_000)
    assert (minute.start(60_000), minute.end(59_999)) == (60_000, 60_000)
    assert minute.end(120_000) == 180_000  # an end belongs to the next window
    assert minute.start(-1) == -60_000  # floored before the epoch too


@pytest.mark.parametrize("t", [0, 1, 59_999, 60_000, 1_763_800_012_345, -59_999])
def test_start_and_end_are_the_spelling_they_replace(t):
    size = 60_000
    assert Tumbling(size).start(t) == t - t % size and Tumbling(size).end(t) == t - t % size + size


def test_a_watermark_given_as_a_float_is_answered_with_an_int():
    start = Tumbling(10_000).start(12_345.5)
    assert start == 10_000 and type(start) is int
