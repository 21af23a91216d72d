"""An amazon_kclpy processor whose ``initialize`` raises: the shard fails visibly
(``initialize_failed``, its batches dead-lettered whole with the reason ``initialize
failed``, no callback of the half-made processor called) and recovers once an
initialize, tried again before each action, succeeds; the connection stays open."""

from __future__ import annotations

import json
import logging

import pytest

from mldserver.api.testing import make_records

from ..harness import running
from ..pool.serving import dead_letters, events


@pytest.mark.parametrize("workers", [2, 0])
async def test_a_processor_whose_initialize_raises_dead_letters_its_batches_whole_until_it_initializes(
        tmp_path, monkeypatch, caplog, workers):
    caplog.set_level(logging.INFO, logger="mldserver")
    path = tmp_path / "seen.jsonl"
    monkeypatch.setenv("MLDSERVER_KCLPY_SEEN", str(path))
    async with running(tmp_path, "tests.kclpy_handlers:FailsInitialize", workers=workers,
                       handler_retries=1) as (_, _, daemon):
        shard = await daemon.shard("shardId-000000000001")  # its initialize answered all the same
        await shard.process_records(make_records(1, 3))
        await shard.process_records([])  # (an empty batch: nothing to keep)
        failed = events(caplog, "initialize_failed")
        assert [(f["callback"], f["error"]) for f in failed] == [
            ("initialize", "ConnectionError: the database is not up"),
            ("process_records", "ConnectionError: the database is not up"),
            ("process_records", "ConnectionError: the database is not up")]
        assert all(f["shard_id"] == shard.shard_id for f in failed)
        letters = dead_letters(tmp_path, shard.shard_id)
        assert [(d["reason"], d["sequence_number"], d["error"]) for d in letters] == [
            ("initialize failed", str(seq), "ConnectionError: the database is not up") for seq in (1, 2, 3)]
        assert not events(caplog, "batch_bisected")  # kept whole: no callback of it was called

        (tmp_path / "seen.jsonl.ready").touch()  # the database is up: the next action initializes it afresh
        await shard.process_records(make_records(4, 2))
        assert daemon.checkpoints[shard.shard_id] == ("5", 0)
        assert [e["before"] for e in events(caplog, "initialized_again")] == ["process_records"]
        await shard.lease_lost()
        assert await shard.close() == 0
    seen = [json.loads(line) for line in path.read_text().splitlines()]
    assert [e["sequence_numbers"] for e in seen if e["event"] == "records"] == [["4", "5"]]
    initializes = [e for e in seen if e["event"] == "initialize"]
    assert len(initializes) == 2 + 2 * 2 + 1  # its 2 attempts at initialize, 2 before each batch, then the one
    assert len(dead_letters(tmp_path, shard.shard_id)) == 3
