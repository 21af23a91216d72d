"""Is the handler what its author meant? Checked once at start-up, before any record,
in the process that will run it (each handler process, or the server's own with
``--workers 0``), and by ``mldserver check --handler``::

    factory = import_from_string("orders:Orders", "handler")
    handler = check_handler(factory, context, "orders:Orders")   # ConfigError (one line), or an instance
    emits(type(handler))                                          # True: its code calls emit

A handler is refused with a ``ConfigError`` that names it when:

- a public method is a near miss of a callback it does not define (``process_record``
  in a class without ``process_records``, ``on_updte``, ``shard_end``): as written, the
  server would call the base class's empty callback and every record would be skipped
  without a word. "did you mean process_records?" (a helper with such a name beside the
  real callback is fine);
- it defines no callback that handles records (``process_records``; for a
  ``ChangeHandler``, ``on_update`` or ``on_delete``);
- a callback is not ``async def`` (``not_async``: the server awaits it);
- calling the factory as the server will, ``factory(context)``, raises (a constructor
  that takes no context, a missing environment variable): the instance made here is
  dropped, and the server makes one per shard later. A factory function's product is
  checked like a class.

An amazon_kclpy processor class arrives here wrapped (``api/loading.py``, ``api/kclpy``):
its callbacks are synchronous by design, and its constructor is called with no
arguments; a class with synchronous callbacks that does not subclass one of
amazon_kclpy's bases is told so.
"""

from __future__ import annotations

import inspect
from typing import Any

from .changes import ChangeHandler
from ..errors import ConfigError
from .handler import Handler

# The handler's callbacks, each awaited by the server.
CALLBACKS = ("initialize", "process_records", "shutdown_requested", "shard_ended", "lease_lost")
CHANGE_CALLBACKS = ("on_update", "on_delete")
# What a subclass may name: the callbacks and the base classes' public attributes.
API = frozenset(CALLBACKS + CHANGE_CALLBACKS) | {n for n in dir(ChangeHandler) if not n.startswith("_")}


def not_async(handler: Any) -> str | None:
    """Why ``handler`` (a class or an instance) cannot be awaited, or None."""
    for name in CALLBACKS:
        method = getattr(handler, name, None)
        if method is not None and not inspect.iscoroutinefunction(method):
            return (f"handler {_name(handler)}: {name} must be a coroutine function "
                    f"(the server awaits it); define it with `async def {name}`")
    return None


def check_class(cls: type) -> None:
    """A handler class's callbacks as the server will see them: ConfigError if one is
    misspelt, none handles records, or one is not ``async def``."""
    own = _defined_by_user(cls)
    for name in sorted(own):
        if name.startswith("_") or name in API or not callable(own[name]):
            continue
        import difflib  # (only here: a name that is not a callback's)

        near = difflib.get_close_matches(name, sorted(API), n=1, cutoff=0.8)
        if near and near[0] not in own and near[0] in CALLBACKS + CHANGE_CALLBACKS:
            raise ConfigError(
                f"handler {_name(cls)}: {name} is not a callback the server calls: did you mean {near[0]}? "
                f"(as written, {near[0]} is the base class's, which does nothing)")
    if issubclass(cls, ChangeHandler):
        if not own.keys() & {"on_update", "on_delete", "process_records", "dispatch"}:
            raise ConfigError(f"handler {_name(cls)}: a ChangeHandler needs on_update or on_delete "
                              f"(async def on_update(self, doc, meta)); it defines neither")
    elif issubclass(cls, Handler) and "process_records" not in own:
        raise ConfigError(f"handler {_name(cls)}: it defines no process_records, so no record would be handled; "
                          f"add async def process_records(self, batch, checkpointer)")
    elif not issubclass(cls, Handler) and not callable(getattr(cls, "process_records", None)):
        raise ConfigError(f"handler {_name(cls)}: it has no process_records; subclass mldserver.Handler "
                          f"and define async def process_records(self, batch, checkpointer)")
    error = not_async(cls)
    if error is not None:
        if not issubclass(cls, Handler):
            error += (" (an amazon_kclpy processor runs unchanged when it subclasses amazon_kclpy's "
                      "RecordProcessorBase: amazon_kclpy.v3.processor, amazon_kclpy.v2.processor or amazon_kclpy.kcl)")
        raise ConfigError(error)


def check_handler(factory: Any, context: Any, spec: str = "") -> Any:
    """``factory`` (a class or a function) checked, then called once as the server will
    call it per shard (``factory(context)``) and what it made checked too. ConfigError
    naming the handler, or the instance (which the caller drops)."""
    if inspect.isclass(factory):
        check_class(factory)
    try:
        instance = factory(context)
    except Exception as exc:
        what = spec or _name(factory)
        if hasattr(factory, "processor_class"):  # an amazon_kclpy processor, wrapped
            raise ConfigError(
                f"handler {what}: {_name(factory)}() failed at start-up: {type(exc).__name__}: {exc} "
                f"(the server builds one per shard with no arguments, as KCLProcess's script does)") from exc
        raise ConfigError(
            f"handler {what}: {_name(factory)}(context) failed at start-up: {type(exc).__name__}: {exc} "
            f"(the server calls it once per shard with the server context; a class takes it in "
            f"__init__(self, context))") from exc
    if instance is None:
        raise ConfigError(f"handler {spec or _name(factory)}: the factory returned None; return a handler")
    if not inspect.isclass(factory) or type(instance) is not factory:
        check_class(type(instance))
    return instance


def emits(cls: type) -> bool:
    """Does the code of ``cls`` (its methods and what they define) call ``emit``? For a
    warning at start-up when no sink keeps rows."""
    def calls(code: Any) -> bool:
        return "emit" in code.co_names or any(calls(c) for c in code.co_consts if inspect.iscode(c))

    classes = cls.__mro__ + getattr(cls, "processor_class", object).__mro__  # (an amazon_kclpy processor's)
    return any(calls(f.__code__) for klass in classes if klass not in (object, Handler, ChangeHandler)
               for f in vars(klass).values() if inspect.isfunction(f))  # (an override's super() too)


def _defined_by_user(cls: type) -> dict[str, Any]:
    """The attributes ``cls`` and its bases define, except mldserver's classes and object."""
    own: dict[str, Any] = {}
    for klass in reversed(cls.__mro__):
        if klass in (object, Handler, ChangeHandler):
            continue
        own.update(vars(klass))
    return own


def _name(obj: Any) -> str:
    owner = obj if inspect.isclass(obj) or inspect.isfunction(obj) else type(obj)
    return f"{owner.__module__}.{owner.__qualname__}"
