"""The handler API: subclass ``Handler`` and point ``mldserver serve --handler`` at it.

``--handler pkg.mod:Attr``: ``Attr`` is called once per shard connection with the
server context and returns the handler for that shard. All methods are coroutines run
on the event loop of a handler process (``mldserver.pool``; with ``--workers 0``, the
server's own), shared with other shards: keep them non-blocking
(``await asyncio.to_thread(...)`` for blocking work)::

    import mldserver

    class Orders(mldserver.Handler):
        async def initialize(self, shard):
            self.shard_id = shard.shard_id

        async def process_records(self, batch, checkpointer):
            for record in batch.records:
                handle(record.partition_key, record.data)
            last = batch.records[-1] if batch.records else None
            if last is not None:
                await checkpointer.checkpoint(last.sequence_number, last.sub_sequence_number)

A method that raises is retried (bounded, with backoff); a batch that still fails is
dead-lettered with its data and the shard moves on. To give up on one record and go on
with the batch: ``batch.fail(record, error)`` (``mldserver.api.failures``). For one callback
per record, subclass ``mldserver.ChangeHandler`` (``mldserver.api.changes``). A ``CheckpointError`` escaping a
method ends that action without a retry. Each call has an execution time-out
(``execution_timeout``, default 60 s) that counts as a failure: in a handler process,
even a call that blocks is stopped (interrupted where it blocks, with ``ExecutionTimeout``;
its process killed and replaced only if that does not stop it). The handler is checked at
start-up (``mldserver.api.checks``): a near miss of a callback's name
(``process_record``) is refused with "did you mean", and so is a handler with no
``process_records``.

Durable timers (Couchbase Eventing's ``createTimer``/``cancelTimer``; see
``mldserver.timers``): ``await self.timers.create(callback, at, reference, context)``
calls ``await callback(context)`` at or after ``at``, at least once, even across
restarts; ``await self.timers.cancel(callback, reference)`` removes it. A call's
timers are committed together, before its checkpoints and its status::

    async def remind(context):                     # module level, async
        ...

    class Orders(mldserver.Handler):
        async def process_records(self, batch, checkpointer):
            for record in batch.records:
                await self.timers.create(remind, time.time() + 3600, record.partition_key, {"id": 7})
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..errors import ConfigError

if TYPE_CHECKING:
    from .checkpointer import Checkpointer
    from .records import Batch, ShardInfo
    from ..timers.api import Timers


class Handler:
    """Subclass it and give ``mldserver serve --handler module:Orders``: the class is
    called once per shard with the server's ``Context``, and its coroutines are called
    in the shard's order, one at a time::

        class Orders(mldserver.Handler):
            async def initialize(self, shard):                 # a ShardInfo
                self.shard_id = shard.shard_id

            async def process_records(self, batch, checkpointer):
                for record in batch.records:
                    order = json.loads(record.data)
                    batch.emit(record, {"customer": order["customer"], "amount": order["amount"]})
                await checkpointer.checkpoint()                # with a sink: as far as it committed

    A method that raises is retried (``handler_retries``, ``handler_backoff``); a batch
    that still fails is split to find the records that fail alone, which are
    dead-lettered with their data while the shard goes on (``batch.fail(record, error)``
    gives up on one record at once). Each call has ``execution_timeout``. The defaults
    below checkpoint at a shard end and at a shutdown request; override only what you
    need. Keep the methods non-blocking: the loop is shared with other shards
    (``await asyncio.to_thread(...)`` for blocking work)."""

    def __init__(self, context: Any) -> None:
        self.context = context

    @property
    def timers(self) -> "Timers":
        """Durable timers: ``create(callback, at, reference, context=None)`` and
        ``cancel(callback, reference)`` (``mldserver.timers``)."""
        timers = getattr(self.context, "timers", None)
        if timers is None:
            raise ConfigError("self.timers needs the server's context: pass the context your factory was given "
                              "to Handler.__init__ (super().__init__(context))")
        return timers

    async def initialize(self, shard: "ShardInfo") -> None:
        """Called once before the shard's first batch with its ``ShardInfo``
        (``shard.shard_id``, where its checkpoint stands); no checkpointing here."""

    async def process_records(self, batch: "Batch", checkpointer: "Checkpointer") -> None:
        """One batch of the shard's records, in order (``batch.records``), with the
        checkpointer of this call only. Emit rows with ``batch.emit(record, row)``;
        checkpoint with ``await checkpointer.checkpoint()``. Required: the base does
        nothing."""

    async def lease_lost(self) -> None:
        """Another worker holds the lease now: checkpoints would fail; clean up fast."""

    async def shard_ended(self, checkpointer: "Checkpointer") -> None:
        """The shard is closed and fully read. Default: checkpoint SHARD_END.

        Whatever this does, the server makes sure SHARD_END is stored before it
        answers the daemon: the daemon gives a shard end one chance only.
        """
        await checkpointer.checkpoint()

    async def shutdown_requested(self, checkpointer: "Checkpointer") -> None:
        """Graceful shutdown or lease hand-off: checkpoint what is safe. Default:
        everything delivered (with no pipeline, delivered records are processed)."""
        await checkpointer.checkpoint()
