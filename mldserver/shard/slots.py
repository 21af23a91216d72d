"""The in-flight slots all shards share, and the wire of one shard connection: what
the driver reads from the daemon and writes back, a batch holding a slot while it is
in memory::

    slots = Slots(8)                     # the server's (max_batches_in_flight): at most 8 batches in memory
    wire = Wire(reader, writer, conn, slots, log, running=lambda: calls.running, on_bad_line=bad_line)
    event = await wire.next_event()      # ProcessRecords(...): its slot taken before most of it was read
    ...                                  # (the action handled)
    await wire.write(conn.send(Status(response_for="processRecords")))   # Lost if the peer went away
    wire.release()                       # the batch is answered: its slot goes back

- A batch waits for ``ready`` (the downstream's back-pressure) before it takes a
  slot: a shard running ahead of the watermark leaves its next batch in the kernel.
- Only a batch takes a slot: a line whose first ``PEEK`` bytes name another action
  (``initialize``, ``leaseLost``, ...) never does; one that names none within them
  does. The slot is taken at the line's first bytes, so the rest of a batch waiting
  for one stays in the kernel, not in memory (the daemon sends one action at a time).
- A holder whose line stops growing for ``STALL_S`` gives its slot back
  (``peer_stalled``) until it sends again; a shard waiting longer than
  ``SLOT_WAIT_LOG_S`` for one logs ``slots_held``, naming each holder (shard, how
  long, in which callback, its line's bytes and how long it has not grown).
- A peer that resets is the end of input (``lost`` says why), not a crash; a write to
  a peer gone raises ``Lost``.
- ``stop()`` (the server stops): a wire idle between actions with nothing of the next
  one received stops at once (``Stopped``); an action that has arrived, even partly,
  is read to its end. ``abort()`` (past ``shutdown_timeout``): waiting for a slot and
  reading an action that has not arrived whole stop too (``unanswered_at_shutdown``).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, AsyncIterator, Awaitable, Callable

from ..base.logs import EventLogger
from .pieces import LineReader
from ..protocol import NEED_DATA, Connection, Event, ProcessRecords, RemoteProtocolError, State, action_in

# Waiting for the daemon's next action: the only time a shard takes a slot.
BETWEEN_ACTIONS = frozenset({State.AWAITING_INITIALIZE, State.READY, State.DRAINING})
# Actions that carry no batch: they never take an in-flight slot (named in a line's
# first bytes; a line that has not named its action within PEEK bytes takes one).
SMALL_ACTIONS = frozenset({"initialize", "leaseLost", "shutdownRequested", "shardEnded", "shutdown"})
PEEK = 256
# A slot holder whose action line has not grown for this long gives its slot back.
STALL_S = 5.0
# Waiting this long for a slot logs who holds the slots (and again, 4 times longer, ...).
SLOT_WAIT_LOG_S = 2.0


class Stopped(Exception):
    """The server stops and this connection has nothing to answer."""


class Lost(Exception):
    """The connection cannot go on (the peer went away, or never replied)."""


class Slots:
    """The in-flight slots all shards share (``max_batches_in_flight``): they bound
    the batches held in memory. Who holds one, since when, is known, so a shard that
    waits for one longer than ``SLOT_WAIT_LOG_S`` logs ``slots_held`` naming the holders."""

    def __init__(self, n: int) -> None:
        self.total = n
        self._sem = asyncio.Semaphore(n)
        self.holders: dict[Wire, float] = {}

    async def acquire(self, wire: Wire, aborted: asyncio.Event) -> bool:
        """Take a slot for ``wire``; False if ``aborted`` is set first."""
        if not self._sem.locked():
            await self._sem.acquire()
            self.holders[wire] = time.monotonic()
            return True
        started = time.monotonic()
        waiting = asyncio.ensure_future(self._sem.acquire())
        stop = asyncio.ensure_future(aborted.wait())
        took = False
        try:
            log_after = SLOT_WAIT_LOG_S
            while True:
                left = max(started + log_after - time.monotonic(), 0.0)
                done, _ = await asyncio.wait((waiting, stop), timeout=left, return_when=asyncio.FIRST_COMPLETED)
                if waiting in done:
                    took = True
                    self.holders[wire] = time.monotonic()
                    return True
                if stop in done:
                    return False
                now = time.monotonic()
                wire.log.warning(
                    "slots_held",
                    waited_s=round(now - started, 1),
                    slots=self.total,
                    holders=[h.describe(now, since) for h, since in sorted(self.holders.items(), key=lambda i: i[1])],
                    what_to_do="every in-flight slot (max_batches_in_flight) is held: slow handler calls or "
                    "stalled peers, named here, hold the other shards up",
                )
                log_after *= 4
        finally:
            stop.cancel()
            if not waiting.done():
                waiting.cancel()
            elif not took and not waiting.cancelled():
                self._sem.release()

    def release(self, wire: Wire) -> None:
        if self.holders.pop(wire, None) is not None:
            self._sem.release()


class Wire:
    def __init__(
        self,
        reader: LineReader,  # the server's connections (pieces.serve_tcp, serve_unix): conn's lines are its
        writer: asyncio.StreamWriter,
        conn: Connection,
        slots: Slots | None,
        log: EventLogger,
        *,
        running: Callable[[], str | None],  # the callback under way, for slots_held
        on_bad_line: Callable[[RemoteProtocolError], Awaitable[None]],
        ready: Callable[[], Awaitable[None]] | None = None,  # awaited before a batch takes a slot
    ) -> None:
        self.reader = reader
        self.writer = writer
        self.conn = conn
        self.slots = slots
        self.log = log
        self._running = running
        self._on_bad_line = on_bad_line
        self._ready = ready
        self.stopping = False
        self.aborted = asyncio.Event()  # past shutdown_timeout: no slot waited for, no action read further
        self.lost: BaseException | None = None  # the peer went away (a reset, a broken pipe)
        self._task: asyncio.Task[Any] | None = None  # the driver's, which stop() and abort() cancel
        self._holding = False
        self._idle = False  # reading, with nothing of the next action received
        self._reading: asyncio.Task[Any] | None = None  # the task in read, if any
        self._grew = time.monotonic()  # when the line being read last grew

    def started(self) -> None:
        """The current task is the driver's: the one ``stop()`` and ``abort()`` end."""
        self._task = asyncio.current_task()

    def describe(self, now: float, since: float) -> dict[str, Any]:
        """For ``slots_held``: who this is and what it does with its slot."""
        return {
            "shard_id": self.conn.shard_id,
            "held_s": round(now - since, 1),
            "state": self.conn.state.name,
            "callback": self._running(),
            "line_bytes": self.conn.buffered,
            "idle_s": round(now - self._grew, 1),
        }

    def drained(self) -> bool:
        """Stopping, with nothing of a next action received."""
        return self.stopping and not self.conn.buffered and not self.reader.unread

    # -- stopping ------------------------------------------------------------------

    def stop(self) -> None:
        """The server stops: an action that has arrived (even partly) is read to its
        end; an idle wire stops at once."""
        self.stopping = True
        if self._idle and self._task is not None:
            self._task.cancel()

    def abort(self) -> None:
        """The server will not wait longer: stop waiting for a slot, and stop reading
        an action that has not arrived whole."""
        self.stop()
        self.aborted.set()
        if self._reading is not None and self._reading is self._task and not self._idle:
            self._task.cancel()

    def close(self) -> None:
        self.writer.close()

    # -- reading -------------------------------------------------------------------

    async def next_event(self) -> Event:
        """The daemon's next event; a line the protocol refuses goes to ``on_bad_line``
        and the next is read."""
        conn = self.conn
        while True:
            try:
                event = conn.next_event()
            except RemoteProtocolError as exc:
                await self._on_bad_line(exc)
                continue
            if event is NEED_DATA:
                if not await self.read():
                    conn.receive_data(b"")  # the end of input
                elif self.slots is not None and not self._holding and conn.state in BETWEEN_ACTIONS:
                    await self._maybe_take_slot()
                continue
            if isinstance(event, ProcessRecords) and self.slots is not None and not self._holding:
                await self._take_slot()  # a batch small enough to arrive in one read
            return event  # type: ignore[return-value]

    async def overflow(self) -> AsyncIterator[tuple[bytes, bool]]:
        """A line over ``max_line_size``, piece by piece as it arrives (never whole in
        memory): (bytes, whether they end the line); it stops early at the end of input."""
        while True:
            chunk, done = self.conn.overflow()
            yield chunk, done
            if done:
                return
            if not await self.read():
                self.conn.receive_data(b"")
                return  # the end of input inside the line

    async def _maybe_take_slot(self) -> None:
        """The first bytes of the next action: a batch waits for a slot before more of
        it is taken into memory (the daemon sends one action at a time); a small
        action never does."""
        if self.conn.buffered == 0:
            return
        name = action_in(self.conn.peek(PEEK))
        if name is None and self.conn.buffered < PEEK:
            return  # its name is still to come: a read more (one piece: the reader holds)
        if name in SMALL_ACTIONS:
            self.reader.hold(False)
            return
        await self._take_slot()

    async def _take_slot(self) -> None:
        assert self.slots is not None
        try:
            self.reader.hold(True)  # while it waits, the rest of the batch stays in the kernel
            if self._ready is not None and not self.aborted.is_set():
                await self._until_aborted(self._ready())  # back-pressure
            if await self.slots.acquire(self, self.aborted):
                self._holding = True
                self._grew = time.monotonic()
        finally:
            self.reader.hold(False)

    async def _until_aborted(self, wait: Awaitable[None]) -> None:
        """``wait``, unless ``abort()`` comes first."""
        waiting = asyncio.ensure_future(wait)
        aborted = asyncio.ensure_future(self.aborted.wait())
        try:
            await asyncio.wait((waiting, aborted), return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (waiting, aborted):
                task.cancel()
            await asyncio.gather(waiting, aborted, return_exceptions=True)
        if not waiting.cancelled():
            waiting.result()  # what it raised, if it raised

    def release(self) -> None:
        """The slot goes back, if this wire holds one."""
        if self._holding:
            self._holding = False
            self.slots.release(self)  # type: ignore[union-attr]

    async def read(self) -> int:
        """The next bytes from the daemon, written in place into ``conn``'s lines: how
        many (0 at the end). A slot holder whose line stops growing gives the slot
        back; an idle wire can be stopped here."""
        idle = self.conn.state in BETWEEN_ACTIONS and self.conn.buffered == 0 and not self.conn.overflowing
        if idle and self.stopping and not self.reader.unread:
            raise Stopped
        if idle and self.slots is not None:
            # The next action's first bytes come alone (one read): if they name a batch,
            # it waits for a slot before more of it is read (``_maybe_take_slot``).
            self.reader.hold(True)
        self._idle = idle
        self._reading = asyncio.current_task()
        try:
            if self._holding and not idle:
                try:
                    async with asyncio.timeout(STALL_S):
                        return await self._received(self.reader.receive())
                except TimeoutError:
                    self.log.warning(
                        "peer_stalled",
                        line_bytes=self.conn.buffered,
                        idle_s=STALL_S,
                        what_to_do="the daemon's side stopped sending in the middle of an action; "
                        "its in-flight slot is given back until it sends again",
                    )
                    self.release()
            return await self._received(self.reader.receive())
        except asyncio.CancelledError:
            task = self._task
            if task is None or asyncio.current_task() is not task or not self.stopping:
                raise
            if self.aborted.is_set() and not self._idle:  # past shutdown_timeout, the action still arriving
                task.uncancel()
                self.log.warning("unanswered_at_shutdown", line_bytes=self.conn.buffered,
                                 what_to_do="the daemon's side had not sent the whole action by shutdown_timeout")
                raise Stopped from None
            if not self._idle:
                raise
            task.uncancel()
            if not self.reader.unread:
                raise Stopped from None
            self._idle = False
            return await self._received(self.reader.receive())
        finally:
            self._idle = False
            self._reading = None

    async def _received(self, read: Any) -> int:
        try:
            n = await read
        except ConnectionError as exc:  # a reset peer: the end of input, not a crash
            self.lost = exc
            return 0
        self._grew = time.monotonic()
        return n

    # -- writing -------------------------------------------------------------------

    async def write(self, data: bytes) -> None:
        try:
            self.writer.write(data)
            await self.writer.drain()
        except ConnectionError as exc:
            self.lost = exc
            raise Lost(f"{type(exc).__name__}: {exc}") from None
