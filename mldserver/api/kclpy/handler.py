"""An amazon_kclpy processor class as an mldserver handler: ``KclpyHandler.wrap(cls)``
is a ``Handler`` class whose instance, one per shard, holds one instance of ``cls``
(built as KCLProcess's script builds it: ``cls()``) and a thread of its own::

    factory = KclpyHandler.wrap(RecordProcessor, 3)     # a Handler subclass named app.RecordProcessor
    handler = factory(context)                           # RecordProcessor() inside
    await handler.initialize(shard)                      # processor.initialize(InitializeInput) in its thread
    await handler.process_records(batch, checkpointer)   # processor.process_records(ProcessRecordsInput)

Each action is dispatched as KCLProcess dispatches it: amazon_kclpy's ``messages``
input, its ``dispatch(checkpointer, processor)``, and for the v2 and v1 APIs
amazon_kclpy's own adapters (``V2toV3Processor``, ``V1toV2Processor``): ``leaseLost`` is
``shutdown`` with ``ZOMBIE``, ``shardEnded`` with ``TERMINATE``, v1's ``initialize``
gets the shard id and its ``process_records`` the records and the checkpointer.

What differs from KCLProcess, on purpose (``docs/kclpy.md``):

- an exception out of a callback is mldserver's failure (retried, then the batch
  dead-lettered, the shard going on), where KCLProcess logs it and answers the action
  as if it had succeeded;
- the calls run in the shard's thread (``thread.py``), taking turns with the other
  shards of the process while they compute (``turns.py``); past ``execution_timeout``
  they are stopped (``ProcessorStopped`` raised in them);
- ``print()`` and ``sys.stderr`` become ``handler_output`` events (``output.py``), its
  own threads' too (with the thread's name);
- whatever the processor does at a shard end, the server stores ``SHARD_END``.
"""

from __future__ import annotations

import weakref
from typing import Any, ClassVar

from amazon_kclpy import messages
from amazon_kclpy.v2 import processor as v2
from amazon_kclpy.v3 import processor as v3

from ...base.logs import get_logger
from ..handler import Handler
from ..records import Batch, ShardInfo
from .emitting import batch as emitting_to
from .inputs import Checkpointer, records_of
from .output import Lines, bind, install
from .thread import ShardThread
from .turns import TURNS

log = get_logger("mldserver.handler")


class KclpyHandler(Handler):
    processor_class: ClassVar[type]  # the user's class (set by ``wrap``)
    api_version: ClassVar[int]  # 3, 2 or 1: which base class it has
    # In a handler process, a batch comes as its line (``batch.line``), parsed in the
    # shard's thread when it gets to it (``inputs.records_of``): a batch waiting for
    # its turn holds no parsed copy.
    parses_line = True
    # Its shards' threads take turns (``turns.py``): its handler process serves them
    # from one heap (``pool/malloc.one_heap``), not one heap per thread.
    takes_turns = True

    @classmethod
    def wrap(cls, processor_class: type, api_version: int) -> type["KclpyHandler"]:
        """A handler class for ``processor_class``, named as it is (errors name the user's class)."""
        return type(processor_class.__name__, (cls,), {
            "processor_class": processor_class, "api_version": api_version,
            "__module__": processor_class.__module__, "__qualname__": processor_class.__qualname__,
            "__doc__": f"{processor_class.__module__}.{processor_class.__qualname__}, an amazon_kclpy "
                       f"v{api_version} processor, run by mldserver",
        })

    def __init__(self, context: Any) -> None:
        super().__init__(context)
        # What it prints, and the threads it starts, as it is made: the shard's output
        # (its id known at initialize).
        self.output = Lines(log)
        install()
        bind(self.output)
        try:
            self.processor = self.processor_class()  # as amazon_kclpy's script makes it: no arguments
        finally:
            self.output.flush()
            bind(None)
        # What KCLProcess calls: the v3 API, amazon_kclpy's adapters in front of v2 and v1.
        target: Any = self.processor
        if self.api_version == 1:
            target = v2.V1toV2Processor(target)
        if self.api_version <= 2:
            target = v3.V2toV3Processor(target)
        self.target = target
        self.thread: ShardThread | None = None
        self.checkpointer: Checkpointer | None = None

    async def initialize(self, shard: ShardInfo) -> None:
        if self.thread is None:
            self.output.log = log.bind(shard_id=shard.shard_id)
            self.thread = ShardThread(shard.shard_id, log, self.output)
            weakref.finalize(self, self.thread.close)  # the shard's instance dropped: its thread ends
            self.checkpointer = Checkpointer(self.thread)
        await self._dispatch(messages.InitializeInput({
            "action": "initialize", "shardId": shard.shard_id, "sequenceNumber": shard.sequence_number,
            "subSequenceNumber": shard.sub_sequence_number}), None)

    async def process_records(self, batch: Batch, checkpointer: Any) -> None:
        await self._dispatch(batch, checkpointer)

    async def lease_lost(self) -> None:
        await self._dispatch(messages.LeaseLostInput({"action": "leaseLost"}), None)

    async def shard_ended(self, checkpointer: Any) -> None:
        await self._dispatch(messages.ShardEndedInput({"action": "shardEnded"}), checkpointer)

    async def shutdown_requested(self, checkpointer: Any) -> None:
        await self._dispatch(messages.ShutdownRequestedInput({"action": "shutdownRequested"}), checkpointer)

    async def _dispatch(self, action: Any, checkpointer: Any) -> None:
        assert self.thread is not None and self.checkpointer is not None, "initialize comes first"
        self.checkpointer.bind(checkpointer)
        try:
            await self.thread.run(self._in_thread, action)
        finally:
            self.checkpointer.bind(None)

    def _in_thread(self, action: Any) -> None:
        with TURNS.turn():  # (one shard computes at a time, unless it blocks: turns.py)
            if isinstance(action, Batch):  # its records read here, off the loop
                batch = action
                records = records_of(batch)
                action = messages.ProcessRecordsInput({"action": "processRecords", "records": records,
                                                       "millisBehindLatest": batch.millis_behind_latest})
                with emitting_to(batch, records):
                    action.dispatch(self.checkpointer, self.target)
                return
            action.dispatch(self.checkpointer, self.target)
