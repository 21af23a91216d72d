"""What an amazon_kclpy processor prints: log events with its shard id, never a byte on
the daemon's conversation.

Under the MultiLangDaemon a processor's stdout is the protocol (a ``print()`` there is a
line the daemon tries to read) and its stderr is logged by the daemon as errors. Here
``sys.stdout`` and ``sys.stderr`` are replaced, once per process, by streams that look
at the writing thread: in a shard's thread (``thread.py``) each line becomes one
``handler_output`` event; anywhere else the write goes where it went before::

    print("Was throttled while checkpointing")          # in shardId-000000000001's thread
    -> {"level":"info","event":"handler_output","shard_id":"shardId-000000000001",
        "stream":"stdout","line":"Was throttled while checkpointing"}

Text is cut into lines at ``\\n``. What is left without a newline (the sample's
``sys.stderr.write(message)``) is logged when the call returns, or once it passes
``HELD_MAX`` characters. Writes that bypass ``sys.stdout``/``sys.stderr`` (``os.write(1,
...)``, a ``logging`` handler made before the server started) go to the process's own
stderr: in a handler process its fd 1 is its stderr, in the server the daemon is not on
it either; nothing reaches the daemon.
"""

from __future__ import annotations

import sys
import threading
from typing import Any

from ...base.logs import EventLogger

HELD_MAX = 4096  # characters held without a newline before they are logged as they stand
EVENT = "handler_output"

_local = threading.local()  # .lines: the writing thread's Lines (None: not a shard's thread)


class Lines:
    """One shard thread's output, cut into lines and logged."""

    def __init__(self, log: EventLogger) -> None:
        self.log = log
        self.held = {"stdout": "", "stderr": ""}

    def write(self, stream: str, text: str) -> int:
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        held = self.held[stream] + text
        if "\n" in held:
            *lines, held = held.split("\n")
            for line in lines:
                self._log(stream, line)
        if len(held) > HELD_MAX:
            self._log(stream, held)
            held = ""
        self.held[stream] = held
        return len(text)

    def flush(self) -> None:
        """Log what is held without a newline (the call is over)."""
        for stream, held in self.held.items():
            if held:
                self.held[stream] = ""
                self._log(stream, held)

    def _log(self, stream: str, line: str) -> None:
        _local.lines = None  # a logging handler that writes to sys.stderr: straight through
        try:
            self.log.info(EVENT, stream=stream, line=line.rstrip("\r"))
        finally:
            _local.lines = self


class ShardStream:
    """``sys.stdout`` or ``sys.stderr``: a shard thread's writes to its ``Lines``, every
    other thread's to the stream it replaced (``fallback``)."""

    def __init__(self, name: str, fallback: Any) -> None:
        self.name = name
        self.fallback = fallback

    def write(self, text: str) -> int:
        lines = getattr(_local, "lines", None)
        if lines is None:
            return self.fallback.write(text)
        return lines.write(self.name, text)

    def writelines(self, texts: Any) -> None:
        for text in texts:
            self.write(text)

    def flush(self) -> None:
        if getattr(_local, "lines", None) is None:
            self.fallback.flush()

    def isatty(self) -> bool:
        return False if getattr(_local, "lines", None) is not None else self.fallback.isatty()

    def __getattr__(self, name: str) -> Any:  # encoding, fileno, buffer...: the stream it replaced
        return getattr(self.fallback, name)


def install() -> None:
    """``sys.stdout`` and ``sys.stderr`` replaced by ``ShardStream``s (once; again if
    something put others in their place)."""
    if not isinstance(sys.stdout, ShardStream):
        sys.stdout = ShardStream("stdout", sys.stdout)
    if not isinstance(sys.stderr, ShardStream):
        sys.stderr = ShardStream("stderr", sys.stderr)


def bind(lines: Lines | None) -> None:
    """The calling thread's writes go to ``lines`` from now on (None: through)."""
    _local.lines = lines
