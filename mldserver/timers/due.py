"""What the scheduler holds in memory of the store: the timers due soon, which of them
are being fired, and where to read the store next. Plain data, no I/O and no asyncio:
the scheduler (``scheduler.py``) reads the store and tells it what it read, what was
written, and how each firing ended; it answers what is due, and what to read next::

    due = DueTimers(shared=False, max_held=10_000, max_in_flight=1_000, horizon_ms=2_000, poll_ms=500)
    until, limit = due.wanted(now)           # None: memory has enough to go on
    rows = await store.due(until, limit, due.after())
    due.read(rows, until, limit, now)        # held: the rows not in flight
    due.written(("handlers.orders:remind", "order-7"), timer)   # a create the store committed
    batch = due.take(now)                    # held -> in flight, due order, max_in_flight at most
    due.ended(batch[0], finished=True)       # its firing settled in the store

What is held is exactly what the store has (apart from the timers in flight) up to a
frontier: ``through`` (every stored timer due by then) or ``cursor`` (every one up to
that ``(due, callback, reference)``); ``loaded(timer)`` says whether a timer lies
within it. Each change the scheduler reports keeps that true:

- a write: a timer within the frontier is held (its replacement, if one was held);
  a cancel drops it. One in flight is marked superseded: its firing ends without
  holding it again, and the replacement (``deferred``) is held then;
- a read: the rows are held, and the frontier moves to the last row (a full read) or
  to ``until`` (the store had no more);
- too many held (creates due soon coming faster than they fire): the earliest
  ``max_held`` are kept and the frontier moves back to the last one kept;
- a shared store (``shared``: other servers change it too) is read again from
  scratch every ``poll_ms``.
"""

from __future__ import annotations

import heapq
import itertools

from .store import After, Key, Timer


class DueTimers:
    def __init__(self, *, shared: bool, max_held: int, max_in_flight: int, horizon_ms: int, poll_ms: int) -> None:
        self.shared = shared
        self.max_held = max_held
        self.max_in_flight = max_in_flight
        self.horizon_ms = horizon_ms
        self.poll_ms = poll_ms
        self.held: dict[Key, Timer] = {}
        self.in_flight: dict[Key, Timer] = {}
        self.through: int | None = None  # every stored timer due by this is held or in flight
        self.cursor: tuple[int, str, str] | None = None  # and every one up to this (due, callback, reference)
        self.polled = -poll_ms  # when a shared store was last read from scratch
        self.deferred: dict[Key, Timer] = {}  # replacements of timers in flight, held once those end
        self.superseded: set[Key] = set()  # timers in flight replaced or cancelled meanwhile
        self._heap: list[tuple[int, int, Key, int]] = []  # (due, seq, key, version); stale ones skipped
        self._seq = itertools.count()

    def loaded(self, timer: Timer) -> bool:
        """Is ``timer`` within what memory mirrors of the store?"""
        return (self.through is not None and timer.due_ms <= self.through) or (
            self.cursor is not None and timer.order <= self.cursor)

    # -- reading the store ----------------------------------------------------------------

    def wanted(self, now: float) -> tuple[int, int] | None:
        """The read to make at ``now``: timers due by ``until``, at most ``limit`` of
        them, after ``after()``; None if memory has enough. A shared store due for a
        poll is read from the start (the frontier is forgotten here)."""
        if self.shared and now >= self.polled + self.poll_ms:
            self.through = self.cursor = None  # others change it too: read it again from the start
        if self.cursor is not None:
            if len(self.held) >= self.max_held // 2:
                return None
        elif self.through is not None and self.through >= now + self.horizon_ms / 2:
            return None
        limit = self.max_held - len(self.held)
        if limit <= 0:
            return None
        return int(now + self.horizon_ms), limit

    def after(self) -> After:
        """Where the next read starts (exclusive): the frontier."""
        return self.cursor if self.cursor is not None else self.through

    def read(self, rows: list[Timer], until: int, limit: int, now: float) -> None:
        """What ``store.due(until, limit, after())`` returned at ``now``."""
        if self.shared:
            self.polled = now
        for timer in rows:
            if timer.key in self.in_flight:
                if timer.key in self.superseded:  # its replacement, held once the firing ends
                    self.deferred[timer.key] = timer
                continue
            held = self.held.get(timer.key)
            if held is None or held.version != timer.version or held.due_ms != timer.due_ms:
                self._hold(timer)
        if len(rows) < limit:
            self.through, self.cursor = until, None
        else:
            self.cursor = rows[-1].order

    # -- what the server changed ----------------------------------------------------------

    def written(self, key: Key, timer: Timer | None) -> bool:
        """The store committed ``timer`` for ``key`` (None: cancelled). Whether it is
        held now (it may be due before the scheduler's next look)."""
        if timer is None:
            self.held.pop(key, None)
            self.deferred.pop(key, None)
            if key in self.in_flight:
                self.superseded.add(key)
        elif key in self.in_flight:
            self.superseded.add(key)
            if self.loaded(timer):
                self.deferred[key] = timer
            else:
                self.deferred.pop(key, None)
        elif self.loaded(timer):
            self._hold(timer)
            return True
        else:
            self.held.pop(key, None)
        return False

    # -- firing ---------------------------------------------------------------------------

    def next_due(self) -> int | None:
        """When the earliest held timer is due, if there is room to fire it (it may
        have been replaced since: a look then finds nothing)."""
        if self._heap and len(self.in_flight) < self.max_in_flight:
            return self._heap[0][0]
        return None

    def take(self, now: float) -> list[Timer]:
        """The held timers due by ``now``, in due order, as many as ``max_in_flight``
        leaves room for: in flight from now on."""
        batch: list[Timer] = []
        room = self.max_in_flight - len(self.in_flight)
        heap = self._heap
        while heap and room > 0 and heap[0][0] <= now:
            due, _, key, version = heapq.heappop(heap)
            timer = self.held.get(key)
            if timer is None or timer.version != version or timer.due_ms != due:
                continue  # replaced, cancelled or moved since
            del self.held[key]
            self.in_flight[key] = timer
            batch.append(timer)
            room -= 1
        return batch

    def ended(self, timer: Timer, *, finished: bool = False, again: Timer | None = None) -> None:
        """``timer``'s firing ended: ``finished`` (deleted from the store), ``again``
        (rescheduled so in the store), or neither (still stored as it was: released,
        or not called)."""
        key = timer.key
        self.in_flight.pop(key, None)
        replacement = self.deferred.pop(key, None)
        if key in self.superseded:
            self.superseded.discard(key)
            if replacement is not None:
                self._hold(replacement)
            return
        if finished:
            return
        if again is not None:
            if self.loaded(again):
                self._hold(again)
        elif not self.shared:
            self._hold(timer)  # not called (or cut short): still stored, due

    # -- holding --------------------------------------------------------------------------

    def _hold(self, timer: Timer) -> None:
        self.held[timer.key] = timer
        heapq.heappush(self._heap, (timer.due_ms, next(self._seq), timer.key, timer.version))
        if len(self.held) > self.max_held * 5 // 4:
            self._evict()
        elif len(self._heap) > 2 * len(self.held) + 1000:
            self._heap = [(t.due_ms, next(self._seq), t.key, t.version) for t in self.held.values()]
            heapq.heapify(self._heap)

    def _evict(self) -> None:
        """Too many held: keep the earliest ``max_held``; the frontier moves back to
        the last one kept."""
        keep = sorted(self.held.values(), key=lambda t: t.order)[: self.max_held]
        last = keep[-1]
        self.cursor = last.order
        if self.through is not None and self.through >= last.due_ms:
            self.through = last.due_ms - 1
        self.held = {t.key: t for t in keep}
        self._heap = [(t.due_ms, next(self._seq), t.key, t.version) for t in keep]
        heapq.heapify(self._heap)
