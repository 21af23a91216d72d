"""The relay (``mldserver connect``) per docs/protocol.md, section 6, against plain sockets.

Every behaviour is checked on both builds of the relay: the one in C that
``mldserver connect`` runs (``relay.c``, built at install) and ``relay.py``
(``MLDSERVER_RELAY=python``, what runs where no compiler was)."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import struct
import time
from pathlib import Path

import pytest

from mldserver import native
from mldserver.ops import relay as relay_module
from mldserver.ops.relay import parse_target
from mldserver.api.testing import Child

from .harness import MLDSERVER

NATIVE = Path(relay_module.NATIVE)


@pytest.fixture(params=["native", "python"])
def connect(request):
    """``spawn("127.0.0.1:PORT ...")``: ``mldserver connect`` with that build of the relay
    (with ``MLDSERVER_NO_EXTENSIONS`` set, relay.py both times: ``build`` says which runs,
    and ``test_the_relay_runs_lean`` checks it is the one running)."""
    if request.param == "native" and native.native_allowed():
        assert os.access(NATIVE, os.X_OK), f"{NATIVE} was not built: run scripts/setup (it needs a C compiler)"
    env = {"MLDSERVER_RELAY": request.param}

    async def spawn(args: str) -> Child:
        return await Child.spawn(f"{MLDSERVER} connect {args}", env=env)

    spawn.build = request.param if native.native_allowed() else "python"
    return spawn


async def echo_server(close_after_eof: bool = True, unix: str | None = None):
    received = bytearray()

    async def handle(reader, writer):
        while data := await reader.read(1 << 16):
            received.extend(data)
            writer.write(data)
            await writer.drain()
        if close_after_eof:
            writer.close()

    if unix:
        server = await asyncio.start_unix_server(handle, path=unix)
        return server, unix, received
    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1], received


def close_with_reset(writer: asyncio.StreamWriter) -> None:
    """Make the connection's close send a reset (RST), not an end of file."""
    writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


async def read_exactly(child: Child, n: int) -> bytes:
    return await asyncio.wait_for(child.stdout.readexactly(n), 30)


async def test_bytes_pass_unchanged_both_ways_and_it_exits_after_stdin_eof(connect):
    server, port, received = await echo_server()
    payload = bytes(range(256)) * 4 + "\u2028\r\n\r".encode() + os.urandom(3 * 1024 * 1024) + b"\n"
    child = await connect(f"127.0.0.1:{port}")
    await child.write(payload)
    assert await read_exactly(child, len(payload)) == payload
    await child.close_stdin()
    assert await child.wait_exit(5) == 0
    assert bytes(received) == payload
    server.close()


async def test_a_small_line_is_relayed_at_once(connect):
    """Relayed as it is, without waiting for more bytes or for the end of input: it comes
    back while nothing follows it and the relay's stdin is still open."""
    server, port, _ = await echo_server()
    child = await connect(f"127.0.0.1:{port}")
    await read_until_ready(child)
    await child.write(b'{"action":"leaseLost"}\n')
    assert await child.read_line(30) == b'{"action":"leaseLost"}'
    await child.close_stdin()
    await child.wait_exit()
    server.close()


async def read_until_ready(child: Child) -> None:
    await child.write(b"warmup\n")
    assert await child.read_line(10) == b"warmup"


async def test_exits_when_the_server_closes_even_with_stdin_open(connect):
    async def handle(reader, writer):
        await reader.readline()
        writer.write(b"bye\n")
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    child = await connect(f"127.0.0.1:{port}")
    await child.write(b"hello\n")
    assert await child.read_line() == b"bye"
    assert await child.wait_exit(5) == 0
    server.close()


async def test_a_server_that_resets_the_connection_is_named_on_stderr(connect):
    """A copy that ends by an error, not an end of input, says so in one stderr line
    (the daemon logs its child's stderr): here the server, having answered, resets the
    connection (a reset before any answer is a refusal: the next tests)."""
    answered = asyncio.Event()

    async def handle(reader, writer):
        await reader.readline()
        writer.write(b"ok\n")
        await answered.wait()
        close_with_reset(writer)
        writer.transport.abort()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    child = await connect(f"127.0.0.1:{port}")
    await child.write(b"hello\n")
    assert await child.read_line() == b"ok"
    answered.set()
    assert await child.read_line() is None
    assert await child.wait_exit(5) == 0
    await asyncio.wait_for(child._stderr_task, 5)
    assert "mldserver connect: the server-to-daemon copy failed: Connection reset by peer" in child.stderr.decode()
    server.close()


@pytest.mark.parametrize("how", ["close", "reset"])
async def test_a_server_that_closes_before_answering_is_a_refusal_named_on_stderr_with_exit_2(connect, how):
    """Accepted, then closed with nothing sent while the daemon still talks: the server
    refused the shard (shutting down, out of file handles), and the daemon's log says so.
    A server that closes with the daemon's bytes unread sends a reset, not an end of file
    (a refusal when the daemon's initialize line got there first): the same one line and
    exit status 2, not a failed copy and exit 0."""
    async def handle(reader, writer):
        if how == "reset":
            await reader.readline()
            close_with_reset(writer)
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    child = await connect(f"127.0.0.1:{port}")
    await child.write(b'{"action":"initialize","shardId":"shardId-1"}\n')
    assert await child.read_line() is None
    assert await child.wait_exit(5) == 2
    await asyncio.wait_for(child._stderr_task, 5)
    assert child.stderr.decode() == (
        f"mldserver connect: the mldserver server at 127.0.0.1:{port} closed the connection before answering: it "
        f"refused this shard (shutting down: its log says shard_refused; or out of file handles: its "
        f"open_files_limit); the daemon starts the shard again\n")
    server.close()


async def test_a_server_closing_unanswered_after_stdin_eof_is_an_ordinary_end(connect):
    async def handle(reader, writer):
        await reader.read()  # the relay's half-close
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    child = await connect(f"127.0.0.1:{port}")
    await child.close_stdin()
    assert await child.wait_exit(5) == 0
    assert child.stderr == b""
    server.close()


def test_a_splice_that_fails_moves_nothing_and_the_rest_goes_by_plain_copies(monkeypatch):
    """relay.py's copy: splice refused mid-stream (ENOMEM, as under memory pressure)
    after a first chunk; every byte still arrives, in order."""
    import errno
    import socket
    import threading

    calls = []
    real = os.splice

    def splice(src, dst, count):
        calls.append(count)
        if len(calls) == 2:
            raise OSError(errno.ENOMEM, "Cannot allocate memory")
        return real(src, dst, min(count, 1000))

    data = os.urandom(300_000)
    got = bytearray()
    r, w = os.pipe()
    left, right = socket.socketpair()

    def write():
        os.write(w, data)
        os.close(w)

    def read():
        while chunk := right.recv(1 << 16):
            got.extend(chunk)

    threads = [threading.Thread(target=write), threading.Thread(target=read)]
    monkeypatch.setattr(os, "splice", splice)
    try:
        for thread in threads:
            thread.start()
        relay_module._pump(r, left.fileno(), splice=True)
        left.shutdown(socket.SHUT_WR)
        for thread in threads:
            thread.join(10)
    finally:
        os.close(r)
        left.close()
        right.close()
    assert len(calls) == 2 and bytes(got) == data


async def test_sigint_is_ignored(connect):
    server, port, _ = await echo_server()
    child = await connect(f"127.0.0.1:{port}")
    await read_until_ready(child)
    child.proc.send_signal(signal.SIGINT)  # delivered before it exits: its exit code tells
    await child.write(b"still here\n")
    assert await child.read_line() == b"still here"
    await child.close_stdin()
    assert await child.wait_exit() == 0
    server.close()


async def test_unreachable_server_gives_one_clear_stderr_line_and_nonzero_exit(connect):
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    started = time.monotonic()
    child = await connect(f"127.0.0.1:{port} --connect-timeout 0.5")
    code = await child.wait_exit(10)
    assert code == 2
    assert 0.4 < time.monotonic() - started < 5
    lines = child.stderr.decode().strip().splitlines()
    assert len(lines) == 1 and f"127.0.0.1:{port}" in lines[0] and "mldserver serve" in lines[0]
    assert await child.read_line() is None


async def test_waits_for_a_server_that_comes_up_within_the_deadline(tmp_path, connect):
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    child = await connect(f"127.0.0.1:{port} --connect-timeout 5")
    await asyncio.sleep(0.5)

    async def handle(reader, writer):
        writer.write(await reader.readline())
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", port)
    await child.write(b"late\n")
    assert await child.read_line() == b"late"
    assert await child.wait_exit() == 0
    server.close()


async def test_unix_socket_target(tmp_path, connect):
    path = str(tmp_path / "mld.sock")
    server, _, _ = await echo_server(unix=path)
    child = await connect(f"unix:{path}")
    await child.write(b"over unix\n")
    assert await child.read_line() == b"over unix"
    await child.close_stdin()
    assert await child.wait_exit() == 0
    server.close()


def test_targets_parse():
    import socket

    assert parse_target("127.0.0.1:7070") == (socket.AF_INET, ("127.0.0.1", 7070))
    assert parse_target("[::1]:7070") == (socket.AF_INET6, ("::1", 7070))
    assert parse_target("unix:/run/mld.sock") == (socket.AF_UNIX, "/run/mld.sock")


@pytest.mark.parametrize("target, says", [("127.0.0.1:99999", "port 99999 is out of range: use 1 to 65535"),
                                          ("127.0.0.1:0", "port 0 is out of range"),
                                          ("127.0.0.1", "expected HOST:PORT or unix:PATH"),
                                          ("unix:", "expected unix:PATH")])
def test_a_bad_target_says_what_is_wrong(target, says):
    with pytest.raises(ValueError, match=says):
        parse_target(target)


def private_kb(pid: int) -> int:
    rollup = Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()
    return sum(int(line.split()[1]) for line in rollup if line.startswith(("Private_Clean:", "Private_Dirty:")))


async def test_the_relay_runs_lean(connect):
    """The C build is the process itself, under 1 MiB of private memory; relay.py runs as
    `python -I -S relay.py` (no site, no package) under 6 MiB."""
    server, port, _ = await echo_server()
    child = await connect(f"127.0.0.1:{port}")
    await read_until_ready(child)
    cmdline = Path(f"/proc/{child.proc.pid}/cmdline").read_bytes().split(b"\0")
    maps = Path(f"/proc/{child.proc.pid}/maps").read_text()
    if connect.build == "native":
        assert cmdline[0] == str(NATIVE).encode() and "python" not in maps
        assert private_kb(child.proc.pid) < 1024
    else:
        assert cmdline[1:3] == [b"-I", b"-S"] and cmdline[3].endswith(b"mldserver/ops/relay.py")
        assert "orjson" not in maps and "uvloop" not in maps
        assert private_kb(child.proc.pid) < 6 * 1024
    await child.close_stdin()
    assert await child.wait_exit() == 0
    server.close()


@pytest.mark.parametrize("args", [
    "127.0.0.1:99999", "127.0.0.1", "unix:", "localhost:7070 extra", "", "--help", "-h",
    "127.0.0.1:7070 --connect-timeout", "127.0.0.1:7070 --connect-timeout -1",
    "127.0.0.1:7070 --connect-timeout inf", "127.0.0.1:7070 --connect-timeout soon",
])
async def test_both_builds_say_the_same_words(args):
    """Usage, help and every refusal: the same exit status and the same text."""
    said = []
    for build in ("native", "python"):
        child = await Child.spawn(f"{MLDSERVER} connect {args}", env={"MLDSERVER_RELAY": build})
        code = await child.wait_exit(10)
        out = await child.stdout.read()
        said.append((code, out.decode(), child.stderr.decode()))
    assert said[0] == said[1]
    assert said[0][0] == (0 if args in ("--help", "-h") else 2)


async def test_both_builds_name_an_unreachable_server_alike():
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    said = []
    for build in ("native", "python"):
        child = await Child.spawn(f"{MLDSERVER} connect 127.0.0.1:{port} --connect-timeout 0.2",
                                  env={"MLDSERVER_RELAY": build})
        said.append((await child.wait_exit(10), child.stderr.decode()))
    assert said[0] == said[1]
    assert "Connection refused" in said[0][1]
