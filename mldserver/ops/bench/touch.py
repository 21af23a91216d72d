"""The handler ``mldserver bench --part relay`` runs: every record's data decoded and
its length added up, the work the amazon_kclpy side's processor does too. A module of
its own, importing only the handler API, as a user's handler module would: its handler
processes carry what they need, not what the bench itself imports (the fake daemon,
the emulators), which would count in the server's memory::

    mldserver serve --handler mldserver.ops.bench.touch:TouchHandler
"""

from __future__ import annotations

from ...api.handler import Handler


class TouchHandler(Handler):
    """Decodes every record's data, as a real handler would."""

    async def process_records(self, batch, checkpointer):
        total = 0
        for record in batch.records:
            total += len(record.data)
