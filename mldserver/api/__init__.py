"""The handler API: what a handler module imports and is given (``import mldserver``
names these; their old module names, ``mldserver.records`` and the like, still work).

- ``handler.py``: ``Handler``, one instance per shard connection, its callbacks;
- ``changes.py``: ``ChangeHandler`` (``on_update(doc, meta)``, ``on_delete(meta)``), one
  call per DynamoDB stream record;
- ``records.py``: ``Record``, ``Batch`` (``batch.emit``), ``ShardInfo``; ``rows.py``: the
  rows a batch emits, as the server carries them (``RowBatch``);
- ``checkpointer.py``: ``checkpointer.checkpoint(...)``, with the daemon's errors handled;
- ``failures.py``: ``batch.fail(record, error)``, a record given up on alone;
- ``context.py``: the server context a handler is built with (``context.sql``,
  ``context.table``); ``bindings.py``: its tables; ``dynamodb_json.py``: their values;
- ``checks.py``: a handler checked at start-up for what it means (a near-miss callback);
  ``loading.py``: what ``--handler`` names, as the server calls it per shard;
- ``kclpy/``: an amazon_kclpy processor class (v1, v2, v3) run unchanged as a handler,
  and ``emit`` for it;
- ``testing.py``: ``FakeDaemon``, the daemon's side, for a handler's own tests.

It imports nothing of the server's parts: they import it.
"""
