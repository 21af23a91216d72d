"""Whether the native parts may be used: the one switch every place that picks between
a native part and its Python path asks (``setup.py`` builds the native parts; each has a
Python path for an install without a C compiler).

``MLDSERVER_NO_EXTENSIONS=1`` (as aiokafka's ``AIOKAFKA_NO_EXTENSIONS``) makes every such
place take its Python path even where the native part was built, so that path can be run
and tested on a machine that has both::

    $ MLDSERVER_NO_EXTENSIONS=1 mldserver connect 127.0.0.1:7070   # runs relay.py, not mldserver-relay

    from ..native import load_native, native_allowed

    _scan = load_native("mldserver.protocol._scan")   # None: not built, or the variable set
    native_allowed()                                  # False with the variable set

The places that ask: ``protocol/lazy.py`` (``protocol/_scan.c``, else pysimdjson),
``pool/frames.py`` (``pool/_b64.c``, else ``Record.data``), ``rows/emitted.py``
(``rows/_emitted.c``, else ``PyCollector``), ``coordinator/merge.py``
(``coordinator/_gather.c``, else pyarrow) and ``ops/relay.py``'s ``exec_lean``
(``mldserver-relay``, built from ``ops/relay.c``, else ``relay.py``). Each asks once,
when it is imported (or, the relay, when it starts): the variable is read from the
environment of the process, not changed while it runs.

It sits below every layer (``tests/test_layers.py``): the protocol core, the lowest of
them, asks it too. It imports nothing but the standard library.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

VARIABLE = "MLDSERVER_NO_EXTENSIONS"


def native_allowed() -> bool:
    """True unless ``MLDSERVER_NO_EXTENSIONS`` is set to anything but ``""`` or ``"0"``."""
    return os.environ.get(VARIABLE, "") in ("", "0")


def load_native(name: str) -> ModuleType | None:
    """The native extension module ``name`` (``mldserver.protocol._scan``), or None where
    it was not built or ``MLDSERVER_NO_EXTENSIONS`` is set: the caller takes its Python
    path then."""
    if not native_allowed():
        return None
    try:
        return importlib.import_module(name)
    except ImportError:  # installed without a C compiler (setup.py warned)
        return None
