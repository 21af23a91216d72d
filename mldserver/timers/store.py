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

- ``put(timers)`` inserts or replaces each (in order: the last of a key wins), all
  in one commit; ``delete(callback, reference)`` says whether there was one;
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

import secrets
from typing import NamedTuple, Protocol, Sequence

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


def new_version() -> int:
    """A version no other server will make (random, 63 bits: an SQLite INTEGER)."""
    return secrets.randbits(63) or 1


class Store(Protocol):
    shared: bool  # several servers fire from it: claims decide who fires what
    pending: int | None

    async def open(self) -> None: ...

    async def close(self) -> None: ...

    async def put(self, timers: Sequence[Timer]) -> None: ...

    async def delete(self, callback: str, reference: str) -> bool: ...

    async def due(self, until_ms: int, limit: int, after: After = None) -> list[Timer]: ...

    async def claim(self, timers: Sequence[Timer], now_ms: int) -> list[Timer]: ...

    async def finish(self, done: Sequence[Timer], retry: Sequence[Timer], release: Sequence[Timer]) -> None: ...
