"""Start-up checks of the machine, shared by ``mldserver serve`` and ``mldserver check``:
a setting that names a place the server cannot use is refused before it listens, in
one line that names the path and what to do::

    writable_state_dir(Path("/var/lib/mldserver"))   # created if missing, then a probe
        -> ConfigError("--state-dir /var/lib/mldserver: cannot write there (Read-only
                        file system): ...")
    free_unix_path(Path("/run/mldserver.sock"))      # a stale socket is removed
        -> ConfigError("--unix /run/mldserver.sock: another server listens there: ...")

They block (a file system, a connect): call them before the loop serves, or in a thread.
"""

from __future__ import annotations

import errno
import os
import socket
import stat
from pathlib import Path

from .errors import ConfigError

PROBE = ".mldserver-probe"


def writable_state_dir(path: Path) -> Path:
    """Create ``path`` (with its parents) and prove it takes a file: write, fsync and
    unlink a probe. The state directory holds the spool, the commit log and the dead
    letters; finding out it is unwritable at the first full batch is too late."""
    what = f"--state-dir {path}"
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise ConfigError(f"{what}: exists and is not a directory: remove it or choose another --state-dir") from None
    except OSError as exc:
        raise ConfigError(f"{what}: cannot create it ({_reason(exc)}): {_fix(exc)}") from None
    probe = path / PROBE
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, b"mldserver checks this folder takes a file\n")
            os.fsync(fd)
        finally:
            os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        try:
            probe.unlink(missing_ok=True)
        except OSError:
            pass
        raise ConfigError(f"{what}: cannot write there ({_reason(exc)}): {_fix(exc)}") from None
    return path


def free_unix_path(path: Path) -> None:
    """Make sure binding ``path`` takes nothing from anyone: nothing there is fine; a
    stale socket (no one accepts on it: a crashed server's) is removed; a live socket
    (another server), or anything that is not a socket, is a ConfigError."""
    what = f"--unix {path}"
    try:
        st = path.lstat()
    except FileNotFoundError:
        if not path.parent.is_dir():
            raise ConfigError(f"{what}: the folder {path.parent} does not exist: create it or choose another path")
        return
    except OSError as exc:
        raise ConfigError(f"{what}: cannot look there ({_reason(exc)}): {_fix(exc)}") from None
    if not stat.S_ISSOCK(st.st_mode):
        raise ConfigError(f"{what}: something that is not a socket is there: remove it or choose another path")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(1.0)
    try:
        sock.connect(str(path))
    except ConnectionRefusedError:  # no one listens: a socket a crashed server left
        pass
    except TimeoutError:  # someone listens, too busy to accept at once
        raise ConfigError(f"{what}: another server listens there (busy): stop it or choose another path") from None
    except OSError as exc:
        raise ConfigError(f"{what}: a socket is there that cannot be checked ({_reason(exc)}): {_fix(exc)}") from None
    else:
        raise ConfigError(f"{what}: another server listens there: stop it or choose another path")
    finally:
        sock.close()
    try:
        path.unlink()
    except OSError as exc:
        raise ConfigError(f"{what}: cannot remove the stale socket there ({_reason(exc)}): {_fix(exc)}") from None


def _reason(exc: OSError) -> str:
    return exc.strerror or str(exc)


def _fix(exc: OSError) -> str:
    if exc.errno in (errno.EACCES, errno.EPERM):
        return "give the server's user write access, or choose another path"
    if exc.errno == errno.ENOSPC:
        return "free space on that file system, or choose another path"
    if exc.errno == errno.EROFS:
        return "choose a path on a writable file system"
    return "choose another path"
