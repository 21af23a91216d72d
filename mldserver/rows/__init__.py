"""The rows handlers emit, on their way from ``batch.emit`` to the coordinator. No
handler imports this folder: ``Batch.emit`` (``api/records.py``) collects into it, a
shard's worker and the handler processes carry its batches, the coordinator orders,
windows and commits them. It imports nothing of the server's but ``base.positions`` and
``native`` (whether the C collector may be used), so every layer that handles rows sits
above it::

    from mldserver.rows.emitted import PyCollector      # what batch.emit appends to
    from mldserver.rows.batch import Item, RowBatch     # a batch's rows, as columns

    rows = RowBatch.of([Item(1_500, position, b'{"k":1}')])
    rows.row(0)                                          # b'{"k":1}'

- ``batch.py``: ``RowBatch``, the rows one processed batch emitted, as columns (times,
  records, positions, one buffer of JSON lines), sliced without copying.
- ``emitted.py``: what ``batch.emit`` collects, a JSON line a row, and ``PyCollector``,
  its Python path.
- ``_emitted.c``: the same collector in C, ``batch.emit`` itself where setup.py built it.
- ``loans.py``: another process's shared memory read in place (a handler process's
  rows), given back when the last reference goes.
"""
