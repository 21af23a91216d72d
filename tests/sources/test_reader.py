"""Which shards a source reads now: parents before children (one after a split; two
after a merge, where a stream merges), a shard read to its end never again; where a
shard with no saved position starts."""

from __future__ import annotations

from mldserver.sources.reader import may_start
from mldserver.sources.shard_reading import first_iterator
from mldserver.sources.service import ListedShard
from mldserver.sources.spec import Start

PARENT = ListedShard("parent", (), True)
CHILD = ListedShard("child", ("parent",), False)
MERGED = ListedShard("merged", ("a", "b"), False)


def test_a_child_waits_until_its_parent_is_read_to_its_end():
    listed = {"parent", "child"}
    assert may_start(PARENT, listed, ended=set().__contains__)
    assert not may_start(CHILD, listed, ended=set().__contains__)
    assert may_start(CHILD, listed, ended={"parent"}.__contains__)


def test_a_child_whose_parent_is_gone_from_the_stream_starts():
    assert may_start(CHILD, {"child"}, ended=set().__contains__)


def test_a_merged_shard_waits_for_both_parents():
    listed = {"a", "b", "merged"}
    assert not may_start(MERGED, listed, ended={"a"}.__contains__)
    assert may_start(MERGED, listed, ended={"a", "b"}.__contains__)
    assert may_start(MERGED, {"b", "merged"}, ended={"b"}.__contains__)


def test_a_shard_read_to_its_end_is_not_read_again():
    assert not may_start(PARENT, {"parent"}, ended={"parent"}.__contains__)


def test_where_a_shard_with_no_saved_position_starts():
    time = Start("time", 1769767200000)
    assert first_iterator(time, from_parent=False, at_timestamp=True) == "AT_TIMESTAMP"  # Kinesis
    assert first_iterator(time, from_parent=False, at_timestamp=False) == "TRIM_HORIZON"  # DynamoDB: skips
    assert first_iterator(Start("latest"), from_parent=False, at_timestamp=True) == "LATEST"
    # a child of a shard read here: from its trim horizon, whatever --from says (nothing lost)
    assert first_iterator(Start("latest"), from_parent=True, at_timestamp=True) == "TRIM_HORIZON"
    assert first_iterator(time, from_parent=True, at_timestamp=True) == "TRIM_HORIZON"


async def test_what_the_reader_keeps_of_its_shards_stays_bounded_as_they_roll_over(tmp_path):
    # DynamoDB Streams opens a new shard per partition about every 4 hours and trims the
    # old ones after a day: a server running for months reads thousands of shard ids. The
    # listing here rolls over as the service's does (trimming takes a day there, so the
    # listing is written out); each shard is read to its end at once.
    import asyncio

    from mldserver.base.config import Settings
    from mldserver.sources.positions import SHARD_END, SavedPositions
    from mldserver.sources.reader import SourceReader
    from mldserver.sources.spec import SourceSpec

    partitions, kept = 4, 3  # generations the stream lists (the rest trimmed)

    class RollingStreams:
        generation = 0

        async def identity(self):  # the same stream all along (reader.stream, reader.created)
            return None, None

        async def shards(self):
            first = max(0, self.generation - kept + 1)
            return [ListedShard(f"shard-{g}-{p}", (f"shard-{g - 1}-{p}",) if g > first else (), g < self.generation)
                    for g in range(first, self.generation + 1) for p in range(partitions)]

    reader = SourceReader(SourceSpec.parse("dynamodb:orders"), Start.parse("trim_horizon"),
                          Settings(state_dir=str(tmp_path), source_discovery_interval=0.001), attach=None)
    reader.saved = SavedPositions.open(tmp_path, "dynamodb:orders")
    reader.streams = streams = RollingStreams()
    read = []

    async def read_shard(shard):  # read to its end once the stream has closed it
        read.append(shard.shard_id)
        while int(shard.shard_id.split("-")[1]) == streams.generation and not reader._stop.is_set():
            await asyncio.sleep(0.001)
        if not reader._stop.is_set():
            await reader.saved.store(shard.shard_id, SHARD_END)

    reader._read_shard = read_shard
    discovering = asyncio.create_task(reader._discover())
    try:
        for generation in range(1, 30):
            streams.generation = generation
            want = {f"shard-{generation - 1}-{p}" for p in range(partitions)}
            while not all(reader.saved.ended(s) for s in want):  # the last generation read to its end
                await asyncio.sleep(0.001)
        assert len(set(read)) >= 29 * partitions  # (each generation's shards read)
        assert len(reader.reading) <= (kept + 1) * partitions  # not one entry per shard ever read
        assert len(reader.saved) <= (kept + 1) * partitions
    finally:
        reader._stop.set()
        reader._wake.set()
        await discovering
