"""A handler that faults in C, under the real KCL 3.x MultiLangDaemon (issue 11).

``mldserver run`` (handler processes, ``--workers 2``) on a 2-shard kinesis-local
stream, with the Spark pipeline and the parquet sink of test_real_daemon.py. The
handler (tests/faulty_handlers.py:FaultOnMarker) emits a row per record and reads
address 0 (SIGSEGV) when a record's data is the marker, at every attempt:

- its handler process dies, the batch is redone in a fresh process ``handler_retries``
  times, each dying the same way, then it is dead-lettered with its data;
- the Java daemon never notices: its child (the relay) keeps its connection, the
  daemon logs no failed child and does not System.exit; the shard goes on with the
  records put after the marker, and its checkpoint passes the dead-lettered batch;
- every other record, put before, alongside and after the marker, on both shards, is
  in the committed output exactly once.

The marker is put alone on shard 0 once every earlier record is committed, and the
later records only once it is dead-lettered, so the dead-lettered batch is the marker
alone whatever batches the daemon makes.
"""

from __future__ import annotations

import base64
import json
import time
from pathlib import Path

import pytest

from mldserver.base.deadletters import DeadLetters
from tests.faulty_handlers import FaultOnMarker

from .components import DynamoDBLocal, KinesisLocal, Run, wait_for, write_properties
from .test_real_daemon import APP, HALF, STREAM, committed, put_plain, wait_committed

pytestmark = [pytest.mark.realdaemon, pytest.mark.spark]  # the pipeline runs in embedded Spark

SHARD0, SHARD1 = "shardId-000000000000", "shardId-000000000001"
# What the daemon's MultiLangShardRecordProcessor logs when its child fails (before its
# System.exit), and what the relay writes to its stderr (which the daemon logs) when
# the server closes on it or is gone.
CHILD_FAILED = ("Child process failed", "Encountered an error while trying to process records",
                "Failed to get status message", "Failed to write", "Child process exited with value",
                "Received error line from subprocess", "mldserver connect:")


def stat(pid: int) -> list[str] | None:
    """/proc/PID/stat's fields after the command (state, ppid, ...), None when gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return None


def alive(pid: int) -> bool:
    """A running process (not a zombie waiting to be reaped)."""
    fields = stat(pid)
    return fields is not None and fields[0] != "Z"


def children(pid: int) -> set[int]:
    """The live processes whose parent is ``pid``: the daemon's children are its relays."""
    pids = (int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit())
    return {p for p in pids if (fields := stat(p)) is not None and fields[1] == str(pid) and fields[0] != "Z"}


@pytest.mark.timeout(600)
def test_real_daemon_survives_a_handler_faulting_in_c(tmp_path):
    kinesis = KinesisLocal(tmp_path)
    dynamodb = DynamoDBLocal(tmp_path)
    out = tmp_path / "out"
    config = tmp_path / "mldserver.toml"
    config.write_text("window = 1.0\nwatermark_margin = 1.0\nidle_timeout = 10.0\ncheckpoint_interval = 0.0\n"
                      "handler_retries = 2\nhandler_backoff = 0.1\n")
    # The lease assignment manager runs every 5 s, not 2 x failoverTimeMillis: its first
    # round (before this worker reported its metrics) assigns nothing, the next one does.
    properties = write_properties(tmp_path, APP, stream=STREAM, app=APP, kinesis=kinesis, dynamodb=dynamodb,
                                  extra={"leaseAssignmentIntervalMillis": "5000"})
    run = None
    try:
        kinesis.create_stream(STREAM, 2)
        started = time.monotonic()
        # 1. records on both shards, before the marker: all committed.
        expected = put_plain(kinesis, "a", 8, [5, HALF + 5])
        assert {e[0] for e in expected} == {SHARD0, SHARD1}
        run = Run(tmp_path, "tests.faulty_handlers:FaultOnMarker", properties, "--workers", "2",
                  "--sink", f"parquet:{out}", "--pipeline", "tests.integration.recording:pipeline",
                  "--config", str(config))
        wait_committed(out, expected, 240)
        leased_s = time.monotonic() - started
        relays = children(run.daemon_pid)
        assert len(relays) == 2, relays  # one relay per shard

        # 2. the marker alone on shard 0, records on shard 1 alongside it: the marker's
        # batch kills its process at each of its 3 attempts, then it is dead-lettered.
        marker = kinesis.client.put_record(StreamName=STREAM, Data=FaultOnMarker.MARKER, PartitionKey="marker",
                                           ExplicitHashKey="5")
        assert marker["ShardId"] == SHARD0
        alongside = put_plain(kinesis, "b", 4, [HALF + 7])
        wait_for(lambda: any(e["event"] == "dead_lettered" for e in run.events()), 120,
                 "the marker's batch dead-lettered", interval=0.5)
        expected += alongside

        # 3. records put after the marker, on its shard and the other: the shard goes on.
        after = put_plain(kinesis, "c", 8, [9, HALF + 9])
        assert {e[0] for e in after} == {SHARD0, SHARD1}
        expected += after
        wait_committed(out, expected, 120)
        last = max((int(e[1]), e[1]) for e in after if e[0] == SHARD0)[1]
        wait_for(lambda: dynamodb.leases(APP)[SHARD0] == (last, 0), 60,
                 "shard 0's checkpoint past the dead-lettered batch", interval=1)

        # The daemon never noticed: alive, with the same relays (children) as before the
        # marker, its log free of any failed child; every shard initialized once on one
        # connection that never closed (no EOF either way); nothing of the daemon's in
        # the server's log as an error.
        events = run.events()
        daemon_log = run.daemon_log.read_text(errors="replace")
        assert run.proc.poll() is None and alive(run.daemon_pid)
        assert children(run.daemon_pid) == relays
        inits = [(e["shard_id"], e["conn"]) for e in events if e["event"] == "initialize"]
        assert sorted(s for s, _ in inits) == [SHARD0, SHARD1] and len({c for _, c in inits}) == 2, inits
        for line in CHILD_FAILED:
            assert line not in daemon_log, line
        kinds = [e["event"] for e in events]
        for kind in ("daemon_exited", "task_crashed", "daemon_error", "closed", "disconnected"):
            assert kind not in kinds, [e for e in events if e["event"] == kind][:2]

        # The handler processes died of SIGSEGV in the handler's code, once per attempt,
        # each running the marker's batch; the batch was then dead-lettered, after them.
        attempts = 3  # handler_retries + 1
        died = [e for e in events if e["event"] == "handler_process_died"]
        assert len(died) == attempts, died
        for death in died:
            assert death["signal"] == "SIGSEGV", death
            assert death["running"] == {"shard_id": SHARD0, "action": "process_records"}, death
            assert "faulty_handlers.py" in death["stack"], death["stack"]
        failed = [e for e in events if e["event"] == "handler_failed" and e.get("callback") == "process_records"]
        assert [f["retry"] for f in failed] == [True, True, False], failed
        assert all("handler process died" in f["error"] for f in failed), failed
        (lettered,) = [e for e in events if e["event"] == "dead_lettered"]
        assert lettered["shard_id"] == SHARD0 and lettered["records"] == 1 and lettered["reason"] == "record failed"
        assert kinds.index("handler_process_died") < kinds.index("dead_lettered")
        assert max(i for i, k in enumerate(kinds) if k == "handler_process_died") < kinds.index("dead_lettered")

        # The dead letter: the marker's batch (the marker alone), with its data.
        path = DeadLetters(run.state_dir / "dead-letters").path_for(SHARD0)
        assert sorted(p.name for p in path.parent.iterdir()) == [path.name]  # no other shard lost anything
        (letter,) = [json.loads(line) for line in path.read_text().splitlines()]
        assert (letter["sequence_number"], letter["sub_sequence_number"], letter["partition_key"]) \
            == (marker["SequenceNumber"], 0, "marker")
        assert base64.b64decode(letter["data"]) == FaultOnMarker.MARKER
        assert letter["reason"] == "record failed" and "handler process died" in letter["error"]
        assert letter["attempts"] == attempts

        # Every other record, exactly once; the marker never.
        rows = committed(out)
        assert len(rows) == len(set(rows)), "a record was committed twice"
        assert set(rows) == set(expected)
        assert marker["SequenceNumber"] not in {r[1] for r in rows}

        # And the daemon stops cleanly, as it would have without the fault.
        assert run.terminate(120) == 0, run.stderr_path.read_text()
        (stopped,) = [e for e in run.events() if e["event"] == "daemon_stopped"]
        assert stopped["clean"] is True, stopped
        print(f"leases taken and first records committed in {leased_s:.0f} s; "
              f"whole test {time.monotonic() - started:.0f} s")
    finally:
        if run is not None:
            run.terminate()
        dynamodb.terminate()
        kinesis.terminate()
