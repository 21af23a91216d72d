"""The Spark boundary. One long-lived child process of the server owns the
SparkSession; the server talks to it over pipes and never blocks its event loop on
Spark (a Spark call from a thread of the busy server starves on the GIL).

- ``process.py``: the server's side: start, supervise (restart with backoff), requests, stop.
- ``child.py``: the Spark process: the frame loop, commits, the table sink's writes, SQL.
- ``session.py``: the Spark process's SparkSession and its daemon-friendly defaults.
- ``pipeline.py``: the pipeline API (``pipeline(df, window)``) and ``WindowInfo``.
- ``frames.py``: the wire format between the two, and the typed frames.
- ``pipes.py``: the framing of every pipe to a child process (header, JSON, body), the
  handler processes' too (``pool/frames.py``).
- ``warmup.py``: throwaway parquet jobs in the Spark process as it starts, so that a
  local master's JVM has compiled a commit's hot paths before the first window.
- ``commitlog.py``: the parquet sink's commit log, one fsynced entry per committed window,
  written by the Spark process and read by the server's side (``sinks/parquet.py``).
- ``bench.py``: the bare hand-off ``mldserver bench --part spark`` compares against.

Only ``child.py`` and ``session.py`` import pyspark, and only in the Spark process;
and ``bench.py``, in the benchmark's own process. Nothing outside ``mldserver/spark/``
imports pyspark (``tests/test_layers.py`` checks it). The ``parquet:DIR`` sink's server
side and the Arrow schema are in ``sinks/`` (``sinks/parquet.py``, ``sinks/schema.py``).
"""
