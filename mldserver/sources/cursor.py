"""One shard read page after page, in order, whoever takes the pages: the server's
source reader (``reader``, which hands each page to the server as a daemon would) and
the Python API (``stream``, which yields its records). What the service says goes
wrong is handled here, once::

    cursor = ShardCursor(streams, ListedShard("shardId-000000000001", (), False), ("TRIM_HORIZON", None),
                         log=log, stop=stopping)
    page = await cursor.read()      # Page(records=[<daemon-shaped>, ...], read=2, next_iterator="AAAA...")
    cursor.last = Position.parse(page.records[-1]["sequenceNumber"], 0)   # handed over: resume after it
    cursor.ended                    # True once the shard is closed and read to its end
    cursor.lag_ms                   # how far behind the shard's head the last page was (ms)
    await cursor.read()             # None only when ``stop`` is set

- the first iterator is ``first`` (``("TRIM_HORIZON", None)``, ``("LATEST", None)``,
  ``("AT_TIMESTAMP", None)`` with ``at_ms``, or the service's ``resume`` after a saved
  position); every later one is the service's ``resume`` after ``last``, so the caller
  says what it has taken by setting ``last``. Kinesis resumes ``AT_SEQUENCE_NUMBER``:
  the user records up to ``last`` are read again and dropped here;
- ``since_ms``: records that arrived (DynamoDB: were created) before it are dropped
  (Kinesis's ``AT_TIMESTAMP`` goes there, but the SDK sends the time in whole seconds;
  DynamoDB has no such iterator and its creation times are whole seconds, so the time
  is taken down to its second there). ``None`` keeps every record;
- two reads are ``read_interval`` apart at least (Kinesis: 5 a second per shard);
- throttled (``source_throttled``): backs off with jitter, up to 30 s; an expired iterator
  (``source_iterator_expired``): a fresh one after ``last``; records trimmed away before
  they were read (``source_records_trimmed``, an error: what was lost): on at the trim
  horizon; the service unreachable (``source_read_failed``): retried with backoff,
  logged once until it recovers.

``lag_ms``, after each page: Kinesis's ``MillisBehindLatest``; for DynamoDB Streams,
which does not say, the time since the creation of the last change read (0 after an
empty page: nothing is left to read).

A page whose records were all dropped comes back empty (its ``read`` says how many the
service returned); its iterator has moved on all the same.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Awaitable

from ..base.backoff import Backoff
from ..base.durable import wall_clock_ms
from ..base.logs import EventLogger
from ..base.positions import Position
from .service import IteratorExpired, ListedShard, Page, Service, Throttled, Trimmed, Unreachable

THROTTLE = Backoff(first=0.5, cap=30.0)
UNREACHABLE = Backoff(first=1.0, cap=30.0)


async def sleep(seconds: float, *events: asyncio.Event) -> None:
    """Sleep, cut short when one of ``events`` is set."""
    if not events:
        await asyncio.sleep(max(0.0, seconds))
        return
    waits = [asyncio.ensure_future(e.wait()) for e in events]
    try:
        await asyncio.wait(waits, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()


async def until(aw: Awaitable[Any], stop: asyncio.Event | None) -> Any:
    """``aw``'s result, or None if ``stop`` is set first (``aw`` cancelled)."""
    if stop is None:
        return await aw
    call = asyncio.ensure_future(aw)
    stopping = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait([call, stopping], return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopping.cancel()
    if not call.done():
        call.cancel()
        await asyncio.gather(call, return_exceptions=True)
        return None
    return call.result()


class ShardCursor:
    def __init__(self, streams: Service, shard: ListedShard, first: tuple[str, str | None], *, log: EventLogger,
                 last: Position | None = None, since_ms: int | None = None, at_ms: int | None = None,
                 stop: asyncio.Event | None = None) -> None:
        """``first``: (iterator type, sequence number) of the first iterator when
        ``last`` is None; ``at_ms``: the time of an ``AT_TIMESTAMP`` one."""
        self.streams = streams
        self.shard = shard
        self.first = first
        self.log = log
        self.last = last
        self.at_ms = at_ms
        self.since_ms = since_ms
        self.stop = stop
        self.iterator: str | None = None
        self.ended = False
        self.children: tuple[str, ...] = ()  # once ended: the last page's (Kinesis ChildShards)
        self.started = False  # an iterator taken: from here on nothing written to the shard is missed
        self.lag_ms: int | None = None  # behind the shard's head after the last page (None: none read yet)
        self._skip: Position | None = None  # AT_SEQUENCE_NUMBER: the user records up to here were taken already
        self._read_at = -float("inf")
        self._throttled = self._failures = 0

    @property
    def since_ms(self) -> int | None:
        return self._since

    @since_ms.setter
    def since_ms(self, value: int | None) -> None:
        if value is not None and not self.streams.at_timestamp:
            value -= value % 1000  # DynamoDB's creation times are whole seconds
        self._since = value

    def _stopped(self) -> bool:
        return self.stop is not None and self.stop.is_set()

    async def read(self) -> Page | None:
        """The shard's next page, its records in order (see the module); None when
        ``stop`` is set first. Call it again after a page whatever it held, until
        ``ended``."""
        streams, shard_id = self.streams, self.shard.shard_id
        while not self._stopped():
            try:
                if self.iterator is None:
                    kind, after = (streams.resume, self.last.text) if self.last is not None else self.first
                    at_ms = self.at_ms if kind == "AT_TIMESTAMP" else None
                    iterator = await until(streams.iterator(shard_id, kind, after, at_ms), self.stop)
                    if iterator is None:
                        return None
                    self.iterator = iterator
                    self._skip = self.last if kind == "AT_SEQUENCE_NUMBER" else None
                    if not self.started:
                        self.log.info("source_shard_started", start=kind, position=after,
                                      parents=list(self.shard.parents))
                        self.started = True
                wait = self._read_at + streams.read_interval - time.monotonic()
                if wait > 0:  # the service's reads a second per shard (Kinesis: 5)
                    await sleep(wait, *([self.stop] if self.stop else []))
                    if self._stopped():
                        return None
                self._read_at = time.monotonic()
                page = await until(streams.records(self.iterator), self.stop)
                if page is None:
                    return None
            except Throttled as exc:
                self.log.warning("source_throttled", error=str(exc), attempt=self._throttled)
                self._throttled += 1
                await self._pause(THROTTLE.delay(self._throttled - 1))
                continue
            except IteratorExpired:
                self.log.info("source_iterator_expired", position=self.last.text if self.last else None)
                self.iterator = None
                continue
            except Trimmed as exc:
                self.log.error("source_records_trimmed", after=self.last.text if self.last else self.first[1],
                               error=str(exc),
                               what_to_do="records between this position and the shard's trim horizon were removed "
                                          "by the stream (its retention) before they were read, and are lost; "
                                          "reading goes on at the trim horizon. Keep the reader running, or read "
                                          "faster")
                self.iterator, self.last, self.first = None, None, ("TRIM_HORIZON", None)
                continue
            except Unreachable as exc:
                if self._failures == 0:
                    self.log.warning("source_read_failed", error=str(exc),
                                     what_to_do="retried with backoff; check the endpoint, region and credentials")
                self._failures += 1
                await self._pause(UNREACHABLE.delay(self._failures - 1))
                continue
            if self._failures:
                self.log.info("source_read_recovered", attempts=self._failures)
            self._throttled = self._failures = 0
            return self._taken(page)
        return None

    def _taken(self, page: Page) -> Page:
        records = page.records
        self.lag_ms = lag_ms(page, self.streams.millis_behind)
        if self._skip is not None and records:
            records = [r for r in records if not _at_or_before(r, self._skip)]
            self._skip = None
        since = self._since
        if since is not None:
            records = [r for r in records if (r.get("approximateArrivalTimestamp") or since) >= since]
        self.iterator = page.next_iterator
        self.ended = page.next_iterator is None
        if self.ended:
            self.children = page.children
        return page._replace(records=records) if records is not page.records else page

    async def _pause(self, seconds: float) -> None:
        await sleep(seconds, *([self.stop] if self.stop else []))


def lag_ms(page: Page, millis_behind: bool, now_ms: int | None = None) -> int | None:
    """How far behind its shard's head ``page`` is: the service's word where it has one
    (``millis_behind``), else the age of its last record (0 for an empty page)::

        lag_ms(Page([{"approximateArrivalTimestamp": 1769767200000, ...}], 1, "it"), False,
               now_ms=1769767200250)   # 250
    """
    if millis_behind:
        return page.behind_ms
    last = page.records[-1].get("approximateArrivalTimestamp") if page.records else None
    if not page.read or last is None:
        return 0 if not page.read else None
    return max(0, (wall_clock_ms() if now_ms is None else now_ms) - last)


def _at_or_before(record: dict[str, Any], position: Position) -> bool:
    at = Position.parse(record.get("sequenceNumber"), record.get("subSequenceNumber") or 0)
    return at is not None and at <= position
