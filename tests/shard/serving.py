"""A server in the test's event loop, the relay command for the fake daemon, and what
the tests read back (dead letters, the calls a recording handler saw)."""

from __future__ import annotations

import contextlib
import json

import mldserver
from mldserver.config import Settings
from mldserver.server import Server

from ..conftest import relay_command


@contextlib.asynccontextmanager
async def running(factory, tmp_path, **overrides):
    settings = Settings(handler="test", port=0, state_dir=str(tmp_path / "state"), handler_backoff=0.01,
                        checkpoint_backoff=0.01, **overrides)
    server = Server(settings, factory)
    await server.start()
    try:
        yield server, relay_command(server.address[1])
    finally:
        await server.shutdown()


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
