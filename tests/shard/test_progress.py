"""A shard's progress: default sub-sequences, the clamp, what is stored."""

from __future__ import annotations

import mldserver
from mldserver.base.positions import Position
from mldserver.api.records import Record
from mldserver.shard.progress import ShardProgress
from mldserver.api.testing import make_records

from ..harness import running


async def test_checkpoint_without_sub_sequence_uses_the_delivered_one(tmp_path):
    class H(mldserver.Handler):
        async def process_records(self, batch, checkpointer):
            await checkpointer.checkpoint(batch.records[-1].sequence_number)

    async with running(tmp_path, H) as (_, _, daemon):
        shard = await daemon.shard("s")
        records = make_records(7, 1) * 3
        for sub, r in enumerate(records):
            records[sub] = dict(r, subSequenceNumber=sub)
        await shard.process_records(records)
        await shard.lease_lost()
        await shard.close()
    assert shard.checkpoint_requests == [("7", 2)]


def p(seq, sub=0):
    return Position(seq, sub, str(seq))


def delivered(*positions, stored=None):
    progress = ShardProgress()
    progress.initialized(stored)
    progress.batch([Record({"sequenceNumber": pos.text, "subSequenceNumber": pos.sub}) for pos in positions])
    return progress


def test_the_last_record_of_a_batch_is_delivered_and_a_sequence_defaults_to_its_last_sub():
    progress = delivered(p(8), p(9, 0), p(9, 1), p(9, 2))
    assert progress.delivered == p(9, 2)
    assert (progress.default_sub("9"), progress.default_sub("8"), progress.default_sub("10")) == (2, 0, 0)
    progress.batch_done()
    assert progress.default_sub("9") == 0 and progress.delivered == p(9, 2)  # an idle shard keeps no batch


def test_the_clamp_goes_no_further_than_safe_delivered_or_asked():
    progress = delivered(p(8), p(9))
    assert progress.clamp(None, safe=p(5)) == p(5)
    assert progress.clamp(None, safe=p(20)) == p(9)  # committed rows from an earlier connection
    assert progress.clamp(p(4), safe=p(5)) == p(4)
    assert progress.clamp(p(7), safe=None) is None  # nothing committed yet


def test_the_clamp_sends_nothing_that_is_not_past_the_stored_checkpoint():
    progress = delivered(p(8), p(9), stored=p(5))
    assert progress.clamp(None, safe=p(5)) is None
    assert progress.clamp(p(4), safe=p(9)) is None
    progress.checkpointed(p(7))
    assert progress.clamp(None, safe=p(7)) is None and progress.clamp(None, safe=p(8)) == p(8)


def test_nothing_delivered_on_this_connection_means_nothing_to_checkpoint():
    progress = ShardProgress()
    progress.initialized(p(5))
    assert progress.clamp(None, safe=p(9)) is None
