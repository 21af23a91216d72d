"""Handlers that misbehave on purpose, for the fault tests (tests/faults, issue 10).

Durations come from the environment of the server process, so one handler serves
several tests: ``MLDSERVER_TEST_WORK`` (seconds of work before a checkpoint) and
``MLDSERVER_TEST_SLEEP`` (seconds per batch).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import ctypes
import json
import os

import mldserver


class WorkThenCheckpoint(mldserver.Handler):
    """Works MLDSERVER_TEST_WORK seconds, then checkpoints everything delivered."""

    async def process_records(self, batch, checkpointer):
        await asyncio.sleep(float(os.environ.get("MLDSERVER_TEST_WORK", "0.8")))
        await checkpointer.checkpoint()


class CheckpointWithinOwnTimeout(mldserver.Handler):
    """Bounds its own checkpoint call: ``asyncio.wait_for(checkpoint(), 0.2)``."""

    async def process_records(self, batch, checkpointer):
        await asyncio.wait_for(checkpointer.checkpoint(), 0.2)


class SlowLogged(mldserver.Handler):
    """Logs ``handler_started`` then sleeps MLDSERVER_TEST_SLEEP seconds per batch."""

    async def process_records(self, batch, checkpointer):
        self.context.log.info("handler_started", records=len(batch.records))
        await asyncio.sleep(float(os.environ.get("MLDSERVER_TEST_SLEEP", "2")))


class Hang(mldserver.Handler):
    """Never returns from a batch (until cancelled)."""

    async def process_records(self, batch, checkpointer):
        self.context.log.info("handler_started", records=len(batch.records))
        await asyncio.Event().wait()


class SwallowCancel(mldserver.Handler):
    """Catches CancelledError and carries on: a time-out or a shutdown cannot stop it."""

    async def process_records(self, batch, checkpointer):
        self.context.log.info("handler_started", records=len(batch.records))
        while True:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                self.context.log.info("handler_swallowed_cancel")


class EmitRows(mldserver.Handler):
    """One row per record (event time: the record's arrival time)."""

    async def process_records(self, batch, checkpointer):
        for record in batch.records:
            batch.emit(record, {"seq": record.sequence_number, "pk": record.partition_key})


class FaultOnMarker(mldserver.Handler):
    """The rows of tests/integration/recording.py (one per record, the record's shard,
    position, partition key and base64 data), checkpointing nothing itself (the sink's
    commits do); a record whose data is ``MARKER`` faults in C at every attempt: its
    handler process dies of SIGSEGV, as a buggy C extension's would."""

    MARKER = b"fault-in-c"

    async def process_records(self, batch, checkpointer):
        for r in batch.records:
            if r.data == self.MARKER:
                ctypes.string_at(0)  # reads address 0: SIGSEGV in C
            batch.emit(r, {"shard_id": batch.shard.shard_id, "sequence_number": r.sequence_number,
                           "sub_sequence_number": r.sub_sequence_number, "partition_key": r.partition_key,
                           "data": base64.b64encode(r.data).decode()})


class EmitSoon(mldserver.Handler):
    """Emits rows whose event time is not a number: ``event_time_ms="soon"``."""

    async def process_records(self, batch, checkpointer):
        for record in batch.records:
            batch.emit(record, {"seq": record.sequence_number}, event_time_ms="soon")


class EventTimeFromKey(mldserver.Handler):
    """Emits one row per record; a partition key of digits is the row's event time
    (epoch ms, any size), else the record's arrival time is."""

    async def process_records(self, batch, checkpointer):
        for record in batch.records:
            key = record.partition_key or ""
            batch.emit(record, {"seq": record.sequence_number}, event_time_ms=int(key) if key.isdigit() else None)


class KeepCheckpointer(mldserver.Handler):
    """Keeps the first batch's checkpointer and calls it during the second batch (the
    second batch's own checkpointer is never used)."""

    def __init__(self, context):
        super().__init__(context)
        self.kept = None

    async def process_records(self, batch, checkpointer):
        if self.kept is None:
            self.kept = checkpointer
            return
        try:
            await self.kept.checkpoint()
            self.context.log.info("stale_checkpointer_worked")
        except Exception as exc:
            self.context.log.info("stale_checkpointer_refused", error=f"{type(exc).__name__}: {exc}")


class SyncProcessRecords(mldserver.Handler):
    """``process_records`` written without ``async``: it logs each call."""

    def process_records(self, batch, checkpointer):  # type: ignore[override]
        self.context.log.info("sync_handler_called")


# -- the scripted handler of the property test ------------------------------------------

class Scripted(mldserver.Handler):
    """Does what its plan says. A batch's plan is the JSON in its first record's data;
    the other callbacks' plans are in ``$MLDSERVER_TEST_PLANS/<shard id>.json``::

        {"initialize": [...], "shutdown_requested": [...], "shard_ended": [...], "lease_lost": [...]}

    A plan is a list of steps: ``["checkpoint", seq, sub]``, ``["checkpoint_within", seq,
    sub, seconds]`` (the handler's own ``asyncio.wait_for`` around it), ``["sleep", s]``,
    ``["raise"]``, ``["cancel"]`` (raises CancelledError, as a cancelled inner task
    does), each step's CheckpointError caught or not as ``["catch"]`` says."""

    def __init__(self, context):
        super().__init__(context)
        self.plans: dict = {}

    async def _run(self, steps, checkpointer):
        catch = False
        for step in steps or []:
            kind = step[0]
            if kind == "catch":
                catch = True
            elif kind == "sleep":
                await asyncio.sleep(step[1])
            elif kind == "raise":
                raise RuntimeError("scripted failure")
            elif kind == "cancel":
                raise asyncio.CancelledError()
            elif kind in ("checkpoint", "checkpoint_within") and checkpointer is not None:
                call = checkpointer.checkpoint(step[1], step[2])
                try:
                    if kind == "checkpoint_within":
                        await asyncio.wait_for(call, step[3])
                    else:
                        await call
                except mldserver.CheckpointError:
                    if not catch:
                        raise

    async def initialize(self, shard):
        folder = os.environ.get("MLDSERVER_TEST_PLANS")
        path = os.path.join(folder, f"{shard.shard_id}.json") if folder and shard.shard_id else None
        if path and os.path.exists(path):
            with open(path) as f:
                self.plans = json.load(f)
        await self._run(self.plans.get("initialize"), None)

    async def process_records(self, batch, checkpointer):
        plan = None
        if batch.records:
            try:
                plan = json.loads(batch.records[0].data)
            except (ValueError, binascii.Error, TypeError):
                plan = None
        await self._run(plan if isinstance(plan, list) else None, checkpointer)

    async def shutdown_requested(self, checkpointer):
        await self._run(self.plans.get("shutdown_requested"), checkpointer)

    async def shard_ended(self, checkpointer):
        await self._run(self.plans.get("shard_ended"), checkpointer)

    async def lease_lost(self):
        await self._run(self.plans.get("lease_lost"), None)


class Typo(mldserver.Handler):
    """``process_record``, one letter short: refused at start-up ("did you mean")."""

    async def process_record(self, batch, checkpointer):
        pass


class NoContext(mldserver.Handler):
    """A constructor that takes no context: refused at start-up, naming the class."""

    def __init__(self):
        pass

    async def process_records(self, batch, checkpointer):
        pass
