"""The relay: ``mldserver connect HOST:PORT | unix:PATH``, the daemon's child process.

The MultiLangDaemon starts one per shard (``executableName = mldserver connect
127.0.0.1:7070``) and talks to it over stdin/stdout; the relay copies bytes unchanged
between those pipes and one connection to the server, promptly (``splice(2)`` from the
daemon's pipe where the kernel allows it, else plain reads and writes: nothing waits
for a buffer to fill).

- stdin EOF (the daemon closed us): half-close the socket, keep copying the server's
  last bytes to stdout, exit when the server closes.
- server EOF: exit at once. If the server closed (or reset the connection) before
  sending a byte while the daemon still talks (stdin open), it refused the shard
  (shutting down, say; the server logs ``shard_refused``): one line on stderr saying
  so, exit status 2.
- a copy that ends by an error, not an end of input (the server reset the connection,
  a write failed): one line on stderr saying which copy and why, so the daemon's log
  says why its child ended. A ``splice`` that fails (``ENOMEM`` under memory pressure,
  or a kernel that refuses it) is not one: the copy goes on with plain reads and writes.
- server unreachable within ``--connect-timeout`` (default 5 s, env
  ``MLDSERVER_CONNECT_TIMEOUT``): one line on stderr (the daemon logs child stderr),
  exit status 2.
- SIGINT is ignored: a Ctrl-C on the daemon's terminal reaches its whole process
  group, and the daemon must be the one to shut its children down.

There is one relay per shard, so its size counts. ``mldserver connect`` executes the
same program built in C (``relay.c``, installed as ``mldserver-relay`` beside this
file when a compiler was there at install time: about 0.2 MiB of private memory).
Where it is missing, or with ``MLDSERVER_RELAY=python`` or ``MLDSERVER_NO_EXTENSIONS=1``,
it re-executes this file as ``python -I -S relay.py ...`` (no site, no package, no
console-script wrapper), which uses only built-in C modules (``_socket``, ``_thread``,
``_signal`` rather than their Python wrappers): about 3.5 MiB private memory instead of 7::

    executableName = mldserver connect 127.0.0.1:7070
    # the daemon's child:  .../mldserver/ops/mldserver-relay 127.0.0.1:7070
    # or, without it:      python -I -S .../mldserver/ops/relay.py 127.0.0.1:7070
"""

import _signal
import _socket
import _thread
import fcntl
import os
import sys
import time

CHUNK = 1 << 20
READ_CHUNK = 1 << 16  # the server's lines are short statuses and checkpoints
F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)
DEFAULT_CONNECT_TIMEOUT = 5.0


def parse_target(target):
    """``HOST:PORT``, ``[V6]:PORT`` or ``unix:PATH`` -> (family, address); ValueError
    saying what is wrong with anything else (a port past 65535 included)."""
    if target.startswith("unix:"):
        if not target[5:]:
            raise ValueError(f"expected unix:PATH, got {target!r}")
        return _socket.AF_UNIX, target[5:]
    host, sep, port = target.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise ValueError(f"expected HOST:PORT or unix:PATH, got {target!r}")
    if not 1 <= int(port) <= 65535:
        raise ValueError(f"port {port} is out of range: use 1 to 65535")
    host = host.strip("[]")
    family = _socket.AF_INET6 if ":" in host else _socket.AF_INET
    return family, (host, int(port))


def connect(target, timeout):
    """A connected socket, retried until ``timeout``; ValueError for a bad target,
    ConnectionError for a server not reached in time."""
    family, address = parse_target(target)
    deadline = time.monotonic() + timeout
    delay = 0.02
    while True:
        sock = _socket.socket(family, _socket.SOCK_STREAM)
        try:
            sock.settimeout(max(0.05, deadline - time.monotonic()))
            sock.connect(address)
            sock.settimeout(None)
            if family != _socket.AF_UNIX:
                sock.setsockopt(_socket.IPPROTO_TCP, _socket.TCP_NODELAY, 1)
            return sock
        except OSError as exc:
            sock.close()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ConnectionError(f"{exc.strerror or exc}") from None
            time.sleep(min(delay, remaining))
            delay = min(delay * 2, 0.5)


def _pump(src, dst, splice):
    """Copy src to dst until EOF, with splice(2) (zero-copy; src must be a pipe) or plain
    reads and writes: the bytes moved, and the OSError of a plain read or write that
    failed (None at EOF). A splice that fails moved nothing: the rest goes by plain
    reads and writes, which wait where splice may fail (memory, a kernel that refuses
    it). Server-to-daemon bytes always take the plain path: a pipe filled by splicing
    from a TCP socket can make the reader's non-blocking read block."""
    moved = 0
    if splice and hasattr(os, "splice"):
        try:
            while n := os.splice(src, dst, CHUNK):
                moved += n
            return moved, None
        except OSError:
            pass
    buf = bytearray(READ_CHUNK)
    view = memoryview(buf)
    try:
        while n := os.readv(src, [buf]):
            moved += n
            out = view[:n]
            while out:
                out = out[os.write(dst, out) :]
    except OSError as exc:
        return moved, exc
    return moved, None


def _grow_pipe(fd):
    """Let the daemon's pipe hold a whole 1 MiB chunk (the default is 64 KiB): a 15 MB
    batch line then crosses in 15 wake-ups instead of 240."""
    try:
        with open("/proc/sys/fs/pipe-max-size") as f:
            size = int(f.read())
        fcntl.fcntl(fd, F_SETPIPE_SZ, min(size, CHUNK))
    except (OSError, ValueError):
        pass  # not a pipe, or not Linux: the default size works, only slower


def main(argv):
    _signal.signal(_signal.SIGINT, _signal.SIG_IGN)
    args = list(argv)
    usage = "usage: mldserver connect HOST:PORT | unix:PATH [--connect-timeout SECONDS]"
    timeout = os.environ.get("MLDSERVER_CONNECT_TIMEOUT", str(DEFAULT_CONNECT_TIMEOUT))
    if "--connect-timeout" in args:
        i = args.index("--connect-timeout")
        timeout = args[i + 1] if i + 1 < len(args) else ""
        del args[i : i + 2]
    if args[:1] in (["-h"], ["--help"]):
        sys.stdout.write(usage + "\n\nThe relay the daemon launches once per shard (executableName): it joins its "
                         "stdin and stdout to the server's shard port. --connect-timeout (or "
                         f"MLDSERVER_CONNECT_TIMEOUT): seconds to keep trying to reach the server (default "
                         f"{DEFAULT_CONNECT_TIMEOUT:g}).\n")
        sys.stdout.flush()  # (the relay ends with os._exit)
        return 0
    if len(args) != 1:
        sys.stderr.write(usage + "\n")
        return 2
    text = timeout
    try:
        timeout = float(text)
        if not 0 < timeout < float("inf"):
            raise ValueError
    except ValueError:
        sys.stderr.write(f"mldserver connect: the connect time-out must be a positive number of seconds, "
                         f"got '{text}' (--connect-timeout or MLDSERVER_CONNECT_TIMEOUT); {usage}\n")
        return 2
    try:
        parse_target(args[0])
    except ValueError as exc:
        sys.stderr.write(f"mldserver connect: bad target {args[0]!r}: {exc}; fix executableName\n")
        return 2
    try:
        sock = connect(args[0], timeout)
    except ConnectionError as exc:
        sys.stderr.write(
            f"mldserver connect: cannot reach the mldserver server at {args[0]} within {timeout:g} s "
            f"({exc}); start it with `mldserver serve` or fix executableName\n"
        )
        sys.stderr.flush()
        return 2
    stdin, stdout, sockfd = 0, 1, sock.fileno()
    _grow_pipe(stdin)

    stdin_ended = []  # the daemon closed our stdin: a server's EOF then is expected

    def upstream():
        _, exc = _pump(stdin, sockfd, splice=True)
        if exc is None:
            stdin_ended.append(True)
        else:
            _ended("daemon-to-server", exc)
        try:
            sock.shutdown(_socket.SHUT_WR)
        except OSError:
            pass

    _thread.start_new_thread(upstream, ())
    received, exc = _pump(sockfd, stdout, splice=False)
    # A server that closes with the daemon's first bytes unread resets the connection.
    if not received and not stdin_ended and (exc is None or isinstance(exc, ConnectionResetError)):
        sys.stderr.write(f"mldserver connect: the mldserver server at {args[0]} closed the connection before "
                         f"answering: it refused this shard (shutting down: its log says shard_refused; or out of "
                         f"file handles: its open_files_limit); the daemon starts the shard again\n")
        sys.stderr.flush()
        return 2
    if exc is not None:
        _ended("server-to-daemon", exc)
    return 0


def _ended(copy, exc):
    """The one stderr line of a copy that ended by an error (the daemon logs it)."""
    try:
        sys.stderr.write(f"mldserver connect: the {copy} copy failed: {exc.strerror or exc}\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


NATIVE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mldserver-relay")


def exec_lean(argv):
    """Replace this process with the relay in C, else a bare interpreter running this
    file (see above); ``MLDSERVER_RELAY=python`` chooses this file, and so does
    ``MLDSERVER_NO_EXTENSIONS=1`` (``mldserver/native.py``: no native part at all).
    Run in the package (``mldserver connect``), never in the bare relay.py."""
    from ..native import native_allowed

    if os.environ.get("MLDSERVER_RELAY") != "python" and native_allowed() and os.access(NATIVE, os.X_OK):
        try:
            os.execv(NATIVE, [NATIVE, *argv])
        except OSError:
            pass  # built for another machine, say: the Python relay does the same job
    os.execv(sys.executable, [sys.executable, "-I", "-S", __file__, *argv])


if __name__ == "__main__":
    os._exit(main(sys.argv[1:]))  # without waiting for the stdin thread
