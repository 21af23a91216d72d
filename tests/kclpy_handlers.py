"""amazon_kclpy processors for the tests (``test_kclpy.py``), one per API version, written
as amazon_kclpy's users write them; each appends what it was handed to the JSON-lines
file named by ``MLDSERVER_KCLPY_SEEN`` (handler processes inherit it), one ``os.write``
a line, so that shards in several processes and threads can share the file."""

from __future__ import annotations

import base64
import json
import os
import threading
import time

from amazon_kclpy import kcl
from amazon_kclpy.v2 import processor as v2processor
from amazon_kclpy.v3 import processor as v3processor


def seen(**entry) -> None:
    entry["thread"] = threading.current_thread().name
    entry["pid"] = os.getpid()
    fd = os.open(os.environ["MLDSERVER_KCLPY_SEEN"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(entry) + "\n").encode())
    finally:
        os.close(fd)


class V2Processor(v2processor.RecordProcessorBase):
    def initialize(self, initialize_input):
        self.shard_id = initialize_input.shard_id
        seen(event="initialize", shard_id=self.shard_id, sequence_number=initialize_input.sequence_number,
             sub_sequence_number=initialize_input.sub_sequence_number)

    def process_records(self, process_records_input):
        records = process_records_input.records
        seen(event="records", shard_id=self.shard_id, millis_behind_latest=process_records_input.millis_behind_latest,
             records=[{"binary_data": base64.b64encode(r.binary_data).decode(), "data": r.data,
                       "sequence_number": r.sequence_number, "sub_sequence_number": r.sub_sequence_number,
                       "partition_key": r.partition_key, "timestamp_millis": r.timestamp_millis,
                       "arrival": r.approximate_arrival_timestamp.isoformat(), "type": type(r).__mro__[1].__name__}
                      for r in records])
        if records:
            process_records_input.checkpointer.checkpoint(records[-1].sequence_number,
                                                          records[-1].sub_sequence_number)

    def shutdown(self, shutdown_input):
        error = None
        try:
            shutdown_input.checkpointer.checkpoint()
        except kcl.CheckpointError as exc:
            error = exc.value
        seen(event="shutdown", shard_id=self.shard_id, reason=shutdown_input.reason, checkpoint_error=error)


class V1Processor(kcl.RecordProcessorBase):
    def initialize(self, shard_id):
        self.shard_id = shard_id
        seen(event="initialize", shard_id=shard_id)

    def process_records(self, records, checkpointer):
        seen(event="records", shard_id=self.shard_id,
             records=[{"binary_data": base64.b64encode(base64.b64decode(r["data"])).decode(), "data": r.get("data"),
                       "sequence_number": r["sequenceNumber"], "sub_sequence_number": r.get("subSequenceNumber"),
                       "partition_key": r["partitionKey"]} for r in records])
        if records:
            checkpointer.checkpoint(records[-1]["sequenceNumber"], records[-1]["subSequenceNumber"])

    def shutdown(self, checkpointer, reason):
        error = None
        try:
            checkpointer.checkpoint()
        except kcl.CheckpointError as exc:
            error = exc.value
        seen(event="shutdown", shard_id=self.shard_id, reason=reason, checkpoint_error=error)


class Base(v3processor.RecordProcessorBase):
    """A v3 processor with nothing to do but what a test's subclass says."""

    def initialize(self, initialize_input):
        self.shard_id = initialize_input.shard_id

    def process_records(self, process_records_input):
        pass

    def lease_lost(self, lease_lost_input):
        pass

    def shard_ended(self, shard_ended_input):
        shard_ended_input.checkpointer.checkpoint()

    def shutdown_requested(self, shutdown_requested_input):
        shutdown_requested_input.checkpointer.checkpoint()


class Poisoned(Base):
    """A batch whose first record's data is ``spin``, ``sleep`` or ``raise`` spins in
    Python, sleeps in C or raises; any other batch is checkpointed."""

    def process_records(self, process_records_input):
        records = process_records_input.records
        what = records[0].binary_data if records else b""
        seen(event="records", shard_id=self.shard_id, first=records[0].sequence_number if records else None,
             what=what.decode(errors="replace"))
        if what == b"spin":
            while True:
                pass
        if what == b"sleep":
            time.sleep(60)
        if what == b"raise":
            raise ValueError("a bad record")
        process_records_input.checkpointer.checkpoint()


class Kept(Base):
    """Keeps the first batch's checkpointer and checkpoints the second batch with it."""

    def process_records(self, process_records_input):
        if not hasattr(self, "kept"):
            self.kept = process_records_input.checkpointer
            return
        self.kept.checkpoint()
        seen(event="kept", shard_id=self.shard_id, same=self.kept is process_records_input.checkpointer)


class Prints(Base):
    """Prints, writes to stderr without a newline, then checkpoints."""

    def process_records(self, process_records_input):
        import sys

        print("hello from", self.shard_id)
        sys.stderr.write("no newline")
        sys.stdout.write("one\ntwo\n")
        process_records_input.checkpointer.checkpoint()


class Emits(Base):
    """The two-line change: ``emit`` from ``mldserver.api.kclpy``."""

    def process_records(self, process_records_input):
        from mldserver.api.kclpy import emit

        for record in process_records_input.records:
            emit(record, {"key": record.partition_key, "size": len(record.binary_data)})


class ThreadPrints(Base):
    """Starts a thread of its own in ``__init__`` and one in ``initialize``, as processors
    that upload in the background do; each prints (and writes to ``sys.stderr`` without a
    newline, then flushes) when a batch asks it to, and the batch waits for it."""

    def __init__(self):
        import queue

        self.asks = queue.SimpleQueue()
        self.done = queue.SimpleQueue()
        threading.Thread(target=self._work, args=("made",), name="uploader", daemon=True).start()

    def initialize(self, initialize_input):
        import queue

        super().initialize(initialize_input)
        self.later = queue.SimpleQueue()
        threading.Thread(target=self._later, name="flusher", daemon=True).start()

    def _work(self, name):
        import sys

        while True:
            size = self.asks.get()
            print(f"uploaded {size} records", name)
            sys.stderr.write("partial ")
            sys.stderr.write("line")
            sys.stderr.flush()
            self.done.put(size)

    def _later(self):
        while True:
            print("flushed", self.later.get())
            self.done.put(None)

    def process_records(self, process_records_input):
        self.asks.put(len(process_records_input.records))
        self.later.put(len(process_records_input.records))
        self.done.get(timeout=10)
        self.done.get(timeout=10)
        process_records_input.checkpointer.checkpoint()


class FailsInitialize(Base):
    """``initialize`` raises until the file ``MLDSERVER_KCLPY_SEEN`` + ``.ready`` exists
    (a database that is not up yet); batches are checkpointed."""

    def initialize(self, initialize_input):
        seen(event="initialize", shard_id=initialize_input.shard_id, sequence_number=initialize_input.sequence_number)
        if not os.path.exists(os.environ["MLDSERVER_KCLPY_SEEN"] + ".ready"):
            raise ConnectionError("the database is not up")
        super().initialize(initialize_input)

    def process_records(self, process_records_input):
        records = process_records_input.records
        seen(event="records", shard_id=self.shard_id, sequence_numbers=[r.sequence_number for r in records])
        process_records_input.checkpointer.checkpoint()
