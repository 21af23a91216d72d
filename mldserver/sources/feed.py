"""The daemon's side of one shard's conversation, for a source read by the server
itself: the source is an in-process MultiLangDaemon. A shard's feed holds one end of a
``socket.socketpair()``; the other end is served by the server exactly as a daemon's
connection (its ShardDriver, the handler processes, the coordinator and the sink do
not know the difference). The feed speaks the protocol as the Java daemon does
(docs/protocol.md): one action, then the server's lines until its status, each
checkpoint request answered on the way, checked as the KCL checks it, and stored
(``store``: the source's saved positions, on disk) before the reply goes back::

    feed = Feed(reader, writer, "shardId-00000001769731200000-6a3f0c2d", store=saved_positions_store)
    await feed.initialize("TRIM_HORIZON")                  # or the saved ("000...17", 0)
    D> {"action":"initialize","shardId":"shardId-...","sequenceNumber":"TRIM_HORIZON","subSequenceNumber":0}
    C< {"action":"status","responseFor":"initialize"}
    await feed.process_records(records, millis_behind_latest=0)
    D> {"action":"processRecords","records":[...],"millisBehindLatest":0}
    C< {"action":"checkpoint","sequenceNumber":"000...18","subSequenceNumber":0}
    D> {"action":"checkpoint","sequenceNumber":"000...18","subSequenceNumber":0,"error":null}   (after store)
    C< {"action":"status","responseFor":"processRecords"}
    await feed.shard_ended()        # True once SHARD_END is stored (checkpoint with sequenceNumber null)
    await feed.close()              # our end half-closed; the server closes its own

``check_checkpoint`` is the KCL's rule, pure (the fake daemon's, ``api.testing``):
nothing while answering ``initialize``; up to the highest record delivered while
answering ``processRecords`` or ``shutdownRequested``, never behind what is stored;
``sequenceNumber: null`` means everything delivered, or ``SHARD_END`` while answering
``shardEnded``. A refusal is the Java exception's name in ``error``.

A ``store`` that raises ``CheckpointRefused`` (the source's lease went to another
server) answers the request with its error (``ShutdownException``), nothing stored;
the reader then ends the shard with ``lease_lost()`` (``leaseLost``).

If the server closes the connection before a status (its shutdown, or a line it could
not take), the action raises ``FeedClosed``.
"""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable

import orjson

from ..base.positions import Position
from .positions import SHARD_END, Saved

LINE_LIMIT = 1 << 20  # the server's lines are short (statuses, checkpoints)


class FeedClosed(Exception):
    """The server closed the shard's connection before answering an action."""


class CheckpointRefused(Exception):
    """Raised by a feed's ``store``: the checkpoint is answered with ``error`` (the
    Java exception's name), nothing stored."""

    def __init__(self, error: str) -> None:
        super().__init__(error)
        self.error = error


def check_checkpoint(phase: str, sequence_number: Any, sub_sequence_number: Any, delivered: Position | None,
                     stored: Saved | None) -> tuple[str | None, Saved | None]:
    """(error, what to store) for a checkpoint request made while answering ``phase``;
    what to store is None when nothing is (an error, or nothing delivered yet)."""
    if phase == "initialize":
        return "InvalidStateException", None
    if phase not in ("processRecords", "shutdownRequested", "shardEnded"):
        return "ShutdownException", None
    if sequence_number is None:
        if phase == "shardEnded":
            return None, SHARD_END
        return None, delivered
    position = Position.parse(sequence_number, sub_sequence_number if sub_sequence_number is not None else 0)
    if position is None or delivered is None or position > delivered:
        return "IllegalArgumentException", None
    if isinstance(stored, Position) and position < stored:
        return "IllegalArgumentException", None
    return None, position


class Feed:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, shard_id: str, *,
                 store: Callable[[Saved], Awaitable[None]], stored: Saved | None = None) -> None:
        self.reader = reader
        self.writer = writer
        self.shard_id = shard_id
        self.store = store
        self.stored = stored  # the shard's position on disk
        self.delivered: Position | None = stored if isinstance(stored, Position) else None
        self.phase = "new"
        self.busy = False  # an action sent, its status not back yet

    async def initialize(self, sequence_number: str, sub_sequence_number: int = 0) -> None:
        await self._action({"action": "initialize", "shardId": self.shard_id, "sequenceNumber": sequence_number,
                            "subSequenceNumber": sub_sequence_number})

    async def process_records(self, records: list[dict[str, Any]], millis_behind_latest: int | None) -> None:
        """``records``: daemon-shaped records (``protocol.dynamodb_records.dynamodb_record``), in order."""
        line = orjson.dumps({"action": "processRecords", "records": records, "millisBehindLatest": millis_behind_latest})
        if records:
            last = records[-1]
            position = Position.parse(last["sequenceNumber"], last.get("subSequenceNumber") or 0)
            if position is not None:
                self.delivered = position
        await self._action(line, "processRecords")

    async def shutdown_requested(self) -> None:
        await self._action({"action": "shutdownRequested"})

    async def lease_lost(self) -> None:
        """The source's lease went to another server: the handler lets go of the shard."""
        await self._action({"action": "leaseLost"})

    async def shard_ended(self) -> bool:
        """Was SHARD_END stored (the one chance the daemon gives)?"""
        await self._action({"action": "shardEnded"})
        return self.stored == SHARD_END

    async def close(self, timeout: float = 10.0) -> None:
        """Half-close our end (the daemon closes the child's stdin) and wait for the
        server to close its end."""
        try:
            if not self.writer.is_closing():
                if self.writer.can_write_eof():
                    self.writer.write_eof()
                await asyncio.wait_for(self.reader.read(), timeout)
        except (OSError, RuntimeError, asyncio.TimeoutError, ValueError):  # (RuntimeError: uvloop, closed meanwhile)
            pass
        finally:
            self.writer.close()

    async def _action(self, message: dict[str, Any] | bytes, phase: str | None = None) -> None:
        name = phase or message["action"]  # type: ignore[index]
        line = message if isinstance(message, bytes) else orjson.dumps(message)
        self.phase, self.busy = name, True
        try:
            self.writer.write(line + b"\n")
            await self.writer.drain()
            while True:
                reply = await self._read()
                if reply.get("action") == "status":
                    if reply.get("responseFor") != name:
                        raise FeedClosed(f"status for {reply.get('responseFor')!r} while waiting for {name!r}")
                    return
                if reply.get("action") == "checkpoint":
                    await self._checkpoint(reply)
        except (ConnectionError, BrokenPipeError) as exc:
            raise FeedClosed(f"{type(exc).__name__}: {exc}") from None
        finally:
            self.phase, self.busy = "idle", False

    async def _read(self) -> dict[str, Any]:
        while True:
            try:
                line = await self.reader.readline()
            except (ValueError, asyncio.LimitOverrunError) as exc:
                raise FeedClosed(f"a line past {LINE_LIMIT} bytes from the server: {exc}") from None
            if not line:
                raise FeedClosed(f"the server closed the connection while answering {self.phase}")
            if line.strip():
                try:
                    message = orjson.loads(line)
                except ValueError:
                    continue  # as the daemon: skipped
                if isinstance(message, dict):
                    return message

    async def _checkpoint(self, request: dict[str, Any]) -> None:
        seq, sub = request.get("sequenceNumber"), request.get("subSequenceNumber")
        error, saved = check_checkpoint(self.phase, seq, sub, self.delivered, self.stored)
        if error is None and saved is not None and saved != self.stored:
            try:
                await self.store(saved)
                self.stored = saved
            except CheckpointRefused as exc:
                error = exc.error
        reply = {"action": "checkpoint", "sequenceNumber": seq, "subSequenceNumber": sub, "error": error}
        self.writer.write(orjson.dumps(reply) + b"\n")
        await self.writer.drain()
