"""Admission to the admin endpoint (mldserver.server.admission): its cap, its header
time-out, and the shard listener served while the admin port is flooded."""

from __future__ import annotations

import asyncio
import os
import resource
import socket

import pytest

from mldserver.api.testing import FakeDaemon, make_records
from mldserver.server.admission import Admission

from .harness import ServerProcess, eventually, relay_command

HALF_SENT = b"GET /status HTTP/1.1\r\nHost: mldserver\r\n"  # no end of headers


class Answering(asyncio.Protocol):
    """A stand-in for aiohttp's handler: answers each request whose headers ended."""

    def connection_made(self, transport):
        self.transport = transport
        self.seen = b""

    def data_received(self, data):
        self.seen += data
        if b"\r\n\r\n" in self.seen:
            self.transport.write(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nok\n")


async def serve(admission):
    server = await asyncio.get_running_loop().create_server(admission, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


async def test_a_connection_past_the_cap_is_answered_503_and_closed_until_one_ends(tmp_path):
    admission = Admission(Answering, cap=2, header_timeout=60)
    server, port = await serve(admission)
    held = [await asyncio.open_connection("127.0.0.1", port) for _ in range(2)]
    await eventually(lambda: admission.open == 2, what="two connections admitted")
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    answer = await asyncio.wait_for(reader.read(), 5)  # to the end: the server closed it
    assert answer.startswith(b"HTTP/1.1 503 Service Unavailable\r\n")
    assert b"2 connections open, its cap" in answer
    assert admission.open == 2 and admission.refused == 1
    writer.close()
    held[0][1].close()
    await eventually(lambda: admission.open == 1, what="the closed connection counted out")
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    assert (await asyncio.wait_for(reader.readline(), 5)) == b"HTTP/1.1 200 OK\r\n"
    for _, w in [*held[1:], (reader, writer)]:
        w.close()
    server.close()


async def test_headers_not_ended_within_the_time_out_get_408_and_a_close(tmp_path):
    admission = Admission(Answering, cap=8, header_timeout=0.3)
    server, port = await serve(admission)
    slow_reader, slow = await asyncio.open_connection("127.0.0.1", port)
    slow.write(HALF_SENT)
    fast_reader, fast = await asyncio.open_connection("127.0.0.1", port)
    fast.write(HALF_SENT[:20])
    fast.write(HALF_SENT[20:] + b"\r\n")  # the end of headers split across writes
    assert (await asyncio.wait_for(fast_reader.readline(), 5)) == b"HTTP/1.1 200 OK\r\n"
    answer = await asyncio.wait_for(slow_reader.read(), 5)
    assert answer.startswith(b"HTTP/1.1 408 Request Timeout\r\n")
    await eventually(lambda: admission.open == 1, what="the slow connection closed")
    await asyncio.sleep(0)  # the fast one, past its headers, is not timed: still open
    assert not fast.is_closing() and admission.timed_out == 1
    fast.close()
    slow.close()
    server.close()


def _half_open(port: int, n: int) -> list[socket.socket]:
    """``n`` connections to the admin port, each with a request line and no end of headers
    (what a slow or hostile client leaves): connected without waiting one by one."""
    socks = []
    for _ in range(n):
        s = socket.socket()
        s.setblocking(False)
        s.connect_ex(("127.0.0.1", port))
        socks.append(s)
    for s in socks:
        s.setblocking(True)
        s.settimeout(30)
        try:
            s.sendall(HALF_SENT)
        except OSError:  # answered 503 and closed by the server already: still a connection it had to take
            pass
    return socks


async def test_a_new_shard_is_served_with_1500_half_open_admin_connections_under_1024_handles(tmp_path):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 2000:
        pytest.skip(f"the test opens 1,500 connections itself; its hard limit is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(4096, hard) if hard != resource.RLIM_INFINITY else 4096, hard))
    server = ServerProcess("tests.handlers:Noop", tmp_path, "--workers", "1", open_files=1024)
    daemon = None
    socks: list[socket.socket] = []
    try:
        assert next(e for e in server.events() if e["event"] == "listening")["open_files_limit"] == 1024
        admin_port = int(server.admin_url.rpartition(":")[2])
        socks = await asyncio.to_thread(_half_open, admin_port, 1500)
        await eventually(lambda: any(e["event"] == "admin_busy" for e in server.events()), timeout=30,
                         what="admin_busy logged")
        assert len(os.listdir(f"/proc/{server.proc.pid}/fd")) < 1024 - 500  # the shards' handles left
        daemon = FakeDaemon(relay_command(server.port))
        shard = await daemon.shard("shardId-000000000001")
        await shard.process_records(make_records(1, 3))  # DaemonExit unless its status came back
        assert shard.phase == "idle" and any(e["event"] == "initialize" for e in server.events())
    finally:
        if daemon is not None:
            await daemon.close()
        for s in socks:
            s.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        server.stop()
