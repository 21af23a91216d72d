"""The server's listeners: the TCP port and/or the unix socket the relays connect to.

Bound first, served last: ``bind()`` runs at the start of ``Server.start()``, so a
port in use is said before anything starts, and ``serve()`` at its end, once the
handler processes, Spark and the coordinator are up::

    listeners = Listeners(accept, settings)    # accept(reader, writer): one connection
    await listeners.bind()                     # ConfigError: "--port 7070: 127.0.0.1:7070 is already in use: ..."
    tasks = await listeners.serve(workers=[4242, 4243])   # the handler processes
    # {"event": "listening", "host": "127.0.0.1", "port": 7070, "handler": "...", "pid": ...,
    #  "open_files_limit": 65536, "workers": [...]}
    listeners.close()                          # no new connection from here on
    await listeners.wait_closed()              # the socket file this server bound is removed

What the machine refuses (a port in use, a host that does not resolve, an address
not of this machine, a port below 1024, a unix path taken by a live socket or a
file) is a ConfigError naming the setting and what to do. The default host is
loopback: the protocol has no authentication, so any other address is logged as
``listening_beyond_loopback``. A unix socket is removed at the end only if it is
still the one this server bound (same device and inode).
"""

from __future__ import annotations

import asyncio
import errno
import ipaddress
import os
import resource
import socket
from pathlib import Path
from typing import Any, Callable

from .preflight import free_unix_path
from ..shard import pieces
from ..base.config import Settings
from ..errors import ConfigError
from ..base.logs import get_logger

log = get_logger("mldserver.server")

# A shard's reader pauses reading at twice this received and not yet looked at; a shard
# waiting for a slot pauses at once (``LineReader.hold``), keeping the rest of its batch
# in the kernel, not in our memory. Reads are written in place into the line they end up
# in (``pieces.InPlace``).
STREAM_LIMIT = 1 << 18


class Listeners:
    def __init__(self, accept: Callable[..., Any], settings: Settings) -> None:
        self.accept = accept
        self.settings = settings
        self.address: tuple[str, int] | str | None = None  # where relays connect (the unix path first)
        self._unix: asyncio.base_events.Server | None = None
        self._tcp: asyncio.base_events.Server | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._unix_socket: tuple[str, int, int] | None = None  # (path, device, inode) of the one we bound

    @property
    def tasks(self) -> list[asyncio.Task[None]]:
        """The serving tasks (owned by the server: one that ends is a crash)."""
        return list(self._tasks)

    async def bind(self) -> None:
        """Bind what the settings name, without accepting yet."""
        s = self.settings
        if s.unix:
            self._unix = await self._bind_unix(s.unix)
        if s.tcp_port is not None:
            self._tcp = await self._bind_tcp(s.host, s.tcp_port)

    async def serve(self, **logged: Any) -> list[asyncio.Task[None]]:
        """Accept connections; log ``listening`` (with ``logged``) for each listener."""
        s = self.settings
        for srv in self._servers:
            await srv.start_serving()  # listening when serve() returns
        if self._unix is not None:
            self._tasks.append(asyncio.create_task(self._unix.serve_forever(), name="listener-unix"))
            self.address = s.unix
            log.info("listening", unix=s.unix, handler=s.handler)
        if self._tcp is not None:
            self._tasks.append(asyncio.create_task(self._tcp.serve_forever(), name="listener-tcp"))
            host, port = self._tcp.sockets[0].getsockname()[:2]
            if self._unix is None:
                self.address = (host, port)
            exposed = sorted({a for a in (sock.getsockname()[0] for sock in self._tcp.sockets) if not _loopback(a)})
            if exposed:
                log.warning(
                    "listening_beyond_loopback",
                    host=s.host,
                    addresses=exposed,
                    what_to_do="the protocol has no authentication: whoever reaches this port can pose as the "
                    "daemon; bind 127.0.0.1 (the default) or firewall the port",
                )
            log.info("listening", host=host, port=port, handler=s.handler, pid=os.getpid(),
                     open_files_limit=resource.getrlimit(resource.RLIMIT_NOFILE)[0], **logged)
        return self.tasks

    def close(self) -> None:
        """Stop accepting (connections already accepted go on)."""
        for srv in self._servers:
            srv.close()

    async def wait_closed(self) -> None:
        """The serving tasks ended and the listeners closed."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for srv in self._servers:
            await srv.wait_closed()

    def remove_unix_socket(self) -> None:
        """Unlink the socket this server bound, only if it is still that socket (not
        a file someone put there since)."""
        if self._unix_socket is None:
            return
        path, dev, ino = self._unix_socket
        self._unix_socket = None
        try:
            st = os.lstat(path)
            if (st.st_dev, st.st_ino) == (dev, ino):
                os.unlink(path)
        except FileNotFoundError:
            pass

    @property
    def _servers(self) -> list[asyncio.base_events.Server]:
        return [srv for srv in (self._unix, self._tcp) if srv is not None]

    async def _bind_unix(self, path: str) -> asyncio.base_events.Server:
        await asyncio.to_thread(free_unix_path, Path(path))
        try:
            srv = await pieces.serve_unix(self.accept, path, STREAM_LIMIT, start_serving=False)
        except (OSError, ValueError) as exc:
            raise ConfigError(f"--unix {path}: cannot listen there ({_reason(exc)}): choose another path") from None
        st = os.stat(path)
        self._unix_socket = (path, st.st_dev, st.st_ino)
        return srv

    async def _bind_tcp(self, host: str, port: int) -> asyncio.base_events.Server:
        try:
            return await pieces.serve_tcp(self.accept, host, port, STREAM_LIMIT, start_serving=False)
        except socket.gaierror as exc:
            raise ConfigError(
                f"--host {host}: cannot resolve it ({_reason(exc)}): give an IP address or a name this machine "
                f"resolves (default 127.0.0.1)"
            ) from None
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                what_to_do = "stop what listens there, or choose another --port (0 picks a free one)"
                raise ConfigError(f"--port {port}: {host}:{port} is already in use: {what_to_do}") from None
            if exc.errno == errno.EADDRNOTAVAIL:
                raise ConfigError(
                    f"--host {host}: not an address of this machine: bind one of its addresses, or 127.0.0.1"
                ) from None
            if exc.errno in (errno.EACCES, errno.EPERM):
                raise ConfigError(
                    f"--port {port}: not allowed to listen on {host}:{port} ({_reason(exc)}): ports below 1024 "
                    f"need privileges; choose a higher --port"
                ) from None
            raise ConfigError(f"--host {host} --port {port}: cannot listen there ({_reason(exc)})") from None


def _loopback(address: str) -> bool:
    return ipaddress.ip_address(address.partition("%")[0]).is_loopback


def _reason(exc: BaseException) -> str:
    return (exc.strerror if isinstance(exc, OSError) else None) or str(exc)
