"""Which shards a source reads now: parents before children (one after a split; two
after a merge, where a stream merges), a shard read to its end never again."""

from __future__ import annotations

from mldserver.sources.dynamodb import ShardInfo
from mldserver.sources.reader import may_start

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
