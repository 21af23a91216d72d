"""The fake daemon's own clean-up: children a failed test left running are killed
before its fixtures are torn down (``conftest.pytest_runtest_teardown``), else the
test's event loop waits on them at its close while they wait on a server stopped later."""

from __future__ import annotations

import signal

from mldserver.api.testing import FakeDaemon, kill_children


async def test_a_child_left_running_is_killed_and_one_that_ended_is_left_alone():
    daemon = FakeDaemon("sleep 60")
    left = await daemon.spawn("shardId-000000000000")
    ended = await daemon.spawn("shardId-000000000001")
    ended.child.proc.kill()
    await ended.child.proc.wait()
    assert kill_children() == 1
    assert await left.child.proc.wait() == -signal.SIGKILL
    assert kill_children() == 0
