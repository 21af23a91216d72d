"""amazon_kclpy processors, unchanged: ``--handler app:RecordProcessor`` may name a class
of any of amazon_kclpy's three APIs, recognised by its base class, and the server runs
it as KCLProcess does, one instance per shard::

    # app.py, as the MultiLangDaemon runs it today; nothing in it changes
    from amazon_kclpy import kcl
    from amazon_kclpy.v3 import processor

    class RecordProcessor(processor.RecordProcessorBase):
        def initialize(self, initialize_input):
            self.shard_id = initialize_input.shard_id
        def process_records(self, process_records_input):
            for record in process_records_input.records:
                handle(record.partition_key, record.binary_data)
            process_records_input.checkpointer.checkpoint()      # synchronous, as always
        def lease_lost(self, lease_lost_input): pass
        def shard_ended(self, shard_ended_input):
            shard_ended_input.checkpointer.checkpoint()
        def shutdown_requested(self, shutdown_requested_input):
            shutdown_requested_input.checkpointer.checkpoint()

    if __name__ == "__main__":                                   # not run by mldserver
        kcl.KCLProcess(RecordProcessor()).run()

    $ mldserver serve --handler app:RecordProcessor

::

    processor_api(RecordProcessor)        # 3 (v2: 2, v1's kcl.RecordProcessorBase: 1; else None)
    wrap(RecordProcessor, 3)              # the Handler class the server makes per shard

- ``handler.py``: the processor as a ``Handler``, each action dispatched as KCLProcess
  dispatches it (amazon_kclpy's inputs and adapters);
- ``inputs.py``: amazon_kclpy's ``Record`` and ``Checkpointer``, over the server's;
- ``thread.py``: one thread per shard, so a blocking processor holds its shard only;
- ``turns.py``: the shards of a process compute one at a time, unless one blocks;
- ``output.py``: its ``print()`` and ``sys.stderr`` as ``handler_output`` log events;
- ``emitting.py``: ``emit(record, row)``, the two-line change that gives it windows.

amazon_kclpy is not imported here: a class can only be a processor if its module
imported amazon_kclpy already (a module that cannot is refused by the importer with
the extra to install, ``mldserver[kclpy]``).
"""

from __future__ import annotations

import inspect
import sys
from typing import Any

from .emitting import emit

__all__ = ["emit", "is_processor_instance", "processor_api", "wrap"]


def processor_api(obj: Any) -> int | None:
    """Which amazon_kclpy API ``obj``, a class, implements (3, 2 or 1), by its base
    class; None for anything else."""
    if not inspect.isclass(obj) or sys.modules.get("amazon_kclpy") is None:
        return None
    for version, base in _bases():
        if issubclass(obj, base):
            return version
    return None


def is_processor_instance(obj: Any) -> bool:
    """``obj`` is an instance of a processor class (named where its class belongs)."""
    return not inspect.isclass(obj) and processor_api(type(obj)) is not None


def wrap(processor_class: type, api_version: int) -> type:
    """The ``Handler`` class the server makes one of per shard, for ``processor_class``."""
    from .handler import KclpyHandler

    return KclpyHandler.wrap(processor_class, api_version)


def _bases() -> list[tuple[int, type]]:
    from amazon_kclpy import kcl
    from amazon_kclpy.v2 import processor as v2
    from amazon_kclpy.v3 import processor as v3

    return [(3, v3.RecordProcessorBase), (2, v2.RecordProcessorBase), (1, kcl.RecordProcessorBase)]
