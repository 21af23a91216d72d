"""``--source`` keeps its word (the shipped CLI against DynamoDB Local and kinesis-local):

- a position is stored with each commit, not every ``checkpoint_interval``: SIGKILLed
  just after a commit, a restart reads again at most the last window's records;
- a saved position the stream does not have (past a shard's end, a shard the stream
  lacks, trimmed away) is one clear error naming ``--reset-positions``, or a
  documented policy, never retried for ever;
- a stream deleted and created again while the server runs is noticed and read from
  the new stream's trim horizon, the old stream's positions dropped (logged).
"""

from __future__ import annotations

import base64
import json
import os
import uuid

import pytest

from ..harness import ServerProcess, log_events
from .components import AWS, wait_for
from .test_dynamodb_changes import make_table
from .test_dynamodb_source import committed, kill, put, saved, stream_sequence_numbers

pytestmark = pytest.mark.slow  # servers killed and restarted against emulators

CHANGES = "tests.pool_handlers:Changes"


@pytest.fixture
def env(aws, tmp_path):
    return {"AWS_ENDPOINT_URL_DYNAMODB": aws.endpoint, "AWS_ACCESS_KEY_ID": AWS["aws_access_key_id"],
            "AWS_SECRET_ACCESS_KEY": AWS["aws_secret_access_key"], "AWS_REGION": AWS["region_name"],
            "MLDSERVER_TEST_SEEN": str(tmp_path / "seen.pickle")}


def rewritten(out) -> int:
    """Rows the file sink wrote more than once (it has no commit log: a record read again
    after a restart is written again)."""
    rows = [r["seq"] for r in committed(out)]
    return len(rows) - len(set(rows))


def test_a_sigkill_just_after_a_commit_rewrites_at_most_that_commits_records(dynamodb, env, tmp_path, serve):
    # checkpoint_interval is 30 s: were positions stored only on it, none would be by the
    # kills below, and each restart would rewrite every record committed so far.
    table = f"word-{uuid.uuid4().hex[:8]}"
    arn = make_table(dynamodb.client, table)
    config = tmp_path / "sink.toml"
    config.write_text("checkpoint_interval = 30.0\nsource_poll_interval = 0.2\nwatermark_margin = 0.2\n"
                      "window = 1.0\n")
    out = tmp_path / "out"
    args = ("--source", f"dynamodb:{table}", "--config", str(config), "--sink", f"file:{out}")
    # Kills take turns: after the round's position is seen stored, and just after the
    # round's commit (stored, or about to be). The first kind reads nothing again. The
    # second reads again at most that commit's records: one round's, for the server it
    # kills started where the round before it was stored. (Two kills in a row just after
    # their commits could each come before the store: the second server's commit then
    # holds the first's records too, and reading it again is still "the last commit".)
    server = serve(CHANGES, *args, env=env)
    written, per_kill, before = 0, [], 0
    for round_ in range(5):
        put(dynamodb.client, table, ROUND, first=written)
        written += ROUND
        wait_for(lambda: len({r["seq"] for r in committed(out)}) >= written, 60, f"round {round_} committed")
        if round_:
            per_kill.append(rewritten(out) - before)  # what the restart wrote again, before this round's rows
        if round_ % 2 == 0:  # the position follows the commit, well within checkpoint_interval
            last = stream_sequence_numbers(dynamodb, arn)[-1]
            wait_for(lambda: [last, 0] in saved(tmp_path, table).values(), 10, f"round {round_}'s position saved")
        kill(server)
        before = rewritten(out)
        server = serve(CHANGES, *args, env=env)
    everything = stream_sequence_numbers(dynamodb, arn)
    wait_for(lambda: [everything[-1], 0] in saved(tmp_path, table).values(), 60, "the last position saved")
    assert server.stop() == 0
    per_kill.append(rewritten(out) - before)
    stored, just_after = per_kill[0::2], per_kill[1::2]
    assert stored == [0, 0, 0], per_kill  # its position stored: nothing read again
    assert all(n <= ROUND for n in just_after), per_kill  # at most the last commit's records
    assert sorted(set(r["seq"] for r in committed(out))) == sorted(everything)  # nothing lost


ROUND = 6  # records a round puts: they land in one window (1 s), two at most, committed at once


# -- a position the stream does not have ---------------------------------------------------

def kinesis_env(kinesis, tmp_path) -> dict:
    return {"AWS_ENDPOINT_URL_KINESIS": kinesis.endpoint, "AWS_ACCESS_KEY_ID": AWS["aws_access_key_id"],
            "AWS_SECRET_ACCESS_KEY": AWS["aws_secret_access_key"], "AWS_REGION": AWS["region_name"],
            "MLDSERVER_TEST_SEEN": str(tmp_path / "seen.pickle")}


def edit_position(tmp_path, source: str, change) -> None:
    from mldserver.sources.positions import positions_path

    path = positions_path(tmp_path / "state", source)
    doc = json.loads(path.read_text())
    doc["shards"] = change(doc["shards"])
    path.write_text(json.dumps(doc))


@pytest.mark.parametrize("where", ["past the end", "before the first"])
def test_a_kinesis_position_the_shard_does_not_have_is_one_error_naming_reset_positions(kinesis, tmp_path, where):
    from .test_kinesis_source import put, saved, seen, stream

    env = kinesis_env(kinesis, tmp_path)
    config = tmp_path / "fast.toml"
    config.write_text("source_poll_interval = 0.2\n")
    name = stream(kinesis, 1)
    records = put(kinesis, name, 3, "a")
    args = ["--handler", "tests.pool_handlers:RecordBatches", "--source", f"kinesis:{name}", "--port", "0",
            "--state-dir", str(tmp_path / "state"), "--config", str(config), "--admin", "127.0.0.1:0"]
    first = ServerProcess(None, tmp_path, *args, "--log-file", str(tmp_path / "first.log"),
                          env={**os.environ, **env})
    assert first.code is None
    wait_for(lambda: list(saved(tmp_path, name).values()) == [[records[-1][1], 0]], 120, "the last position saved")
    assert first.stop() == 0
    step = 10**20 if where == "past the end" else -1
    moved = str(int(records[0 if step < 0 else -1][1]) + step)
    edit_position(tmp_path, f"kinesis:{name}", lambda shards: {k: [moved, 0] for k in shards})

    second = ServerProcess(None, tmp_path, *args, "--log-file", str(tmp_path / "second.log"),
                           env={**os.environ, **env})
    if second.code is None:  # it listened, then found the position: it stops by itself
        second.proc.wait(120)
    assert second.proc.returncode == 2, second.stderr
    [line] = second.stderr.strip().splitlines()
    assert "--reset-positions" in line and moved in line and "shardId-000000000000" in line, line
    events = [e["event"] for e in log_events(tmp_path / "second.log")]
    assert events.count("source_position_invalid") == 1 and "source_read_failed" not in events, events
    assert "task_crashed" not in events
    assert len(seen(tmp_path)) == 3  # nothing read again, nothing read wrongly

    reset = ServerProcess(None, tmp_path, *args, "--reset-positions", "--log-file", str(tmp_path / "reset.log"),
                          env={**os.environ, **env})
    assert reset.code is None
    wait_for(lambda: len(seen(tmp_path)) >= 6, 120, "read again from the trim horizon")
    assert reset.stop() == 0


def test_a_dynamodb_position_botocore_refuses_is_one_error_naming_reset_positions(dynamodb, env, tmp_path):
    table = f"bad-{uuid.uuid4().hex[:8]}"
    make_table(dynamodb.client, table)
    put(dynamodb.client, table, 2)
    config = tmp_path / "fast.toml"
    config.write_text("checkpoint_interval = 0.0\nsource_poll_interval = 0.2\n")
    args = ["--handler", "tests.pool_handlers:RecordChanges", "--source", f"dynamodb:{table}", "--port", "0",
            "--state-dir", str(tmp_path / "state"), "--config", str(config), "--admin", "127.0.0.1:0"]
    first = ServerProcess(None, tmp_path, *args, "--log-file", str(tmp_path / "first.log"), env={**os.environ, **env})
    wait_for(lambda: saved(tmp_path, table), 60, "a position saved")
    assert first.stop() == 0
    edit_position(tmp_path, f"dynamodb:{table}", lambda shards: {k: ["17", 0] for k in shards})  # too short
    second = ServerProcess(None, tmp_path, *args, "--log-file", str(tmp_path / "second.log"),
                           env={**os.environ, **env})
    if second.code is None:
        second.proc.wait(120)
    assert second.proc.returncode == 2, second.stderr
    [line] = second.stderr.strip().splitlines()
    assert "--reset-positions" in line and "after 17" in line, line
    events = [e["event"] for e in log_events(tmp_path / "second.log")]
    assert events.count("source_position_invalid") == 1 and "source_read_failed" not in events, events


# -- a stream deleted and created again while read -----------------------------------------

def test_a_kinesis_stream_created_again_while_read_is_read_from_its_trim_horizon(kinesis, tmp_path, serve):
    from .test_kinesis_source import put, saved, stream

    env = kinesis_env(kinesis, tmp_path)
    config = tmp_path / "fast.toml"
    config.write_text("source_poll_interval = 0.2\nsource_discovery_interval = 0.5\nwindow = 0.5\n"
                      "watermark_margin = 0.2\n")
    out = tmp_path / "out"
    name = stream(kinesis, 1)
    old = put(kinesis, name, 4, "old")
    server = serve("tests.pool_handlers:DigestAndData", "--source", f"kinesis:{name}", "--config", str(config),
                   "--sink", f"file:{out}", env=env)
    wait_for(lambda: len(committed(out)) >= 4, 120, "the old stream's records committed")
    wait_for(lambda: list(saved(tmp_path, name).values()) == [[old[-1][1], 0]], 60, "the old stream's position")

    kinesis.client.delete_stream(StreamName=name)
    wait_for(lambda: name not in kinesis.client.list_streams()["StreamNames"], 60, "the stream deleted")
    kinesis.create_stream(name, 1)
    new = put(kinesis, name, 4, "new")  # (kinesis-local: the same sequence numbers as the old stream's)
    wait_for(lambda: len(committed(out)) >= 8, 120, "the new stream's records committed")
    wait_for(lambda: list(saved(tmp_path, name).values()) == [[new[-1][1], 0]], 60, "the new stream's position")
    events = server.events()
    [recreated] = [e for e in events if e["event"] == "source_stream_recreated"]
    assert recreated["running"] is True and recreated["shards"] == 1
    started = [e["start"] for e in events if e["event"] == "source_shard_started"]
    assert started == ["TRIM_HORIZON", "TRIM_HORIZON"]
    assert server.stop() == 0
    data = sorted(base64.b64decode(r["data"]) for r in committed(out))
    assert data == sorted(r[4] for r in old + new)  # each record of both streams once


def test_a_table_deleted_and_created_again_while_read_is_read_from_its_new_stream(dynamodb, env, tmp_path, serve):
    table = f"again-{uuid.uuid4().hex[:8]}"
    make_table(dynamodb.client, table)
    config = tmp_path / "fast.toml"
    config.write_text("checkpoint_interval = 0.0\nsource_poll_interval = 0.2\nsource_discovery_interval = 0.5\n")
    put(dynamodb.client, table, 3)
    server = serve("tests.pool_handlers:RecordChanges", "--source", f"dynamodb:{table}", "--config", str(config),
                   env=env)
    from .test_dynamodb_changes import seen

    wait_for(lambda: len(seen(tmp_path / "seen.pickle")) >= 3, 60, "the first table's changes")
    dynamodb.client.delete_table(TableName=table)
    wait_for(lambda: table not in dynamodb.client.list_tables()["TableNames"], 60, "the table deleted")
    arn = make_table(dynamodb.client, table)
    put(dynamodb.client, table, 2, first=10)
    got = wait_for(lambda: len(s := seen(tmp_path / "seen.pickle")) >= 5 and s, 60, "the new table's changes")
    assert [e["doc"]["n"] for e in got] == [0, 1, 2, 10, 11]
    [recreated] = [e for e in server.events() if e["event"] == "source_stream_recreated"]
    assert recreated["stream"] == arn and recreated["running"] is True
    wait_for(lambda: json.loads((tmp_path / "state" / "sources").glob("*.json").__next__().read_text())["stream"]
             == arn, 30, "the new stream's positions saved")
    assert server.stop() == 0
