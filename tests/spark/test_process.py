"""The Spark process seen from the server: SQL through ``context.sql`` (named
parameters bound by Spark, rows streamed as the caller iterates, nothing run before
the first row is asked for), on a real embedded Spark session."""

from __future__ import annotations

import pytest
import pytest_asyncio

from mldserver.base.config import Settings
from mldserver.api.context import Context
from mldserver.errors import ConfigError
from mldserver.spark.process import SparkError, SparkProcess

from ..harness import eventually

pytestmark = [pytest.mark.spark, pytest.mark.asyncio(loop_scope="module")]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def context(tmp_path_factory):
    state = tmp_path_factory.mktemp("state")
    spark = SparkProcess(Settings(handler="x:y", state_dir=str(state)))
    await spark.start()
    yield Context(spark.settings, spark=spark)
    await spark.stop()


async def test_sql_binds_named_parameters_as_values_never_as_text(context):
    sneaky = "x' OR '1'='1"
    rows = [row async for row in await context.sql("SELECT :name AS name, :n + 1 AS m", name=sneaky, n=2)]
    assert rows == [{"name": sneaky, "m": 3}]


async def test_rows_stream_through_every_partition_when_read_to_the_end(context):
    rows = await context.sql("SELECT id FROM range(0, 5000, 1, 20) WHERE id >= :low", low=10)
    ids = [row["id"] async for row in rows]
    assert ids == list(range(10, 5000))
    assert context.spark.last_sql_jobs >= 20  # one Spark job per partition, fetched in turn


async def test_leaving_the_loop_early_stops_spark_computing_partitions(context):
    context.spark.last_sql_jobs = None
    async for row in await context.sql("SELECT id FROM range(0, 5000, 1, 20) WHERE id >= :low", low=10):
        assert row == {"id": 10}
        break
    # The abandoned iterator is closed by the loop, soon after.
    await eventually(lambda: context.spark.last_sql_jobs is not None, timeout=5, what="the cursor closed")
    assert context.spark.last_sql_jobs <= 2


async def test_a_statement_never_iterated_is_not_run(context):
    create = "CREATE OR REPLACE TEMPORARY VIEW never_run AS SELECT :k AS k"  # runs the moment Spark sees it
    rows = await context.sql(create, k=1)
    del rows  # never iterated
    with pytest.raises(SparkError, match="never_run"):  # so the view does not exist
        async for _ in await context.sql("SELECT k FROM never_run"):
            pass
    async for _ in await context.sql(create, k=1):  # iterated, the same statement creates it
        pass
    assert [row async for row in await context.sql("SELECT k FROM never_run")] == [{"k": 1}]


async def test_sql_without_spark_says_how_to_get_it():
    with pytest.raises(ConfigError, match="--pipeline"):
        await Context(Settings(handler="x:y")).sql("SELECT 1")
