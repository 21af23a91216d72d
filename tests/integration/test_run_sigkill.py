"""``mldserver run`` SIGKILLed (an OOM kill, a node's reboot of the process), then run
again on the same state dir, with the real KCL 3.x daemon, kinesis-local and DynamoDB
Local (components.py):

1. the daemon it started is gone within 20 s of the server's SIGKILL: the kernel kills
   it with the server (``ops.tether``), not when its relays' pipes close;
2. the restart is the same KCL worker (``<state-dir>/daemon/worker-id``), so it takes
   its leases back at once instead of waiting for them to expire: records put after
   the kill are served within 150 s;
3. each shard resumes at its stored checkpoint, not at TRIM_HORIZON: nothing the
   first run checkpointed is delivered again.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from mldserver.ops.tether import started

from .components import DynamoDBLocal, KinesisLocal, Run, wait_for, write_properties
from .test_real_daemon import HALF, Seen, positions, put_plain, wait_seen

pytestmark = pytest.mark.realdaemon

STREAM, APP = "orders", "mldserver-sigkill"
SHARDS = ("shardId-000000000000", "shardId-000000000001")


@pytest.mark.timeout(900)
def test_a_sigkilled_run_leaves_nothing_running_and_its_restart_resumes_its_leases(tmp_path):
    kinesis = KinesisLocal(tmp_path)
    dynamodb = DynamoDBLocal(tmp_path)
    record_file = tmp_path / "seen.jsonl"
    properties = write_properties(tmp_path, APP, stream=STREAM, app=APP, kinesis=kinesis, dynamodb=dynamodb)
    serve_args = ("tests.integration.recording:Recording", properties)
    env = {"MLDSERVER_RECORD_FILE": str(record_file)}
    seen = Seen(record_file)
    runs: list[Run] = []
    try:
        kinesis.create_stream(STREAM, 2)
        before = put_plain(kinesis, "a", 10, [5, HALF + 5])
        began = time.monotonic()
        runs.append(Run(tmp_path, *serve_args, run=1, env=env))
        first = runs[0]
        wait_seen(seen, before, 240)
        first_start_s = time.monotonic() - began
        # Every record checkpointed, and stored in the lease table.
        last = {shard: max(positions(seen, shard)) for shard in SHARDS}
        wait_for(lambda: all(dynamodb.leases(APP).get(s) == (str(last[s][0]), last[s][1]) for s in SHARDS), 60,
                 "each shard's last record stored as its checkpoint", interval=1)
        stored = dynamodb.leases(APP)

        # 1. SIGKILL the server: its daemon goes with it.
        os.kill(first.proc.pid, signal.SIGKILL)
        first.proc.wait()
        killed = time.monotonic()
        wait_for(lambda: started(first.daemon_pid) is None, 20, f"the daemon (pid {first.daemon_pid}) gone")
        daemon_gone_s = time.monotonic() - killed

        # 2. records put after the kill, served by the restart within 150 s.
        marker = len(seen.entries())
        after = put_plain(kinesis, "b", 10, [7, HALF + 7])
        began = time.monotonic()
        runs.append(Run(tmp_path, *serve_args, run=2, env=env))
        second = runs[1]
        assert not [e for e in second.events() if e["event"] == "daemon_leftover_stopped"]  # nothing was left
        worker = {run.log_path.name: next(e for e in run.events() if e["event"] == "daemon_started")["worker_id"]
                  for run in runs}
        assert len(set(worker.values())) == 1, worker
        wait_seen(seen, after, 150, since=marker)
        restart_s = time.monotonic() - began

        # 3. each shard resumed at its checkpoint; nothing checkpointed came again.
        resumed = {e["shard_id"]: (e["sequence_number"], e["sub_sequence_number"])
                   for e in seen.events("initialize", since=marker)}
        assert resumed == {shard: stored[shard] for shard in SHARDS}, (resumed, stored)
        again = set(seen.records(marker)) & set(before)
        assert not again, f"delivered again after the restart: {sorted(again)[:3]}"
        print(f"first start {first_start_s:.0f} s; daemon gone {daemon_gone_s:.2f} s after the server's SIGKILL; "
              f"restart served new records in {restart_s:.0f} s")
    finally:
        for run in runs:
            run.terminate()
        dynamodb.terminate()
        kinesis.terminate()
