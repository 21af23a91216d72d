"""What ties ``mldserver run``'s daemon to its server, across a crash and a restart.

Three things, each for one way a daemon could outlive its server or come back as a
stranger:

::

    proc = subprocess.Popen([...java...], preexec_fn=die_with(os.getpid()))
    # the server is SIGKILLed (an OOM kill): the kernel SIGKILLs the daemon at once

    pidfile = Pidfile(Path("state/daemon/daemon.pid"))
    pidfile.left()            # what clear would find, nothing stopped (check --for run)
    pidfile.clear(log)        # a daemon an earlier run of this state dir left: SIGKILLed,
                              # logged as daemon_leftover_stopped; a live server still
                              # using the state dir: ConfigError
    pidfile.write(proc.pid)   # {"pid": 4242, "started": 981223, "server_pid": 4201, ...}

    worker_id(Path("state/daemon"))   # "mldserver-7d0c5e3a9b1f4e2c": the same every run

- ``die_with``: the child asks the kernel for SIGKILL when its parent dies (Linux
  ``prctl(PR_SET_PDEATHSIG)``). The kernel sends it when the *thread* that forked
  exits, so the daemon is started from the loop's thread, which is the main thread
  (``server.run``). SIGKILL, not SIGTERM: the daemon's graceful shutdown would ask
  shards to checkpoint through a server that is gone, and would take
  ``shutdownGraceMillis``; the leases it holds stay with its worker identity, which
  the next run takes over.
- ``Pidfile``: the daemon's pid and the server's, each with its start time (field 22
  of ``/proc/PID/stat``, so a recycled pid is never mistaken for them). A daemon the
  kernel did not tether (one started by an earlier version) is found by the next run
  of the same state dir and stopped before it listens (the old daemon's next relay
  would otherwise connect to the new server).
- ``worker_id``: the KCL ``workerId`` kept in ``<state-dir>/daemon/worker-id``. A
  restarted daemon is then the same worker and takes its own leases back at once; a
  new identity waits until the old worker's leases expire and the leader lock times
  out (150 to 197 s seen, against 58 s for a first start).
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import sys
import time
import uuid
from pathlib import Path
from typing import Callable

from ..base.durable import atomic_write
from ..base.logs import EventLogger
from ..errors import ConfigError

PR_SET_PDEATHSIG = 1
WORKER_ID_FILE = "worker-id"
STOP_WAIT_S = 10.0  # a SIGKILLed JVM is gone in well under a second; this is for a loaded machine


def die_with(parent: int) -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes the child die (SIGKILL) when ``parent`` does; None
    where the kernel has no such thing. ``prctl`` is looked up before the fork, so the
    child only makes two system calls; a parent that died before the request took
    effect is caught by the ``getppid`` check after it."""
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl

    def child() -> None:
        prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        if os.getppid() != parent:
            os.kill(os.getpid(), signal.SIGKILL)

    return child


def started(pid: int) -> int | None:
    """When ``pid`` started (clock ticks since boot), or None: no such process, or a
    zombie (killed and not yet reaped: as good as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:  # no such process (or no /proc: not Linux)
        return None
    fields = stat[stat.rfind(")") + 2:].split()  # after "pid (comm) ": comm may hold spaces
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


def alive(pid: int, at: int | None) -> bool:
    """``pid`` is the process that started at ``at`` and still runs."""
    return at is not None and started(pid) == at


class Pidfile:
    """``<state-dir>/daemon/daemon.pid``: which daemon this state dir's server started."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def read(self) -> dict | None:
        try:
            held = json.loads(self.path.read_text())
            return held if isinstance(held, dict) and isinstance(held.get("pid"), int) else None
        except (OSError, ValueError):
            return None

    def write(self, pid: int) -> None:
        me = os.getpid()
        held = {"pid": pid, "started": started(pid), "server_pid": me, "server_started": started(me)}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(self.path, (json.dumps(held) + "\n").encode())

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)

    def left(self) -> dict | None:
        """What ``clear`` finds, nothing stopped (``mldserver check --for run`` asks): the
        file's fields when the daemon an earlier run left still runs, else None;
        ConfigError when the server that started it still runs: two servers on one
        state dir would share its ledger and the daemon's worker identity."""
        held = self.read()
        if held is None:
            return None
        server = held.get("server_pid")
        if isinstance(server, int) and server != os.getpid() and alive(server, held.get("server_started")):
            raise ConfigError(f"--state-dir {self.path.parent.parent}: mldserver run (pid {server}) still uses it, "
                              f"with its daemon (pid {held['pid']}): stop it first, or give another --state-dir")
        return held if alive(held["pid"], held.get("started")) else None

    def clear(self, log: EventLogger) -> None:
        """Stop the daemon an earlier run left, if it runs, and drop the file; refuse
        (``left``'s ConfigError) when the server that started it still runs."""
        held = self.left()
        if held is not None:
            pid = held["pid"]
            os.kill(pid, signal.SIGKILL)
            deadline = time.monotonic() + STOP_WAIT_S
            while started(pid) is not None and time.monotonic() < deadline:
                time.sleep(0.05)
            log.warning("daemon_leftover_stopped", pid=pid, server_pid=held.get("server_pid"),
                        gone=started(pid) is None, pidfile=str(self.path))
        self.remove()


def worker_id(directory: Path) -> str:
    """The KCL worker identity of this state dir's daemon: made once, then read."""
    path = directory / WORKER_ID_FILE
    try:
        found = path.read_text().strip()
    except FileNotFoundError:
        found = ""
    if found:
        return found
    made = f"mldserver-{uuid.uuid4().hex[:16]}"
    directory.mkdir(parents=True, exist_ok=True)
    atomic_write(path, (made + "\n").encode())
    return made
