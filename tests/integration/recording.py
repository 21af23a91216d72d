"""A handler that appends everything it sees to $MLDSERVER_RECORD_FILE (JSON lines),
so a test can check what the real daemon delivered, emits one row per record (for a
server run with a sink), and checkpoints each batch's last record (which the server
clamps to what the sink committed). Its shard_ended and shutdown_requested are the
Handler defaults. ``pipeline`` runs in the server's Spark process on each window."""

from __future__ import annotations

import base64
import json
import os

import mldserver


def _write(entry: dict) -> None:
    with open(os.environ["MLDSERVER_RECORD_FILE"], "a") as f:
        f.write(json.dumps(entry) + "\n")


class Recording(mldserver.Handler):
    async def initialize(self, shard):
        self.shard_id = shard.shard_id
        _write({"event": "initialize", "shard_id": shard.shard_id, "sequence_number": shard.sequence_number,
                "sub_sequence_number": shard.sub_sequence_number})

    async def process_records(self, batch, checkpointer):
        if not batch.records:
            return
        for r in batch.records:
            batch.emit(r, {"shard_id": self.shard_id, "sequence_number": r.sequence_number,
                           "sub_sequence_number": r.sub_sequence_number, "partition_key": r.partition_key,
                           "data": base64.b64encode(r.data).decode()})
        _write({
            "event": "records",
            "shard_id": self.shard_id,
            "records": [
                {"sequence_number": r.sequence_number, "sub_sequence_number": r.sub_sequence_number,
                 "partition_key": r.partition_key, "data": base64.b64encode(r.data).decode()}
                for r in batch.records
            ],
        })
        last = batch.records[-1]
        await checkpointer.checkpoint(last.sequence_number, last.sub_sequence_number)
        _write({"event": "checkpointed", "shard_id": self.shard_id, "sequence_number": last.sequence_number,
                "sub_sequence_number": last.sub_sequence_number})

    async def shutdown_requested(self, checkpointer):
        _write({"event": "shutdown_requested", "shard_id": self.shard_id})
        await super().shutdown_requested(checkpointer)

    async def lease_lost(self):
        _write({"event": "lease_lost", "shard_id": self.shard_id})

    async def shard_ended(self, checkpointer):
        _write({"event": "shard_ended", "shard_id": self.shard_id})
        await super().shard_ended(checkpointer)


def pipeline(df, window):
    """The rows as they are, tagged with their window."""
    from pyspark.sql import functions as F

    return df.withColumn("window_id", F.lit(window.id))
