"""Which shards a source reads now: parents before children (one after a split; two
after a merge, where a stream merges), a shard read to its end never again; where a
shard with no saved position starts."""

from __future__ import annotations

from mldserver.sources.reader import first_iterator, may_start
from mldserver.sources.service import ShardInfo
from mldserver.sources.spec import Start

PARENT = ShardInfo("parent", (), True)
CHILD = ShardInfo("child", ("parent",), False)
MERGED = ShardInfo("merged", ("a", "b"), False)


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
