"""``mldserver serve --source dynamodb:TABLE``: the server reads a real DynamoDB stream
itself (DynamoDB Local, streams on, ``NEW_AND_OLD_IMAGES``) into a ``ChangeHandler`` in a
handler process, with no daemon: the values exactly as written, in order; a SIGKILL and a
restart resume after the saved position (nothing twice, nothing lost); ``--from`` a time
skips what came before it; ``--from`` where positions are saved is refused with one line;
with ``--sink file:DIR``, every change committed once across a SIGKILL and a restart."""

from __future__ import annotations

import json
import os
import random
import signal
import time
import uuid
from collections import Counter
from datetime import datetime, timezone

import boto3
import pytest
from boto3.dynamodb.types import TypeSerializer

from mldserver.sources.positions import positions_path

from ..harness import ServerProcess
from .components import AWS, wait_for
from .test_dynamodb_changes import make_table, same, seen, write

pytestmark = pytest.mark.slow  # servers killed and restarted against an emulator, minutes in all

HANDLER = "tests.pool_handlers:RecordChanges"
SER = TypeSerializer()


@pytest.fixture
def env(aws, tmp_path):
    """The AWS configuration (DynamoDB Local) and where RecordChanges writes what it saw."""
    return {"AWS_ENDPOINT_URL_DYNAMODB": aws.endpoint, "AWS_ACCESS_KEY_ID": AWS["aws_access_key_id"],
            "AWS_SECRET_ACCESS_KEY": AWS["aws_secret_access_key"], "AWS_REGION": AWS["region_name"],
            "MLDSERVER_TEST_SEEN": str(tmp_path / "seen.pickle")}


@pytest.fixture
def config(tmp_path):
    """Checkpoint every batch (a ChangeHandler's checkpoint_interval), poll often."""
    path = tmp_path / "mldserver.toml"
    path.write_text("checkpoint_interval = 0.0\nsource_poll_interval = 0.2\n")
    return str(path)


def put(client, table: str, n: int, first: int = 0) -> None:
    for i in range(first, first + n):
        client.put_item(TableName=table, Item={k: SER.serialize(v) for k, v in
                                               {"pk": f"item#{i}", "sk": i, "n": i}.items()})


def saved(tmp_path, table: str) -> dict:
    path = positions_path(tmp_path / "state", f"dynamodb:{table}")
    return json.loads(path.read_text())["shards"] if path.exists() else {}


def stream_sequence_numbers(dynamodb, arn: str) -> list[str]:
    """Every record's sequence number in the stream, in order (one shard in DynamoDB Local)."""
    streams = boto3.client("dynamodbstreams", endpoint_url=dynamodb.endpoint, **AWS)
    out = []
    for shard in streams.describe_stream(StreamArn=arn)["StreamDescription"]["Shards"]:
        it = streams.get_shard_iterator(StreamArn=arn, ShardId=shard["ShardId"],
                                        ShardIteratorType="TRIM_HORIZON")["ShardIterator"]
        while it:
            page = streams.get_records(ShardIterator=it)
            out += [r["dynamodb"]["SequenceNumber"] for r in page["Records"]]
            if not page["Records"]:
                break
            it = page.get("NextShardIterator")
    return out


def kill(server: ServerProcess) -> None:
    server.proc.send_signal(signal.SIGKILL)
    server.proc.wait()


def test_put_update_delete_reach_a_change_handler_exactly_in_order(dynamodb, env, config, tmp_path, serve):
    table = f"orders-{uuid.uuid4().hex[:8]}"
    arn = make_table(dynamodb.client, table)
    expected = write(dynamodb.client, table)
    server = serve(HANDLER, "--source", f"dynamodb:{table}", "--config", config, env=env)

    got = wait_for(lambda: len(seen(tmp_path / "seen.pickle")) >= len(expected) and seen(tmp_path / "seen.pickle"),
                   60, "every change handled")
    assert [(e["callback"], e["event_name"]) for e in got] == [(c, n) for c, n, _, _ in expected]
    for entry, (_, _, new, old) in zip(got, expected):
        assert same(entry["doc"], new), (entry["doc"], new)
        assert same(entry["old"], old), (entry["old"], old)
        assert entry["source"] == "dynamodb" and entry["pid"] != server.proc.pid  # in a handler process
    sequence_numbers = stream_sequence_numbers(dynamodb, arn)
    assert [e["sequence_number"] for e in got] == sequence_numbers
    wait_for(lambda: [sequence_numbers[-1], 0] in saved(tmp_path, table).values(), 30, "the last position saved")
    [shard_id] = saved(tmp_path, table)
    started = [e for e in server.events() if e["event"] == "source_shard_started"]
    assert [(e["shard_id"], e["start"]) for e in started] == [(shard_id, "TRIM_HORIZON")]
    assert server.stop() == 0
    assert any(e["event"] == "source_stopped" for e in server.events())


def test_a_restart_after_sigkill_resumes_after_the_saved_position(dynamodb, env, config, tmp_path, serve):
    table = f"items-{uuid.uuid4().hex[:8]}"
    arn = make_table(dynamodb.client, table)
    put(dynamodb.client, table, 5)
    first = serve(HANDLER, "--source", f"dynamodb:{table}", "--config", config, env=env)
    sequence_numbers = wait_for(lambda: len(s := stream_sequence_numbers(dynamodb, arn)) == 5 and s, 30, "5 records")
    wait_for(lambda: [sequence_numbers[-1], 0] in saved(tmp_path, table).values(), 60, "the 5th change saved")
    kill(first)

    put(dynamodb.client, table, 4, first=5)
    second = serve(HANDLER, "--source", f"dynamodb:{table}", "--config", config, env=env)
    got = wait_for(lambda: len(s := seen(tmp_path / "seen.pickle")) >= 9 and s, 60, "the 4 new changes handled")
    [resumed] = [e for e in second.events() if e["event"] == "source_shard_started"]
    assert resumed["start"] == "AFTER_SEQUENCE_NUMBER" and resumed["position"] == sequence_numbers[-1]
    assert [e["doc"]["n"] for e in got] == list(range(9))  # each once, in order: nothing twice, nothing lost
    assert [e["sequence_number"] for e in got] == stream_sequence_numbers(dynamodb, arn)
    second.stop()


def test_from_a_time_skips_the_changes_made_before_it(dynamodb, env, config, tmp_path, serve):
    table = f"later-{uuid.uuid4().hex[:8]}"
    make_table(dynamodb.client, table)
    put(dynamodb.client, table, 3)
    # DynamoDB Local's creation times are whole minutes (AWS's whole seconds): the time is
    # the next minute, so the first changes fall before it and the next ones in its minute.
    since = (int(time.time()) // 60 + 1) * 60
    wait_for(lambda: time.time() >= since + 0.5, 70, "the next minute", interval=0.05)
    put(dynamodb.client, table, 2, first=3)
    stamp = datetime.fromtimestamp(since, timezone.utc).isoformat()
    server = serve(HANDLER, "--source", f"dynamodb:{table}", "--from", stamp, "--config", config, env=env)
    got = wait_for(lambda: len(s := seen(tmp_path / "seen.pickle")) >= 2 and s, 60, "the changes after the time")
    wait_for(lambda: saved(tmp_path, table), 30, "the position saved")
    assert [e["doc"]["n"] for e in got] == [3, 4]
    server.stop()
    assert [e["doc"]["n"] for e in seen(tmp_path / "seen.pickle")] == [3, 4]


def test_from_with_saved_positions_is_refused_until_they_are_reset(dynamodb, env, config, tmp_path, serve):
    table = f"again-{uuid.uuid4().hex[:8]}"
    make_table(dynamodb.client, table)
    put(dynamodb.client, table, 2)
    first = serve(HANDLER, "--source", f"dynamodb:{table}", "--config", config, env=env)
    wait_for(lambda: len(seen(tmp_path / "seen.pickle")) >= 2 and saved(tmp_path, table), 60, "2 changes saved")
    assert first.stop() == 0

    args = ["--handler", HANDLER, "--source", f"dynamodb:{table}", "--from", "latest", "--port", "0",
            "--state-dir", str(tmp_path / "state"), "--config", config]
    refused = ServerProcess(None, tmp_path, *args, env={**os.environ, **env})
    assert refused.code == 2, refused
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1 and "--reset-positions" in lines[0] and f"dynamodb:{table}" in lines[0], lines

    put(dynamodb.client, table, 1, first=2)  # before the reset: latest starts after it
    reset = serve(HANDLER, "--source", f"dynamodb:{table}", "--from", "latest", "--reset-positions",
                  "--config", config, env=env)
    assert any(e["event"] == "positions_reset" for e in reset.events())
    wait_for(lambda: any(e["event"] == "source_shard_started" and e["start"] == "LATEST" for e in reset.events()),
             30, "the shard started at LATEST")
    put(dynamodb.client, table, 1, first=3)
    wait_for(lambda: len(seen(tmp_path / "seen.pickle")) >= 3, 60, "the change after the reset")
    reset.stop()
    assert [e["doc"]["n"] for e in seen(tmp_path / "seen.pickle")] == [0, 1, 3]


def committed(out) -> list[dict]:
    rows = []
    for path in sorted(out.glob("*.jsonl")) if out.exists() else []:
        rows += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return rows


def test_a_file_sink_commits_every_change_once_across_a_sigkill(dynamodb, env, tmp_path, serve):
    table = f"sunk-{uuid.uuid4().hex[:8]}"
    arn = make_table(dynamodb.client, table)
    config = tmp_path / "sink.toml"
    config.write_text("checkpoint_interval = 0.0\nsource_poll_interval = 0.2\nwatermark_margin = 0.2\n"
                      "window = 1.0\n")
    out = tmp_path / "out"
    args = ("--source", f"dynamodb:{table}", "--config", str(config), "--sink", f"file:{out}")
    put(dynamodb.client, table, 6)
    first = serve("tests.pool_handlers:Changes", *args, env=env)
    sequence_numbers = wait_for(lambda: len(s := stream_sequence_numbers(dynamodb, arn)) == 6 and s, 30, "6 records")
    wait_for(lambda: len(committed(out)) >= 6, 60, "the first 6 changes committed")
    # The position saved is what the sink committed: the checkpoint follows the commit.
    wait_for(lambda: [sequence_numbers[-1], 0] in saved(tmp_path, table).values(), 30, "the committed position saved")
    kill(first)

    put(dynamodb.client, table, 5, first=6)
    second = serve("tests.pool_handlers:Changes", *args, env=env)
    everything = wait_for(lambda: len(s := stream_sequence_numbers(dynamodb, arn)) == 11 and s, 30, "11 records")
    wait_for(lambda: len(committed(out)) >= 11, 60, "the 5 new changes committed")
    wait_for(lambda: [everything[-1], 0] in saved(tmp_path, table).values(), 30, "the last position saved")
    assert second.stop() == 0
    assert sorted(r["seq"] for r in committed(out)) == sorted(everything)  # each change once


def table_seqs(lake) -> Counter:
    """How many times each change's sequence number is in the Iceberg table (none: no
    table yet)."""
    from pyiceberg.catalog.sql import SqlCatalog
    from pyiceberg.exceptions import NoSuchTableError

    if not (lake / "catalog.db").exists():
        return Counter()
    catalog = SqlCatalog("mldserver", uri=f"sqlite:///{lake}/catalog.db", warehouse=f"file://{lake}")
    try:
        data = catalog.load_table(("mldserver", "windows")).scan(selected_fields=("seq",)).to_arrow()
    except NoSuchTableError:
        return Counter()
    return Counter(data.column("seq").to_pylist())


@pytest.mark.parametrize("seed", [7, 8, 9, 10])
def test_an_iceberg_sink_holds_every_change_exactly_once_across_sigkills_at_random_moments(
        dynamodb, env, tmp_path, serve, seed):
    # Killed wherever the seed says (in a commit, before the position is saved, between
    # batches): a restart reads again from the saved position, which may lag the table's,
    # and the table's own positions leave out what it already holds.
    rng = random.Random(seed)
    table = f"lake-{uuid.uuid4().hex[:8]}"
    arn = make_table(dynamodb.client, table)
    config = tmp_path / "sink.toml"
    config.write_text("source_poll_interval = 0.1\nwatermark_margin = 0.2\nwindow = 0.5\n")
    lake = tmp_path / "lake"
    args = ("--source", f"dynamodb:{table}", "--config", str(config), "--sink", f"iceberg:{lake}")
    written = 0
    for round_ in range(3):
        put(dynamodb.client, table, 8, first=written)
        written += 8
        # counted before the start: on a loaded machine the round's first commit may land before serve() returns
        before = sum(table_seqs(lake).values())
        server = serve("tests.pool_handlers:Changes", *args, env=env)
        wait_for(lambda: sum(table_seqs(lake).values()) > before, 90, f"a commit in round {round_}")
        time.sleep(rng.uniform(0, 1.0))  # the moment of the kill: the campaign's random part
        kill(server)
    put(dynamodb.client, table, 8, first=written)
    everything = wait_for(lambda: len(s := stream_sequence_numbers(dynamodb, arn)) == written + 8 and s, 30,
                          "every record in the stream")
    last = serve("tests.pool_handlers:Changes", *args, env=env)
    wait_for(lambda: set(table_seqs(lake)) >= set(everything), 90, "every change in the table")
    assert last.stop() == 0
    counts = table_seqs(lake)
    assert sorted(counts) == sorted(everything) and set(counts.values()) == {1}, counts
