"""The Spark process (``python -m mldserver.spark.child``), started and supervised by
the server (``process.py``). It owns the SparkSession and answers frames
(``frames.py``) on its stdin/stdout, one at a time, in order. Anything else that
writes to stdout (the JVM, a pipeline's print) is sent to stderr, which the server
points at ``spark.log``.

The first frame (``frames.StartRequest``) configures it; the reply says it is ready::

    {"op": "start", "id": 1, "master": "local[*]", "remote": null, "conf": {},
     "work_dir": ".../state/spark", "sink_dir": ".../output", "format": "parquet",
     "pipeline": "handlers.orders:per_customer", "sys_path": [...]}
    -> {"id": 1, "ok": true, "spark_version": "4.3.0", "classic": true}

Then, with a local master, it warms Spark's JVM in a thread until the first request
comes (``warmup.py``: ``{"event": "warmed_up", "jobs": 50, "ms": ..., "cut_short": false}``),
and:

- ``commit {window, path}`` (``frames.CommitRequest``): if the commit log has the
  window, answer at once (``already``): a window re-sent after a restart is never
  committed twice. Else read
  the window's Arrow file, run ``pipeline(df, window)``, write what it returns under
  ``DIR/_staging/``, fsync it, rename it to ``DIR/window=<id>`` (replacing a
  half-written one: ``durable.publish_dir``), then append the commit-log entry.
- ``write {window, path, out}`` (the ``iceberg:`` sink, ``frames.WriteRequest``): read the
  window's Arrow file, run ``pipeline(df, window)``, add the ``window`` column, write
  what it returns as parquet (microsecond timestamps, as Iceberg has them) under a
  staging name, fsync it, rename it to ``out``; answer the files. The server's
  table library commits them: no commit log here.
- ``sql_fetch {cursor, query, args, n}``: the first fetch of a cursor runs
  ``spark.sql(query, args=args)`` and opens ``toLocalIterator`` (partition by
  partition); each fetch returns up to ``n`` rows as dicts and ``done``.
- ``sql_close {cursor}``: stops the iterator; answers how many Spark jobs it ran.
- ``stop``: answers, stops the session, exits.

The sink folder is locked (``DIR/_lock``) for the life of the process, so two
Spark processes never write one sink. The process dies with the server (PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import shutil
import signal
import sys
import threading
import time
import traceback
import uuid
from itertools import islice
from pathlib import Path
from typing import Any, Callable

from ..base.durable import publish_dir
from ..base.importer import import_from_string
from .commitlog import CommitLog
from .frames import CommitRequest, StartRequest, WindowFrame, commit_entry, encode, read_frame
from .pipeline import WindowInfo, identity
from .warmup import WarmUp

EXECUTOR_POLL_S = 2.0  # how often the live executors are read (a lost worker is told within this)
LOCK_WAIT = 30.0  # seconds: the Spark process of a server that just died may still hold the lock


class SparkChild:
    """The session, the sink and the SQL cursors: one method per request."""

    def __init__(self, options: StartRequest) -> None:
        from . import session

        self.options = options
        self.sink_dir = Path(options["sink_dir"]) if options.get("sink_dir") else None
        self.format = options.get("format") or "parquet"
        if self.sink_dir is not None:
            self.lock = _lock(self.sink_dir)
            shutil.rmtree(self.sink_dir / "_staging", ignore_errors=True)
            self.commit_log = CommitLog(self.sink_dir)
        self.pipeline = identity
        if options.get("pipeline"):
            self.pipeline = import_from_string(options["pipeline"], "pipeline")
        self.spark = session.build(options)
        self.classic = session.is_classic(self.spark)
        self.local = self.classic and self.spark.sparkContext.master.startswith("local")
        self.cursors: dict[int, Any] = {}
        # Spark's JVM warmed before the first window (a local master's: warmup.py)
        self.warm = WarmUp(self._read, self._scratch, Path(options["work_dir"]) / "warm-up") if self.local else None

    def ready(self) -> dict[str, Any]:
        return {"spark_version": self.spark.version, "classic": self.classic}

    def executors(self) -> list[str] | None:
        """The cluster's live executors' ids (the driver left out), or None where Spark
        does not say (Spark Connect)."""
        if not self.classic:
            return None
        ids = str(self.spark.sparkContext._jsc.sc().getExecutorIds().mkString(","))
        return sorted(filter(None, ids.split(",")), key=lambda i: (len(i), i))

    def watch_executors(self, tell: Callable[[dict[str, Any]], None], every: float = EXECUTOR_POLL_S) -> None:
        """In a thread of its own: each change in the live executors told to the server
        (``{"event": "executors", "executors": [...], "lost": [...], "added": [...]}``),
        whatever request the main thread is running (a job that loses a worker goes
        on: Spark runs its tasks again elsewhere; the server logs the loss)."""
        def run() -> None:
            known: list[str] | None = None
            while True:
                try:
                    now = self.executors()
                except Exception:  # the session going away: the process is stopping
                    return
                if now is None:
                    return
                if known is not None and now != known:
                    tell({"event": "executors", "executors": now, "lost": sorted(set(known) - set(now)),
                          "added": sorted(set(now) - set(known))})
                elif known is None:
                    tell({"event": "executors", "executors": now, "lost": [], "added": []})
                known = now
                time.sleep(every)

        if not self.local and self.classic:
            threading.Thread(target=run, name="executors", daemon=True).start()

    # -- commits ---------------------------------------------------------------------

    def commit(self, request: CommitRequest) -> dict[str, Any]:
        w = request["window"]
        done = self.commit_log.entry(w["id"])
        if done is not None and not w.get("version"):
            return {"already": True, "rows_out": done.get("rows_out")}
        # An amended window (allowed_lateness) replaces what was written of it, whole: the
        # same rows again after a restart, or more.
        version = (done.get("version", 1) + 1 if done is not None else 1) if w.get("version") else None
        started = time.perf_counter()
        window = window_info(w)
        out = self.pipeline(self._read(request["path"]), window)
        rows_out = None
        if out is not None:
            if not hasattr(out, "write"):
                raise TypeError(
                    f"pipeline {self.options.get('pipeline')} returned {type(out).__name__}: "
                    "return a DataFrame to write, or None if it wrote its own output"
                )
            rows_out = self._publish(out, w["id"])
        self.commit_log.append(commit_entry(w, rows_out, version))
        self.commit_log.compact_if_due()  # (the older entries folded into one file, now and then)
        return {"rows_out": rows_out, "spark_ms": round((time.perf_counter() - started) * 1000, 1)}

    def _read(self, path: str):
        import pyarrow.parquet as pq

        if self.local:
            # The executors share this file system: Spark reads the file itself.
            from pyspark.sql.pandas.types import from_arrow_schema

            return self.spark.read.schema(from_arrow_schema(pq.read_schema(path))).parquet(path)
        return self.spark.createDataFrame(pq.read_table(path))  # Arrow batches over the wire

    def _scratch(self, df, folder: str) -> None:
        """A warm-up job's output, written as a commit writes its window's."""
        df.write.format(self.format).mode("overwrite").save(folder)

    def warm_up(self, tell: Callable[[dict[str, Any]], None]) -> None:
        if self.warm is not None:
            self.warm.start(tell)

    def warmed(self) -> None:
        """A request came: the warm-up stops for good, before the request runs."""
        if self.warm is not None:
            self.warm.stop()

    def _publish(self, df, window_id: str) -> int | None:
        assert self.sink_dir is not None
        staging = self.sink_dir / "_staging" / f"{window_id}-{uuid.uuid4().hex[:8]}"
        df.write.format(self.format).save(str(staging))
        # A folder already there was published before a crash but never logged: redone.
        final = publish_dir(staging, self.sink_dir / f"window={window_id}")
        if self.format != "parquet":
            return None
        import pyarrow.parquet as pq

        return sum(pq.read_metadata(p).num_rows for p in final.glob("*.parquet"))

    def write(self, request: dict[str, Any]) -> dict[str, Any]:
        w = request["window"]
        window = window_info(w)
        out = self.pipeline(self._read(request["path"]), window)
        if out is None or not hasattr(out, "write"):
            raise TypeError(
                f"pipeline {self.options.get('pipeline')} returned {type(out).__name__}: with the iceberg sink, "
                "return the DataFrame to commit to the table"
            )
        if "window" not in out.columns:
            from pyspark.sql import functions as F

            out = out.withColumn("window", F.lit(w["id"]))
        final = Path(request["out"])
        staging = final.with_name(f"_{final.name}")
        self.spark.conf.set("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
        out.write.parquet(str(staging))
        publish_dir(staging, final)
        import pyarrow.parquet as pq

        files = sorted(final.glob("*.parquet"))
        return {"files": [f"file://{p}" for p in files], "rows_out": sum(pq.read_metadata(p).num_rows for p in files)}

    # -- SQL ---------------------------------------------------------------------------

    def sql_fetch(self, request: dict[str, Any]) -> dict[str, Any]:
        cursor = request["cursor"]
        tag = f"mldserver-sql-{cursor}"
        if self.classic:
            self.spark.sparkContext.setJobGroup(tag, request.get("query", "")[:200])
        rows = self.cursors.get(cursor)
        if rows is None:
            df = self.spark.sql(request["query"], args=request.get("args") or None)
            rows = self.cursors[cursor] = df.toLocalIterator(prefetchPartitions=False)
        n = request.get("n", 1000)
        chunk = [row.asDict(recursive=True) for row in islice(rows, n)]
        return {"rows": chunk, "done": len(chunk) < n}

    def sql_close(self, request: dict[str, Any]) -> dict[str, Any]:
        cursor = request["cursor"]
        rows = self.cursors.pop(cursor, None)
        if rows is not None and hasattr(rows, "close"):
            rows.close()
        if not self.classic:
            return {"jobs": None}
        jobs = self.spark.sparkContext.statusTracker().getJobIdsForGroup(f"mldserver-sql-{cursor}")
        return {"jobs": len(jobs)}

    def stop(self) -> None:
        self.spark.stop()


def _lock(sink_dir: Path) -> int:
    sink_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(sink_dir / "_lock", os.O_RDWR | os.O_CREAT, 0o644)
    deadline = time.monotonic() + LOCK_WAIT
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if time.monotonic() > deadline:
                holder = os.pread(fd, 64, 0).decode(errors="replace").strip()
                raise RuntimeError(
                    f"another Spark process (pid {holder or '?'}) writes to {sink_dir}: "
                    "stop that server, or give this one its own --sink directory"
                ) from None
            time.sleep(0.2)
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode(), 0)
    return fd


def _die_with_parent() -> None:
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass  # not Linux: the closed stdin still ends the loop


def _error(exc: BaseException) -> dict[str, Any]:
    text = f"{type(exc).__name__}: {exc}"
    return {
        "ok": False,
        "error": text if len(text) < 4000 else text[:4000] + " ...",
        "traceback": "".join(traceback.format_exception(exc)[-8:]),
    }


def window_info(w: WindowFrame) -> WindowInfo:
    """What a pipeline is told of the window a request names."""
    return WindowInfo(id=w["id"], start=w["start"], end=w["end"], rows=w["rows"], late_rows=w["late"],
                      kind=w.get("kind", "tumbling"), version=w.get("version", 0))


def main() -> None:
    _die_with_parent()
    requests = os.fdopen(os.dup(0), "rb")
    replies = os.fdopen(os.dup(1), "wb")
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(2, 1)  # stray prints (JVM, user code) go to the log, never into the frames
    sys.stdout = sys.stderr

    writing = threading.Lock()  # replies, and what the executors' watcher tells

    def reply(message: dict[str, Any]) -> None:
        with writing:
            replies.write(encode(message))
            replies.flush()

    frame = read_frame(requests)
    if frame is None:
        return
    options, _ = frame
    sys.path[:0] = [p for p in options.get("sys_path", []) if p not in sys.path]
    try:
        child = SparkChild(options)  # type: ignore[arg-type]
    except BaseException as exc:
        reply({"id": options["id"], **_error(exc)})
        raise SystemExit(1) from None
    reply({"id": options["id"], "ok": True, **child.ready()})
    child.watch_executors(reply)
    child.warm_up(reply)
    ops = {"commit": child.commit, "write": child.write, "sql_fetch": child.sql_fetch, "sql_close": child.sql_close}
    while (frame := read_frame(requests)) is not None:
        request, _ = frame
        child.warmed()
        op = request.get("op")
        if op == "stop":
            reply({"id": request["id"], "ok": True})
            child.stop()
            return
        try:
            result = ops[op](request)
        except Exception as exc:
            reply({"id": request["id"], **_error(exc)})
            continue
        reply({"id": request["id"], "ok": True, **result})
    os._exit(0)  # the server is gone: no orderly Spark stop, the JVM follows its pipe


if __name__ == "__main__":
    main()
