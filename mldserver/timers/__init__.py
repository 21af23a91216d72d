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
            await checkpointer.checkpoint()   # the batch's timers are committed first, in one commit

In a timer callback (no ``self``), ``await timers.create(...)`` and
``await timers.cancel(...)`` do the same.

A create costs no round trip: it is checked at once (a mistake raises ``TimerError``
there) and kept with the call; the call's timers become durable together, in one
commit, before any checkpoint the call asks for and before its action's status (a
callback's, before it counts as done). A record checkpointed after a create never
loses its timer; a call that fails loses its timers with it, and its action, redone,
creates them again. A cancel the call's own timers cannot answer asks the store (one
commit, with the call's timers so far).

The parts:

- ``api.py``: the checks every argument goes through, and the handler-facing ``Timers``.
- ``pending.py``: a call's timers, kept until they are written in one commit.
- ``store.py``: a stored ``Timer`` and what every timer store does.
- ``sqlite.py``: the embedded store, the default, in the state dir.
- ``dynamodb.py``: a store several servers share, one DynamoDB table.
- ``scheduler.py``: the scheduler's loop: reads the store ahead, hands due timers to the firing.
- ``due.py``: what the scheduler holds of the store (due when, in flight, where to read next), no I/O.
- ``settle.py``: one batch fired and its end settled in the store: retries, redos, dead letters.
- ``firing.py``: what a firing is, and callbacks fired in the server's loop (``workers = 0``).
- ``remote.py``: the handler process's side: ``self.timers`` there, its ops on the wire.
- ``stats.py``: the timers' metrics, read from the scheduler at each scrape.

Settings: ``timer_store`` (``sqlite``, ``sqlite:PATH`` or ``dynamodb:TABLE``) and
``timer_context_size`` (bytes of a context's JSON, 1024 by default); callbacks get
``execution_timeout`` and are retried ``handler_retries`` times, ``handler_backoff``
apart, then dead-lettered with their context (``dead-letters/_timers.jsonl``).
"""

from .api import Timers, TimerError, cancel, create

__all__ = ["TimerError", "Timers", "cancel", "create"]
