"""``ops.tether``: a child that dies with its parent, the daemon's pidfile (a leftover
stopped, a live server's daemon and a recycled pid left alone), and the state dir's
worker identity. ``mldserver run`` itself under a SIGKILL is in tests/test_daemon.py."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from mldserver.base.logs import get_logger
from mldserver.errors import ConfigError
from mldserver.ops.tether import Pidfile, alive, die_with, started, worker_id

from .harness import eventually



def wait_gone(pid: int, timeout: float) -> None:
    asyncio.run(eventually(lambda: started(pid) is None, timeout, what=f"pid {pid} gone", interval=0.05))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_tethered_child_is_killed_when_its_parent_is():
    # A parent that starts a tethered grandchild, prints its pid and waits: SIGKILLed.
    parent = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
        import os, subprocess, sys, time
        from mldserver.ops.tether import die_with
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"],
                                 preexec_fn=die_with(os.getpid()), start_new_session=True)
        print(child.pid, flush=True)
        time.sleep(300)
    """)], stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    assert started(child) is not None
    parent.kill()
    parent.wait()
    parent.stdout.close()
    wait_gone(child, 5)


def test_die_with_is_a_preexec_fn_on_linux():
    assert (die_with(os.getpid()) is not None) == sys.platform.startswith("linux")


def test_a_leftover_daemon_is_killed_and_its_pidfile_removed(tmp_path, sleepers):
    leftover = sleepers()
    pidfile = Pidfile(tmp_path / "daemon" / "daemon.pid")
    pidfile.write(leftover.pid)
    # As an earlier server (now gone) wrote it: this process is not that server.
    held = pidfile.read()
    held.update(server_pid=leftover.pid + 1_000_000, server_started=1)
    pidfile.path.write_text(json.dumps(held))
    pidfile.clear(get_logger("mldserver.daemon"))
    assert leftover.wait(5) == -signal.SIGKILL
    assert not pidfile.path.exists()


def test_the_daemon_of_a_server_that_still_runs_is_left_alone_and_the_start_refused(tmp_path, sleepers):
    daemon, server = sleepers(), sleepers()
    pidfile = Pidfile(tmp_path / "state" / "daemon" / "daemon.pid")
    pidfile.path.parent.mkdir(parents=True)
    pidfile.path.write_text(json.dumps(
        {"pid": daemon.pid, "started": started(daemon.pid), "server_pid": server.pid,
         "server_started": started(server.pid)}))
    with pytest.raises(ConfigError, match=rf"--state-dir {tmp_path / 'state'}: mldserver run \(pid {server.pid}\) "
                                          rf"still uses it, with its daemon \(pid {daemon.pid}\)"):
        pidfile.clear(get_logger("mldserver.daemon"))
    assert daemon.poll() is None and pidfile.path.exists()


def test_a_pid_now_used_by_another_process_is_not_killed(tmp_path, sleepers):
    other = sleepers()
    pidfile = Pidfile(tmp_path / "daemon.pid")
    pidfile.path.write_text(json.dumps(
        {"pid": other.pid, "started": started(other.pid) - 1, "server_pid": 0, "server_started": None}))
    pidfile.clear(get_logger("mldserver.daemon"))
    assert other.poll() is None and alive(other.pid, started(other.pid))
    assert not pidfile.path.exists()


@pytest.mark.parametrize("text", ["", "not json", '{"pid": "12"}', "[1, 2]"])
def test_a_pidfile_that_does_not_parse_is_dropped(tmp_path, text):
    path = tmp_path / "daemon.pid"
    path.write_text(text)
    Pidfile(path).clear(get_logger("mldserver.daemon"))
    assert not path.exists()


def test_the_worker_id_is_made_once_per_state_dir(tmp_path):
    first = worker_id(tmp_path / "a")
    assert first.startswith("mldserver-") and worker_id(tmp_path / "a") == first
    assert (tmp_path / "a" / "worker-id").read_text() == first + "\n"
    assert worker_id(tmp_path / "b") != first
