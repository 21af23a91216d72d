r"""The KCL daemon's output as messages: a log line with the lines that continue it.

The daemon (logback) writes one line per message, but a message carrying an exception
goes on over many: the exception, its stack frames, its causes. Read line by line, one
failed attempt at the lease table was 40 ``daemon_error`` events; grouped, it is one::

    2026-11-27 21:38:46,212 [multi-lang-daemon-0000] ERROR s.a.kinesis.coordinator.Scheduler [NONE] - Caught exception when initializing LeaseCoordinator
    java.lang.RuntimeException: software.amazon.awssdk.core.exception.SdkClientException: Unable to execute HTTP request: Connection refused: /127.0.0.1:9 (SDK Attempt Count: 9)
    \tat software.amazon.kinesis.retrieval.AWSExceptionManager.apply(AWSExceptionManager.java:68)
    ...
    Caused by: java.net.ConnectException: Connection refused
    \tat java.base/sun.nio.ch.Net.pollConnect(Native Method)
    \t... 3 common frames omitted

    messages = Messages()
    messages.feed(line)   # -> the messages this line ended (a new message starts with it)
    messages.flush()      # -> the message under way, if any: its end, after a quiet moment

A message starts with a log line (its time stamp, ``[thread]`` and level) at that level
(``WARN`` -> warning, ``ERROR`` -> error, ``INFO`` -> info, ``DEBUG``/``TRACE`` -> debug).
Every other line continues the message under way (``\tat ...``, ``Caused by:``,
``... 3 common frames omitted``, a usage text), except an exception the JVM printed by
itself (``Exception in thread "main" ...``, or ``java.lang.NullPointerException: ...``
after a line that is not a WARN or ERROR awaiting its exception): that starts a message
of its own, at error. The reader decides when a message is over: at the next one, or
when the daemon has been quiet for a moment (``Daemon``'s timer, ``QUIET_S``).

Pure: no clock, no I/O.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable

QUIET_S = 0.5  # the daemon quiet this long: the message under way has ended

LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d[,.]\d+ \[[^\]]*\] (?P<level>TRACE|DEBUG|INFO|WARN|ERROR|FATAL)\b")
LEVELS = {"TRACE": "debug", "DEBUG": "debug", "INFO": "info", "WARN": "warning", "ERROR": "error", "FATAL": "error"}
# An exception's own line: "java.lang.RuntimeException: ...", "Exception in thread ...".
EXCEPTION = re.compile(r"^(Exception in thread |[\w.$]+(Exception|Error|Throwable)(: |$))")
CAUSED_BY = "Caused by: "


@dataclass(frozen=True, slots=True)
class Message:
    """One message of the daemon's: ``level`` (ours), its ``lines``."""

    level: str
    lines: tuple[str, ...]

    @property
    def first(self) -> str:
        return self.lines[0]

    @property
    def exception(self) -> str | None:
        """The exception it carries (its first line), if any."""
        return next((line for line in self.lines if EXCEPTION.match(line)), None)

    @property
    def caused_by(self) -> str | None:
        """The deepest ``Caused by:`` of its exception, if any."""
        return deepest_cause(self.lines)


def deepest_cause(lines: Iterable[str]) -> str | None:
    """The deepest ``Caused by:`` of a Java stack trace's ``lines``, where the trouble
    began (as the JVM prints it, or as py4j quotes it in a Python error), if any."""
    causes = [line.strip()[len(CAUSED_BY):] for line in lines if line.strip().startswith(CAUSED_BY)]
    return causes[-1] if causes else None


class Messages:
    """Lines in (without their newline), whole messages out."""

    def __init__(self) -> None:
        self._level = "info"
        self._lines: list[str] = []

    @property
    def pending(self) -> bool:
        """A message is under way (``flush`` would end it)."""
        return bool(self._lines)

    def feed(self, line: str) -> list[Message]:
        """The message this line ended, if it starts one; else it continues the one under way."""
        m = LOG_LINE.match(line)
        if m is not None:
            return self._start(LEVELS[m["level"]], line)
        if EXCEPTION.match(line) and not self._awaits_exception():
            return self._start("error", line)  # the JVM's own, not a logged message's
        if not self._lines:
            return self._start("info", line)  # a bare line with nothing before it (a usage text, a JVM notice)
        self._lines.append(line)
        return []

    def flush(self) -> Message | None:
        """The message under way, ended (None if there is none)."""
        if not self._lines:
            return None
        message = Message(self._level, tuple(self._lines))
        self._lines = []
        return message

    def _start(self, level: str, line: str) -> list[Message]:
        ended = self.flush()
        self._level, self._lines = level, [line]
        return [] if ended is None else [ended]

    def _awaits_exception(self) -> bool:
        # A WARN or ERROR line alone so far: the exception on the next line is its own.
        return len(self._lines) == 1 and self._level in ("warning", "error")
