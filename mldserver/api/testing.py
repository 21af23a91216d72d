"""A fake MultiLangDaemon: the daemon's side of the protocol, strict the way the Java
one is, for testing handlers (yours and ours) without Java, Kinesis or DynamoDB.

It launches the child exactly as the daemon does (``executableName`` split on spaces,
no shell, pipes), writes one action at a time and reads child lines until a status
arrives, answering each checkpoint request in between. Like the Java daemon:

- a child line that is not JSON, or a message with a key the daemon does not accept,
  is skipped (recorded in ``child.skipped``; the real daemon logs it and may hang);
- a status whose ``responseFor`` is not the action, a bare ``null`` line, or the
  child's end of output before a status is fatal: ``DaemonExit`` (the real daemon
  calls System.exit(1), killing every shard of the worker);
- checkpoints are checked as the KCL checks them and stored in ``daemon.checkpoints``
  (shard id -> (sequence number, sub-sequence) or ``SHARD_END``), which a later
  ``daemon.shard(...)`` resumes from, as a restarted daemon does.

Example, testing a handler through a running server::

    daemon = FakeDaemon("mldserver connect 127.0.0.1:7070")
    shard = await daemon.shard("shardId-000000000000")       # spawn + initialize
    await shard.process_records(make_records(1, count=3))
    await shard.shard_ended()                                 # checkpoints SHARD_END
    assert daemon.checkpoints["shardId-000000000000"] == SHARD_END
    await shard.close()                                       # close stdin, child exits
    await daemon.close()                                      # every child it spawned: ended
    kill_children()            # after a test that failed midway: SIGKILL what is left (tests/conftest.py)

DynamoDB stream records as the KCL's DynamoDB Streams adapter delivers them, from the
Streams API's own (boto3's ``get_records``; DynamoDB Local's stream too)::

    records = [dynamodb_record(adapter_change(r)) for r in streams.get_records(...)["Records"]]
    await shard.process_records(records)
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import signal
import sys
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

from ..protocol.dynamodb_records import adapter_change, dynamodb_record  # noqa: F401  (re-exported: tests build records so)

# What ``mldserver.api.testing`` offers (the documentation's Python API page lists these).
__all__ = ["FakeDaemon", "Shard", "Child", "SocketChild", "DaemonExit", "make_records", "errors_in_order",
           "kill_children", "relay_command", "parse_child_line", "adapter_change", "dynamodb_record", "SHARD_END"]

SHARD_END = "SHARD_END"
"""What ``daemon.checkpoints[shard_id]`` holds once a shard's end was checkpointed::

    await shard.shard_ended()
    assert daemon.checkpoints["shardId-000000000000"] == SHARD_END
"""
STATUS_KEYS = frozenset({"action", "responseFor"})
CHECKPOINT_KEYS = frozenset({"action", "sequenceNumber", "subSequenceNumber"})
V1_CHECKPOINT_KEYS = frozenset({"action", "checkpoint"})


class DaemonExit(Exception):
    """The Java daemon would call System.exit(1) here."""


def relay_command(host: str, port: int) -> str:
    """``executableName`` as a user writes it: the ``mldserver`` script beside this
    interpreter (``python -m mldserver`` where there is none)."""
    script = Path(sys.executable).parent / "mldserver"
    prefix = str(script) if script.exists() else f"{sys.executable} -m mldserver"
    return f"{prefix} connect {host}:{port}"


def make_records(
    first_sequence_number: int,
    count: int,
    data_bytes: int = 8,
    *,
    partition_key: str = "pk{i}",
    approximate_arrival_timestamp: int | None = 1476889707000,
    data: Callable[[int], bytes] | None = None,
) -> list[dict[str, Any]]:
    """``count`` records as the daemon writes them in a ``processRecords`` line, with
    consecutive sequence numbers from ``first_sequence_number``::

        make_records(100, count=2)
        # [{"action": "record", "data": "MTAwMTAwMTA=", "partitionKey": "pk0", "sequenceNumber": "100",
        #   "subSequenceNumber": 0, "approximateArrivalTimestamp": 1476889707000},
        #  {... "partitionKey": "pk1", "sequenceNumber": "101" ...}]

    ``data`` is called with each record's sequence number and returns its payload (the
    default: the number's digits repeated to ``data_bytes``); ``partition_key`` is a
    format string of ``i`` (the record's index) and ``seq``::

        make_records(7, count=3, partition_key="customer-{seq}",
                     data=lambda seq: json.dumps({"order": seq}).encode())
        # sequence numbers "7", "8", "9"; record.data == b'{"order": 7}' in the handler

    ``approximate_arrival_timestamp`` (epoch ms, or None) is every record's: a row
    emitted without ``event_time_ms`` takes it as its event time."""
    out = []
    for i in range(count):
        seq = first_sequence_number + i
        payload = data(seq) if data else (str(seq).encode() * (data_bytes // max(1, len(str(seq))) + 1))[:data_bytes]
        out.append(
            {
                "action": "record",
                "data": base64.b64encode(payload).decode("ascii"),
                "partitionKey": partition_key.format(i=i, seq=seq),
                "sequenceNumber": str(seq),
                "subSequenceNumber": 0,
                "approximateArrivalTimestamp": approximate_arrival_timestamp,
            }
        )
    return out


_children: "weakref.WeakSet[Child]" = weakref.WeakSet()  # spawned, for kill_children


def kill_children() -> int:
    """SIGKILL every child a ``FakeDaemon`` spawned that still runs (a test that failed
    before closing its shards); how many. Called before a test's fixtures are torn down:
    a live child keeps its event loop from closing, and waits on a server those fixtures
    stop only afterwards. Every child's pipes are closed too, killed or not: an open
    pipe also keeps the loop from closing."""
    killed = 0
    for child in list(_children):
        if child.proc.returncode is None:
            try:
                os.kill(child.proc.pid, signal.SIGKILL)
                killed += 1
            except ProcessLookupError:
                pass
        try:
            child.close_pipes_now()
        except RuntimeError:  # its loop has closed, and with it every pipe
            pass
    return killed


class Child:
    """One child process as the daemon sees it: lines in, lines out."""

    def __init__(self, proc: asyncio.subprocess.Process, stdin: asyncio.StreamWriter,
                 stdout: "_Output", stderr: "_Output") -> None:
        _children.add(self)
        self.proc = proc
        self.stdin = stdin
        self._outputs = (stdout, stderr)
        self.stdout: asyncio.StreamReader = stdout.reader
        self.skipped: list[bytes] = []
        self.stderr = bytearray()
        self._stderr_task = asyncio.ensure_future(self._drain_stderr())

    @classmethod
    async def spawn(cls, command: str, env: dict[str, str] | None = None, cwd: str | None = None) -> "Child":
        """Start ``command`` as the daemon starts ``executableName``: split on spaces, no
        shell, pipes for stdin, stdout and stderr; ``env`` is added to this process's.

        They are OS pipes, as Java's ProcessBuilder makes them (asyncio's own stdin is a
        socket pair, where the relay's zero-copy ``splice`` from its stdin fails)."""
        argv = [part for part in command.split(" ") if part]
        loop = asyncio.get_running_loop()
        (stdin_r, stdin_w), (stdout_r, stdout_w), (stderr_r, stderr_w) = os.pipe(), os.pipe(), os.pipe()
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv, stdin=stdin_r, stdout=stdout_w, stderr=stderr_w, env={**os.environ, **(env or {})}, cwd=cwd)
        except BaseException:
            for fd in (stdin_w, stdout_r, stderr_r):
                os.close(fd)
            raise
        finally:
            for fd in (stdin_r, stdout_w, stderr_w):
                os.close(fd)
        stdout, stderr = (_Output(asyncio.StreamReader(limit=1 << 24), loop) for _ in range(2))
        await loop.connect_read_pipe(lambda: stdout, open(stdout_r, "rb", 0))
        await loop.connect_read_pipe(lambda: stderr, open(stderr_r, "rb", 0))
        protocol = asyncio.StreamReaderProtocol(asyncio.StreamReader())
        transport, _ = await loop.connect_write_pipe(lambda: protocol, open(stdin_w, "wb", 0))
        return cls(proc, asyncio.StreamWriter(transport, protocol, None, loop), stdout, stderr)

    async def _drain_stderr(self) -> None:
        while chunk := await self._outputs[1].reader.read(65536):
            self.stderr += chunk

    async def write(self, data: bytes) -> None:
        """Write raw bytes to the child's stdin (a line must end with ``\\n``). A child
        that has gone takes nothing (a broken pipe): the end of its output tells, as the
        daemon learns it (``read_message`` raises ``DaemonExit``)."""
        try:
            self.stdin.write(data)
            await self.stdin.drain()
        except (BrokenPipeError, ConnectionResetError):
            pass

    async def send(self, message: dict[str, Any]) -> None:
        """Write one message as a JSON line: ``await child.send({"action": "leaseLost"})``."""
        await self.write(json.dumps(message, separators=(",", ":")).encode() + b"\n")

    async def read_line(self, timeout: float = 10.0) -> bytes | None:
        """The next non-blank line (line end stripped), or None at end of output."""
        while True:
            line = await asyncio.wait_for(self.stdout.readline(), timeout)
            if not line:
                return None
            line = line.rstrip(b"\n").rstrip(b"\r")
            if line.strip():
                return line

    async def ended(self, wait: float = 2.0) -> str:
        """How the child ended, for an error: its exit status (waited ``wait`` seconds)
        and the end of what it wrote to stderr."""
        try:
            code: int | str = await asyncio.wait_for(self.proc.wait(), wait)
        except TimeoutError:
            code = "still running"
        try:
            await asyncio.wait_for(asyncio.shield(self._stderr_task), 0.5)
        except Exception:  # a time-out: what it wrote so far
            pass
        said = bytes(self.stderr[-600:]).decode("utf-8", "replace").strip()
        return f"exit status {code}; its stderr: {said or 'empty'}"

    async def read_message(self, timeout: float = 10.0) -> dict[str, Any]:
        """The next message the daemon would accept, skipping (and recording) junk."""
        while True:
            line = await self.read_line(timeout)
            if line is None:
                raise DaemonExit(f"the child's output ended before a status ({await self.ended()})")
            message = parse_child_line(line)
            if message is None:
                self.skipped.append(line)
                continue
            return message

    async def close_stdin(self) -> None:
        """Close the child's stdin, as the daemon does when it ends the shard's processor:
        a relay then ends its connection and exits."""
        if not self.stdin.is_closing():
            self.stdin.close()
            try:
                await self.stdin.wait_closed()
            except (BrokenPipeError, ConnectionResetError):
                pass

    async def wait_exit(self, timeout: float = 5.0) -> int:
        """The child's exit code, waited for at most ``timeout`` seconds
        (``asyncio.TimeoutError`` past it)."""
        code = await asyncio.wait_for(self.proc.wait(), timeout)
        await self._close_pipes()
        return code

    async def kill(self) -> None:
        """SIGKILL the child (as a crashed daemon host would leave it) and wait for it."""
        if self.proc.returncode is None:
            self.proc.kill()
            await self.proc.wait()
        await self._close_pipes()

    def close_pipes_now(self) -> None:
        """Its three pipes closed at once, unread output dropped (``kill_children``)."""
        self.stdin.close()
        for output in self._outputs:
            output.transport.close()

    async def _close_pipes(self) -> None:
        """After its exit: its stdin closed, its stdout and stderr read to their end (what
        it wrote stays readable), so no pipe outlives the loop."""
        self.stdin.close()
        try:
            await asyncio.wait_for(asyncio.gather(*(asyncio.shield(o.closed) for o in self._outputs)), 5)
        except TimeoutError:  # a grandchild still holds a pipe
            self.close_pipes_now()
        await self._stderr_task
        _children.discard(self)  # nothing of it is left for kill_children

    async def end(self, timeout: float = 5.0) -> None:
        """Its stdin closed and its exit waited for, killed past ``timeout``: nothing of
        it (its process, its pipes) outlives the loop that started it."""
        if self.proc.returncode is None:
            try:
                await asyncio.wait_for(self.close_stdin(), timeout)  # a child not reading keeps it from flushing
                await self.wait_exit(timeout)
                return
            except (asyncio.TimeoutError, OSError):
                pass
        await self.kill()


class _Output(asyncio.StreamReaderProtocol):
    """A child's stdout or stderr pipe into ``reader``; ``closed`` is done once it has ended."""

    def __init__(self, reader: asyncio.StreamReader, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(reader)
        self.reader = reader
        self.closed: asyncio.Future[None] = loop.create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self.transport = transport

    def eof_received(self) -> bool:
        super().eof_received()
        return False  # a pipe has no half-close: end it here (uvloop keeps it open on True)

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        if not self.closed.done():
            self.closed.set_result(None)


class SocketChild(Child):
    """A direct TCP connection to the server in place of a relay (benchmarks)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.stdout, self.writer = reader, writer
        self.skipped = []
        self.stderr = bytearray()

    @classmethod
    async def open(cls, host: str, port: int) -> "SocketChild":  # type: ignore[override]
        """Connect to a server's shard port: ``await SocketChild.open("127.0.0.1", 7070)``."""
        reader, writer = await asyncio.open_connection(host, port, limit=1 << 24)
        return cls(reader, writer)

    async def write(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def close_stdin(self) -> None:
        if self.writer.can_write_eof():
            self.writer.write_eof()

    async def wait_exit(self, timeout: float = 5.0) -> int:
        await asyncio.wait_for(self.stdout.read(), timeout)
        self.writer.close()
        return 0

    async def kill(self) -> None:
        self.writer.close()

    async def end(self, timeout: float = 5.0) -> None:
        self.writer.close()
        try:
            await asyncio.wait_for(self.writer.wait_closed(), timeout)
        except (asyncio.TimeoutError, OSError):
            pass


def parse_child_line(line: bytes) -> dict[str, Any] | None:
    """What the Java daemon makes of a child line: a message, None (skipped), or fatal."""
    try:
        obj = json.loads(line)
    except ValueError:
        return None
    if obj is None:
        raise DaemonExit("the child wrote a bare null line")
    if not isinstance(obj, dict):
        return None
    keys = frozenset(obj)
    action = obj.get("action")
    if action == "status" and keys == STATUS_KEYS:
        return obj
    if action == "checkpoint" and ({"action"} <= keys <= CHECKPOINT_KEYS or keys == V1_CHECKPOINT_KEYS):
        return obj
    return None


def _position(seq: str | None, sub: int | None) -> tuple[int, int]:
    return int(seq or 0), sub or 0


@dataclass
class Shard:
    """One shard's conversation: a child and what the daemon knows of it."""

    daemon: "FakeDaemon"
    shard_id: str
    child: Child
    delivered: tuple[str, int] | None = None  # highest (sequence, sub) delivered
    phase: str = "new"
    checkpoint_requests: list[tuple[str | None, int | None]] = field(default_factory=list)
    actions: list[str] = field(default_factory=list)

    async def initialize(self, sequence_number: str | None = "TRIM_HORIZON", sub_sequence_number: int | None = 0):
        """Send ``initialize`` and wait for its status. A checkpoint the daemon stored for
        this shard wins over ``sequence_number``, as after a restart; with ``v1`` the
        message has KCL 1.x's ``checkpoint`` key instead."""
        stored = self.daemon.checkpoints.get(self.shard_id)
        if stored is not None and stored != SHARD_END:
            sequence_number, sub_sequence_number = stored
        message = {"action": "initialize", "shardId": self.shard_id}
        if self.daemon.v1:
            message["checkpoint"] = sequence_number
        else:
            message.update(sequenceNumber=sequence_number, subSequenceNumber=sub_sequence_number)
        await self._action(message, "initialize")

    async def process_records(self, records: list[dict[str, Any]], millis_behind_latest: int | None = 0) -> None:
        """Send one ``processRecords`` action and wait for its status, answering the
        checkpoints the child asks for meanwhile (stored in ``daemon.checkpoints``)::

            await shard.process_records(make_records(1, count=3))
            assert shard.checkpoint_requests[-1] == ("3", 0)   # if the handler checkpointed
        """
        await self.process_line(
            json.dumps(
                {"action": "processRecords", "records": records, "millisBehindLatest": millis_behind_latest},
                separators=(",", ":"),
            ).encode()
            + b"\n",
            records[-1] if records else None,
        )

    async def process_line(self, line: bytes, last: dict[str, Any] | None) -> None:
        """A pre-encoded processRecords line (benchmarks); ``last`` is its last record."""
        if last is not None:
            self.delivered = (last["sequenceNumber"], last.get("subSequenceNumber") or 0)
        await self._action(line, "processRecords")

    async def shutdown_requested(self) -> None:
        """Send ``shutdownRequested`` (the daemon is stopping) and wait for its status."""
        await self._action({"action": "shutdownRequested"}, "shutdownRequested")

    async def lease_lost(self) -> None:
        """Send ``leaseLost`` (another worker took the shard) and wait for its status."""
        await self._action({"action": "leaseLost"}, "leaseLost")

    async def shard_ended(self) -> None:
        """Send ``shardEnded`` and wait for its status; as in the KCL, a shard whose child
        did not checkpoint ``SHARD_END`` meanwhile is stuck (``daemon.stuck``)."""
        await self._action({"action": "shardEnded"}, "shardEnded")
        if self.daemon.checkpoints.get(self.shard_id) != SHARD_END:
            # The real daemon checks this after the status: the shard is stuck for good.
            self.daemon.stuck.add(self.shard_id)

    async def shutdown(self, reason: str) -> None:
        """Send KCL 1.x's ``shutdown`` with ``reason`` (``TERMINATE`` or ``ZOMBIE``)."""
        await self._action({"action": "shutdown", "reason": reason}, "shutdown:" + reason)

    async def close(self, timeout: float = 5.0) -> int:
        """Close the child's stdin and wait for it to exit (the daemon waits forever)."""
        await self.child.close_stdin()
        return await self.child.wait_exit(timeout)

    async def _action(self, message: dict[str, Any] | bytes, phase: str) -> None:
        self.phase = phase
        name = phase.split(":")[0]
        self.actions.append(name)
        if isinstance(message, bytes):
            await self.child.write(message)
        else:
            await self.child.send(message)
        while True:
            reply = await self.child.read_message(self.daemon.timeout)
            if reply["action"] == "status":
                if reply["responseFor"] != name:
                    raise DaemonExit(f"status for {reply['responseFor']!r} while waiting for {name!r}")
                self.phase = "idle"
                return
            await self.child.send(self._checkpoint(reply))

    def _checkpoint(self, request: dict[str, Any]) -> dict[str, Any]:
        """Apply a checkpoint request as the KCL would and build the reply."""
        if "checkpoint" in request and "sequenceNumber" not in request:
            seq, sub = request.get("checkpoint"), None
        else:
            seq, sub = request.get("sequenceNumber"), request.get("subSequenceNumber")
        self.checkpoint_requests.append((seq, sub))
        error = self.daemon.inject_error(self, seq, sub)
        if error is None:
            error = self._store(seq, sub)
        reply: dict[str, Any] = {"action": "checkpoint", "sequenceNumber": seq, "subSequenceNumber": sub, "error": error}
        return reply

    def _store(self, seq: str | None, sub: int | None) -> str | None:
        phase = self.phase
        if phase == "initialize":
            return "InvalidStateException"
        if phase in ("leaseLost", "shutdown:ZOMBIE"):
            return "ShutdownException"
        stored = self.daemon.checkpoints.get(self.shard_id)
        if phase in ("shardEnded", "shutdown:TERMINATE") and seq is None:
            self.daemon.checkpoints[self.shard_id] = SHARD_END
            return None
        if seq is None:
            if self.delivered is None:
                return None
            seq, sub = self.delivered
        elif not seq.isdigit():
            return "IllegalArgumentException"
        position = _position(seq, sub)
        if self.delivered is None or position > _position(*self.delivered):
            return "IllegalArgumentException"
        if stored not in (None, SHARD_END) and position < _position(*stored):
            return "IllegalArgumentException"
        self.daemon.checkpoints[self.shard_id] = (seq, sub or 0)
        return None


class FakeDaemon:
    """The daemon: spawns a child per shard with ``command`` and keeps the lease table's
    checkpoints (``checkpoints``: shard id -> (sequence number, sub-sequence) or
    ``SHARD_END``), which a later ``shard(...)`` resumes from::

        daemon = FakeDaemon(relay_command("127.0.0.1", 7070),
                            errors=errors_in_order(["ThrottlingException"]))  # the first checkpoint refused
        shard = await daemon.shard("shardId-000000000000")
        await shard.process_records(make_records(1, count=3))

    ``v1``: speak KCL 1.x (``checkpoint`` in ``initialize``); ``timeout``: how long an
    action may wait for its status before the test fails."""

    def __init__(
        self,
        command: str,
        *,
        env: dict[str, str] | None = None,
        v1: bool = False,
        timeout: float = 30.0,
        errors: Callable[[Shard, str | None, int | None], str | None] | None = None,
    ) -> None:
        self.command = command
        self.env = env
        self.v1 = v1  # KCL up to 1.7.1: no sequenceNumber key in initialize
        self.timeout = timeout
        self.checkpoints: dict[str, Any] = {}
        self.stuck: set[str] = set()
        self.shards: list[Shard] = []  # every shard it spawned a child for, in order
        self._errors = errors

    def inject_error(self, shard: Shard, seq: str | None, sub: int | None) -> str | None:
        """The error the daemon answers this checkpoint with (the ``errors`` hook's, e.g.
        ``errors_in_order(["ThrottlingException"])``), or None: stored."""
        return self._errors(shard, seq, sub) if self._errors else None

    async def spawn(self, shard_id: str) -> Shard:
        """Start a child for ``shard_id`` without initializing it (``shard.initialize``)."""
        shard = Shard(self, shard_id, await Child.spawn(self.command, self.env))
        self.shards.append(shard)
        return shard

    async def shard(self, shard_id: str, sequence_number: str | None = "TRIM_HORIZON") -> Shard:
        """Spawn a child and initialize it (from the stored checkpoint, if any)."""
        shard = await self.spawn(shard_id)
        await shard.initialize(sequence_number)
        return shard

    async def close(self, timeout: float = 5.0) -> None:
        """The daemon exits: every child it spawned has its stdin closed and is waited
        for, killed past ``timeout`` (a child still exiting when a test's loop closes
        leaves its process and pipes open under it)."""
        await asyncio.gather(*(shard.child.end(timeout) for shard in self.shards))


def errors_in_order(names: Iterable[str | None]) -> Callable[[Shard, str | None, int | None], str | None]:
    """An ``errors`` hook replying with these error names in turn, then success."""
    queue = list(names)
    return lambda shard, seq, sub: queue.pop(0) if queue else None
