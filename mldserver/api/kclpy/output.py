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
``HELD_MAX`` characters, or once that stream is flushed.

A processor's own threads print the same way: a thread started from a shard's thread
(in its processor's ``initialize``, ``process_records``...) or while the processor is
made, and the threads those start, write lines of their own, logged with the shard's id
and the thread's ``name``; their text without a newline waits for one, for a flush or
for ``HELD_MAX``::

    threading.Thread(target=upload, name="uploader").start()   # in initialize
    print("uploaded 500 records")                               # in upload, later
    -> {"level":"info","event":"handler_output","shard_id":"shardId-000000000001",
        "thread":"uploader","stream":"stdout","line":"uploaded 500 records"}

Which thread started which is noted as it starts: ``install`` wraps
``threading.Thread.start``, once (Python 3.11 raises no audit event for it), and the
wrapper does nothing more than note it. Writes that bypass ``sys.stdout``/``sys.stderr`` (``os.write(1,
...)``, a ``logging`` handler made before the server started) go to the process's own
stderr: in a handler process its fd 1 is its stderr, in the server the daemon is not on
it either; nothing reaches the daemon.
"""

from __future__ import annotations

import functools
import sys
import threading
from typing import Any

import weakref

from ...base.logs import EventLogger

HELD_MAX = 4096  # characters held without a newline before they are logged as they stand
EVENT = "handler_output"

_local = threading.local()  # .lines: the writing thread's Lines (None: not a shard's; unset: not looked up)
# Threads started by a thread with Lines, not yet writing: their shard's Lines.
_started: "weakref.WeakKeyDictionary[threading.Thread, Lines]" = weakref.WeakKeyDictionary()


class Lines:
    """One shard thread's output, cut into lines and logged; or, with ``shard``, the
    output of a thread its processor started (``thread``: the thread's name), logged
    with the shard's logger as it is when the line is logged."""

    def __init__(self, log: EventLogger | None, *, shard: "Lines | None" = None, thread: str | None = None) -> None:
        self.log = log  # (the shard's: its id bound at initialize)
        self.shard = shard
        self.thread = thread
        self.held = {"stdout": "", "stderr": ""}

    def started(self, thread: str) -> "Lines":
        """The Lines of a thread started by this one's thread."""
        return Lines(None, shard=self.shard or self, thread=thread)

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

    def flush(self, stream: str | None = None) -> None:
        """Log what is held without a newline (the call is over, or ``stream`` flushed)."""
        for name, held in self.held.items():
            if held and stream in (None, name):
                self.held[name] = ""
                self._log(name, held)

    def _log(self, stream: str, line: str) -> None:
        log = self.shard.log if self.shard is not None else self.log
        assert log is not None
        _local.lines = None  # a logging handler that writes to sys.stderr: straight through
        try:
            if self.thread is None:
                log.info(EVENT, stream=stream, line=line.rstrip("\r"))
            else:
                log.info(EVENT, thread=self.thread, stream=stream, line=line.rstrip("\r"))
        finally:
            _local.lines = self


def current() -> Lines | None:
    """The calling thread's Lines: bound (a shard's thread), inherited from the thread
    that started it (looked up once), or None."""
    try:
        return _local.lines
    except AttributeError:
        pass
    thread = threading.current_thread()
    shard = _started.pop(thread, None)
    lines = _local.lines = shard.started(thread.name) if shard is not None else None
    return lines


def _noting_starts(start: Any) -> Any:
    """``threading.Thread.start`` that notes, first, the starting thread's Lines (its
    shard's) for the new thread."""
    @functools.wraps(start)
    def noting(self: threading.Thread) -> None:
        lines = getattr(_local, "lines", None)
        if lines is not None:
            _started[self] = lines.shard or lines
        return start(self)

    noting.notes_lines = True  # type: ignore[attr-defined]
    return noting


class ShardStream:
    """``sys.stdout`` or ``sys.stderr``: a shard thread's writes to its ``Lines``, every
    other thread's to the stream it replaced (``fallback``)."""

    def __init__(self, name: str, fallback: Any) -> None:
        self.name = name
        self.fallback = fallback

    def write(self, text: str) -> int:
        lines = current()
        if lines is None:
            return self.fallback.write(text)
        return lines.write(self.name, text)

    def writelines(self, texts: Any) -> None:
        for text in texts:
            self.write(text)

    def flush(self) -> None:
        lines = current()
        if lines is None:
            self.fallback.flush()
        else:
            lines.flush(self.name)

    def isatty(self) -> bool:
        return False if current() is not None else self.fallback.isatty()

    def __getattr__(self, name: str) -> Any:  # encoding, fileno, buffer...: the stream it replaced
        return getattr(self.fallback, name)


def install() -> None:
    """``sys.stdout`` and ``sys.stderr`` replaced by ``ShardStream``s (once; again if
    something put others in their place); the threads started from shard threads seen."""
    if not getattr(threading.Thread.start, "notes_lines", False):
        threading.Thread.start = _noting_starts(threading.Thread.start)  # type: ignore[method-assign]
    if not isinstance(sys.stdout, ShardStream):
        sys.stdout = ShardStream("stdout", sys.stdout)
    if not isinstance(sys.stderr, ShardStream):
        sys.stderr = ShardStream("stderr", sys.stderr)


def bind(lines: Lines | None) -> None:
    """The calling thread's writes go to ``lines`` from now on (None: through)."""
    _local.lines = lines
