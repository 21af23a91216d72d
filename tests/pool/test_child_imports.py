"""A handler process loads only what it runs: the handler API, its frames, the timers'
handler-side API, and the user's module, never the server's side (the server, the
coordinator, the admin endpoint and its aiohttp, the metrics and prometheus_client,
Spark, Iceberg), whose modules would cost every process their memory and start-up."""

from __future__ import annotations

import json

from mldserver.api.testing import make_records

from ..harness import eventually, running
from .serving import MemorySink

SERVER_SIDE = ("mldserver.server", "mldserver.coordinator", "mldserver.shard.driver", "mldserver.ops",
               "mldserver.sinks", "mldserver.spark.process", "prometheus_client", "aiohttp", "pyspark",
               "pyiceberg")


def server_side(modules: list[str]) -> list[str]:
    return [m for m in modules if any(m == s or m.startswith(s + ".") for s in SERVER_SIDE)]


def test_the_check_finds_the_servers_side():
    assert server_side(["mldserver.server", "mldserver.server.admin", "aiohttp.web", "mldserver.api.records",
                        "mldserver.serverless"]) == ["mldserver.server", "mldserver.server.admin", "aiohttp.web"]


async def test_a_handler_process_loads_none_of_the_servers_side_after_a_batch(tmp_path, monkeypatch):
    report = tmp_path / "modules.json"
    monkeypatch.setenv("MLDSERVER_TEST_MODULES", str(report))
    async with running(tmp_path, "tests.handlers:ReportModules", workers=1, sink=MemorySink(),
                       window=60.0) as (server, _, daemon):
        shard = await daemon.shard("shardId-000000000001")
        await shard.process_records(make_records(1, 10))  # rows emitted: the columns and the frames used
        await eventually(report.exists, 30, what="the handler process's report")
        loaded = json.loads(report.read_text())
        assert loaded["pid"] in {p.pid for p in server.pool.processes}  # from a handler process
        assert "mldserver.pool.frames" in loaded["modules"] and "tests.handlers" in loaded["modules"]
        assert server_side(loaded["modules"]) == []
        await shard.close()
