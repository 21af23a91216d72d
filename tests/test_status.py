"""``mldserver status``, ``pause``, ``resume``, ``reload`` as users run them, against a
``mldserver serve`` process with a shard connected, and with no server at all."""

from __future__ import annotations

import json
import os
import re
import subprocess

import mldserver
from mldserver.api.testing import FakeDaemon, make_records

from .harness import MLDSERVER, ROOT, eventually, relay_command


def cli(*args, timeout=20):
    return subprocess.run([MLDSERVER, *args], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=timeout)


def test_status_with_no_server_is_one_line_naming_the_url_and_exit_1():
    result = cli("status", "--admin", "127.0.0.1:9")  # the discard port: nothing answers there
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1 and "http://127.0.0.1:9/status" in result.stderr
    assert "Traceback" not in result.stderr
    result = cli("pause", "--admin", "http://127.0.0.1:9")
    assert result.returncode == 1 and "http://127.0.0.1:9/pause" in result.stderr


async def test_status_shows_each_shard_and_pause_resume_answer(serve):
    server = serve("tests.handlers:Noop")
    admin = await eventually(lambda: server.admin_url, what="admin_listening logged")
    daemon = FakeDaemon(relay_command(server.port))
    shard = await daemon.shard("shardId-000000000007")
    await shard.process_records(make_records(1, 3), millis_behind_latest=1234)

    result = cli("status", "--admin", admin)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    # First, which server answered: its version, pid, handler and state dir, then where it listens.
    assert lines[0] == (f"mldserver {mldserver.__version__}  pid {server.proc.pid}  handler tests.handlers:Noop  "
                        f"state dir {server.state_dir.resolve()}")
    assert lines[1].startswith(f"server 127.0.0.1:{server.port}  ready  running")
    header = next(line for line in lines if line.startswith("SHARD"))
    row = next(line for line in lines if line.startswith("shardId-000000000007"))
    assert header.split()[:3] == ["SHARD", "CONN", "STATE"]
    cells = re.split(r"\s{2,}", row)
    assert cells[2] == "READY" and cells[3].startswith("processRecords (") and cells[4:6] == ["3", "1,234"]

    result = cli("pause", "--admin", admin)
    assert result.returncode == 0 and json.loads(result.stdout) == {"paused": True, "changed": True}
    assert "PAUSED" in cli("status", "--admin", admin).stdout.splitlines()[1]
    assert json.loads(cli("resume", "--admin", admin).stdout) == {"paused": False, "changed": True}
    result = cli("reload", "--admin", admin)
    assert result.returncode == 0 and json.loads(result.stdout) == {"reloaded": True}

    watch = subprocess.Popen([MLDSERVER, "status", "--watch", "--interval", "0.1", "--admin", admin], cwd=ROOT,
                             env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE, text=True)
    seen = ""
    while seen.count("shardId-000000000007") < 2:  # two frames drawn, each after a clear-screen
        seen += watch.stdout.readline()
    watch.terminate()
    watch.wait(10)
    watch.stdout.close()
    assert seen.count("\x1b[H\x1b[2J") >= 2
    await shard.close()
