"""``context.sql`` from a handler process: the query travels to the server, which asks
its Spark process, and the rows come back as the handler iterates."""

from __future__ import annotations

import pytest

from ..harness import eventually, running
from .serving import drive, expected, pooled, seen

pytestmark = pytest.mark.spark


async def test_context_sql_from_a_handler_process_reaches_the_servers_spark(tmp_path):
    async with running(tmp_path, **pooled("Sql", workers=1, spark_master="local[1]", spark_start_timeout=300.0)) as (
            server, sink, daemon):
        shards = await drive(daemon, 2, 1)
        want = expected(2, 1)
        await eventually(lambda: seen(sink) >= want, timeout=60, what="the rows in the sink")
        # the loop left early (three rows of 100,000): its cursor closed as the call ended,
        # not kept until the connection ends (nor found by a later call of another process)
        open_cursors = [key for driver in server.drivers.values() for key in driver.calls._cursors]
        assert open_cursors == []
        for shard in shards:
            await shard.shard_ended()
            assert await shard.close() == 0
    assert {(r["m"], r["s"], tuple(r["first"])) for r in sink.rows} == {(6, "x' OR '1'='1", (0, 1, 2))}
