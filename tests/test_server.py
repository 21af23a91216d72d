"""``mldserver serve`` as users run it: start-up errors, logs, signals, unix sockets."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import subprocess

import pytest

import mldserver
from mldserver.base.config import Settings
from mldserver.errors import ServerCrashed
from mldserver.server.server import Server
from mldserver.sinks.file import FileSink
from mldserver.api.testing import FakeDaemon, make_records

from .handlers import Noop
from .harness import MLDSERVER, ROOT, eventually, relay_command
from .helpers import FakeClock


def run_serve(*args, timeout=20):
    admin = [] if any(a.startswith("--admin") for a in args) else ["--admin", "127.0.0.1:0"]
    return subprocess.run([MLDSERVER, "serve", *args, *admin], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
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


def test_a_server_killed_by_a_fatal_signal_leaves_every_threads_stack_on_stderr(serve):
    """A crash in native code (a sink's, a library's) is a fatal signal: its stderr says
    where each thread was, which is all a crash report has to go on."""
    server = serve("tests.handlers:Noop")
    server.proc.send_signal(signal.SIGSEGV)
    assert server.proc.wait(20) == -signal.SIGSEGV
    said = server.stderr
    assert "Fatal Python error: Segmentation fault" in said
    assert "Current thread 0x" in said and "\nThread 0x" in said  # the loop's, and the trimmer's (pool/malloc.py)


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
    assert names.index("signal_received") < names.index("shutting_down") < names.index("stopped")
    assert next(e for e in events if e["event"] == "signal_received")["signal"] == "SIGTERM"


async def test_sighup_reloads_the_handler_and_the_server_keeps_serving(serve):
    server = serve("tests.handlers:CheckpointLast")
    server.proc.send_signal(signal.SIGHUP)
    await eventually(lambda: any(e["event"] == "reloaded" for e in server.events()), timeout=20,
                     what="the reload logged")
    daemon = FakeDaemon(f"{MLDSERVER} connect 127.0.0.1:{server.port}")
    shard = await daemon.shard("shardId-1")
    await shard.process_records(make_records(1, 3))
    await shard.shard_ended()
    assert await shard.close() == 0
    assert daemon.checkpoints["shardId-1"] == "SHARD_END"
    server.proc.send_signal(signal.SIGTERM)
    assert server.proc.wait(20) == 0
    events = server.events()
    names = [e["event"] for e in events]
    assert names.index("signal_received") < names.index("reloaded") < names.index("shutting_down")
    assert next(e for e in events if e["event"] == "signal_received")["signal"] == "SIGHUP"
    assert "stopped" in names


async def test_sighup_in_the_servers_own_loop_cannot_reload_and_says_so(serve):
    server = serve("tests.handlers:Noop", "--workers", "0")
    server.proc.send_signal(signal.SIGHUP)
    await eventually(lambda: any(e["event"] == "reload_skipped" for e in server.events()), timeout=20,
                     what="the skipped reload logged")
    assert server.proc.poll() is None
    server.proc.send_signal(signal.SIGTERM)
    assert server.proc.wait(20) == 0


class Emit(mldserver.Handler):
    async def process_records(self, batch, checkpointer):
        for record in batch.records:
            batch.emit(record, {"seq": record.sequence_number})


class BuggySink(FileSink):
    """A sink with a bug (not an I/O error) until ``fixed``."""

    fixed = False

    async def commit(self, window):
        if not self.fixed:
            raise TypeError(f"a bug in the sink, window {window.id}")
        await super().commit(window)


async def test_a_sink_that_keeps_failing_is_retried_turns_the_server_not_ready_and_once_fixed_commits(
    tmp_path, caplog, monkeypatch
):
    """Whatever the sink raises, the committer retries it with backoff; the server stays up,
    /readyz (``not_ready``) and /status say what fails; fixed, the window commits: nothing
    lost."""
    from mldserver.server import server as server_module
    from mldserver.server.admin import status_of

    monkeypatch.setattr(server_module, "SINK_UNREADY_AFTER", 0.5)
    caplog.set_level(logging.INFO, logger="mldserver")
    settings = Settings(handler="test", port=0, state_dir=str(tmp_path / "state"), window=60.0)
    clock = FakeClock(1476889707000 + 3_600_000)  # an hour after the records' time: their window closes
    sink = BuggySink(tmp_path / "out")
    server = Server(settings, Emit, clock=clock, sink=sink)
    serving = asyncio.ensure_future(server.serve())
    await eventually(lambda: server.address or serving.done(), what="the server listening")
    daemon = FakeDaemon(relay_command(server.address[1]))
    shard = await daemon.shard("shardId-1")
    await shard.process_records(make_records(10, 3), millis_behind_latest=0)
    await eventually(lambda: (server.not_ready() or "").startswith("the sink has failed window"), timeout=30,
                     what="/readyz not ready, the sink's error said")
    assert "TypeError: a bug in the sink" in server.not_ready() and server.unhealthy() is None  # alive
    failing = status_of(server)["coordinator"]["sink_failing"]
    assert failing["error"].startswith("TypeError: a bug in the sink") and failing["attempts"] >= 1
    sink.fixed = True
    await eventually(lambda: list((tmp_path / "out").glob("*.jsonl")), timeout=60, what="the window committed")
    await eventually(lambda: server.not_ready() is None, what="ready again")
    assert status_of(server)["coordinator"]["sink_failing"] is None
    await shard.close()
    server.stop()
    await asyncio.wait_for(serving, 30)
    names = [r.getMessage() for r in caplog.records if r.name.startswith("mldserver")]
    assert "task_crashed" not in names and "sink_commit_failed" in names and "sink_recovered" in names
    rows = [line for path in (tmp_path / "out").glob("*.jsonl") for line in path.read_text().splitlines()]
    assert len(rows) == 3


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


async def test_shutdown_removes_only_the_unix_socket_it_bound(tmp_path):
    path = tmp_path / "mld.sock"
    server = Server(Settings(handler="test", unix=str(path), state_dir=str(tmp_path / "state")), Noop)
    await server.start()
    assert path.is_socket()
    path.unlink()
    path.write_text("put here since\n")
    await server.shutdown()
    assert path.read_text() == "put here since\n"


def test_console_log_format(tmp_path):
    proc = subprocess.Popen([MLDSERVER, "serve", "--handler", "tests.handlers:Noop", "--port", "0",
                             "--log-format", "console", "--state-dir", str(tmp_path), "--admin", "127.0.0.1:0"],
                            cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                            stderr=subprocess.PIPE, text=True)
    line = proc.stderr.readline()
    proc.send_signal(signal.SIGINT)
    proc.wait(20)
    proc.stderr.close()
    assert "listening" in line and "port=" in line
    with pytest.raises(json.JSONDecodeError):
        json.loads(line)
