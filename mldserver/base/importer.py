"""Load user code named ``module:attr`` (``--handler``, ``--pipeline``), strictly.

``import_from_string("handlers.passthrough:Passthrough")`` returns the attribute.
Each failure is a ConfigError that says exactly what is wrong::

    Import string "handlers.passthrough" must be in format "<module>:<attribute>".
    Could not import module "handlers.passthrouh".
    Attribute "Passthru" not found in module "handlers.passthrough".

An ImportError raised *inside* the user's module (a missing dependency of theirs) is
reported as such, with its own message, not as "could not import module"; when that
dependency is one an extra of mldserver installs, the message says which::

    Importing module "app" (handler) failed: No module named 'amazon_kclpy': an amazon_kclpy
    processor needs it: pip install 'mldserver[kclpy]' (or the amazon-kclpy your application uses)

``callable_only=False`` returns what it finds, callable or not (``not_callable`` is the
message for it): the caller looks at it first (``api/loading.py``: an amazon_kclpy
processor instance where its class belongs).
"""

from __future__ import annotations

import importlib
from typing import Any

from ..errors import ConfigError


# A missing module that an extra provides: the extra to install.
EXTRAS = {
    "amazon_kclpy": "an amazon_kclpy processor needs it: pip install 'mldserver[kclpy]' "
                    "(or the amazon-kclpy your application uses)",
}


def import_from_string(spec: str, what: str = "handler", *, callable_only: bool = True) -> Any:
    module_name, _, attrs = spec.partition(":")
    if not module_name or not attrs:
        raise ConfigError(f'Import string "{spec}" must be in format "<module>:<attribute>" ({what}).')
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and (module_name == exc.name or module_name.startswith(exc.name + ".")):
            raise ConfigError(
                f'Could not import module "{module_name}" ({what} {spec}): is it on PYTHONPATH '
                f"(the server's working directory is included)?"
            ) from None
        hint = EXTRAS.get((exc.name or "").partition(".")[0])
        raise ConfigError(f'Importing module "{module_name}" ({what}) failed: {exc}'
                          + (f": {hint}" if hint else "")) from exc
    except Exception as exc:
        raise ConfigError(f'Importing module "{module_name}" ({what}) failed: {type(exc).__name__}: {exc}') from exc
    obj: Any = module
    for attr in attrs.split("."):
        try:
            obj = getattr(obj, attr)
        except AttributeError:
            raise ConfigError(f'Attribute "{attrs}" not found in module "{module_name}" ({what}).') from None
    if callable_only and not callable(obj):
        raise ConfigError(not_callable(spec, what))
    return obj


def not_callable(spec: str, what: str) -> str:
    return f'"{spec}" is not callable: the {what} must be a class or a factory function.'
