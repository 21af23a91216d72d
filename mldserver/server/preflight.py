"""Start-up checks of the machine, shared by ``mldserver serve`` and ``mldserver check``:
a setting that names a place the server cannot use is refused before it listens, in
one line that names the path and what to do::

    writable_state_dir(Path("/var/lib/mldserver"))   # created if missing, then a probe
        -> ConfigError("--state-dir /var/lib/mldserver: cannot write there (Read-only
                        file system): ...")
    writable_sink(settings)                          # the same for --sink file:/data/out
        -> ConfigError("--sink file:/data/out: cannot write there (Permission denied): ...")
    free_unix_path(Path("/run/mldserver.sock"))      # a stale socket is removed
        -> ConfigError("--unix /run/mldserver.sock: another server listens there: ...")

    extras(settings)          # pyspark for --pipeline / --sink parquet:, pyiceberg for --sink iceberg:
        -> ConfigError("--sink parquet:out needs Spark, which this installation lacks: pip install 'mldserver[spark]' ...")
    java("Spark (--pipeline, --sink parquet: or iceberg:)")   # $JAVA_HOME/bin/java, else java on PATH
        -> "/usr/lib/jvm/java-17-openjdk-amd64/bin/java"
        -> ConfigError("Spark (...) needs Java 17 or later, and there is none: JAVA_HOME is not set
                        and no java is on PATH; install one (Debian/Ubuntu: ...) or set JAVA_HOME")

They block (a file system, a connect, ``java -version``): call them before the loop
serves, or in a thread.
"""

from __future__ import annotations

import errno
import importlib.util
import os
import re
import shutil
import socket
import stat
import subprocess
from pathlib import Path

from typing import TYPE_CHECKING

from ..errors import ConfigError

if TYPE_CHECKING:
    from ..base.config import Settings

PROBE = ".mldserver-probe"


def probe_path(path: Path) -> Path:
    """The probe file this process writes in ``path``: named by pid, so two processes that
    check one state directory at once (``check`` beside a starting ``serve``) never unlink
    each other's probe."""
    return path / f"{PROBE}-{os.getpid()}"


JAVA = 17  # the oldest Java that Spark 4 and the KCL 3 daemon run on
INSTALL_JAVA = ("install one (Debian/Ubuntu: apt-get install openjdk-17-jre-headless; macOS: brew install "
                "openjdk@17; a container: FROM eclipse-temurin:17-jre) or set JAVA_HOME to one")


def extras(settings: "Settings") -> None:
    """What the settings use is installed: Spark (``mldserver[spark]``) for a pipeline or
    a parquet sink, Iceberg (``mldserver[iceberg]``) for the table sink; a ConfigError
    naming the extra otherwise. The core install runs everything else."""
    from ..base.config import uses_spark

    if uses_spark(settings) and importlib.util.find_spec("pyspark") is None:
        raise ConfigError(f"{_spark_use(settings)} needs Spark, which this installation lacks: "
                          f"pip install 'mldserver[spark]' (and Java 17 or later)")
    if (settings.sink or "").startswith("iceberg:") and importlib.util.find_spec("pyiceberg") is None:
        raise ConfigError(f"--sink {settings.sink} needs Iceberg, which this installation lacks: "
                          f"pip install 'mldserver[iceberg]'")


def _spark_use(settings: "Settings") -> str:
    if settings.pipeline:
        return f"--pipeline {settings.pipeline}"
    if settings.sink:
        return f"--sink {settings.sink}"
    return "--spark-master/--spark-remote"


def java(what: str) -> str:
    """The java ``what`` runs on: $JAVA_HOME/bin/java, else java on PATH, if it is Java
    17 or later; else a ConfigError saying what was found and what to install."""
    home = os.environ.get("JAVA_HOME")
    if home:
        found = str(Path(home) / "bin" / "java")
        if not os.access(found, os.X_OK):
            raise ConfigError(f"{what} needs Java {JAVA} or later, and JAVA_HOME={home} has no bin/java; "
                              f"{INSTALL_JAVA}")
    else:
        found = shutil.which("java") or ""
        if not found:
            raise ConfigError(f"{what} needs Java {JAVA} or later, and there is none: JAVA_HOME is not set and no "
                              f"java is on PATH; {INSTALL_JAVA}")
    try:
        out = subprocess.run([found, "-version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ConfigError(f"{what} needs Java {JAVA} or later, and {found} does not run ({exc}); {INSTALL_JAVA}"
                          ) from None
    version = re.search(r'version "(\d+)(?:\.(\d+))?', out.stderr + out.stdout)
    major = None if version is None else int(version[2] if version[1] == "1" and version[2] else version[1])
    if major is None or major < JAVA:
        said = (out.stderr or out.stdout).strip().splitlines()
        raise ConfigError(f"{what} needs Java {JAVA} or later, and {found} is "
                          f"{'Java ' + str(major) if major else repr(said[0] if said else '')}; {INSTALL_JAVA}")
    return found


def writable_state_dir(path: Path) -> Path:
    """Create ``path`` (with its parents) and prove it takes a file: write, fsync and
    unlink a probe. The state directory holds the spool, the commit log and the dead
    letters; finding out it is unwritable at the first full batch is too late."""
    return writable_dir(path, f"--state-dir {path}", "--state-dir")


def writable_sink(settings: "Settings") -> Path | None:
    """The sink's directory, created and probed as the state directory is (``file:`` and
    ``parquet:`` write there; ``iceberg:`` keeps its catalog and files there unless
    ``table_catalog`` names a catalog of its own): a sink that cannot be written is
    refused at the start, not found out at the first window. None without such a sink."""
    from ..base.config import SinkSpec

    if not settings.sink:
        return None
    spec = SinkSpec.parse(settings.sink)
    if spec.kind == "iceberg" and settings.table_catalog:
        return None  # the catalog says where the table's files go
    assert spec.directory is not None  # (only iceberg: goes without, and only with a catalog: above)
    return writable_dir(spec.directory, f"--sink {settings.sink}", "--sink directory")


def writable_dir(path: Path, what: str, option: str) -> Path:
    """``path`` created if missing and proven to take a file (a probe written, fsynced and
    unlinked), or a ConfigError starting with ``what`` that says what to do."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise ConfigError(f"{what}: exists and is not a directory: remove it or choose another {option}") from None
    except OSError as exc:
        raise ConfigError(f"{what}: cannot create it ({_reason(exc)}): {_fix(exc)}") from None
    probe = probe_path(path)
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
