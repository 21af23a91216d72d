"""What ``--handler MODULE:ATTR`` names, as the server calls it: once per shard, with the
server context. The one place that reads a handler spec, for the server, each handler
process and ``mldserver check``::

    factory = load_handler("handlers.orders:Orders")         # the class itself
    factory = load_handler("app:RecordProcessor")            # an amazon_kclpy processor class:
                                                             # a Handler class wrapping it (api/kclpy)
    load_handler("app:processor")                            # an instance of one: ConfigError
        -> handler app:processor is an instance of the amazon_kclpy processor app.RecordProcessor:
           name its class (--handler app:RecordProcessor); the server makes one instance per shard

Anything else is the importer's (``base/importer.py``), with its exact messages.
"""

from __future__ import annotations

from typing import Any, Callable

from ..base.importer import import_from_string, not_callable
from ..errors import ConfigError
from . import kclpy


def load_handler(spec: str) -> Callable[[Any], Any]:
    return handler_factory(import_from_string(spec, "handler", callable_only=False), spec)


def handler_factory(obj: Any, spec: str = "") -> Callable[[Any], Any]:
    """``obj`` as the server calls it per shard: an amazon_kclpy processor class wrapped
    (``kclpy.wrap``), anything callable as it is."""
    version = kclpy.processor_api(obj)
    if version is not None:
        return kclpy.wrap(obj, version)
    if kclpy.is_processor_instance(obj):
        cls = type(obj)
        module, _, _ = spec.partition(":")
        raise ConfigError(
            f"handler {spec or cls.__qualname__} is an instance of the amazon_kclpy processor "
            f"{cls.__module__}.{cls.__qualname__}: name its class (--handler {module or cls.__module__}:"
            f"{cls.__qualname__}); the server makes one instance per shard, as KCLProcess makes one per process")
    if not callable(obj):
        raise ConfigError(not_callable(spec, "handler"))
    return obj
