"""The ledger: how far a shard may checkpoint, given what the sink committed."""

from __future__ import annotations

from mldserver.coordinator.ledger import Ledger
from mldserver.base.positions import Position
from mldserver.rows.batch import Item, RowBatch


def row(seq, sub=0, data=b"{}"):
    return Item(1000, pos(seq, sub), data)


def rows(*items):
    return RowBatch.of(items)


def pos(seq, sub=0):
    return Position(seq, sub, str(seq))


def test_nothing_is_safe_until_rows_commit_then_the_prefix_is():
    ledger = Ledger()
    batch = rows(row(10), row(11))
    ledger.add("A", [batch], last=pos(12))
    assert ledger.safe("A") is None
    ledger.commit("A", [batch[:1]])
    assert ledger.safe("A") == pos(10)
    ledger.commit("A", [batch[1:]])
    assert ledger.safe("A") == pos(12)  # record 12 had no row: done with its batch


def test_a_batch_without_rows_is_safe_at_once_when_nothing_is_pending():
    ledger = Ledger()
    ledger.add("A", [rows()], last=pos(5))
    assert ledger.safe("A") == pos(5)


def test_a_record_with_rows_still_pending_is_not_safe():
    ledger = Ledger()
    batch = rows(row(10, data=b'{"a":1}'), row(10, data=b'{"a":2}'), row(11))
    ledger.add("A", [batch], last=pos(11))
    ledger.commit("A", [batch[:1]])  # one of record 10's two rows
    assert ledger.safe("A") is None
    ledger.commit("A", [batch[1:2]])
    assert ledger.safe("A") == pos(10)


def test_later_batches_do_not_pass_an_earlier_pending_row():
    ledger = Ledger()
    batch = rows(row(10))
    ledger.add("A", [batch], last=pos(10))
    ledger.add("A", [rows()], last=pos(20))
    assert ledger.safe("A") is None
    ledger.commit("A", [batch])
    assert ledger.safe("A") == pos(20)


def test_buffered_rows_and_bytes_are_counted_and_released():
    ledger = Ledger()
    batch = rows(row(1, data=b"x" * 10), row(2, data=b"y" * 20))
    ledger.add("A", [batch], last=pos(2))
    assert (ledger.rows, ledger.bytes) == (2, batch.held_bytes()) and batch.held_bytes() > (10 + 1) + (20 + 1)
    ledger.commit("A", [batch])
    assert (ledger.rows, ledger.bytes) == (0, 0) and ledger.done("A")


def test_a_batch_holds_its_bytes_until_its_last_row_is_committed():
    ledger = Ledger()
    first, second = rows(row(1), row(2), row(3)), rows(row(4))
    ledger.add("A", [first], last=pos(3))
    ledger.add("A", [second], last=pos(4))
    ledger.commit("A", [first[:2]])  # a slice of the first batch still holds its buffers
    assert (ledger.rows, ledger.bytes) == (2, first.held_bytes() + second.held_bytes())
    ledger.commit("A", [first[2:]])
    assert (ledger.rows, ledger.bytes) == (1, second.held_bytes())


def test_a_lost_lease_drops_the_pending_rows_and_keeps_what_is_safe():
    ledger = Ledger()
    batch = rows(row(10), row(11, data=b'{"k":1}'))
    ledger.add("A", [batch], last=pos(12))
    ledger.commit("A", [batch[:1]])
    assert ledger.drop("A") == 1
    assert ledger.rows == 0 and ledger.bytes == 0
    assert ledger.safe("A") == pos(10) and ledger.done("A")
    assert ledger.drop("unknown") == 0


def test_the_last_end_is_where_the_uncommitted_rows_batches_end():
    ledger = Ledger()
    assert ledger.last_end("A") is None  # never heard of
    batch = rows(row(10), row(11))
    ledger.add("A", [batch], last=pos(12))
    ledger.add("A", [rows()], last=pos(14))  # a batch without rows, after them
    assert ledger.last_end("A") == pos(14)  # what a spool of A's rows goes up to
    ledger.commit("A", [batch])
    assert ledger.safe("A") == pos(14) and ledger.last_end("A") is None  # nothing past what is safe


def test_rows_out_of_their_shards_order_commit_by_piece_and_the_checkpoint_stays_below_the_lowest_left():
    """With max_out_of_orderness a batch's rows are sorted by time, in a piece a window:
    a window commits rows of several pieces, a later batch's before an earlier's."""
    ledger = Ledger()
    early, late = rows(row(10), row(13)), rows(row(11), row(12))  # one batch, its rows sorted apart
    ledger.add("A", [early, late], last=pos(13))
    other = rows(row(20))
    ledger.add("A", [other], last=pos(21))
    ledger.commit("A", [early[:1], other])  # rows 10 and 20: row 11 still waits
    assert ledger.safe("A") == pos(10)
    ledger.commit("A", [late])
    assert ledger.safe("A") == pos(12)  # 13 waits
    ledger.commit("A", [early[1:]])
    assert ledger.safe("A") == pos(21) and ledger.done("A") and (ledger.rows, ledger.bytes) == (0, 0)
