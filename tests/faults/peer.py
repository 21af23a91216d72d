"""A strict daemon side over a raw socket, for the fault tests (issue 10).

``Peer`` plays one shard's daemon without a relay process: it writes one action,
then reads the server's lines until a status arrives, answering each checkpoint
request with whatever ``reply`` returns (a reply dict, raw bytes, or an awaitable of
either: a slow or malformed daemon). It is strict the way the Java daemon is
(:func:`mldserver.api.testing.parse_child_line` judges each line), and it raises, with a
message naming the action, where the real daemon would exit or hang::

    peer = await Peer.open(server.port)
    await peer.action(initialize("shardId-000000000001"))
    requests = await peer.action(process_records(make_records(1, 3)))
    await peer.finish()          # half-close; anything written after is unowed
"""

from __future__ import annotations

import asyncio
import inspect
import json
import time
from typing import Any, Callable

from mldserver.api.testing import parse_child_line

from ..harness import eventually

Reply = Callable[[dict[str, Any]], Any]


class NoStatus(AssertionError):
    """The action was never answered: the daemon exits (EOF) or hangs (silence)."""


class Violation(AssertionError):
    """The server wrote something the daemon would exit on or mistake."""


def initialize(shard_id: str, sequence_number: str | None = "TRIM_HORIZON", sub: int | None = 0) -> dict:
    return {"action": "initialize", "shardId": shard_id, "sequenceNumber": sequence_number,
            "subSequenceNumber": sub}


def process_records(records: list[dict], millis_behind_latest: int | None = 0) -> dict:
    return {"action": "processRecords", "records": records, "millisBehindLatest": millis_behind_latest}


def ok_reply(request: dict[str, Any]) -> dict[str, Any]:
    """The daemon storing a checkpoint: its reply echoes the request, no error."""
    return {"action": "checkpoint", "sequenceNumber": request.get("sequenceNumber"),
            "subSequenceNumber": request.get("subSequenceNumber"), "error": None}


def error_reply(error: str | None) -> Reply:
    return lambda request: {**ok_reply(request), "error": error}


def encode(message: dict[str, Any] | bytes) -> bytes:
    if isinstance(message, bytes):
        return message if message.endswith(b"\n") else message + b"\n"
    return json.dumps(message, separators=(",", ":")).encode() + b"\n"


class Peer:
    opened: list["Peer"] = []  # closed after each test by the fixture in conftest.py

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        Peer.opened.append(self)
        self.checkpoint_requests: list[dict[str, Any]] = []

    @classmethod
    async def open(cls, port: int, host: str = "127.0.0.1") -> "Peer":
        reader, writer = await asyncio.open_connection(host, port, limit=1 << 24)
        return cls(reader, writer)

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def _line(self, name: str, deadline: float) -> dict[str, Any]:
        while True:
            left = deadline - time.monotonic()
            try:
                line = await asyncio.wait_for(self.reader.readline(), max(left, 0.001))
            except (asyncio.TimeoutError, TimeoutError):
                raise NoStatus(f"no status for {name!r}: nothing arrived for the whole bound (the daemon hangs)") from None
            except ConnectionResetError:
                line = b""
            if not line:
                raise NoStatus(f"the server closed the connection before the status for {name!r} "
                               "(the real daemon calls System.exit(1))")
            line = line.rstrip(b"\n").rstrip(b"\r")
            if not line.strip():
                continue
            try:
                message = parse_child_line(line)
            except Exception as exc:  # DaemonExit: a bare null line
                raise Violation(f"while answering {name!r}: {exc}") from None
            if message is None:
                raise Violation(f"while answering {name!r} the server wrote a line the daemon skips: {line[:300]!r}")
            return message

    async def action(self, message: dict[str, Any] | bytes, reply: Reply = ok_reply, timeout: float = 20.0,
                     name: str | None = None) -> list[dict[str, Any]]:
        """Send one action and read up to its status; the checkpoint requests it made."""
        if name is None:
            name = message["action"] if isinstance(message, dict) else json.loads(message)["action"]
        await self.send(encode(message))
        return await self.answer(name, reply, timeout)

    async def answer(self, name: str, reply: Reply = ok_reply, timeout: float = 20.0) -> list[dict[str, Any]]:
        """Read up to the status for ``name`` (its action already sent)."""
        requests: list[dict[str, Any]] = []
        deadline = time.monotonic() + timeout
        while True:
            message = await self._line(name, deadline)
            if message["action"] == "status":
                if message["responseFor"] != name:
                    raise Violation(f"status for {message['responseFor']!r} while waiting for {name!r} "
                                    "(the real daemon calls System.exit(1))")
                return requests
            requests.append(message)
            self.checkpoint_requests.append(message)
            answer = reply(message)
            if inspect.isawaitable(answer):
                answer = await answer
            if answer is not None:
                await self.send(encode(answer))

    async def finish(self, timeout: float = 20.0) -> bytes:
        """Close our side (the daemon closing the child's stdin) and return whatever
        the server still writes before it closes: nothing is owed, so it must be b""."""
        if self.writer.can_write_eof():
            self.writer.write_eof()
        try:
            rest = await asyncio.wait_for(self.reader.read(), timeout)
        except ConnectionResetError:
            rest = b""
        self.writer.close()
        return rest

    def close(self) -> None:
        self.writer.close()


async def wait_event(server: Any, event: str, timeout: float = 30.0, **fields: Any) -> dict[str, Any]:
    def find():
        for e in server.events():
            if e.get("event") == event and all(e.get(k) == v for k, v in fields.items()):
                return e
        return None

    return await eventually(find, timeout, what=f"log event {event!r} {fields or ''}", interval=0.02)


async def wait_exit(proc: Any, timeout: float) -> int | None:
    """The process's exit code, or None if it is still running after ``timeout``."""
    deadline = time.monotonic() + timeout
    while proc.poll() is None:
        if time.monotonic() > deadline:
            return None
        await asyncio.sleep(0.05)
    return proc.returncode
