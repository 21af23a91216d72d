"""``mldserver check``: what ``mldserver serve`` would find at start-up, without serving.

The same code path as ``serve``: the settings through ``config.load`` (every value
against its Rule), the handler and the pipeline through the importer, the state
directory created and probed by ``preflight``, the log file opened as ``logs`` opens
it. It neither binds nor starts Spark, so it can run beside a live server (before a
restart, in a deploy script)::

    $ mldserver check --config /etc/mldserver.toml
    config      /etc/mldserver.toml (execution_timeout=30.0, handler_retries=4)
    handler     handlers.orders:Orders (class)
    pipeline    handlers.orders:pipeline (function)
    state_dir   /var/lib/mldserver (writable)
    listen      127.0.0.1:7070
    sink        parquet:/var/lib/mldserver/output
    ok

Exit 0 when all is well; a mistake is the ConfigError ``serve`` would stop on: one line
on stderr, exit 2. Each check is one function of ``CHECKS``: more (the daemon's
properties file) join them there.
"""

from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path
from typing import Any, Callable, TextIO

from . import logs, preflight
from .config import Settings
from .importer import import_from_string


def config(settings: Settings, source: str | None) -> tuple[str, str]:
    changed = [
        f"{f.name}={getattr(settings, f.name)!r}"
        for f in dataclasses.fields(Settings)
        if f.name != "handler" and getattr(settings, f.name) != f.default
    ]
    return "config", f"{source or '(no file)'}" + (f" ({', '.join(changed)})" if changed else " (all defaults)")


def handler(settings: Settings, source: str | None) -> tuple[str, str]:
    return "handler", f"{settings.handler} ({_kind(import_from_string(settings.handler, 'handler'))})"


def pipeline(settings: Settings, source: str | None) -> tuple[str, str] | None:
    if not settings.pipeline:
        return None
    return "pipeline", f"{settings.pipeline} ({_kind(import_from_string(settings.pipeline, 'pipeline'))})"


def state_dir(settings: Settings, source: str | None) -> tuple[str, str]:
    path = preflight.writable_state_dir(Path(settings.state_dir))
    return "state_dir", f"{path.resolve()} (writable)"


def log_file(settings: Settings, source: str | None) -> tuple[str, str] | None:
    if not settings.log_file:
        return None
    logs.file_handler(settings.log_file).close()
    return "log_file", f"{settings.log_file} (appendable)"


def listen(settings: Settings, source: str | None) -> tuple[str, str]:
    where = [f"unix:{settings.unix}"] if settings.unix else []
    if settings.tcp_port is not None:
        where.append(f"{settings.host}:{settings.tcp_port}")
    return "listen", " and ".join(where)


def sink(settings: Settings, source: str | None) -> tuple[str, str]:
    return "sink", settings.sink or "(none: rows are not collected)"


CHECKS: list[Callable[[Settings, str | None], tuple[str, str] | None]] = [
    config, handler, pipeline, state_dir, log_file, listen, sink,
]


def run(settings: Settings, source: str | None, out: TextIO) -> None:
    """Run every check, printing what each found; the first that fails raises its
    ConfigError (the CLI prints it and exits 2)."""
    for check in CHECKS:
        found = check(settings, source)
        if found is not None:
            out.write(f"{found[0]:<11} {found[1]}\n")
    out.write("ok\n")


def _kind(obj: Any) -> str:
    return "class" if inspect.isclass(obj) else "function" if inspect.isfunction(obj) else type(obj).__name__
