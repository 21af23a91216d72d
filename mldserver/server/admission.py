"""Admission to the admin endpoint: a cap on its connections and a time-out on a request's
headers, so that whatever reaches the admin port cannot use the file handles the shard
listener needs.

Each admin connection holds a file handle. Without a cap, some 1,100 half-sent requests
used all of a 1,024-handle limit, and the next shard's relay was accepted and closed at
once by the event loop (out of handles, it drops what it cannot accept). ``Admission``
wraps the protocol of the HTTP server (aiohttp's request handler) and holds the admin side
to ``cap`` connections, well below any limit the server starts under::

    admission = Admission(runner.server, cap=64, header_timeout=10.0)
    server = await loop.create_server(admission, "127.0.0.1", 7071, backlog=64)

    # connection 65 while 64 are open: answered at once, then closed
    HTTP/1.1 503 Service Unavailable
    Connection: close
    Retry-After: 1

    admin endpoint busy: 64 connections open, its cap; try again

    # a connection whose first request's headers have not ended 10 s after it opened
    HTTP/1.1 408 Request Timeout

Past its first request, a connection is aiohttp's: an idle keep-alive connection is
closed after its ``keepalive_timeout`` (``IDLE_TIMEOUT_S``, the next request unfinished
or not begun). The first refusal of a burst is logged as ``admin_busy`` (at most one a
minute, with how many were refused since the last), never one line per connection: a
flood must not become a flood of log lines either.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Callable, cast

from ..base.logs import get_logger

log = get_logger("mldserver.admin")

MAX_CONNECTIONS = 64  # Prometheus, `mldserver status --watch` and a few people: far more than enough
HEADER_TIMEOUT_S = 10.0  # from the connection's opening to the end of its first request's headers
IDLE_TIMEOUT_S = 15.0  # aiohttp's keepalive_timeout: an idle connection between requests
BUSY_LOG_EVERY_S = 60.0

END_OF_HEADERS = b"\r\n\r\n"


def _answer(status: str, text: str) -> bytes:
    body = text.encode() + b"\n"
    return (f"HTTP/1.1 {status}\r\nConnection: close\r\nContent-Type: text/plain; charset=utf-8\r\n"
            f"Content-Length: {len(body)}\r\nRetry-After: 1\r\n\r\n").encode() + body


class Admission:
    """A protocol factory for ``loop.create_server``: ``factory()``'s protocol for each
    connection while fewer than ``cap`` are open, a refusal (503, closed) beyond."""

    def __init__(self, factory: Callable[[], asyncio.Protocol], *, cap: int = MAX_CONNECTIONS,
                 header_timeout: float = HEADER_TIMEOUT_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.factory = factory
        self.cap = cap
        self.header_timeout = header_timeout
        self.open = 0  # connections admitted and not yet lost
        self.refused = 0  # in all
        self.timed_out = 0  # in all
        self._clock = clock
        self._logged_at: float | None = None
        self._refused_at_log = 0

    def __call__(self) -> asyncio.Protocol:
        if self.open >= self.cap:
            self.refused += 1
            self._busy()
            return _Refused(_answer("503 Service Unavailable",
                                    f"admin endpoint busy: {self.cap} connections open, its cap; try again"))
        self.open += 1
        return _Admitted(self, self.factory())

    def _busy(self) -> None:
        now = self._clock()
        if self._logged_at is not None and now - self._logged_at < BUSY_LOG_EVERY_S:
            return
        log.warning("admin_busy", open=self.open, cap=self.cap, refused=self.refused - self._refused_at_log,
                    timed_out=self.timed_out,
                    what_to_do="connections past the cap are answered 503 and closed, the shards are not "
                               "affected; if this is not a scrape or a client gone wrong, firewall the admin port")
        self._logged_at = now
        self._refused_at_log = self.refused


class _Refused(asyncio.Protocol):
    """Answers at once and closes: the file handle is given back within the loop's turn."""

    def __init__(self, answer: bytes) -> None:
        self.answer = answer

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport = cast(asyncio.Transport, transport)  # uvloop's transports do not subclass asyncio's
        transport.write(self.answer)
        transport.close()


class _Admitted(asyncio.Protocol):
    """The inner protocol, counted, with its first request's headers timed."""

    def __init__(self, admission: Admission, inner: Any) -> None:
        self.admission = admission
        self.inner = inner
        self.transport: asyncio.Transport | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._tail = b""  # the last bytes seen, for an end of headers split across reads

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self._timer = asyncio.get_running_loop().call_later(self.admission.header_timeout, self._too_slow)
        self.inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if self._timer is not None:
            seen = self._tail + data
            if END_OF_HEADERS in seen:
                self._timer.cancel()
                self._timer = None
                self._tail = b""
            else:
                self._tail = seen[-(len(END_OF_HEADERS) - 1):]
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received()

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        self.admission.open -= 1
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.inner.connection_lost(exc)

    def _too_slow(self) -> None:
        self._timer = None
        self.admission.timed_out += 1
        assert self.transport is not None
        if not self.transport.is_closing():
            self.transport.write(_answer("408 Request Timeout", f"the request's headers did not arrive within "
                                                                f"{self.admission.header_timeout:g} s"))
            self.transport.close()
