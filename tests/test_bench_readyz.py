"""The chaos bench's ``/readyz`` polls (``mldserver.ops.bench.killed``) are judged only
where they were sent and answered within one phase: an answer the server gave just before
a kill, read just after it, is not a server that said ready while it was down; a request
the kill cut off is not a server that said not ready while it served."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

from mldserver.ops.bench.killed import Kill, Killed, Phase, Poll

from .harness import eventually


async def test_a_poll_answered_across_a_kill_is_timed_from_before_the_kill():
    received, release = asyncio.Event(), asyncio.Event()

    async def answer_late(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        received.set()
        await release.wait()  # the answer is on its way while the kill comes
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer_late, "127.0.0.1", 0)
    result = Killed(seed=0, shards=1)
    phase = SimpleNamespace(admin=server.sockets[0].getsockname()[:2], result=result)
    stop = asyncio.Event()
    poller = asyncio.create_task(Phase.poll_ready(phase, stop))
    try:
        await asyncio.wait_for(received.wait(), 10)
        killed_at = time.time()
        release.set()
        await eventually(lambda: result.polls, 10, what="the poll to be answered")
    finally:
        stop.set()
        await poller
        server.close()
        await server.wait_closed()
    [poll] = result.polls
    assert poll.status == 200 and poll.sent <= killed_at <= poll.answered, (poll, killed_at)


def _readyz_check(polls: list[Poll]):
    """The readiness check over two kills, at t=100 and t=200 (each restart listening 5 s
    and serving 10 s later), and the final stop at t=300."""
    result = Killed(seed=0, shards=1, polls=polls, stopped_at=300.0)
    for at in (100.0, 200.0):
        result.kills.append(Kill(at_s=1.0, killed_at=at, listened_at=at + 5, served_at=at + 10))
    [check] = [c for c in result.checks() if c.name.startswith("/readyz")]
    return check


def test_polls_that_straddle_a_kill_are_not_judged_and_the_others_are():
    straddling = [Poll(199.9, 200.1, 200),  # answered by the server just killed
                  Poll(199.95, 200.2, None)]  # cut off by the kill
    down, up = [Poll(101.0, 101.1, None), Poll(201.0, 201.1, None)], [Poll(150.0, 150.1, 200)]
    assert _readyz_check(straddling + down + up).ok
    assert not _readyz_check(straddling + down + up + [Poll(202.0, 202.1, 200)]).ok  # ready while down
    assert not _readyz_check(straddling + down + up + [Poll(150.0, 150.1, None)]).ok  # not ready while serving
