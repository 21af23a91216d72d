"""A checkpoint asked for during a batch with failed records stops short of the
first one: nothing passes a record before the server has dead-lettered it."""

from __future__ import annotations

from mldserver.api.failures import FailureGuard, held_at
from mldserver.api.records import Batch, Record, ShardInfo


class Recording:
    def __init__(self):
        self.calls = []
        self.closed = False

    async def checkpoint(self, sequence_number=None, sub_sequence_number=None, *, retry=True):
        self.calls.append((sequence_number, sub_sequence_number))


def batch_of(positions):
    records = [Record({"sequenceNumber": seq, "subSequenceNumber": sub}) for seq, sub in positions]
    return Batch(records, 0, ShardInfo("shardId-0", None, None))


async def test_without_failures_a_checkpoint_goes_through_unchanged():
    batch, real = batch_of([("100", 0), ("101", 0)]), Recording()
    guard = FailureGuard(real, batch)
    await guard.checkpoint()
    await guard.checkpoint("101", 0)
    assert real.calls == [(None, None), ("101", 0)]
    assert guard.closed is False  # the rest of the checkpointer shows through


async def test_a_checkpoint_past_a_failed_record_stops_at_the_record_before_it():
    batch, real = batch_of([("100", 0), ("101", 0), ("102", 0), ("103", 0)]), Recording()
    guard = FailureGuard(real, batch)
    batch.fail(batch.records[2], "poisoned")
    await guard.checkpoint()
    await guard.checkpoint("103", 0)
    await guard.checkpoint("102")
    await guard.checkpoint("100", 0)  # before the failure: as asked
    await guard.checkpoint("101")
    assert real.calls == [("101", 0), ("101", 0), ("101", 0), ("100", 0), ("101", None)]


async def test_with_the_first_record_failed_nothing_of_the_batch_is_checkpointed():
    batch, real = batch_of([("100", 0), ("101", 0)]), Recording()
    batch.fail(batch.records[0], "poisoned")
    await FailureGuard(real, batch).checkpoint()
    await FailureGuard(real, batch).checkpoint("101", 0)
    await FailureGuard(real, batch).checkpoint("99", 0)  # an earlier batch's record
    assert real.calls == [("99", 0)]


def test_sub_sequence_numbers_of_one_aggregate_are_held_apart():
    batch = batch_of([("100", 0), ("100", 1), ("100", 2), ("101", 0)])
    batch.fail(batch.records[2], "poisoned")
    assert held_at(batch, None, None) == ("100", 1)
    assert held_at(batch, "100", 1) == ("100", 1)
    assert held_at(batch, "100", None) == ("100", 1)  # all of 100 would pass 100/2
    assert held_at(batch, "101", 0) == ("100", 1)


def test_a_failed_record_without_a_position_holds_at_the_record_before_it_and_no_further():
    batch = batch_of([("100", 0), ("101", 0), ("x", 0), ("103", 0)])
    batch.fail(batch.records[2], "malformed")
    assert held_at(batch, None, None) == ("101", 0)
    assert held_at(batch, "100", 0) == ("100", 0)
    assert held_at(batch, "103", 0) == ("101", 0)
