"""Sinks: where closed windows go. A sink has one method::

    class Sink:
        def commit(self, window: Window, rows: list[bytes]) -> None: ...

``rows`` are the window's rows in merged order, each one JSON object (bytes); the
first ``window.late`` of them are late rows. ``commit`` is called off the event loop,
one window at a time, in window order; it must be durable when it returns (the
coordinator then marks the rows committed and lets shards checkpoint past them). An
exception means "not committed": the same window is offered again after a backoff.

``open_sink("file:DIR")`` builds a sink from the ``--sink`` flag.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from ..coordinator.windows import Window
from ..errors import ConfigError


class Sink(Protocol):
    def commit(self, window: Window, rows: list[bytes]) -> None: ...


def open_sink(spec: str) -> Sink:
    kind, _, where = spec.partition(":")
    if not where:
        raise ConfigError(f"--sink {spec!r}: give a directory, as in file:./out")
    if kind == "file":
        from .file import FileSink

        return FileSink(Path(where))
    raise ConfigError(f"--sink {spec!r}: the {kind!r} sink is not available in this version (use file:DIR)")
