"""``mldserver serve`` as users run it: start-up errors, logs, signals, unix sockets."""

from __future__ import annotations

import json
import os
import signal
import subprocess

import pytest

from mldserver.testing import FakeDaemon, make_records

from .conftest import MLDSERVER, ROOT


def run_serve(*args, timeout=20):
    return subprocess.run([MLDSERVER, "serve", *args], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize(
    "spec, message",
    [
        ("tests.handlers", 'Import string "tests.handlers" must be in format "<module>:<attribute>"'),
        ("tests.nosuch:H", 'Could not import module "tests.nosuch"'),
        ("tests.handlers:Nope", 'Attribute "Nope" not found in module "tests.handlers"'),
    ],
)
def test_a_handler_that_cannot_be_loaded_is_an_exact_error_and_exit_2(spec, message, tmp_path):
    result = run_serve("--handler", spec, "--port", "0", "--state-dir", str(tmp_path))
    assert result.returncode == 2
    assert message in result.stderr
    assert "Traceback" not in result.stderr


def test_unknown_config_key_is_named(tmp_path):
    cfg = tmp_path / "mld.toml"
    cfg.write_text('handler = "tests.handlers:Noop"\nexecution_timeot = 3\n')
    result = run_serve("--config", str(cfg))
    assert result.returncode == 2 and "unknown setting 'execution_timeot'" in result.stderr


def test_missing_handler_says_what_to_pass():
    result = run_serve("--port", "0")
    assert result.returncode == 2 and "--handler MODULE:ATTR" in result.stderr


async def test_logs_are_json_lines_and_sigterm_shuts_down_in_order(serve):
    server = serve("tests.handlers:CheckpointLast")
    daemon = FakeDaemon(f"{MLDSERVER} connect 127.0.0.1:{server.port}")
    shard = await daemon.shard("shardId-000000000003")
    await shard.process_records(make_records(1, 3))
    await shard.lease_lost()
    await shard.close()
    server.proc.send_signal(signal.SIGTERM)
    assert server.proc.wait(20) == 0
    events = server.events()
    assert all({"ts", "level", "event"} <= set(e) for e in events)
    listening = next(e for e in events if e["event"] == "listening")
    assert listening["host"] == "127.0.0.1" and listening["port"] == server.port
    shard_events = [e for e in events if e.get("shard_id") == "shardId-000000000003"]
    assert {"initialize", "lease_lost", "closed"} <= {e["event"] for e in shard_events}
    assert all("conn" in e for e in shard_events)
    names = [e["event"] for e in events]
    assert names.index("shutdown_requested") < names.index("shutting_down") < names.index("stopped")


async def test_serves_a_unix_socket(serve, tmp_path):
    path = tmp_path / "mld.sock"
    server = serve("tests.handlers:Noop", "--unix", str(path))
    daemon = FakeDaemon(f"{MLDSERVER} connect unix:{path}")
    shard = await daemon.shard("s")
    await shard.shard_ended()
    await shard.close()
    assert daemon.checkpoints["s"] == "SHARD_END"
    server.stop()
    assert not path.exists()


def test_console_log_format(tmp_path):
    proc = subprocess.Popen([MLDSERVER, "serve", "--handler", "tests.handlers:Noop", "--port", "0",
                             "--log-format", "console", "--state-dir", str(tmp_path)],
                            cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                            stderr=subprocess.PIPE, text=True)
    line = proc.stderr.readline()
    proc.send_signal(signal.SIGINT)
    proc.wait(20)
    proc.stderr.close()
    assert "listening" in line and "port=" in line
    with pytest.raises(json.JSONDecodeError):
        json.loads(line)
