"""Names a package offers, imported when first asked for (PEP 562's module ``__getattr__``).

A package's ``__init__`` names what its users import (``from mldserver.server import
Server``) without importing it: the relay the daemon starts once per shard, and a handler
process, import ``mldserver`` and pay for none of the server. Every such face says where
each name lives, once, and this makes its ``__getattr__``::

    __all__ = ["Server", "ServerCrashed", "run"]
    __getattr__ = lazy_attributes(__name__, {"Server": ".server", "run": ".server", "ServerCrashed": "..errors"})

A name is looked up in its module (relative to the package, or absolute) the first time
it is asked for, then kept in the package, so the next lookup is an ordinary attribute.
``submodules`` are names that are the package's own modules (``mldserver.timers``, for
``mldserver.timers.create`` in a timer callback). Anything else is an ``AttributeError``
naming the package, as for any module.

It imports nothing but the standard library, and sits below every layer
(``tests/test_layers.py``); ``tests/test_faces.py`` tests it.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any, Callable, Iterable


def lazy_attributes(package: str, names: dict[str, str], submodules: Iterable[str] = ()) -> Callable[[str], Any]:
    """The ``__getattr__`` of the package ``package``: each of ``names`` imported from
    its module when first asked for, each of ``submodules`` as the module itself."""
    modules = frozenset(submodules)

    def __getattr__(name: str) -> Any:
        if name in modules:
            return importlib.import_module(f"{package}.{name}")
        module = names.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module, package), name)
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__
