"""The handler API: what a handler module imports and is given (``import mldserver``
names these; ``mldserver.api.testing`` is the fake daemon for a handler's own tests).
It imports nothing of the server's parts: they import it.

- ``handler.py``: ``Handler``, one instance per shard connection, and its callbacks.
- ``changes.py``: ``ChangeHandler`` (``on_update(doc, meta)``, ``on_delete(meta)``), one
  call per DynamoDB or Kinesis stream record.
- ``records.py``: ``Record``, ``Batch`` (``batch.emit``) and ``ShardInfo``, what a handler
  sees of a batch.
- ``rows.py``: the rows a batch emitted, as columns (``RowBatch``), as the server carries them.
- ``emitted.py``: what ``batch.emit`` collects, a JSON line a row, and ``PyCollector``, its
  Python path.
- ``loans.py``: another process's shared memory read in place (a handler process's rows),
  given back when the last reference goes.
- ``_emitted.c``: the same collector in C, ``batch.emit`` itself where setup.py built it.
- ``checkpointer.py``: ``checkpointer.checkpoint(...)``, with the daemon's errors handled.
- ``failures.py``: ``batch.fail(record, error)``, a record given up on alone.
- ``context.py``: the server context a handler is built with (``context.sql``,
  ``context.table``).
- ``bindings.py``: the DynamoDB tables ``context.table(alias)`` reads and writes.
- ``dynamodb_json.py``: DynamoDB JSON to exact Python values, and back.
- ``adapter.py``: DynamoDB stream records as the KCL's Streams adapter hands them to the daemon.
- ``checks.py``: a handler checked at start-up for what it means (a near-miss callback, say).
- ``loading.py``: what ``--handler`` names, as the server calls it once per shard.
- ``kclpy/``: an amazon_kclpy processor class (v1, v2, v3) run unchanged as a handler,
  and ``emit`` for it.
- ``testing.py``: ``FakeDaemon``, the daemon's side, for a handler's own tests.
"""
