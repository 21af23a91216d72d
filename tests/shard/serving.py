"""What the worker tests read back: dead letters, and the calls a recording handler saw."""

from __future__ import annotations

import json

import mldserver


def dead_letters(tmp_path, shard_id):
    path = tmp_path / "state" / "dead-letters" / f"{shard_id}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


class Recorder(mldserver.Handler):
    calls: list = []

    async def initialize(self, shard):
        self.calls.append(("initialize", shard.shard_id, shard.sequence_number))

    async def process_records(self, batch, checkpointer):
        self.calls.append(("process_records", [(r.sequence_number, r.sub_sequence_number, r.partition_key, r.data)
                                               for r in batch.records]))

    async def lease_lost(self):
        self.calls.append(("lease_lost",))


def recorder():
    calls = []
    return type("R", (Recorder,), {"calls": calls}), calls
