"""The relay: ``mldserver connect HOST:PORT | unix:PATH``, the daemon's child process.

The MultiLangDaemon starts one per shard (``executableName = mldserver connect
127.0.0.1:7070``) and talks to it over stdin/stdout; the relay copies bytes unchanged
between those pipes and one connection to the server, promptly (``splice(2)`` from the daemon's pipe where the
kernel allows it, else plain reads and writes: nothing waits for a buffer to fill).

- stdin EOF (the daemon closed us): half-close the socket, keep copying the server's
  last bytes to stdout, exit when the server closes.
- server EOF: exit at once.
- server unreachable within ``--connect-timeout`` (default 5 s, env
  ``MLDSERVER_CONNECT_TIMEOUT``): one line on stderr (the daemon logs child stderr),
  exit status 2.
- SIGINT is ignored: a Ctrl-C on the daemon's terminal reaches its whole process
  group, and the daemon must be the one to shut its children down.

It imports only the standard library's os, socket, signal, sys and threading, and
nothing of mldserver beyond this module, so it starts in tens of milliseconds.
"""

from __future__ import annotations

import errno
import os
import signal
import socket
import sys
import threading
import time

CHUNK = 1 << 20
DEFAULT_CONNECT_TIMEOUT = 5.0


def parse_target(target: str) -> tuple[int, object]:
    """``HOST:PORT``, ``[V6]:PORT`` or ``unix:PATH`` -> (family, address)."""
    if target.startswith("unix:"):
        return socket.AF_UNIX, target[5:]
    host, sep, port = target.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise ValueError(f"expected HOST:PORT or unix:PATH, got {target!r}")
    host = host.strip("[]")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return family, (host, int(port))


def connect(target: str, timeout: float) -> socket.socket:
    family, address = parse_target(target)
    deadline = time.monotonic() + timeout
    delay = 0.02
    while True:
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.settimeout(max(0.05, deadline - time.monotonic()))
            sock.connect(address)
            sock.settimeout(None)
            if family != socket.AF_UNIX:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return sock
        except OSError as exc:
            sock.close()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ConnectionError(f"{exc.strerror or exc}") from None
            time.sleep(min(delay, remaining))
            delay = min(delay * 2, 0.5)


def _pump(src: int, dst: int, splice: bool) -> None:
    """Copy src to dst until EOF, with splice(2) (zero-copy; src must be a pipe) or
    plain reads and writes. Server-to-daemon bytes always take the plain path: a pipe
    filled by splicing from a TCP socket can make the reader's non-blocking read block."""
    if splice and hasattr(os, "splice"):
        try:
            while os.splice(src, dst, CHUNK):
                pass
            return
        except OSError as exc:
            if exc.errno not in (errno.EINVAL, errno.ENOSYS, errno.EBADF):
                raise
    buf = bytearray(CHUNK)
    view = memoryview(buf)
    while n := os.readv(src, [buf]):
        out = view[:n]
        while out:
            out = out[os.write(dst, out) :]


def main(argv: list[str]) -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    args = list(argv)
    timeout = float(os.environ.get("MLDSERVER_CONNECT_TIMEOUT", DEFAULT_CONNECT_TIMEOUT))
    if "--connect-timeout" in args:
        i = args.index("--connect-timeout")
        timeout = float(args[i + 1])
        del args[i : i + 2]
    if len(args) != 1 or args[0] in ("-h", "--help"):
        sys.stderr.write("usage: mldserver connect HOST:PORT | unix:PATH [--connect-timeout SECONDS]\n")
        return 2
    try:
        sock = connect(args[0], timeout)
    except (ValueError, ConnectionError) as exc:
        sys.stderr.write(
            f"mldserver connect: cannot reach the mldserver server at {args[0]} within {timeout:g} s "
            f"({exc}); start it with `mldserver serve` or fix executableName\n"
        )
        sys.stderr.flush()
        return 2
    stdin, stdout, sockfd = sys.stdin.fileno(), sys.stdout.fileno(), sock.fileno()

    def upstream() -> None:
        try:
            _pump(stdin, sockfd, splice=True)
        except OSError:
            pass
        try:
            sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    threading.Thread(target=upstream, daemon=True).start()
    try:
        _pump(sockfd, stdout, splice=False)
    except OSError:
        pass
    return 0
