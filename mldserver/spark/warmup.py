"""Spark's JVM warmed before a window waits on it: throwaway jobs that read and write
parquet as a window's commit does, on rows of their own, run by the Spark process
(``child.py``) in a thread from its start until they are done or the first request
comes, whichever is first::

    warm = WarmUp(read, write, work_dir / "warm-up")   # read(path) -> DataFrame, write(df, folder)
    warm.start(tell)            # when it ends: tell({"event": "warmed_up", "jobs": 50, "ms": 9630.4,
                                #                     "cut_short": False})
                                # a job that raised ends it, and says why: {..., "jobs": 0,
                                #   "cut_short": True, "error": "Py4JJavaError: ... No space left on device"}
    ...                         # a request arrives
    warm.stop()                 # the job running let finish (some 0.2 s): none runs beside the request

Why: the JVM compiles what has run hot, and how many jobs a session has run decides
how warm it is more than their rows do. On the 2-core machine the project is built on
(`mldserver bench --part spark`, 100,000-row windows, one closing at a time), a
window's close to commit took 463-508 ms (p50) in a session's first eight windows and
358-401 ms from the eighteenth; the first window 3.2-3.4 s. After these 50 jobs
(9.5-9.7 s): 326-356 ms in the first eight, the first window 0.5-0.7 s. A server with
the default 60 s windows has a minute before its first one closes: the warm-up runs in
it. It never competes with a commit or a query: the first request stops it for good.
Only a local master is warmed (its executors are this machine's; a cluster's JVMs are
not ours to spend).

The rows are the kind a handler emits: strings (base64 data among them), integers and
an event time, in a file written as the sink writes a window's. The user's pipeline is
never called: it may write elsewhere. A warm-up job that fails ends the warm-up and is no
error of the server's (the first window meets a cold JVM), but what failed is told: the
same fault (a full disk, a broken Spark install) may fail a window's commit next.
"""

from __future__ import annotations

import shutil
import threading
import time
import traceback
from pathlib import Path
from typing import Any, Callable

JOBS = 50  # jobs: how many a session runs decides how warm it is, more than their rows
ROWS = 10_000  # rows a job: a job of some 0.2 s, the most a request can wait for


class WarmUp:
    """The warm-up thread of one Spark process."""

    def __init__(self, read: Callable[[str], Any], write: Callable[[Any, str], None], folder: Path,
                 jobs: int = JOBS, rows: int = ROWS) -> None:
        self._read, self._write = read, write
        self.folder, self.jobs, self.rows = folder, jobs, rows
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, tell: Callable[[dict[str, Any]], None]) -> None:
        """The jobs begin in a thread of their own; ``tell`` hears how they went."""
        self._thread = threading.Thread(target=self._run, args=(tell,), name="warm-up", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """No warm-up job runs once this returns: the one running (some 0.2 s) is let
        finish, for a cancelled job logs an error in Spark's log. Idempotent: a later
        request finds nothing to stop."""
        thread, self._thread = self._thread, None
        if thread is None:
            return
        self._stopping.set()
        thread.join()

    def _run(self, tell: Callable[[dict[str, Any]], None]) -> None:
        jobs, ms, error = self.run()
        told: dict[str, Any] = {"event": "warmed_up", "jobs": jobs, "ms": ms, "cut_short": jobs < self.jobs}
        if error is not None:
            told["error"] = error
        tell(told)

    def run(self) -> tuple[int, float, str | None]:
        """The jobs, here and now (``start`` runs them in a thread): how many ran, in
        how many milliseconds, and why one failed (None: none did, or it failed as the
        warm-up was being stopped). Never raises: a warm-up cut short is no error."""
        started = time.perf_counter()
        done, error = 0, None
        try:
            path = self._input()
            while done < self.jobs and not self._stopping.is_set():
                self._write(self._read(str(path)), str(self.folder / "out"))
                shutil.rmtree(self.folder / "out", ignore_errors=True)
                done += 1
        except Exception as exc:
            if not self._stopping.is_set():
                error = _first_line(exc)
                traceback.print_exc()  # whole, into spark.log (the Spark process's stderr)
        finally:
            shutil.rmtree(self.folder, ignore_errors=True)
        return done, round((time.perf_counter() - started) * 1000, 1), error

    def _input(self) -> Path:
        """A parquet file of ``rows`` rows like a handler's."""
        import pyarrow as pa
        import pyarrow.compute as pc
        import pyarrow.parquet as pq

        shutil.rmtree(self.folder, ignore_errors=True)
        self.folder.mkdir(parents=True)
        n = self.rows
        ids = pa.array(range(n), pa.int64())
        text = pc.cast(ids, pa.string())
        table = pa.table({
            "shard_id": pa.array(["shardId-000000000000"] * n),
            "sequence_number": pc.binary_join_element_wise("4959", text, ""),
            "sub_sequence_number": pa.array([0] * n, pa.int64()),
            "partition_key": pc.binary_join_element_wise("key-", text, ""),
            "approximate_arrival_timestamp": ids,
            "data": pc.binary_join_element_wise("bWVvdw==", text, "0123456789" * 12, ""),
            "event_time": pc.cast(ids, pa.timestamp("ms")),
        })
        path = self.folder / "in.parquet"
        pq.write_table(table, path, compression="none", use_dictionary=False)  # as the sink writes a window's
        return path


def _first_line(exc: Exception, most: int = 500) -> str:
    """``Type: message``, its first line (a JVM error's goes on for pages)."""
    text = f"{type(exc).__name__}: {exc}".split("\n", 1)[0]
    return text if len(text) <= most else text[:most] + " ..."
