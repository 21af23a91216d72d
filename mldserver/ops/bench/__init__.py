"""``mldserver bench``: what mldserver costs, measured against what it replaces, in one run.

Eleven parts, each in its own module, all sharing ``common.py``::

    mldserver bench --part relay         # relay.py: throughput, latency, memory vs amazon_kclpy
    mldserver bench --part coordinator   # coordinator.py: the coordinator's cost (file sink vs none)
    mldserver bench --part spark         # spark.py: end to end vs the bare Spark hand-off
    mldserver bench --part changes       # changes.py: a ChangeHandler vs a batch Handler decoding by hand
    mldserver bench --part timers        # timers.py: durable timers created and fired per second, memory
    mldserver bench --part table         # table.py: the iceberg sink vs the parquet sink, position read-back
    mldserver bench --part kclpy         # kclpy.py: amazon_kclpy's sample processor behind mldserver vs
                                         #   under amazon_kclpy's KCLProcess: records/s, CPU, memory
    mldserver bench --part chaos         # chaos.py: poisoned batches and SIGKILLed handler processes
                                         #   vs an undisturbed run, and the checks (--duration 300, --seed N);
                                         #   then killed.py: mldserver run SIGKILLed (the real daemon)
    mldserver bench --part source        # source.py: serve --source kinesis: vs the KCL daemon + relay on
                                         #   kinesis-local: records/s, CPU per record, put to handler
    mldserver bench --part stream        # stream.py: mldserver.open_stream vs Bloop's Stream on the same
                                         #   DynamoDB changes (DynamoDB Local): CPU per change, the floor
    mldserver bench --part scale         # scale.py: mldserver run servers joining and dying on one stream,
                                         #   one Iceberg table: balance times, rows/s, conflicts, once each
    mldserver bench                      # every part but chaos (which runs for --duration), source, stream and scale
    mldserver bench --workers 2 0        # servers with 2 handler processes and with none, side by side

The bare hand-off runs Spark in this process, through ``mldserver.spark.bench``: only
``mldserver/spark/`` imports pyspark.

- ``common.py``: what every part shares: a server in its own process, memory figures from
  /proc, the batches the coordinator and Spark parts feed.
- ``relay.py``: ``--part relay``, throughput, latency and memory against amazon_kclpy.
- ``touch.py``: the handler ``--part relay`` runs, in a module that imports only the handler API.
- ``coordinator.py``: ``--part coordinator``, the coordinator's cost (file sink vs none).
- ``spark.py``: ``--part spark``, the pipeline end to end against the bare hand-off.
- ``changes.py``: ``--part changes``, a ``ChangeHandler`` against a batch ``Handler``.
- ``timers.py``: ``--part timers``, durable timers created and fired per second.
- ``table.py``: ``--part table``, the iceberg sink against the parquet sink.
- ``kclpy.py``: ``--part kclpy``, amazon_kclpy's sample behind mldserver and under KCLProcess.
- ``kclpy_sample.py``: the sample processor ``--part kclpy`` measures on both sides.
- ``chaos.py``: ``--part chaos``, a seeded chaos campaign and the checks of its promises.
- ``outside.py``: the chaos campaign's faults from outside the handler (sink, admin port).
- ``killed.py``: the chaos bench's last phase, ``mldserver run`` SIGKILLed and run again.
- ``source.py``: ``--part source``, ``serve --source kinesis:`` against the KCL daemon.
- ``stream.py``: ``--part stream``, ``mldserver.open_stream`` against Bloop's Stream.
- ``bloop_side.py``: Bloop's side of ``--part stream``, a script run in its own process.
- ``scale.py``: ``--part scale``, servers joining and dying on one stream, one table.
"""

from __future__ import annotations


async def amain(args) -> None:
    shard_counts = [1, 2] if args.quick and args.shards == [1, 32] else args.shards
    with_kclpy = not args.no_kclpy and args.part in ("all", "relay", "kclpy")
    if with_kclpy:
        try:
            import amazon_kclpy  # noqa: F401
        except ImportError:
            print("amazon_kclpy not installed (pip install kclpy-ext, or scripts/setup --test); "
                  "skipping it: pass --no-kclpy to silence this")
            with_kclpy = False
    if args.workers is None:
        from ...base.config import Settings

        args.workers = list(dict.fromkeys([Settings.workers, 0]))  # the default beside the server's own loop
    import tempfile  # (here: the bench's handler modules, ``touch``, import this package and nothing more)

    with tempfile.TemporaryDirectory(prefix="mldserver-bench-") as tmp:
        if args.part in ("all", "coordinator"):
            from . import coordinator

            await coordinator.run(shard_counts, args.quick, tmp, args.workers)
        if args.part in ("all", "spark"):
            from . import spark

            await spark.run(args.quick, tmp)
        if args.part in ("all", "changes"):
            from . import changes

            await changes.run(args, tmp)
        if args.part in ("all", "timers"):
            from . import timers

            await timers.run(args.quick, tmp, args.workers)
        if args.part in ("all", "table"):
            from . import table

            await table.run(args.quick, tmp, getattr(args, "commits", None))
        if args.part in ("all", "relay"):
            from . import relay

            await relay.run(args, shard_counts, with_kclpy, tmp)
        if args.part in ("all", "kclpy") and with_kclpy:
            from . import kclpy

            await kclpy.run(args, shard_counts, tmp)
        if args.part == "chaos":
            from . import chaos

            await chaos.run(args, tmp)
        if args.part == "source":
            from . import source

            await source.run(args, tmp)
        if args.part == "stream":
            from . import stream

            await stream.run(args, tmp)
        if args.part == "scale":
            from . import scale

            await scale.run(args, tmp)


def main(args) -> None:
    import uvloop

    uvloop.run(amain(args))
