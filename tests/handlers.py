"""Handlers the tests (and the conformance scenarios) run the server with."""

from __future__ import annotations

import asyncio
import os

import mldserver


class Noop(mldserver.Handler):
    """Does nothing with a batch; the Handler defaults apply to every other callback."""

    async def process_records(self, batch, checkpointer):
        pass


class CheckpointLast(mldserver.Handler):
    async def process_records(self, batch, checkpointer):
        if batch.records:
            last = batch.records[-1]
            await checkpointer.checkpoint(last.sequence_number, last.sub_sequence_number)


class CheckpointNull(mldserver.Handler):
    async def process_records(self, batch, checkpointer):
        await checkpointer.checkpoint()


class CheckpointFirstRetryOnce(mldserver.Handler):
    async def process_records(self, batch, checkpointer):
        first = batch.records[0]
        try:
            await checkpointer.checkpoint(first.sequence_number, first.sub_sequence_number)
        except mldserver.CheckpointError:
            await checkpointer.checkpoint(first.sequence_number, first.sub_sequence_number)


class CheckpointLastNoting(mldserver.Handler):
    """Checkpoints each batch's last record; notes (class-wide, for workers = 0) each
    refused checkpoint's error and each ``lease_lost``."""

    noted: list[str] = []

    async def process_records(self, batch, checkpointer):
        if batch.records:
            last = batch.records[-1]
            try:
                await checkpointer.checkpoint(last.sequence_number, last.sub_sequence_number)
            except mldserver.CheckpointError as exc:
                self.noted.append(exc.error)

    async def lease_lost(self):
        self.noted.append("lease_lost")


class Raise(mldserver.Handler):
    async def process_records(self, batch, checkpointer):
        raise RuntimeError("this handler always fails")


class EchoData(mldserver.Handler):
    """Raises unless each record's data is what make_records() generates for it."""

    async def process_records(self, batch, checkpointer):
        for record in batch.records:
            seq = record.sequence_number
            expected = (seq.encode() * (len(record.data) // len(seq) + 1))[: len(record.data)]
            if record.data != expected:
                raise ValueError(f"record {seq}: data differs")


class Sleepy(mldserver.Handler):
    """Sleeps MLDSERVER_TEST_SLEEP seconds per batch (time-outs, shutdown)."""

    async def process_records(self, batch, checkpointer):
        await asyncio.sleep(float(os.environ.get("MLDSERVER_TEST_SLEEP", "1")))
        if batch.records:
            await checkpointer.checkpoint()


HANDLER_KINDS = {
    "noop": "tests.handlers:Noop",
    "checkpoint_last": "tests.handlers:CheckpointLast",
    "checkpoint_null": "tests.handlers:CheckpointNull",
    "checkpoint_first_retry_once": "tests.handlers:CheckpointFirstRetryOnce",
    "raise": "tests.handlers:Raise",
    "echo_data": "tests.handlers:EchoData",
}


class ReportModules(mldserver.Handler):
    """Emits a row per record, then writes the process's pid and every module it has
    loaded to the file ``MLDSERVER_TEST_MODULES`` names (JSON)."""

    async def process_records(self, batch, checkpointer):
        import json
        import sys

        for record in batch.records:
            batch.emit(record, {"n": 1})
        path = os.environ["MLDSERVER_TEST_MODULES"]
        with open(path + ".tmp", "w") as out:
            json.dump({"pid": os.getpid(), "modules": sorted(sys.modules)}, out)
        os.replace(path + ".tmp", path)


class DataTimes(mldserver.Handler):
    """A replay's handler: each record is JSON with its own event time ``t`` (epoch ms),
    emitted as a row with that time."""

    async def process_records(self, batch, checkpointer):
        import orjson

        for record in batch.records:
            event = orjson.loads(record.data)
            batch.emit(record, {"carrier": event["carrier"], "delay": event["delay"], "t": event["t"]},
                       event_time_ms=event["t"])
