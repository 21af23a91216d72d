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

import json
import uuid

import pytest

from .components import wait_for
from .test_dynamodb_changes import make_table
from .test_dynamodb_source import committed, kill, put, saved, stream_sequence_numbers

pytestmark = pytest.mark.slow  # servers killed and restarted against emulators

CHANGES = "tests.pool_handlers:Changes"


@pytest.fixture
def env(aws, tmp_path):
    from .components import AWS

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
    server = serve(CHANGES, *args, env=env)
    written, per_kill, before = 0, [], 0
    for round_ in range(5):
        put(dynamodb.client, table, ROUND, first=written)
        written += ROUND
        wait_for(lambda: len({r["seq"] for r in committed(out)}) >= written, 60, f"round {round_} committed")
        if round_:
            per_kill.append(rewritten(out) - before)  # what the restart wrote again, before this round's rows
        if round_ == 0:  # the position follows the commit, well within checkpoint_interval
            last = stream_sequence_numbers(dynamodb, arn)[-1]
            wait_for(lambda: [last, 0] in saved(tmp_path, table).values(), 10, "the committed position saved")
        kill(server)  # just after the round's commit: its position stored, or about to be
        before = rewritten(out)
        server = serve(CHANGES, *args, env=env)
    everything = stream_sequence_numbers(dynamodb, arn)
    wait_for(lambda: [everything[-1], 0] in saved(tmp_path, table).values(), 60, "the last position saved")
    assert server.stop() == 0
    per_kill.append(rewritten(out) - before)
    assert all(n <= ROUND for n in per_kill), per_kill  # at most the last commit's records, each kill
    assert sorted(set(r["seq"] for r in committed(out))) == sorted(everything)  # nothing lost


ROUND = 6  # records a round puts: they land in one window (1 s), two at most, committed at once
