"""A source's saved positions: one file in the state dir, written whole, read back as
positions; a corrupt file or a reset said plainly."""

from __future__ import annotations

import asyncio
import json

import pytest

from mldserver.base.positions import Position
from mldserver.errors import ConfigError
from mldserver.sources.positions import SHARD_END, SavedPositions, positions_path


async def test_positions_stored_are_read_back_by_the_next_server(tmp_path):
    saved = SavedPositions.open(tmp_path, "dynamodb:orders")
    assert len(saved) == 0 and saved.get("shardId-1") is None
    await saved.set_stream("arn:stream")
    await saved.store("shardId-1", Position.parse("000000000000000000017", 0))
    await saved.store("shardId-0", SHARD_END)

    path = positions_path(tmp_path, "dynamodb:orders")
    assert path == tmp_path / "sources" / "dynamodb_3aorders.json"
    assert json.loads(path.read_text()) == {"source": "dynamodb:orders", "stream": "arn:stream", "shards": {
        "shardId-1": ["000000000000000000017", 0], "shardId-0": "SHARD_END"}}
    again = SavedPositions.open(tmp_path, "dynamodb:orders")
    assert again.get("shardId-1") == Position.parse("000000000000000000017", 0)
    assert again.get("shardId-1").text == "000000000000000000017"  # leading zeros kept
    assert again.ended("shardId-0") and not again.ended("shardId-1") and again.stream == "arn:stream"


async def test_a_shard_is_ended_for_its_children_only_once_its_shard_end_is_written():
    # discovery starts a child once its parents are ended: a SHARD_END stored but still on
    # its way to the lease item (or the disk) must not count, or a crash then would find
    # the child read and the parent not ended, its last records read again after the child's
    written: list[bytes] = []
    gate = asyncio.Event()

    async def write(data: bytes) -> None:
        await gate.wait()
        written.append(data)

    saved = SavedPositions.decode("kinesis:clicks", None, write=write)
    storing = asyncio.ensure_future(saved.store("shardId-000000000000", SHARD_END))
    await asyncio.sleep(0)
    assert not storing.done() and saved.get("shardId-000000000000") == SHARD_END
    assert not saved.ended("shardId-000000000000")  # not written yet
    gate.set()
    await storing
    assert saved.ended("shardId-000000000000") and b"SHARD_END" in written[-1]
    assert SavedPositions.decode("kinesis:clicks", written[-1], write=write).ended("shardId-000000000000")


async def test_a_kinesis_streams_creation_time_is_kept_and_a_restart_drops_every_position(tmp_path):
    saved = SavedPositions.open(tmp_path, "kinesis:clicks")
    await saved.set_stream("arn:clicks", 1769731200000)
    await saved.store("shardId-000000000000", Position.parse("4959", 0))
    again = SavedPositions.open(tmp_path, "kinesis:clicks")
    assert (again.stream, again.created, len(again)) == ("arn:clicks", 1769731200000, 1)
    await again.restart("arn:clicks", 1769734800000)  # the same name and ARN, created again
    third = SavedPositions.open(tmp_path, "kinesis:clicks")
    assert (third.stream, third.created, len(third)) == ("arn:clicks", 1769734800000, 0)


async def test_stores_from_many_shards_at_once_all_reach_the_file(tmp_path):
    saved = SavedPositions.open(tmp_path, "dynamodb:orders")
    await asyncio.gather(*(saved.store(f"shardId-{i}", Position.parse(str(100 + i), 0)) for i in range(20)))
    again = SavedPositions.open(tmp_path, "dynamodb:orders")
    assert {s: again.get(s).seq for s in again.shard_ids()} == {f"shardId-{i}": 100 + i for i in range(20)}


async def test_shards_gone_from_the_stream_are_forgotten(tmp_path):
    saved = SavedPositions.open(tmp_path, "dynamodb:orders")
    await saved.store("a", SHARD_END)
    await saved.store("b", Position.parse("5", 0))
    await saved.store("c", SHARD_END)
    await saved.forget(["a", "never-seen", "c"])  # every one of them, in one pass
    assert SavedPositions.open(tmp_path, "dynamodb:orders").shard_ids() == ["b"]
    assert not saved.ended("a") and not saved.ended("c")


async def test_reset_deletes_the_file_and_says_whether_there_was_one(tmp_path):
    saved = SavedPositions.open(tmp_path, "dynamodb:orders")
    await saved.store("a", Position.parse("5", 0))
    assert SavedPositions.reset(tmp_path, "dynamodb:orders") is True
    assert SavedPositions.reset(tmp_path, "dynamodb:orders") is False
    assert len(SavedPositions.open(tmp_path, "dynamodb:orders")) == 0


@pytest.mark.parametrize("text", ["{not json", '{"shards": {"a": ["x", 0]}}', '{"shards": []}', "[]",
                                  '{"shards": {}, "created": "yesterday"}'])
def test_a_corrupt_file_is_a_config_error_naming_it(tmp_path, text):
    path = positions_path(tmp_path, "dynamodb:orders")
    path.parent.mkdir(parents=True)
    path.write_text(text)
    with pytest.raises(ConfigError, match="--reset-positions") as caught:
        SavedPositions.open(tmp_path, "dynamodb:orders")
    assert str(path) in str(caught.value)
