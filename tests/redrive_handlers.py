"""Handlers for the redrive tests (tests/test_redrive.py): broken on some records until
a fix is deployed. The fix is a file, read when the module is imported, so a handler
process sees it only once ``mldserver reload`` imports the module again."""

from __future__ import annotations

import os
from pathlib import Path

import mldserver

FIXED = Path(os.environ.get("MLDSERVER_TEST_FIX", "/nonexistent")).exists()  # (unset: collected for doctests)


class FailPoison(mldserver.Handler):
    """One row per record; raises on a record whose partition key is ``poison``
    until fixed, and on ``doomed`` always."""

    async def process_records(self, batch, checkpointer):
        for record in batch.records:
            if record.partition_key == "doomed" or (record.partition_key == "poison" and not FIXED):
                raise ValueError(f"cannot take {record.partition_key} {record.sequence_number}")
            batch.emit(record, {"seq": record.sequence_number, "shard": batch.shard.shard_id, "fixed": FIXED})
