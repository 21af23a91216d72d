"""The native gather of a window's rows: each row copied once, in the order given, and
nothing copied when a row is not inside its body or the rows do not fit."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from mldserver.coordinator._gather import gather

BODIES = [b'{"k":1}\n{"k":3}\n', b'{"k":2}\n']


def int64s(*values):
    return np.array(values, dtype=np.int64)


def test_rows_are_copied_one_after_another_in_the_order_given():
    out = bytearray(24)
    assert gather(out, BODIES, int64s(0, 1, 0), int64s(0, 0, 8), int64s(8, 8, 16)) == 24
    assert bytes(out) == b'{"k":1}\n{"k":2}\n{"k":3}\n'


@given(st.lists(st.binary(max_size=40), min_size=1, max_size=6), st.data())
def test_any_rows_of_any_bodies_come_out_as_slicing_them_would(bodies, data):
    picks = data.draw(st.lists(st.tuples(st.integers(0, len(bodies) - 1), st.integers(0, 40), st.integers(0, 40)),
                               max_size=30))
    rows = [(p, min(a, b, len(bodies[p])), min(max(a, b), len(bodies[p]))) for p, a, b in picks]
    want = b"".join(bodies[p][a:b] for p, a, b in rows)
    out = np.zeros(len(want) + 3, dtype=np.uint8)
    columns = [int64s(*(r[i] for r in rows)) for i in range(3)]
    assert gather(out, [memoryview(b) for b in bodies], *columns) == len(want)
    assert out[: len(want)].tobytes() == want


@pytest.mark.parametrize("part, start, end, error", [
    ((2,), (0,), (8,), "not inside"),        # no such body
    ((0,), (8,), (17,), "not inside"),       # past its end
    ((0,), (9,), (8,), "not inside"),        # backwards
    ((0,), (-1,), (8,), "not inside"),
    ((0, 0), (0,), (8,), "one length"),
    ((0, 0, 0), (0, 0, 0), (16, 16, 16), "take 48 bytes, out has 24"),
])
def test_a_row_outside_its_body_or_rows_that_do_not_fit_copy_nothing(part, start, end, error):
    out = bytearray(b"x" * 24)
    with pytest.raises(ValueError, match=error):
        gather(out, BODIES, int64s(*part), int64s(*start), int64s(*end))
    assert out == b"x" * 24


def test_columns_must_be_int64_and_out_writable():
    with pytest.raises(TypeError, match="part must be native int64"):
        gather(bytearray(8), BODIES, np.array([0], dtype=np.int32), int64s(0), int64s(8))
    with pytest.raises(BufferError):
        gather(b"x" * 8, BODIES, int64s(0), int64s(0), int64s(8))
