"""A stored timer and what every timer store does (``sqlite.py``, ``dynamodb.py``).

A timer is keyed by its callback's name and its reference; creating one with the same
key replaces it (a new ``version``), as Couchbase Eventing's ``createTimer`` does::

    Timer(callback="handlers.orders:remind", reference="order-7", due_ms=1763719260000,
          context=b'{"order":7}', version=4611686018427387911, attempts=0)

``version`` is what makes a firing safe against a replacement made meanwhile: the
scheduler finishes a fired timer with ``finish(done=[timer])``, which deletes it only
if it still has that version; a replacement (a new version) stays and fires later, a
cancellation has already deleted it. ``attempts`` counts failed calls, kept in the
store so that retries and the dead letter survive a restart.

The store's contract (each call durable when it returns; the scheduler is the only
caller, and runs them on one event loop):

- ``write(ops)``: creates (a ``Timer``: insert or replace) and cancels (a ``Key``:
  delete) in order, all in one commit; whether each cancel found a timer (one
  created earlier in the same ops counts). A call's timers arrive so, together
  (``pending.py``)::

      await store.write([Timer("m:remind", "order-7", due_ms, b'{"order":7}', version),
                         ("m:remind", "order-8")])          # -> [True]: order-8 was there

  ``put(timers)`` is ``write`` of creates only; ``delete(callback, reference)`` of
  one cancel, and says whether there was one;
- ``due(until_ms, limit, after)``: timers due at or before ``until_ms``, in
  ``(due_ms, callback, reference)`` order, after a key (``(due, callback, reference)``)
  or after a due time (an int, exclusive), at most ``limit`` of them;
- ``claim(timers, now_ms)``: the ones this server may fire now. A store of one
  server's own (``shared = False``) returns them all; a shared one (DynamoDB)
  claims each with a conditional write, for ``claim_ms``;
- ``finish(done, retry, release)``: delete the fired (and dead-lettered) ones,
  reschedule the failed ones (``retry``: the timer with its new due time and
  attempts), hand back the claims of the ones not called (``release``); each only if
  its version is unchanged;
- ``pending``: how many timers the store holds (None while unknown).
"""

from __future__ import annotations

import os
from typing import NamedTuple, Protocol, Sequence, Union

Key = tuple[str, str]  # (callback, reference)
After = tuple[int, str, str] | int | None


class Timer(NamedTuple):
    callback: str  # module:function, found again by name (api.resolve)
    reference: str
    due_ms: int  # epoch milliseconds; fired at or after it
    context: bytes  # the callback's argument, JSON
    version: int = 0  # set when stored; a replacement gets a new one
    attempts: int = 0  # failed calls so far

    @property
    def key(self) -> Key:
        return (self.callback, self.reference)

    @property
    def order(self) -> tuple[int, str, str]:
        """Where it sorts among timers: by due time, then by key."""
        return (self.due_ms, self.callback, self.reference)


Op = Union[Timer, Key]  # a create (the timer to store) or a cancel (the key to delete)


def net(ops: Sequence[Op]) -> tuple[dict[Key, Timer | None], list[bool | None], list[Key]]:
    """What ``ops`` leave, for a store that cannot run them in order in one
    transaction: each key's end state (its timer, or None: deleted), each cancel's
    answer where the ops tell it (a create before it on its key: True; a cancel: False)
    or None where only the store can (the first op on its key), and those keys in
    order (a store deletes them before anything else, and answers from what it found)::

        net([Timer("m:cb", "a", ...), ("m:cb", "a"), ("m:cb", "b")])
        -> ({("m:cb", "a"): None, ("m:cb", "b"): None}, [True, None], [("m:cb", "b")])
    """
    final: dict[Key, Timer | None] = {}
    answers: list[bool | None] = []
    asked: list[Key] = []
    for op in ops:
        if isinstance(op, Timer):
            final[op.key] = op
            continue
        if op in final:
            answers.append(final[op] is not None)
        else:
            answers.append(None)
            asked.append(op)
        final[op] = None
    return final, answers, asked


def new_version() -> int:
    """A version no other server will make (random, 63 bits: an SQLite INTEGER)."""
    return int.from_bytes(os.urandom(8)) >> 1 or 1


class Store(Protocol):
    shared: bool  # several servers fire from it: claims decide who fires what
    pending: int | None

    async def open(self) -> None: ...

    async def close(self) -> None: ...

    async def write(self, ops: Sequence[Op]) -> list[bool]: ...

    async def put(self, timers: Sequence[Timer]) -> None: ...

    async def delete(self, callback: str, reference: str) -> bool: ...

    async def due(self, until_ms: int, limit: int, after: After = None) -> list[Timer]: ...

    async def claim(self, timers: Sequence[Timer], now_ms: int) -> list[Timer]: ...

    async def finish(self, done: Sequence[Timer], retry: Sequence[Timer], release: Sequence[Timer]) -> None: ...
