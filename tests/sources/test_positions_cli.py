"""``mldserver positions --source X [--state-dir D] [--json]``: a source's saved positions
read back as the server wrote them, one line a shard or one JSON object; nothing saved
yet is one line naming the source and the state dir, exit 1; a source that does not
parse, exit 2."""

from __future__ import annotations

import json
import subprocess

from mldserver.base.positions import Position
from mldserver.sources.positions import SHARD_END, SavedPositions

from ..harness import MLDSERVER

ARN = "arn:aws:kinesis:us-east-1:123456789012:stream/clicks"
SEQ = "49590338271490256608559692538361571095921575989136588898"


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([MLDSERVER, "positions", *args], capture_output=True, text=True, timeout=60)


async def save(state, source: str = "kinesis:clicks") -> SavedPositions:
    saved = SavedPositions.open(state, source)
    await saved.set_stream(ARN)
    await saved.store("shardId-000000000000", SHARD_END)
    await saved.store("shardId-000000000001", Position.parse(SEQ, 0))
    await saved.store("shardId-000000000002", Position.parse("17", 2))
    return saved


async def test_each_shard_is_one_line_saying_where_it_resumes(tmp_path):
    saved = await save(tmp_path / "state")
    done = cli("--source", "kinesis:clicks", "--state-dir", str(tmp_path / "state"))
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert done.stdout.splitlines() == [
        f"kinesis:clicks  stream {ARN}  ({saved.path})",
        "  shardId-000000000000  SHARD_END (read to its end)",
        f"  shardId-000000000001  after {SEQ}",
        "  shardId-000000000002  after 17 sub 2",
    ]


async def test_json_is_the_saved_positions_as_the_server_writes_them(tmp_path):
    saved = await save(tmp_path / "state")
    await save(tmp_path / "state", "dynamodb:orders")
    done = cli("--source", "kinesis:clicks", "--source", "dynamodb:orders", "--state-dir", str(tmp_path / "state"),
               "--json")
    assert done.returncode == 0, done.stderr
    first, second = map(json.loads, done.stdout.splitlines())
    assert first == {"source": "kinesis:clicks", "stream": ARN, "path": str(saved.path),
                     "shards": json.loads(saved.path.read_text())["shards"]}
    assert first["shards"]["shardId-000000000002"] == ["17", 2] and second["source"] == "dynamodb:orders"


def test_a_source_with_nothing_saved_is_one_line_naming_it_and_the_state_dir(tmp_path):
    done = cli("--source", "dynamodb:orders", "--state-dir", str(tmp_path / "state"))
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.count("\n") == 1, done.stderr
    assert "no positions saved yet for dynamodb:orders in " + str(tmp_path / "state") in done.stderr


def test_a_source_that_does_not_parse_is_a_mistake(tmp_path):
    done = cli("--source", "kafka:orders", "--state-dir", str(tmp_path))
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "dynamodb:TABLE" in done.stderr
