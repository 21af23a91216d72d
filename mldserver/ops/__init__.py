"""Operations: the commands beside ``serve``.

- ``relay.py``: ``mldserver connect``, the relay the daemon launches per shard (it imports
  nothing heavy), and the choice between it and the C build.
- ``relay.c``: the same relay in C, built as ``mldserver-relay`` where there was a compiler.
- ``daemon.py``: ``mldserver run``, the server with the real KCL daemon as its child.
- ``daemon_messages.py``: the daemon's output read as messages, a line with its stack trace,
  each one event at the daemon's own level.
- ``tether.py``: what ties that daemon to its server: it dies with it, a leftover is
  stopped, a restart is the same KCL worker.
- ``properties.py``: the daemon's properties file, read as Java reads it and checked.
- ``kcl_keys.py``: the daemon's property keys, generated from its jars by
  ``scripts/kcl-property-keys`` (do not edit).
- ``check.py``: ``mldserver check``, what ``serve`` would find at start-up, without serving.
- ``status.py``: ``mldserver status``, ``pause``, ``resume``, ``reload``: clients of the
  admin endpoint.
- ``redrive.py``: ``mldserver redrive``, dead letters sent through the current handler again.
- ``positions.py``: ``mldserver positions``, a source's saved positions.
- ``table.py``: ``mldserver table maintain``, the Iceberg table sink's maintenance by hand.
- ``demo.py``: ``mldserver demo``, the whole pipeline driven by the fake daemon.
- ``emulators.py``: kinesis-local and DynamoDB Local on loopback, for benches and tests.
- ``local.py``: ``mldserver local``, the emulators and a properties file, to try ``run``.
- ``bench/``: ``mldserver bench``, one module a part (its own map).
"""
