"""Durable timers, Couchbase Eventing's ``createTimer`` / ``cancelTimer``: a handler
asks for ``await callback(context)`` at or after a time; it happens at least once,
in a handler process, even if the server restarts in between::

    import time
    import mldserver
    from mldserver import timers

    async def expire(context):                       # module level, async: stored by name
        await archive(context["cart"])

    class Carts(mldserver.Handler):
        async def process_records(self, batch, checkpointer):
            for record in batch.records:
                cart = record.partition_key
                if record.data == b"checkout":
                    await self.timers.cancel(expire, cart)       # -> True if one was pending
                else:                                            # replaces the cart's timer
                    await self.timers.create(expire, time.time() + 1800, cart, {"cart": cart})
            ...

In a timer callback (no ``self``), ``await timers.create(...)`` and
``await timers.cancel(...)`` do the same.

The parts: ``api`` (the checks and the handler-facing ``Timers``), ``store`` (a
stored ``Timer`` and the store's contract), ``sqlite`` (the embedded store, the
default) and ``dynamodb`` (a table several servers share), ``scheduler`` (what is
due soon, in memory; firing; retries; dead letters), ``firing`` (callbacks in a
handler process or in the server's loop), ``remote`` (the handler process's side),
``stats`` (the metrics).

Settings: ``timer_store`` (``sqlite``, ``sqlite:PATH`` or ``dynamodb:TABLE``) and
``timer_context_size`` (bytes of a context's JSON, 1024 by default); callbacks get
``execution_timeout`` and are retried ``handler_retries`` times, ``handler_backoff``
apart, then dead-lettered with their context (``dead-letters/_timers.jsonl``).
"""

from .api import Timers, TimerError, cancel, create

__all__ = ["TimerError", "Timers", "cancel", "create"]
