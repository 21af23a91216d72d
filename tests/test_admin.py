"""The admin endpoint against a running server: /metrics counts what happened in a
fake-daemon run (parsed with prometheus_client's own parser), /healthz and /readyz
follow the server's tasks and its Spark process, wrong paths and methods are named,
and pause holds every shard's next handler call until resume, losing nothing."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

import mldserver
from mldserver.base.config import Settings
from mldserver.errors import ConfigError, ServerCrashed
from mldserver.server.server import Server
from mldserver.sinks.file import FileSink
from mldserver.api.testing import FakeDaemon, make_records

from .harness import eventually, relay_command
from .helpers import FakeClock

RECORD_TIME = 1476889707000  # make_records' arrival time
POISON, SLOW = b"poison", b"slow"


class Recorded(mldserver.Handler):
    """One row per record; fails on a poisoned record, outlives execution_timeout on a
    slow one; every call's start goes to ``CALLS`` (shard, first sequence number, time)."""

    CALLS: list[tuple[str, str | None, float]] = []

    async def initialize(self, shard):
        self.shard_id = shard.shard_id

    async def process_records(self, batch, checkpointer):
        Recorded.CALLS.append((self.shard_id, batch.records[0].sequence_number if batch.records else None,
                               time.monotonic()))
        for record in batch.records:
            if record.data == POISON:
                raise ValueError("poisoned record")
            if record.data == SLOW:
                await asyncio.sleep(30)
            batch.emit(record, {"shard": self.shard_id, "seq": record.sequence_number})


def settings(tmp_path, **extra) -> Settings:
    return Settings(**{"handler": "test", "port": 0, "admin": "127.0.0.1:0", "state_dir": str(tmp_path / "state"),
                       "window": 60.0, "handler_retries": 0, "execution_timeout": 0.5, "checkpoint_interval": 0.0,
                       **extra})


async def started(server: Server) -> asyncio.Future:
    serving = asyncio.ensure_future(server.serve())
    await eventually(lambda: server.address or serving.done(), timeout=30, what="the server listening")
    return serving


def url(server: Server, path: str) -> str:
    host, port = server.admin.bound
    return f"http://{host}:{port}{path}"


async def get(server: Server, path: str, method: str = "GET") -> tuple[int, str]:
    async with aiohttp.ClientSession() as session:
        async with session.request(method, url(server, path)) as resp:
            return resp.status, await resp.text()


async def scrape(server: Server) -> dict[tuple[str, tuple], float]:
    """Every sample: (name, sorted labels) -> value, as Prometheus would read them."""
    status, text = await get(server, "/metrics")
    assert status == 200
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def data(payload: bytes):
    return lambda seq: payload


async def test_metrics_count_records_dead_letters_timeouts_and_windows_of_a_fake_daemon_run(tmp_path):
    clock = FakeClock(RECORD_TIME + 3_600_000)  # an hour later: caught up, the records' window closes
    server = Server(settings(tmp_path), Recorded, clock=clock, sink=FileSink(tmp_path / "out"))
    serving = await started(server)
    daemon = FakeDaemon(relay_command(server.address[1]))
    shard = await daemon.shard("shardId-000000000001")
    other = await daemon.shard("shardId-000000000002")
    await shard.process_records(make_records(100, 10), millis_behind_latest=5000)
    await shard.process_records(make_records(110, 4, data=data(POISON)), millis_behind_latest=4000)
    await shard.process_records(make_records(114, 1, data=data(SLOW)), millis_behind_latest=3000)
    await shard.process_records(make_records(115, 5), millis_behind_latest=0)
    await other.process_records(make_records(500, 7), millis_behind_latest=0)

    await eventually(lambda: server.coordinator.committer.windows_committed >= 1, timeout=20, what="the window committed")
    m = await scrape(server)
    one, two = (("shard_id", "shardId-000000000001"),), (("shard_id", "shardId-000000000002"),)
    assert m["mldserver_records_total", one] == 20 and m["mldserver_records_total", two] == 7
    assert m["mldserver_batches_total", one] == 4 and m["mldserver_batches_total", two] == 1
    calls = {(dict(k)["callback"], dict(k)["outcome"]): v for (n, k), v in m.items()
             if n == "mldserver_handler_calls_total"}
    assert calls[("process_records", "success")] == 3
    assert calls[("process_records", "failure")] == 1 + 6  # the poisoned batch, then its bisection's halves
    assert calls[("process_records", "timeout")] == 1
    assert calls[("initialize", "success")] == 2
    assert m["mldserver_handler_call_duration_seconds_count", (("callback", "process_records"),)] == 5 + 6
    assert m["mldserver_dead_letters_total", (("kind", "record_failed"),)] == 5  # 4 poisoned + the slow one
    assert m["mldserver_windows_committed_total", ()] == server.coordinator.committer.windows_committed
    assert m["mldserver_rows_committed_total", ()] == 10 + 5 + 7
    assert m["mldserver_window_commit_duration_seconds_count", ()] == server.coordinator.committer.windows_committed
    assert m["mldserver_late_rows_total", ()] == 0
    assert m["mldserver_millis_behind_latest", one] == 0
    assert m["mldserver_connected_shards", ()] == 2
    assert m["mldserver_handler_process_restarts_total", ()] == 0
    assert m["mldserver_event_loop_lag_seconds_count", ()] > 0
    assert ("mldserver_buffered_rows", ()) in m and ("mldserver_watermark_lag_seconds", ()) in m
    await other.process_records([], millis_behind_latest=0)  # its next action checkpoints what committed
    assert daemon.checkpoints.get("shardId-000000000002") == ("506", 0)
    m = await scrape(server)
    assert m["mldserver_checkpoints_total", (("outcome", "stored"),)] >= 1

    status, text = await get(server, "/status")
    assert status == 200 and '"shard_id":"shardId-000000000001"' in text
    for s in (shard, other):
        await s.close()
    server.stop()
    await asyncio.wait_for(serving, 30)


@pytest.mark.parametrize("workers", [2, 0])
async def test_status_names_the_handler_process_that_holds_each_shard(tmp_path, workers):
    server = Server(settings(tmp_path, handler="tests.handlers:Noop", workers=workers))
    serving = await started(server)
    daemon = FakeDaemon(relay_command(server.address[1]))
    shards = [await daemon.shard(f"shardId-00000000000{i}") for i in (1, 2)]
    try:
        for shard in shards:
            await shard.process_records(make_records(1, 3))
        status, text = await get(server, "/status")
        assert status == 200
        got = {s["shard_id"]: s for s in json.loads(text)["shards"]}
        assert sorted(got) == ["shardId-000000000001", "shardId-000000000002"]
        assert all(s["batches"] == 1 and s["records"] == 3 for s in got.values())
        if workers:
            live = {p.pid for p in server.pool.processes if p.alive}
            for shard_id, s in got.items():
                holder = next(p for p in server.pool.processes if shard_id in server.pool.shards_of(p).values())
                assert s["handler_process"] == holder.pid and holder.pid in live
                os.kill(holder.pid, 0)  # a process that runs
        else:  # in the server's own loop: no handler process
            assert [s["handler_process"] for s in got.values()] == [None, None]
    finally:
        for shard in shards:
            await shard.close()
        server.stop()
        await asyncio.wait_for(serving, 30)


async def test_healthz_turns_503_naming_the_coordinator_task_that_died(tmp_path):
    # A shard inside a slow handler call keeps the shutdown (and so the endpoint) going
    # for execution_timeout after the crash: long enough to ask.
    server = Server(settings(tmp_path, execution_timeout=10.0), Recorded, sink=FileSink(tmp_path / "out"))
    serving = await started(server)
    assert await get(server, "/healthz") == (200, "ok\n")
    assert (await get(server, "/readyz"))[0] == 200
    daemon = FakeDaemon(relay_command(server.address[1]))
    shard = await daemon.shard("shardId-000000000001")
    busy = asyncio.ensure_future(shard.process_records(make_records(1, 1, data=data(SLOW))))
    await eventually(lambda: any(d.calls.running for d in server.drivers.values()), what="the slow call")
    committer = next(t for t in server.coordinator.tasks if t.get_name() == "coordinator-committer")
    committer.cancel()  # the task dies (as on a bug): the server logs task_crashed and shuts down
    await eventually(lambda: server.crashed, what="the crash noticed")
    status, text = await get(server, "/healthz")
    assert status == 503 and "coordinator-committer" in text
    assert (await get(server, "/readyz"))[0] == 503
    with pytest.raises(ServerCrashed):
        await asyncio.wait_for(serving, 30)
    await busy
    await shard.close()


@pytest.mark.spark
async def test_readyz_is_503_until_the_spark_process_is_up(tmp_path):
    server = Server(settings(tmp_path, sink=f"parquet:{tmp_path / 'out'}"), Recorded)
    serving = asyncio.ensure_future(server.serve())
    await eventually(lambda: server.admin.bound or serving.done(), timeout=30, what="the admin endpoint bound")
    status, text = await get(server, "/readyz")
    assert status == 503 and "Spark process is starting" in text
    assert (await get(server, "/healthz"))[0] == 200  # alive, not ready
    await eventually(lambda: server.address, timeout=240, what="Spark up and the server listening")
    assert await get(server, "/readyz") == (200, "ready\n")
    status, text = await get(server, "/status")
    assert '"spark":{"state":"up","restarts":0,"last_error":null,"executors":null,"executors_lost":0}' in text
    server.stop()
    await asyncio.wait_for(serving, 60)


async def test_a_wrong_path_or_method_is_named_with_what_exists(tmp_path):
    server = Server(settings(tmp_path), Recorded)
    serving = await started(server)
    status, text = await get(server, "/nosuch", "POST")
    assert status == 404 and "POST /nosuch: no such path" in text and "POST /pause, /resume, /reload" in text
    status, text = await get(server, "/")  # what exists, from the root
    assert status == 200 and set(json.loads(text)["endpoints"]) == {
        "GET /metrics", "GET /healthz", "GET /readyz", "GET /status", "POST /pause", "POST /resume", "POST /reload",
        "POST /redrive"}
    status, text = await get(server, "/pause")
    assert status == 405 and "GET /pause: use POST /pause" in text
    status, text = await get(server, "/reload", "POST")
    assert status == 409 and "--workers 0" in text  # a factory object runs in the server's loop
    server.stop()
    await asyncio.wait_for(serving, 30)


async def test_an_admin_port_in_use_is_a_config_error_naming_admin(tmp_path):
    first = Server(settings(tmp_path), Recorded)
    serving = await started(first)
    host, port = first.admin.bound
    second = Server(settings(tmp_path, admin=f"{host}:{port}"), Recorded)
    with pytest.raises(ConfigError, match=rf"--admin {host}:{port}: {host}:{port} is already in use"):
        await second.serve()
    first.stop()
    await asyncio.wait_for(serving, 30)


def test_a_malformed_admin_address_is_a_config_error():
    with pytest.raises(ConfigError, match="--admin 7071: use HOST:PORT"):
        Server(Settings(handler="test", admin="7071"), Recorded)
    assert Server(Settings(handler="test", admin="off"), Recorded).admin is None


def test_with_the_endpoint_off_aiohttp_is_never_imported(tmp_path):
    """aiohttp (some 20 MiB of the server's memory) only where the endpoint is on."""
    probe = ("import sys; from mldserver.base.config import Settings; from mldserver.server.server import Server; "
             "from tests.handlers import Noop; Server(Settings(handler='test', admin=sys.argv[1]), Noop); "
             "print('aiohttp' in sys.modules)")
    for admin, imported in (("off", "False"), ("OFF ", "False"), ("127.0.0.1:0", "True")):
        out = subprocess.run([sys.executable, "-c", probe, admin], capture_output=True, text=True, timeout=60,
                             cwd=Path(__file__).parent.parent)
        assert out.stdout.strip() == imported, (admin, out.stderr)


async def test_pause_holds_every_shards_next_handler_call_and_resume_loses_nothing(tmp_path):
    Recorded.CALLS = []
    clock = FakeClock(RECORD_TIME + 3_600_000)
    server = Server(settings(tmp_path), Recorded, clock=clock, sink=FileSink(tmp_path / "out"))
    serving = await started(server)
    daemon = FakeDaemon(relay_command(server.address[1]))
    ids = [f"shardId-00000000000{i}" for i in range(4)]
    shards = [await daemon.shard(i) for i in ids]
    firsts = {i: 1000 * (n + 1) for n, i in enumerate(ids)}

    # Before the pause: one batch a shard, caught up, so its window closes and commits.
    await asyncio.gather(*(s.process_records(make_records(firsts[s.shard_id], 5), millis_behind_latest=0)
                           for s in shards))
    assert (await get(server, "/pause", "POST"))[0] == 200
    paused_at = time.monotonic()
    # During: each shard's next batch arrives and waits; the windows closed before commit
    # and every shard checkpoints them (the daemon's checkpoints advance while paused).
    later = RECORD_TIME + 120_000  # the next windows: they close once these arrive
    during = [asyncio.ensure_future(s.process_records(
        make_records(firsts[s.shard_id] + 5, 5, approximate_arrival_timestamp=later), millis_behind_latest=0))
        for s in shards]
    await eventually(lambda: server.pause_gate.waiting == 4, what="4 actions held at the gate")
    await eventually(lambda: all(daemon.checkpoints.get(i) == (str(firsts[i] + 4), 0) for i in ids),
                     timeout=15, what="the windows closed before the pause committed and checkpointed")
    assert not any(d.done() for d in during)
    _, text = await get(server, "/status")
    assert '"paused":true' in text and '"waiting_actions":4' in text
    resumed_at = time.monotonic()  # (handler calls may start before the answer arrives)
    assert (await get(server, "/resume", "POST"))[0] == 200
    await asyncio.gather(*during)

    assert not [c for c in Recorded.CALLS if paused_at < c[2] < resumed_at]  # no handler call while paused
    seen = sorted((shard, seq) for shard, seq, _ in Recorded.CALLS)
    assert seen == sorted((i, str(firsts[i] + k)) for i in ids for k in (0, 5))  # each batch once
    await eventually(lambda: server.coordinator.committer.rows_committed == 40, timeout=15, what="every row committed")
    await asyncio.gather(*(s.process_records([], millis_behind_latest=0) for s in shards))  # their checkpoints
    assert all(daemon.checkpoints.get(i) == (str(firsts[i] + 9), 0) for i in ids)
    rows = [json.loads(line) for p in sorted((tmp_path / "out").glob("*.jsonl")) for line in p.read_text().splitlines()]
    assert sorted((r["shard"], r["seq"]) for r in rows) == sorted(
        (i, str(firsts[i] + k)) for i in ids for k in range(10))  # every record once in the sink
    for s in shards:
        await s.close()
    server.stop()
    await asyncio.wait_for(serving, 30)


def test_serve_with_its_admin_port_in_use_is_one_line_and_exit_2(tmp_path):
    import socket
    import subprocess

    from .harness import MLDSERVER, ROOT

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        result = subprocess.run(
            [MLDSERVER, "serve", "--handler", "tests.handlers:Noop", "--port", "0", "--state-dir", str(tmp_path),
             "--admin", f"127.0.0.1:{port}"],
            cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert result.returncode == 2
    assert result.stderr.splitlines()[-1] + "\n" == (f"mldserver: --admin 127.0.0.1:{port}: 127.0.0.1:{port} is already in use: stop what "
                             f"listens there, or choose another --admin HOST:PORT (port 0 picks one; off disables)\n")
    assert "Traceback" not in result.stderr
