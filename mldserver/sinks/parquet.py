"""The Spark sink (``--sink parquet:DIR``, the default when a pipeline is given):
each closed window goes through the user's pipeline in the Spark process and is
committed exactly once.

Here, on the server's side, a window's rows (JSON lines, in merged order) become an
Arrow table (``ahead.py``: each batch's rows parsed as they arrive, once the schema is
known, and put in merged order at the close; else ``schema.py``, pyarrow's JSON reader
on the window's buffer as it is, in a thread) written to
``<state-dir>/spark/windows/<id>.parquet`` (plain: no compression, no dictionaries, as
it is read once; Spark's own reader takes a 100,000-row window in less time than
``createDataFrame`` of the same Arrow table); the Spark process reads that file into a
DataFrame, runs the pipeline, publishes ``DIR/window=<id>/`` and appends
``DIR/_commits/<id>.json`` (``spark/commitlog.py``)::

    DIR/window=1763719200000-1763719260000/part-00000-....parquet
    DIR/_commits/1763719200000-1763719260000.json
    DIR/_schema.arrow                 # the inferred schema, fixed from then on

Readers (``spark.read.parquet(DIR)``, pyarrow datasets) skip names starting with
``_``. Rows that do not fit the schema are dead-lettered with the error
(``<state-dir>/dead-letters/rows.jsonl``) and the rest of the window goes on.

The coordinator says which window comes next (``prepare``, ``base/handoff.py``), when
several closed at once or one closes while another commits: its Arrow file is written,
in a thread, while the Spark process commits the window in front of it (the file is an
input, not output: nothing is published before its own commit, and commits stay one at
a time, in order). One file is written at a time: a window told while the one in front
is still being written begins once that one is with Spark::

    sink.prepare(w2)        # noted
    await sink.commit(w1)   # w1's file written; w2's begins; Spark commits w1
    await sink.commit(w2)   # w2's file is ready (or is awaited): Spark commits w2
    sink.prepare(w4)        # told while w3 is with Spark: w4's file begins at once
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pyarrow.parquet as pq

from ..base.config import Settings, state_path
from ..base.handoff import Committed, Window
from ..base.deadletters import DeadLetters
from ..base.durable import empty_dir
from ..base.logs import get_logger
from ..spark.commitlog import CommitLog
from .ahead import TablesAhead
from .schema import declared, load, save
from ..spark.frames import CommitRequest, window_frame
from ..spark.process import SparkProcess

log = get_logger("mldserver.sink")


class SparkSink:
    def __init__(self, settings: Settings, spark: SparkProcess, directory: Path, dead_letters: DeadLetters) -> None:
        self.spark = spark
        self.directory = directory
        self.dead_letters = dead_letters
        self.commit_log = CommitLog(directory)
        self.inputs = state_path(settings, "spark", "windows").resolve()  # the Spark process runs elsewhere
        self.schema_path = directory / "_schema.arrow"
        self.schema = declared(settings.schema)  # a ConfigError before the server binds
        self.rows_out = 0
        self.ahead = TablesAhead.of(settings)  # each batch's rows into Arrow as they arrive, once the schema is known
        self._next: Window | None = None  # prepare's window: its file is begun once the one in front is handed over
        self._with_spark = False  # a window's file is written and Spark commits it: the next file may begin
        self._inputs: dict[str, asyncio.Future[list[tuple[bytes, str]]]] = {}  # window id -> its file being written

    async def start(self) -> Committed:
        def prepare() -> Committed:
            empty_dir(self.inputs)
            if self.schema is None:
                self.schema = load(self.schema_path)
            return self.commit_log.read()

        return await asyncio.to_thread(prepare)

    def arrived(self, pieces: list) -> None:  # rows.RowBatch pieces, as the coordinator keeps them
        self.ahead.arrived(pieces, self.schema)

    def prepare(self, window: Window) -> None:
        """``window`` is committed after the one committing next (or now): its file is
        written while Spark commits that one."""
        if self._with_spark:
            self._begin(window)
        else:
            self._next = window

    async def commit(self, window: Window) -> None:
        started = time.perf_counter()
        path = self._input_path(window)
        written = self._inputs.pop(window.id, None)
        if written is None and not path.exists():  # a retry after a failed attempt reuses the file
            written = asyncio.ensure_future(asyncio.to_thread(self._write_input, window, path))
        if written is not None:
            rejected = await written
            if rejected:
                await self.dead_letters.rejected_rows(window.id, rejected, "row does not fit the schema", log)
        upcoming, self._next = self._next, None
        if upcoming is not None and upcoming is not window:
            self._begin(upcoming)  # now, not at prepare: two files written at once only slow this one down
        request: CommitRequest = {"op": "commit", "path": str(path), "window": window_frame(window)}
        handed_over = time.perf_counter()
        self._with_spark = True
        try:
            reply = await self.spark.request(request)
        finally:
            self._with_spark = False
        # input_ms: its file written, or waited for (near 0 when prepared ahead); spark_ms: the job and commit there
        log.debug("window_handed_over", window=window.id, input_ms=round((handed_over - started) * 1000, 1),
                  spark_ms=reply.get("spark_ms"))
        self.ahead.committed(window)
        await asyncio.to_thread(path.unlink, True)
        self.rows_out += reply.get("rows_out") or 0
        if reply.get("already"):
            log.info("window_already_committed", window=window.id)

    def _begin(self, window: Window) -> None:
        """Write ``window``'s file ahead of its commit, in a thread (once)."""
        if window.id in self._inputs:
            return
        ahead = asyncio.ensure_future(asyncio.to_thread(self._write_input, window, self._input_path(window)))
        # Its commit awaits it (and raises what it raised); if none comes (the server
        # stops first), a failure is not reported as never retrieved.
        ahead.add_done_callback(lambda f: f.cancelled() or f.exception())
        self._inputs[window.id] = ahead

    def _input_path(self, window: Window) -> Path:
        return self.inputs / f"{window.id}.parquet"

    def _write_input(self, window: Window, path: Path) -> list[tuple[bytes, str]]:
        table, rejected = self.ahead.rows_to_table(window.rows, self.schema)
        if self.schema is None:
            self.schema = table.schema
            save(table.schema, self.schema_path)
            log.info("schema_inferred", window=window.id, schema=str(table.schema).replace("\n", "; "))
        tmp = path.with_name(f"_{path.name}")
        # Read once, by Spark, then deleted: no compression, no dictionaries to build
        # (some 20 ms less a 100,000-row window, and Spark reads it no slower).
        pq.write_table(table, tmp, compression="none", use_dictionary=False)
        tmp.replace(path)
        return [(window.rows[i], error) for i, error in rejected]
