"""Handlers the handler-process tests run in real handler processes (tests/pool).

A record whose partition key is ``poison`` misbehaves as ``MLDSERVER_TEST_POISON``
says, in the handler process: ``segv`` (a fault in C, through ctypes), ``exit``
(``os._exit(3)``), ``badrow`` (emits a row orjson cannot encode), ``checkpoint-exit`` (exits while its
checkpoint request is being answered), ``block`` (``time.sleep`` for a minute: the test SIGKILLs the
process, or ``execution_timeout`` interrupts it), ``stubborn`` (blocks, and blocks again when
interrupted: ``execution_timeout`` kills its process), ``await`` (awaits a minute:
``execution_timeout`` cancels it), ``raise``. Every row carries the module's
``VERSION`` and the process's pid, so a test can tell which code handled a batch.
"""

from __future__ import annotations

import asyncio
import ctypes
import hashlib
import os
import pickle
import time

import mldserver

VERSION = 1


def misbehave() -> None:
    how = os.environ.get("MLDSERVER_TEST_POISON", "raise")
    if how == "segv":
        ctypes.string_at(0)  # reads address 0: SIGSEGV in C
    elif how == "exit":
        os._exit(3)
    elif how == "block":
        marker = os.environ.get("MLDSERVER_TEST_MARKER")
        if marker:
            with open(marker, "a") as f:
                f.write(f"{os.getpid()}\n")
        time.sleep(60)
    elif how == "stubborn":
        try:
            time.sleep(60)
        except BaseException:  # the server's interrupt, swallowed
            time.sleep(60)
    raise RuntimeError("poisoned record")


class Emit(mldserver.Handler):
    """One row per record, checkpoints nothing itself (the sink's commits do)."""

    async def process_records(self, batch, checkpointer):
        for record in batch.records:
            if record.partition_key == "poison":
                if os.environ.get("MLDSERVER_TEST_POISON") == "badrow":
                    batch.emit(record, {"not json": {1, 2}})
                    continue
                if os.environ.get("MLDSERVER_TEST_POISON") == "checkpoint-exit":
                    # dies while its checkpoint request is with the server (and the daemon)
                    asyncio.ensure_future(checkpointer.checkpoint(record.sequence_number, 0))
                    await asyncio.sleep(0)
                    await asyncio.sleep(0)
                    os._exit(3)
                if os.environ.get("MLDSERVER_TEST_POISON") == "await":
                    await asyncio.sleep(60)
                misbehave()
            batch.emit(record, {"seq": record.sequence_number, "shard": batch.shard.shard_id,
                                "version": VERSION, "pid": os.getpid()})


class Digest(mldserver.Handler):
    """One row per record with the SHA-256 of its data: the sink shows the exact bytes."""

    async def process_records(self, batch, checkpointer):
        for record in batch.records:
            batch.emit(record, {"seq": record.sequence_number, "shard": batch.shard.shard_id,
                                "sha256": hashlib.sha256(record.data).hexdigest(), "pid": os.getpid()})


class DigestAndData(mldserver.Handler):
    """Digest's row with the record's data too (base64): a batch of 1 KiB records emits
    rows large enough to come back in the rows arena (``pool/arena.py``)."""

    async def process_records(self, batch, checkpointer):
        for record in batch.records:
            batch.emit(record, {"seq": record.sequence_number, "shard": batch.shard.shard_id,
                                "sha256": hashlib.sha256(record.data).hexdigest(), "data": record.raw_data})


class KeepsARecord(mldserver.Handler):
    """Reads every record's data alone (its line is not parsed), and keeps the last
    record of each call until the next, which emits a row for it (``"kept"``) with its
    partition key and sequence number, read only then: from its line after its call
    ended, once the line's region went back."""

    kept = None

    async def process_records(self, batch, checkpointer):
        for record in batch.records:
            record.data
        kept, self.kept = self.kept, batch.records[-1]
        if kept is not None:
            batch.emit(batch.records[0], {"shard": "kept", "seq": kept.sequence_number,
                                          "partition_key": kept.partition_key,
                                          "sha256": hashlib.sha256(kept.data).hexdigest()})


class DigestAndDataThenDie(DigestAndData):
    """DigestAndData, whose process SIGKILLs itself as soon as the call that saw the
    record with sequence number 5000 has returned: right after its done frame (naming
    the rows arena) is written, before the server has read it."""

    async def process_records(self, batch, checkpointer):
        await super().process_records(batch, checkpointer)
        if any(record.sequence_number == "5000" for record in batch.records):
            asyncio.get_running_loop().call_soon(os.kill, os.getpid(), 9)


class DigestAndDataDiesOnce(DigestAndData):
    """DigestAndData, whose process SIGKILLs itself in the middle of the first call
    that sees the record with sequence number 3000 (the file ``MLDSERVER_TEST_MARKER``
    names says it has): the batch is redone in another process, whose rows come back in
    its rows arena."""

    async def process_records(self, batch, checkpointer):
        marker = os.environ["MLDSERVER_TEST_MARKER"]
        if any(record.sequence_number == "3000" for record in batch.records) and not os.path.exists(marker):
            with open(marker, "w") as f:
                f.write(f"{os.getpid()}\n")
            os.kill(os.getpid(), 9)
        await super().process_records(batch, checkpointer)


class EmitCheckpoint(Emit):
    """Emits and checkpoints the batch's last record (no sink: the daemon stores it)."""

    async def process_records(self, batch, checkpointer):
        await super().process_records(batch, checkpointer)
        if batch.records:
            last = batch.records[-1]
            await checkpointer.checkpoint(last.sequence_number, last.sub_sequence_number)


class Blocker(mldserver.Handler):
    """Blocks its loop ``MLDSERVER_TEST_SLEEP`` seconds per batch (time.sleep)."""

    async def process_records(self, batch, checkpointer):
        if any(r.partition_key == "poison" for r in batch.records):
            time.sleep(float(os.environ.get("MLDSERVER_TEST_SLEEP", "1.5")))


class Hog(mldserver.Handler):
    """Keeps ``MLDSERVER_TEST_HOG`` MiB per poisoned batch alive: a leak."""

    leak: list = []

    async def process_records(self, batch, checkpointer):
        if any(r.partition_key == "poison" for r in batch.records):
            self.leak.append(b"x" * (int(os.environ.get("MLDSERVER_TEST_HOG", "64")) << 20))  # resident
        for record in batch.records:
            batch.emit(record, {"seq": record.sequence_number, "shard": batch.shard.shard_id, "pid": os.getpid()})


class Sql(mldserver.Handler):
    """Asks Spark, through the server, per batch: a parameter bound by Spark, and the
    first rows of a longer query (leaving the loop early closes the cursor)."""

    async def process_records(self, batch, checkpointer):
        [row] = [r async for r in await self.context.sql("SELECT :n + 1 AS m, :s AS s", n=len(batch.records),
                                                          s="x' OR '1'='1")]
        first = []
        async for r in await self.context.sql("SELECT id FROM range(0, 100000, 1, 8)"):
            first.append(r["id"])
            if len(first) == 3:
                break
        for record in batch.records:
            batch.emit(record, {"shard": batch.shard.shard_id, "seq": record.sequence_number, **row, "first": first})


class Changes(mldserver.ChangeHandler):
    """One row per record from ``on_update``; a record whose partition key is
    ``poison`` raises every time (retried alone, then dead-lettered)."""

    async def initialize(self, shard):
        self.shard_id = shard.shard_id

    async def on_update(self, doc, meta):
        if meta.partition_key == "poison":
            raise RuntimeError("poisoned record")
        self.emit({"seq": meta.sequence_number, "shard": self.shard_id, "pid": os.getpid()})


class SlowChanges(Changes):
    """``Changes``, and a record whose partition key is ``slow`` awaits a minute
    (``execution_timeout`` cancels its batch's call)."""

    async def on_update(self, doc, meta):
        if meta.partition_key == "slow":
            await asyncio.sleep(60)
        await super().on_update(doc, meta)


class FailOne(mldserver.Handler):
    """A batch handler that gives up on the poisoned record with ``batch.fail``, emits
    a row for every other, and checkpoints the batch's last record itself."""

    async def process_records(self, batch, checkpointer):
        for record in batch.records:
            if record.partition_key == "poison":
                batch.fail(record, ValueError("no such customer"))
                continue
            batch.emit(record, {"seq": record.sequence_number, "shard": batch.shard.shard_id, "pid": os.getpid()})
        if batch.records:
            last = batch.records[-1]
            await checkpointer.checkpoint(last.sequence_number, last.sub_sequence_number)


class RecordChanges(mldserver.ChangeHandler):
    """Appends what each callback saw, pickled (exact Python values), to the file
    ``MLDSERVER_TEST_SEEN`` names."""

    async def on_update(self, doc, meta):
        self._write("on_update", doc, meta)

    async def on_delete(self, meta):
        self._write("on_delete", None, meta)

    def _write(self, callback, doc, meta):
        entry = {"callback": callback, "doc": doc, "keys": meta.keys, "old": meta.old, "event_name": meta.event_name,
                 "event_id": meta.event_id, "sequence_number": meta.sequence_number, "expired": meta.expired,
                 "creation_time_ms": meta.creation_time_ms, "source": meta.source, "pid": os.getpid()}
        with open(os.environ["MLDSERVER_TEST_SEEN"], "ab") as f:
            pickle.dump(entry, f)


class RecordBatches(mldserver.Handler):
    """Appends each record it handles (its shard, position, partition key and exact
    bytes), pickled, to the file ``MLDSERVER_TEST_SEEN`` names, then (after
    ``MLDSERVER_TEST_DELAY`` seconds, if set) checkpoints the batch at its last record."""

    async def process_records(self, batch, checkpointer):
        if not batch.records:
            return
        with open(os.environ["MLDSERVER_TEST_SEEN"], "ab") as f:
            for record in batch.records:
                pickle.dump({"shard": batch.shard.shard_id, "seq": record.sequence_number,
                             "sub": record.sub_sequence_number or 0, "key": record.partition_key,
                             "data": record.data, "pid": os.getpid()}, f)
        if os.environ.get("MLDSERVER_TEST_DELAY"):  # a slow handler: a shard's reader waits on it
            await asyncio.sleep(float(os.environ["MLDSERVER_TEST_DELAY"]))
        last = batch.records[-1]
        await checkpointer.checkpoint(last.sequence_number, last.sub_sequence_number)
