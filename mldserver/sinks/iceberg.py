"""The table sink (``--sink iceberg:DIR``): every server's windows committed into one
Apache Iceberg table, exactly once, however the shards' leases move between servers.

One machine: a SQLite catalog (``DIR/catalog.db``) and the table's files under DIR.
Many machines: any pyiceberg catalog (REST, Glue, DynamoDB), named in the config::

    # mldserver.toml
    sink = "iceberg:/data/lake"          # the warehouse, when the catalog names none
    stream = "orders"                    # the key of every position: the same on every server
                                         # (with --source: the source's text, dynamodb:orders, by default)
    table = "mldserver.windows"          # NAMESPACE.NAME
    [table_catalog]                      # pyiceberg's catalog properties; default SQLite in DIR
    type = "rest"
    uri = "https://catalog.example.com"

A REST catalog (``rest_catalog``) decides where tables go: it is sent its own
``warehouse`` (a catalog's name in Polaris or Lakekeeper), never DIR, and its only
compare-and-swap is ``assert-ref-snapshot-id`` (step 3 below).

The table holds the rows (the handler's fields, as the ``parquet:`` sink writes them)
plus ``window`` (``"<start>-<end>"``, the window the rows were committed with, as the
``parquet:`` sink's ``window=<id>`` folder; with ``allowed_lateness``, a late row within it
is in its own window: a later snapshot amends that window with it, ``window_ids``). Each commit is one Iceberg snapshot, made
by one transaction that appends the window's rows and raises, in the table's own
properties, the committed intervals and the highest committed position of each of
its shards, and the last window the committing server committed::

    mldserver.intervals/orders/shardId-000000000001 = [[["4959...8000", 1], ["4959...8898", 0]]]
    mldserver.position/orders/shardId-000000000001 = ["49590338271490256608559692538361571095921575989136588898", 0]
    mldserver.server/worker-1 = {"stream": "orders", "window": "1763719200000-1763719260000", "end": 1763719260000}

The intervals (``base.intervals``, each [low, high], low ``null`` for minus infinity) say
which positions are committed: each reading of the shard covers from where it started
(just above its initialize checkpoint, or its first record) to the highest position
its commits reach (``Window.claims``), so rows below where a reading started, which no
reading had, are not taken for committed however high the position is. The position
is the highest interval's end, as before; a table written before intervals has only
it, read as one interval: everything at or below it.

and whose snapshot summary names it: ``mldserver.server`` (``server_id``, default the
host's name and a digest of the state dir: ``server_id``), ``mldserver.stream``, ``mldserver.window``, ``mldserver.rows``,
``mldserver.late-rows``, ``mldserver.amended-rows``, ``mldserver.skipped-rows`` (already committed by another
server), ``mldserver.positions``.

**Reading a position back** (``committed_position``, each time a shard is initialized
here) is one catalog lookup and one read of the table's current metadata file: no
data file, no manifest, and not the snapshots before it. The metadata stays small
however many windows were committed: a commit expires all but the last
``table_snapshots_kept`` snapshots once there are twice as many (time travel reaches
that far back), and keeps ``previous-versions-max`` metadata files.

**The commit protocol**, one window, retried until it commits:

1. load the table (its current metadata: the base of this attempt);
2. leave out each row inside its shard's committed intervals in the base's properties:
   another server committed it (a lease that moved; a retry of a commit that landed);
3. append the rest and set the grown intervals and raised positions, in one transaction whose commit is a
   compare-and-swap on the catalog's pointer to the metadata (the SQLite catalog's
   ``UPDATE ... WHERE metadata_location = <base>``; the REST catalog's
   ``assert-ref-snapshot-id``, which is why every commit makes a snapshot, an empty
   one when only positions move). pyiceberg's own retry, which would re-apply the same
   positions and rows on a newer base, is switched off (``commit.retry.num-retries=0``);
4. a conflict (another server committed first) goes back to 1 with the new base.

So no row is added twice: a row lands only in a commit whose base says no interval
of its shard holds it, and that commit's intervals hold it (a row outside the claim
[start, position] of its window is one committed already: the claim starts at or
below every row this server read of the shard since the start). A crash
between writing data files and committing them leaves files no snapshot names
(invisible to readers; table maintenance removes them: ``maintenance.py``);
the retry writes its own. A commit that landed although its caller never heard
(a crash just after) is found in step 2: nothing left to add.

Without a pipeline the server parses the window's rows into Arrow (``window_table``)
and pyiceberg writes and commits them: no Spark. With ``--pipeline``, the Spark
process runs the pipeline on the window's remaining rows and writes the output files
(``op: write``) where the table keeps its data; pyiceberg then commits those very
files (``add_files``, no second copy). On object storage (``s3://``) Spark writes them
under the state dir and the sink copies them into the table's storage with the
catalog's FileIO first (``_upload``): Spark needs no S3 client. All of it runs in a thread: pyiceberg blocks.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import random
import socket
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from ..base.config import Settings, positions_stream, state_path
from ..base.durable import empty_dir
from ..base.handoff import Committed, Window
from ..base.intervals import Intervals, covers, from_json, to_json, top, union
from ..errors import ConfigError, MldserverError
from ..base.logs import get_logger
from ..base.positions import Position
from ..base.secrets import redacted, scrub
from .ahead import TablesAhead
from .schema import declared, rows_to_table
from ..spark.frames import WriteRequest

if TYPE_CHECKING:
    from .maintenance import Report
    from pyiceberg.catalog import Catalog
    from pyiceberg.table import Table

    from ..base.deadletters import DeadLetters
    from ..spark.process import SparkProcess

log = get_logger("mldserver.sink")

WINDOW_COLUMN = "window"
POSITION_PREFIX = "mldserver.position/"
INTERVALS_PREFIX = "mldserver.intervals/"
SERVER_PREFIX = "mldserver.server/"
CONFLICT_RETRIES = 8  # attempts inside one commit before the coordinator's backoff takes over
TABLE_PROPERTIES = {
    "format-version": "2",
    "commit.retry.num-retries": "0",  # a conflict is ours to redo (filter again), never pyiceberg's
    "commit.manifest-merge.enabled": "true",  # a manifest per commit would grow every scan
    "write.metadata.delete-after-commit.enabled": "true",
    "write.metadata.previous-versions-max": "16",
}


class TableConflict(MldserverError):
    """Other servers kept committing first, ``CONFLICT_RETRIES`` times in a row: the
    coordinator offers the window again after a backoff."""

    retriable = True


class TableUnavailable(MldserverError):
    """The catalog or the table's storage failed (a locked SQLite file, a REST error):
    retried like any sink I/O."""

    retriable = True


def position_key(stream: str, shard_id: str) -> str:
    """The table property holding a shard's highest committed position. Shard ids
    repeat across streams (``shardId-000000000000`` is in every Kinesis stream)."""
    return f"{POSITION_PREFIX}{stream}/{shard_id}"


def read_position(properties: dict[str, str], stream: str, shard_id: str) -> Position | None:
    value = properties.get(position_key(stream, shard_id))
    return None if value is None else Position.from_json(orjson.loads(value))


def intervals_key(stream: str, shard_id: str) -> str:
    """The table property holding a shard's committed intervals (``base.intervals``)."""
    return f"{INTERVALS_PREFIX}{stream}/{shard_id}"


def read_intervals(properties: dict[str, str], stream: str, shard_id: str) -> Intervals:
    """A shard's committed intervals; a table written before them (or raised since by
    a server that knows none: its position above them): everything at or below its
    position."""
    value = properties.get(intervals_key(stream, shard_id))
    position = read_position(properties, stream, shard_id)
    intervals = () if value is None else from_json(orjson.loads(value))
    if position is not None and (not intervals or position > intervals[-1][1]):
        return ((None, position),)
    return intervals


def window_table(window: Window, schema: pa.Schema | None,
                 ahead: TablesAhead | None = None) -> tuple[pa.Table, list[int], list[tuple[bytes, str]]]:
    """The one place this sink reads a window's rows: them as Arrow (with the ``window``
    column), the index in ``window.rows`` of each table row, and the rows that do not
    fit ``schema`` with the reason (None: inferred from the rows). ``ahead``: the rows'
    tables made as they arrived, where it has them."""
    table, rejected = (ahead.rows_to_table if ahead is not None else rows_to_table)(window.rows, schema)
    if rejected:
        out = {i for i, _ in rejected}
        indices = [i for i in range(len(window.rows)) if i not in out]
    else:
        indices = list(range(len(window.rows)))
    ids = window_ids(window)
    table = table.append_column(WINDOW_COLUMN, pa.array([ids[i] for i in indices] if ids else [window.id] * len(indices),
                                                        pa.string()))
    return table, indices, [(window.rows[i], error) for i, error in rejected]


def window_ids(window: Window) -> list[str] | None:
    """Each row's window where some rows amend earlier windows (``Window.amends``: with
    ``allowed_lateness``, they follow the late rows); None when every row is the
    window's own."""
    if not window.amends:
        return None
    ids = [window.id] * window.late_rows
    for amended, count in window.amends:
        ids.extend([amended] * count)
    return ids + [window.id] * (len(window) - len(ids))


def fresh_rows(window: Window, committed: dict[str, Intervals]) -> list[bool] | None:
    """Per row of the window: is it outside its shard's committed intervals
    (``committed``)? None when every row is above them all (the usual case: each
    shard's first row is above its highest; a shard's rows are in its order, so its
    first is its lowest)::

        fresh_rows(window, {"s0": ((None, Position(7, 0, "7")),)})   # [False, True, True] for s0 at 6, 8, 9
        fresh_rows(window, {"s0": ((Position(7, 1, "7"), Position(8, 0, "8")),)})   # [True, False, True]
    """
    if not committed:
        return None
    if window.sources is None:
        raise TypeError("the table sink needs window.sources (each row's shard and position)")
    sources = list(window.sources)
    first = dict(reversed(sources))  # the last write wins: each shard's first row
    if not any(intervals[-1][1] >= first[s] for s, intervals in committed.items() if intervals and s in first):
        return None
    return [(intervals := committed.get(s)) is None or not covers(intervals, p) for s, p in sources]


@dataclass
class Attempt:
    """One try at committing a window: the base it read and what it decided."""

    base: "Table | None"  # None: the table does not exist yet
    keep: list[bool] | None  # per row of the window (None: all)
    kept_rows: int
    raised: dict[str, Intervals] = field(default_factory=dict)  # shard -> its intervals to set (grown)
    rejected: list[tuple[bytes, str]] = field(default_factory=list)  # rows parsed now that do not fit


class IcebergSink:
    def __init__(
        self,
        settings: Settings,
        directory: Path | None,
        dead_letters: "DeadLetters",
        *,
        spark: "SparkProcess | None" = None,
        catalog: "Catalog | None" = None,
    ) -> None:
        stream = positions_stream(settings)
        assert stream, "config.load refuses an iceberg sink without a stream or a source"
        self.settings = settings
        self.directory = directory
        self.dead_letters = dead_letters
        self.spark = spark if settings.pipeline else None
        self.stream = stream
        self.server_id = server_id(settings)
        namespace, _, name = settings.table.rpartition(".")
        self.identifier = (namespace, name)
        self.catalog = catalog
        self.row_schema = declared(settings.schema)  # a ConfigError before the server binds
        self.inputs = state_path(settings, "spark", "windows").resolve()
        self.conflicts = 0
        self.rows_out = 0
        self._maintained_at = time.monotonic()  # the first maintenance one interval after the start
        self._maintaining: asyncio.Future | None = None
        # the window being committed, parsed with this schema: its Arrow rows, their indices
        self._prepared: tuple[str, pa.Schema | None, pa.Table, list[int]] | None = None
        self.ahead = TablesAhead.of(settings)  # rows into Arrow as they arrive, once the schema is known

    # -- the Sink protocol -------------------------------------------------------------

    async def start(self) -> Committed:
        try:
            await asyncio.to_thread(self._start)
        except Exception as exc:  # before the server binds: one line, exit 2
            raise ConfigError(
                f"--sink {self.settings.sink}: cannot open the table {'.'.join(self.identifier)} "
                f"(catalog {catalog_text(self.settings, self.directory)}): {said(exc)}; "
                f"check the folder (writable?) or table_catalog"
            ) from exc
        return Committed()  # positions are read per shard, when it is initialized here

    def arrived(self, pieces: list) -> None:  # rows.RowBatch pieces, as the coordinator keeps them
        self.ahead.arrived(pieces, self.row_schema)

    async def committed_position(self, shard_id: str) -> Position | None:
        return top(await self.committed_intervals(shard_id))

    async def committed_intervals(self, shard_id: str) -> Intervals:
        return await asyncio.to_thread(self._committed_intervals, shard_id)

    async def commit(self, window: Window) -> None:
        for attempt_number in range(CONFLICT_RETRIES):
            attempt = await asyncio.to_thread(self._attempt, window)
            if attempt.rejected:
                await self._reject(window, attempt.rejected)
            if attempt.kept_rows == 0 and not attempt.raised:
                log.info("window_already_committed", window=window.id, rows=len(window))
                break
            spark = self.spark is not None and attempt.kept_rows > 0
            files = await self._spark_files(window, attempt) if spark else None
            if await asyncio.to_thread(self._finish, window, attempt, files):
                break
            self.conflicts += 1
            log.info("table_commit_conflict", window=window.id, attempt=attempt_number + 1)
            await asyncio.sleep(random.uniform(0.01, 0.05) * (attempt_number + 1))
        else:
            raise TableConflict(f"window {window.id}: {CONFLICT_RETRIES} commits in a row lost to other servers")
        self._prepared = None
        self.ahead.committed(window)
        self._maybe_maintain()

    def _maybe_maintain(self) -> None:
        """Every ``table_maintenance_interval`` seconds (after a commit), maintenance in a
        thread (``maintenance.py``), one at a time; a failure is logged, never raised."""
        interval = self.settings.table_maintenance_interval
        if not interval or time.monotonic() - self._maintained_at < interval:
            return
        if self._maintaining is not None and not self._maintaining.done():
            return
        self._maintained_at = time.monotonic()
        self._maintaining = asyncio.ensure_future(asyncio.to_thread(self.maintain))
        self._maintaining.add_done_callback(lambda f: f.cancelled() or f.exception())

    def maintain(self, dry_run: bool = False) -> "Report | None":
        """Maintenance of the table now (in a thread): logged ``table_maintained``, or
        ``table_maintenance_failed`` and None."""
        from .maintenance import maintain

        started = time.perf_counter()
        name = ".".join(self.identifier)
        try:
            table = self._load(self._catalog())
            if table is None:
                return None
            report = maintain(table, keep=self.settings.table_snapshots_kept,
                                          older_than=self.settings.table_orphan_age, dry_run=dry_run)
        except Exception as exc:
            log.warning("table_maintenance_failed", table=name, error=said(exc))
            return None
        log.info("table_maintained", table=name, expired=report.expired, orphans=report.orphans,
                 orphan_bytes=report.orphan_bytes, young=report.young, dry_run=dry_run,
                 duration_ms=round((time.perf_counter() - started) * 1000, 1))
        return report

    async def _reject(self, window: Window, rejected: list[tuple[bytes, str]]) -> None:
        await self.dead_letters.rejected_rows(window.id, rejected, "row does not fit the table's schema", log)

    # -- in a thread -------------------------------------------------------------------

    def _start(self) -> None:
        catalog = self._catalog()
        try:
            catalog.create_namespace_if_not_exists(self.identifier[0])
            table = self._load(catalog)
            if table is None and self.row_schema is not None:
                table = self._create(catalog, self.row_schema)
        except Exception as exc:
            raise _unavailable(exc) if _transient(exc) else exc from exc
        if table is not None:
            if table.properties.get("commit.retry.num-retries") != "0":
                with table.transaction() as tx:  # a table made elsewhere: our retries, not pyiceberg's
                    tx.set_properties({"commit.retry.num-retries": "0"})
                table = self._load(catalog)
            self._adopt(table)
        if self.spark is not None:
            empty_dir(self.inputs)
        log.info("table_opened", table=".".join(self.identifier), exists=table is not None,
                 server=self.server_id, stream=self.stream)

    def _committed_intervals(self, shard_id: str) -> Intervals:
        try:
            table = self._load(self._catalog())
        except Exception as exc:
            raise _unavailable(exc) if _transient(exc) else exc from exc
        return () if table is None else read_intervals(table.properties, self.stream, shard_id)

    def _prepare(self, window: Window) -> list[tuple[bytes, str]]:
        """The window's rows as Arrow, parsed once per window and schema (an attempt
        may find the table made meanwhile by another server, with its own schema)."""
        if self._prepared is not None and self._prepared[:2] == (window.id, self.row_schema):
            return []
        table, indices, rejected = window_table(window, self.row_schema, self.ahead)
        self._prepared = (window.id, self.row_schema, table, indices)
        return rejected

    def _attempt(self, window: Window) -> Attempt:
        try:
            base = self._load(self._catalog())
        except Exception as exc:
            raise _unavailable(exc) if _transient(exc) else exc from exc
        if base is not None:
            self._adopt(base)
        rejected = self._prepare(window)
        committed: dict[str, Intervals] = {}
        if base is not None:
            for shard_id in window.positions:
                intervals = read_intervals(base.properties, self.stream, shard_id)
                if intervals:
                    committed[shard_id] = intervals
        keep = fresh_rows(window, committed)
        assert self._prepared is not None
        _, _, rows, indices = self._prepared
        kept = rows.num_rows if keep is None else sum(keep[i] for i in indices)
        raised = {}
        for shard_id, claim in window.claims().items():
            known = committed.get(shard_id, ())
            grown = union(known, claim)
            if grown != known:
                raised[shard_id] = grown
        return Attempt(base, keep, kept, raised, rejected)

    def _rows(self, attempt: Attempt) -> pa.Table:
        assert self._prepared is not None
        _, _, rows, indices = self._prepared
        if attempt.keep is None:
            return rows
        return rows.filter(pa.array([attempt.keep[i] for i in indices], pa.bool_()))

    def _finish(self, window: Window, attempt: Attempt, files: list[str] | None) -> bool:
        """Commit on the attempt's base; False when another commit got there first."""
        from pyiceberg.exceptions import CommitFailedException, TableAlreadyExistsError

        catalog = self._catalog()
        rows = self._rows(attempt) if files is None else None
        table = attempt.base
        try:
            if table is None:
                schema = rows.schema if rows is not None else self._file_schema(files[0])  # type: ignore[index]
                try:
                    table = self._create(catalog, schema)
                except TableAlreadyExistsError:
                    if files:
                        self._remove(files)
                    return False  # another server made it first: filter against its commits
                if files and self._staged(files[0]):  # a REST catalog's new table: its files go there now
                    staging = os.path.dirname(files[0].removeprefix("file://"))
                    files = self._upload(files, staging, f"{table.location().rstrip('/')}/data/"
                                                         f"{os.path.basename(staging)}", table.io)
            summary = self._summary(window, attempt)
            with table.transaction() as tx:
                tx.set_properties({
                    **{intervals_key(self.stream, s): orjson.dumps(to_json(i)).decode()
                       for s, i in attempt.raised.items()},
                    **{position_key(self.stream, s): orjson.dumps(top(i).to_json()).decode()  # type: ignore[union-attr]
                       for s, i in attempt.raised.items()},
                    f"{SERVER_PREFIX}{self.server_id}": orjson.dumps(
                        {"stream": self.stream, "window": window.id, "end": window.end}).decode(),
                })
                # Every commit is a snapshot, an empty one when only the positions move (every
                # row dead-lettered, or the pipeline's output empty): its ``assert-ref-snapshot-id``
                # is what makes a REST catalog's commit a compare-and-swap (the properties alone
                # assert nothing there, and a stale base's intervals would overwrite newer ones)
                if files is None:
                    tx.append(rows, snapshot_properties=summary)
                elif files:
                    tx.add_files(files, snapshot_properties=summary, check_duplicate_files=False)
                else:
                    tx.append(table.schema().as_arrow().empty_table(), snapshot_properties=summary)
                self._expire(tx, table)
        except CommitFailedException:
            if files is not None:
                self._remove(files)
            return False
        except Exception as exc:
            if _transient(exc):
                raise _unavailable(exc) from exc
            raise  # anything else is a bug, not something a retry mends
        if table is not attempt.base:
            self._adopt(table)
        self.rows_out += attempt.kept_rows
        if attempt.kept_rows < len(window):
            log.info("rows_already_committed", window=window.id, rows=len(window) - attempt.kept_rows)
        return True

    def _summary(self, window: Window, attempt: Attempt) -> dict[str, str]:
        return {
            "mldserver.server": self.server_id,
            "mldserver.stream": self.stream,
            "mldserver.window": window.id,
            "mldserver.rows": str(attempt.kept_rows),
            "mldserver.late-rows": str(window.late_rows),
            "mldserver.amended-rows": str(sum(count for _, count in window.amends)),
            "mldserver.skipped-rows": str(len(window) - attempt.kept_rows),
            "mldserver.positions": orjson.dumps({s: p.to_json() for s, p in window.positions.items()}).decode(),
        }

    def _expire(self, tx: Any, table: "Table") -> None:
        snapshots = table.metadata.snapshots
        kept = self.settings.table_snapshots_kept
        if len(snapshots) < 2 * kept:
            return
        from pyiceberg.table.update.snapshot import ExpireSnapshots

        ExpireSnapshots(transaction=tx).by_ids([s.snapshot_id for s in snapshots[:-kept]]).commit()

    # -- the table ---------------------------------------------------------------------

    def _catalog(self) -> "Catalog":
        if self.catalog is None:
            self.catalog = open_catalog(self.settings, self.directory)
        return self.catalog

    def _load(self, catalog: "Catalog") -> "Table | None":
        from pyiceberg.exceptions import NoSuchTableError

        try:
            return catalog.load_table(self.identifier)
        except NoSuchTableError:
            return None

    def _create(self, catalog: "Catalog", schema: pa.Schema) -> "Table":
        if WINDOW_COLUMN not in schema.names:
            schema = schema.append(pa.field(WINDOW_COLUMN, pa.string()))
        table = catalog.create_table(self.identifier, schema=_iceberg_types(schema), properties=TABLE_PROPERTIES)
        log.info("table_created", table=".".join(self.identifier), location=table.location(),
                 schema=str(schema).replace("\n", "; "))
        return table

    def _adopt(self, table: "Table") -> None:
        """Rows are parsed with the table's schema from now on (whoever made it)."""
        schema = _arrow_schema(table)
        self.row_schema = schema.remove(schema.get_field_index(WINDOW_COLUMN))

    # -- with a pipeline: the Spark process writes the files ---------------------------

    async def _spark_files(self, window: Window, attempt: Attempt) -> list[str]:
        assert self.spark is not None
        path = self.inputs / f"{window.id}.parquet"
        await asyncio.to_thread(_write_parquet, self._rows(attempt).drop_columns([WINDOW_COLUMN]), path)
        if attempt.base is not None:
            base: str | None = attempt.base.location()
        else:  # a REST catalog places the table when it makes it: the files wait here until then (_finish)
            base = None if rest_catalog(self.settings) else warehouse(self.settings, self.directory)
        name = f"spark-{window.id}-{uuid.uuid4().hex[:12]}"
        dest = f"{(base or '').removeprefix('file://')}/data/{name}"
        remote = base is None or not _local(base)  # object storage (s3://): Spark writes here, copied there
        out = str(self.inputs / name) if remote else dest
        request: WriteRequest = {
            "op": "write",
            "path": str(path),
            "out": out,
            "window": {"id": window.id, "start": window.start, "end": window.end, "kind": window.kind,
                       "rows": attempt.kept_rows, "late": window.late_rows, "positions": {}},
        }  # fmt: skip
        reply = await self.spark.request(request)
        await asyncio.to_thread(path.unlink, True)
        files = list(reply["files"])
        if base is None:
            return files  # staged under self.inputs: _finish copies them where the table it makes is
        io = attempt.base.io if attempt.base is not None else None  # the table's: a REST catalog may vend keys
        return await asyncio.to_thread(self._upload, files, out, dest, io) if remote else files

    def _upload(self, files: list[str], staging: str, dest: str, io: Any = None) -> list[str]:
        """Spark's output files, written on this machine, copied into the table's storage
        with the table's FileIO (``io``; else the catalog's: pyiceberg's S3 client, so
        Spark needs no S3 jars), then removed here: their new paths, for ``add_files``."""
        import shutil

        io = io if io is not None else self._file_io(dest)
        uploaded = []
        for local in files:
            path = local.removeprefix("file://")
            target = f"{dest}/{os.path.basename(path)}"
            with open(path, "rb") as src, io.new_output(target).create(overwrite=True) as out:
                shutil.copyfileobj(src, out, 1 << 20)
            uploaded.append(target)
        shutil.rmtree(staging, ignore_errors=True)
        return uploaded

    def _staged(self, path: str) -> bool:
        """Is this one of Spark's files still under the state dir (written before the
        table, and so its place, existed)?"""
        return _local(path) and Path(path.removeprefix("file://")).resolve().is_relative_to(self.inputs)

    def _file_io(self, location: str) -> Any:
        from pyiceberg.io import load_file_io

        return load_file_io(dict(self._catalog().properties), location)

    def _file_schema(self, path: str) -> pa.Schema:
        if _local(path):
            return pq.read_schema(path.removeprefix("file://"))
        with self._file_io(path).new_input(path).open() as f:
            return pq.ParquetFile(f).schema_arrow

    def _remove(self, files: list[str]) -> None:
        """Files a lost commit wrote (another server committed first): gone, wherever they are."""
        for f in files:
            try:
                if _local(f):
                    os.unlink(f.removeprefix("file://"))
                else:
                    self._file_io(f).delete(f)
            except Exception:
                pass  # table maintenance removes what is left (orphans)


CATALOG_NAME = "mldserver"  # the catalog's name unless [table_catalog] gives name = "..."


def server_id(settings: Settings) -> str:
    """This server's name in the table's commits: ``--server-id``, else its host's name
    and a digest of its state dir (stable across restarts, apart between servers)."""
    if settings.server_id:
        return settings.server_id
    state = os.path.abspath(settings.state_dir)
    return f"{socket.gethostname()}:{hashlib.sha256(state.encode()).hexdigest()[:8]}"


def warehouse(settings: Settings, directory: Path | None) -> str:
    """Where new tables' files go: ``[table_catalog]``'s ``warehouse``, else DIR."""
    named = (settings.table_catalog or {}).get("warehouse")
    if named:
        return str(named)
    assert directory is not None, "config.load refuses iceberg: with no folder and no warehouse"
    return f"file://{directory}"


def rest_catalog(settings: Settings) -> bool:
    """Is ``[table_catalog]`` an Iceberg REST catalog (``type = "rest"``, or no type and
    an ``http(s)://`` uri, as pyiceberg infers it)? Such a server decides where each
    table's files go, and its ``warehouse`` is whatever that server names by it (a
    catalog's name in Polaris or Lakekeeper, a table bucket's ARN in S3 Tables): the
    sink sends the configured ``warehouse`` as it is and never DIR in its place."""
    properties = settings.table_catalog or {}
    kind = str(properties.get("type", "")).lower()
    return kind == "rest" or (not kind and str(properties.get("uri", "")).startswith("http"))


def catalog_text(settings: Settings, directory: Path | None) -> str:
    """The catalog, fit to print (passwords and keys starred)."""
    if settings.table_catalog:
        return str(redacted(settings.table_catalog))
    return f"sqlite:///{directory}/catalog.db"


def probe(settings: Settings, directory: Path | None) -> str:
    """What ``mldserver check`` says of the table sink: the catalog reached, the table
    found (or to be made at the first window), the warehouse written to (a probe file
    put and deleted; a REST catalog's once it made the table, since that server decides
    where tables go); else a ConfigError naming what failed, in one line."""
    what = f"--sink {settings.sink}"
    try:
        catalog = open_catalog(settings, directory)
    except Exception as exc:
        raise ConfigError(f"{what}: cannot reach the catalog {catalog_text(settings, directory)}: "
                          f"{said(exc)}; check [table_catalog] (its uri, its "
                          f"driver: pip install 'mldserver[iceberg]')") from None
    namespace, _, name = settings.table.rpartition(".")
    try:
        table = catalog.load_table((namespace, name))
    except Exception as exc:
        from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError

        if not isinstance(exc, (NoSuchTableError, NoSuchNamespaceError)):
            raise ConfigError(f"{what}: the catalog answers but the table {settings.table} cannot be read: "
                              f"{said(exc)}") from None
        table = None
    if table is not None:
        location = table.location()
    elif rest_catalog(settings):  # the server puts the table where it decides: nothing to write to yet
        return f"catalog reached, table {settings.table} made at the first window where the catalog puts it"
    else:
        location = warehouse(settings, directory)
    try:
        from pyiceberg.io import load_file_io

        io = load_file_io({**catalog.properties, **(table.io.properties if table is not None else {})}, location)
        path = f"{location.rstrip('/')}/_mldserver-check-{uuid.uuid4().hex[:12]}"
        with io.new_output(path).create(overwrite=True) as out:
            out.write(b"mldserver check: this warehouse takes a file\n")
        io.delete(path)
    except Exception as exc:
        raise ConfigError(f"{what}: the warehouse {scrub(location)} cannot be written: {said(exc)}; "
                          f"check its path or bucket and the credentials in [table_catalog]") from None
    found = (f"table {settings.table}, {len(table.snapshots())} snapshots" if table is not None
             else f"table {settings.table} made at the first window")
    return f"catalog reached, {found}, warehouse {scrub(location)} writable"


def open_catalog(settings: Settings, directory: Path | None) -> "Catalog":
    """The catalog ``table_catalog`` names (pyiceberg's ``load_catalog`` properties; its
    ``name``, default ``mldserver``, is the catalog's name, the one other engines give to
    find the same tables), else SQLite in ``DIR/catalog.db`` with DIR as the warehouse."""
    if settings.table_catalog:
        from pyiceberg.catalog import load_catalog

        properties = {str(k): str(v) for k, v in settings.table_catalog.items()}
        name = properties.pop("name", CATALOG_NAME)
        if not rest_catalog(settings):  # a REST catalog decides where tables go: DIR is not its warehouse
            properties["warehouse"] = warehouse(settings, directory)
        return load_catalog(name, **properties)
    from pyiceberg.catalog.sql import SqlCatalog

    assert directory is not None

    directory.mkdir(parents=True, exist_ok=True)
    for attempt in range(3):  # two servers creating the catalog's own tables at once
        try:
            return SqlCatalog("mldserver", uri=f"sqlite:///{directory}/catalog.db", warehouse=f"file://{directory}")
        except Exception:
            if attempt == 2:
                raise
            time.sleep(0.1)
    raise AssertionError("unreachable")


def _arrow_schema(table: "Table") -> pa.Schema:
    """The table's schema as rows are parsed with it: pyiceberg's large strings and lists
    (at any depth) as the plain ones Arrow's JSON reader makes."""
    return pa.schema([pa.field(f.name, _plain(f.type), f.nullable) for f in table.schema().as_arrow()])


def _plain(t: pa.DataType) -> pa.DataType:
    if pa.types.is_large_string(t):
        return pa.string()
    if pa.types.is_large_binary(t):
        return pa.binary()
    if pa.types.is_large_list(t) or pa.types.is_list(t):
        return pa.list_(_plain(t.value_type))
    if pa.types.is_struct(t):
        return pa.struct([f.with_type(_plain(f.type)) for f in t])
    return t


def _iceberg_types(schema: pa.Schema) -> pa.Schema:
    """Arrow types Iceberg has: timestamps in microseconds, strings."""
    fields = []
    for f in schema:
        t = f.type
        if pa.types.is_timestamp(t) and t.unit in ("s", "ms"):
            t = pa.timestamp("us", t.tz)
        fields.append(pa.field(f.name, t, True))
    return pa.schema(fields)


def _write_parquet(table: pa.Table, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"_{path.name}")
    pq.write_table(table, tmp, compression="none")
    tmp.replace(path)


def _local(location: str) -> bool:
    return location.startswith(("file://", "/"))


def _unavailable(exc: Exception) -> TableUnavailable:
    return TableUnavailable(said(exc))


SAID_LIMIT = 400  # characters of a driver's or a catalog's error in one line


def said(exc: BaseException) -> str:
    """An error fit for one line of ``check``, an exit-2 line or a log field: its type
    and message, secrets starred, whitespace collapsed (a wrong REST ``uri`` that reaches
    some web server answers with a page of HTML, newlines and all), at most
    ``SAID_LIMIT`` characters::

        said(RESTError('404: Received unexpected JSON Payload: <!DOCTYPE HTML>\\n<html>...'))
            -> 'RESTError: 404: Received unexpected JSON Payload: <!DOCTYPE HTML> <html>...'
    """
    text = " ".join(f"{type(exc).__name__}: {scrub(str(exc))}".split())
    return text if len(text) <= SAID_LIMIT else text[:SAID_LIMIT - 3] + "..."


def _transient(exc: Exception) -> bool:
    """A failure of the catalog or the storage, which may pass (a locked SQLite file,
    a REST catalog's 5xx or its 429 when it throttles, a full disk), not a bug."""
    from pyiceberg.exceptions import (CommitStateUnknownException, ServerError, ServiceUnavailableError,
                                      TooManyRequestsError)

    if isinstance(exc, (OSError, CommitStateUnknownException, ServerError, ServiceUnavailableError,
                        TooManyRequestsError)):
        return True
    return type(exc).__module__.split(".")[0] in ("sqlalchemy", "requests", "urllib3", "botocore")
