"""The Spark boundary. One long-lived child process of the server owns the
SparkSession; the server talks to it over pipes and never blocks its event loop on
Spark (a Spark call from a thread of the busy server starves on the GIL).

- ``process.py``  server side: start, supervise (restart with backoff), requests, stop
- ``sink.py``     server side: the ``parquet:DIR`` sink, a window's rows to an Arrow file
- ``schema.py``   server side: rows (JSON) to Arrow with a declared or inferred schema
- ``child.py``    the Spark process: the frame loop, commits, the table sink's writes, SQL cursors
- ``session.py``  the Spark process: the SparkSession and its daemon-friendly defaults
- ``pipeline.py`` the pipeline API (``pipeline(df, window)``) and ``WindowInfo``
- ``frames.py``   the wire format between the two, and the typed frames
- ``bench.py``    the bare hand-off ``mldserver bench --part spark`` compares against

Only ``child.py`` and ``session.py`` import pyspark, and only in the Spark process;
and ``bench.py``, in the benchmark's own process. Nothing outside ``mldserver/spark/``
imports pyspark (``tests/test_layers.py`` checks it).
"""
