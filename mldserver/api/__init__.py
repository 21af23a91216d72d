"""The handler API: what a handler module imports and is given (``import mldserver``
names these; ``mldserver.api.testing`` is the fake daemon for a handler's own tests).
It imports nothing of the server's parts: they import it.

- ``handler.py``: ``Handler``, one instance per shard connection, and its callbacks.
- ``changes.py``: ``ChangeHandler`` (``on_update(doc, meta)``, ``on_delete(meta)``), one
  call per DynamoDB or Kinesis stream record.
- ``records.py``: ``Record``, ``Batch`` (``batch.emit``) and ``ShardInfo``, what a handler
  sees of a batch.
- ``checkpointer.py``: ``checkpointer.checkpoint(...)``, with the daemon's errors handled.
- ``failures.py``: ``batch.fail(record, error)``, a record given up on alone.
- ``context.py``: the server context a handler is built with (``context.sql``,
  ``context.table``).
- ``bindings.py``: the DynamoDB tables ``context.table(alias)`` reads and writes.
- ``dynamodb_json.py``: DynamoDB JSON to exact Python values, and back.
- ``checks.py``: a handler checked at start-up for what it means (a near-miss callback, say).
- ``loading.py``: what ``--handler`` names, as the server calls it once per shard.
- ``kclpy/``: an amazon_kclpy processor class (v1, v2, v3) run unchanged as a handler,
  and ``emit`` for it.
- ``testing.py``: ``FakeDaemon``, the daemon's side, for a handler's own tests.
"""
