"""amazon_kclpy's own sample app, unchanged, under the real KCL 3.1.3 MultiLangDaemon:
``mldserver run --properties <a file written for amazon_kclpy> --handler
samples.sample_kclpy_app:RecordProcessor`` against kinesis-local and DynamoDB Local.

The properties file is the one an amazon_kclpy user has (``executableName =
sample_kclpy_app.py``, ``processingLanguage``): ``mldserver run`` sets its relay in its
place. The sample checkpoints its first batch at its largest sequence number (in the
lease table), its output is in the server's log with each shard's id and not in the
daemon's, and on SIGTERM each shard gets ``shutdownRequested`` (the sample checkpoints
all it was given) and ``leaseLost``; everything exits 0, and no error is logged but the
daemon's own graceful-shutdown time-out (``components.kcl_shutdown_timeout``).
"""

from __future__ import annotations

import pytest

from .components import DynamoDBLocal, KinesisLocal, Run, kcl_shutdown_timeout, wait_for, write_properties

pytestmark = pytest.mark.realdaemon

STREAM, APP = "kclpy-sample", "mldserver-kclpy-sample"
HALF = 2**127  # shard 0 of a 2-shard stream covers hash keys below this
SAMPLE = "samples.sample_kclpy_app:RecordProcessor"


def put(kinesis: KinesisLocal, prefix: str, count: int) -> dict[str, list[str]]:
    """Records over both shards: each shard's sequence numbers, in order."""
    entries = [{"Data": f"{prefix}-{i}".encode(), "PartitionKey": f"{prefix}-{i}",
                "ExplicitHashKey": str([7, HALF + 7][i % 2])} for i in range(count)]
    result = kinesis.client.put_records(StreamName=STREAM, Records=entries)
    assert not result.get("FailedRecordCount")
    out: dict[str, list[str]] = {}
    for r in result["Records"]:
        out.setdefault(r["ShardId"], []).append(r["SequenceNumber"])
    return out


@pytest.mark.timeout(600)
def test_the_sample_app_runs_unchanged_under_the_real_daemon_through_mldserver_run(tmp_path):
    kinesis = KinesisLocal(tmp_path)
    dynamodb = DynamoDBLocal(tmp_path)
    run = None
    try:
        kinesis.create_stream(STREAM, 2)
        first = put(kinesis, "a", 20)
        assert sorted(first) == ["shardId-000000000000", "shardId-000000000001"]
        properties = write_properties(tmp_path, "kclpy", stream=STREAM, app=APP, kinesis=kinesis, dynamodb=dynamodb,
                                      extra={"executableName": "sample_kclpy_app.py",  # as amazon_kclpy's users have it
                                             "processingLanguage": "python/3.11",
                                             "callProcessRecordsEvenForEmptyRecordList": "false"})
        run = Run(tmp_path, SAMPLE, properties)
        (overridden,) = [e for e in run.events() if e["event"] == "executable_overridden"]
        assert overridden["was"] == "sample_kclpy_app.py"

        # Its first batch of each shard checkpointed at the largest sequence number (the sample's).
        largest = {shard: (seqs[-1], 0) for shard, seqs in first.items()}
        wait_for(lambda: all(dynamodb.leases(APP).get(s) == cp for s, cp in largest.items()), 240,
                 "the sample's checkpoints in the lease table", interval=1)
        printed = [e for e in run.events() if e["event"] == "handler_output"]
        for shard, seqs in first.items():
            lines = "".join(e["line"] for e in printed if e.get("shard_id") == shard)
            assert all(f"Sequence Number: {seq}," in lines for seq in seqs), shard

        # More records, then SIGTERM: shutdownRequested checkpoints them all (the sample's
        # checkpoint() with no argument), leaseLost is logged, both exit cleanly.
        later = put(kinesis, "b", 10)
        wait_for(lambda: sum(f"Sequence Number: {seqs[-1]}," in e["line"] for e in run.events()
                             if e["event"] == "handler_output" for seqs in later.values()) == len(later), 120,
                 "the later records at the sample", interval=1)
        assert run.terminate(120) == 0, run.stderr_path.read_text()
        assert {s: dynamodb.leases(APP)[s] for s in later} == {s: (seqs[-1], 0) for s, seqs in later.items()}
        events = run.events()
        said = {(e["shard_id"], e["line"]) for e in events if e["event"] == "handler_output"}
        for shard in first:
            assert (shard, "Shutdown has been requested, checkpointing.") in said
            assert (shard, "Lease has been lost") in said
        assert [e for e in events if e["level"] == "error" and not kcl_shutdown_timeout(e)] == []
        assert [e for e in events if e["event"] == "handler_failed"] == []
        daemon_log = run.daemon_log.read_text(errors="replace")
        assert "Record (Partition Key" not in daemon_log and "Lease has been lost" not in daemon_log  # not the daemon's
    finally:
        if run is not None:
            run.terminate()
        kinesis.terminate()
        dynamodb.terminate()
