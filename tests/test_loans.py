"""Memory on loan (``rows/loans.py``): read in place, given back exactly once, when the last
reference to it goes, whatever kind of view it was (numpy's, a memoryview, pyarrow's),
in whichever thread; split in place into parts given back on their own."""

from __future__ import annotations

import gc
import mmap
import threading

import numpy as np
import pyarrow as pa
import pytest

from mldserver.rows.loans import lend, lent, origin, split


@pytest.fixture
def shared():
    """1 MiB of shared memory, mapped read-only as the server maps a rows arena, with
    its first bytes numbered; and the list of what was given back."""
    writable = mmap.mmap(-1, 1 << 20)
    writable[:256] = bytes(range(256))
    yield writable, []
    gc.collect()


def test_a_loan_reads_the_memory_in_place_and_cannot_write_it(shared):
    memory, given = shared
    loan = lend(memory, 16, 64, given.append)
    assert bytes(loan[:4]) == bytes([16, 17, 18, 19]) and len(loan) == 64
    memory[16] = 99
    assert loan[0] == 99  # the same memory, not a copy
    with pytest.raises(ValueError, match="read-only"):
        loan[0] = 1


def test_it_is_given_back_once_when_its_last_view_goes_whatever_the_view(shared):
    memory, given = shared
    loan = lend(memory, 128, 64, given.append)
    keep = [loan[3:9], memoryview(loan)[1:2], np.frombuffer(memoryview(loan[10:]), dtype=np.uint8),
            pa.py_buffer(loan[5:])]
    del loan
    while keep:
        assert given == []  # a view still refers to it
        keep.pop()
    assert given == [(128, 64)]
    gc.collect()
    assert given == [(128, 64)]  # once


def test_it_is_given_back_in_the_thread_that_lets_it_go(shared):
    memory, given = shared
    where = []
    loan = lend(memory, 0, 64, lambda part: where.append((part, threading.current_thread().name)))
    holder = [loan]
    del loan
    thread = threading.Thread(target=holder.clear, name="sink")
    thread.start()
    thread.join()
    assert where == [((0, 64), "sink")]


def test_a_split_loan_is_given_back_in_parts_each_on_its_own_never_whole(shared):
    memory, given = shared
    loan = lend(memory, 64, 200, given.append)
    first, second, third = split(loan, [50, 120])
    assert (bytes(first[:2]), len(first), bytes(second[:1]), len(second), len(third)) == (
        bytes([64, 65]), 50, bytes([114]), 70, 80)
    assert split(loan, [10]) is None and lent(loan) is None  # split once only: the caller copies
    del loan
    assert given == []
    del second
    assert given == [(114, 70)]
    del third, first
    assert sorted(given) == [(64, 50), (114, 70), (184, 80)]  # the whole, exactly, in parts


def test_origin_says_where_a_view_starts_in_its_loan(shared):
    memory, given = shared
    loan = lend(memory, 0, 256, given.append)
    assert origin(loan, loan) == 0
    assert origin(memoryview(loan[20:])[5:], loan) == 25
    assert lent(loan) is loan and lent(loan[1:]) is None and lent(b"x") is None
