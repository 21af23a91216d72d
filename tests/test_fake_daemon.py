"""The fake daemon's own clean-up: children a failed test left running are killed
before its fixtures are torn down (``conftest.pytest_runtest_teardown``), else the
test's event loop waits on them at its close while they wait on a server stopped later."""

from __future__ import annotations

import asyncio
import signal
import sys

from mldserver.api.testing import Child, FakeDaemon, kill_children


async def test_a_child_left_running_is_killed_and_one_that_ended_is_left_alone():
    daemon = FakeDaemon("sleep 60")
    left = await daemon.spawn("shardId-000000000000")
    ended = await daemon.spawn("shardId-000000000001")
    ended.child.proc.kill()
    await ended.child.proc.wait()
    assert kill_children() == 1
    assert await left.child.proc.wait() == -signal.SIGKILL
    assert kill_children() == 0


async def test_a_childs_stdin_and_stdout_are_pipes_as_the_daemons_are(tmp_path):
    """Java's ProcessBuilder gives a child pipes (asyncio's own stdin is a socket pair,
    where the relay's zero-copy splice from its stdin fails, so a bench through it would
    measure the relay's fallback)."""
    script = tmp_path / "kinds.py"
    script.write_text("import os, stat\n"
                      "print(*(stat.S_ISFIFO(os.fstat(fd).st_mode) for fd in (0, 1, 2)), flush=True)\n")
    child = await Child.spawn(f"{sys.executable} {script}")
    assert await child.read_line() == b"True True True"
    assert await child.wait_exit() == 0


async def test_a_child_that_never_reads_its_stdin_is_ended_all_the_same():
    """Bytes left in its stdin's buffer keep the pipe from closing: ``end`` kills it
    past its time-out rather than wait for a flush that never comes."""
    child = await Child.spawn("sleep 60")
    child.stdin.write(b"x" * (4 << 20))  # far more than a pipe holds
    await asyncio.wait_for(child.end(timeout=0.5), 10)
    assert child.proc.returncode == -signal.SIGKILL
