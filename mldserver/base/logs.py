"""Structured logs: one JSON object per line, ``tail -f`` and ``jq`` friendly.

Every entry has ``ts`` (UTC, ISO 8601 with milliseconds), ``level`` and ``event``,
plus fields where they apply (``shard_id``, ``conn``, ``records``, ``duration_ms``,
``error``)::

    log = get_logger("mldserver.shard").bind(conn=3, shard_id="shardId-000000000001")
    log.info("batch", records=500, duration_ms=1.7)
    -> {"ts":"2026-11-21T10:00:00.123Z","level":"info","event":"batch","conn":3,
        "shard_id":"shardId-000000000001","records":500,"duration_ms":1.7}

Follow one shard: ``tail -f server.log | jq -c 'select(.shard_id=="shardId-000000000001")'``.
Only the CLI calls :func:`configure`; library code only gets loggers.

Every event mldserver logs is in one catalogue, the data file ``events.toml`` beside
this module, read by :func:`events`::

    events()["window_committed"]  ->  LogEvent(area="coordinator", levels=("info",),
                                               meaning="A closed window was committed to the sink ...")

With ``MLDSERVER_CHECK_EVENTS=1`` in the environment (the tests' processes and the
servers they start) a logger raises ``UncataloguedEvent`` for a name, or a level of it,
that is not there; otherwise nothing is looked up. A handler's ``context.log``
(:func:`handler_logger`) logs the handler's own events, unchecked.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from pathlib import Path
from typing import Any, Iterator, NamedTuple, TextIO

import orjson

from .durable import utc_timestamp
from .secrets import scrub
from ..errors import ConfigError

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}
LEVELS = tuple(_LEVELS)  # the levels an event is logged at
EVENTS_FILE = Path(__file__).with_name("events.toml")


class LogEvent(NamedTuple):
    """An entry of the catalogue: ``[area.name]`` in ``events.toml``."""

    area: str  # the part of the server that logs it (a heading of the reference)
    levels: tuple[str, ...]  # the levels it is logged at
    meaning: str  # one line: what happened
    todo: str = ""  # what to do about it: every warning and error has one (the troubleshooting reference)


def events(path: Path = EVENTS_FILE) -> dict[str, LogEvent]:
    """Every log event mldserver can emit, in the catalogue's order (its areas' too). An
    entry with other keys than ``levels``, ``meaning`` and ``todo``, without the first two,
    or an event under two areas, is a ValueError naming it."""
    import tomllib  # (only here: the catalogue is read when checked, by tests and the docs)

    found: dict[str, LogEvent] = {}
    for area, entries in tomllib.loads(path.read_text()).items():
        for name, entry in entries.items():
            if name in found:
                raise ValueError(f"{path}: the event {name!r} is under two areas, {found[name].area!r} and "
                                 f"{area!r}: keep one table, [{found[name].area}.{name}] or [{area}.{name}]")
            if not {"levels", "meaning"} <= set(entry) <= {"levels", "meaning", "todo"}:
                raise ValueError(f"{path}: [{area}.{name}] has {sorted(entry)}: give it levels, meaning and, "
                                 f"for a warning or an error, todo")
            found[name] = LogEvent(area, tuple(entry["levels"]), entry["meaning"], entry.get("todo", ""))
    return found


class UncataloguedEvent(AssertionError):
    """An event (or a level of it) logged that the catalogue (``events.toml``) does not list."""


def catalogue() -> frozenset[tuple[str, int]] | None:
    """The (event, level) pairs loggers check against, or None (no check)."""
    if os.environ.get("MLDSERVER_CHECK_EVENTS", "") in ("", "0"):
        return None
    return frozenset((name, _LEVELS[level]) for name, event in events().items() for level in event.levels)


_CATALOGUE = catalogue()  # read once: the hot path pays one comparison when it is off


class EventLogger:
    """A logger whose messages are event names and whose details are fields."""

    __slots__ = ("_logger", "_fields", "_checked")

    def __init__(self, logger: logging.Logger, fields: dict[str, Any] | None = None, *, checked: bool = True) -> None:
        self._logger = logger
        self._fields = fields or {}
        self._checked = checked  # against the catalogue, when there is one (False: a handler's own events)

    def bind(self, **fields: Any) -> "EventLogger":
        return EventLogger(self._logger, {**self._fields, **fields}, checked=self._checked)

    def _log(self, level: int, event: str, fields: dict[str, Any], exc_info: Any = None) -> None:
        if _CATALOGUE is not None and self._checked and (event, level) not in _CATALOGUE:
            raise UncataloguedEvent(
                f"log event {event!r} at level {logging.getLevelName(level).lower()} is not in "
                f"the catalogue, mldserver/base/events.toml: add it there ([area.{event}], its levels, one "
                f"line on what it means and, for a warning or an error, what to do)")
        if self._logger.isEnabledFor(level):
            self._logger.log(level, event, extra={"fields": {**self._fields, **fields}}, exc_info=exc_info)

    def debug(self, event: str, **fields: Any) -> None:
        self._log(logging.DEBUG, event, fields)

    def info(self, event: str, **fields: Any) -> None:
        self._log(logging.INFO, event, fields)

    def warning(self, event: str, **fields: Any) -> None:
        self._log(logging.WARNING, event, fields)

    def error(self, event: str, exc_info: Any = None, **fields: Any) -> None:
        self._log(logging.ERROR, event, fields, exc_info)

    def is_enabled(self, level: str) -> bool:
        return self._logger.isEnabledFor(_LEVELS[level])


def get_logger(name: str) -> EventLogger:
    return EventLogger(logging.getLogger(name))


def handler_logger() -> EventLogger:
    """A handler's ``context.log``: the handler's own events, named as it likes."""
    return EventLogger(logging.getLogger("mldserver.handler"), checked=False)


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": utc_timestamp(record.created),
            "level": record.levelname.lower(),
            "event": record.getMessage(),
        }
        entry.update(getattr(record, "fields", {}))
        if record.exc_info:
            entry["traceback"] = self.formatException(record.exc_info)
        try:
            line = orjson.dumps(entry, default=str).decode()
        except TypeError:  # orjson refuses what JSON allows: an int past 64 bits, a non-str key
            line = orjson.dumps(_encodable(entry), default=str).decode()
        return scrub(line)  # no password or key a catalog's error quoted


_INT64 = range(-(1 << 63), 1 << 64)  # what orjson encodes as a number


def _encodable(value: Any) -> Any:
    """``value`` with what orjson cannot encode made a string (an event time of
    2**64 ms logs as "18446744073709551616"), so the line is still written."""
    if isinstance(value, int) and not isinstance(value, bool) and value not in _INT64:
        return str(value)
    if isinstance(value, dict):
        return {str(k): _encodable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_encodable(v) for v in value]
    return value


class ConsoleFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        fields = " ".join(f"{k}={v}" for k, v in getattr(record, "fields", {}).items())
        line = f"{utc_timestamp(record.created)} {record.levelname.lower():7} {record.getMessage():24} {fields}".rstrip()
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return scrub(line)


def configure(fmt: str = "json", level: str = "info", file: str | None = None, stream: TextIO | None = None) -> None:
    """Send mldserver's logs to ``file`` (appended) or stderr, as JSON lines or console text.
    A file that cannot be opened, or an unknown level, is a ConfigError naming it."""
    if level not in _LEVELS:
        raise ConfigError(f"log_level must be one of {', '.join(map(repr, _LEVELS))}, got {level!r}")
    handler: logging.Handler
    handler = file_handler(file) if file else logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else ConsoleFormatter())
    root = logging.getLogger("mldserver")
    root.handlers[:] = [handler]
    root.setLevel(_LEVELS[level])
    root.propagate = False


def file_handler(file: str) -> logging.FileHandler:
    """``file`` opened for appending (created if need be), or a ConfigError naming it.
    Opened again when it is moved or deleted (logrotate's default ``create`` mode, or
    ``mv server.log server.log.1``): the server never writes on into a rotated file."""
    import logging.handlers  # (only here: a server with --log-file; a handler process writes none)

    try:
        return logging.handlers.WatchedFileHandler(file)
    except OSError as exc:
        raise ConfigError(
            f"--log-file {file}: cannot open it for appending ({exc.strerror}): "
            f"create its folder or fix the permissions, or choose another path"
        ) from None


@contextlib.contextmanager
def errors_only() -> Iterator[None]:
    """Within it, mldserver logs errors alone: the clean-up after a start-up that failed
    (its one-line error says what happened; "shutting_down" and "stopped" would say a
    server had run)."""
    root = logging.getLogger("mldserver")
    level = root.level
    root.setLevel(max(level, logging.ERROR))
    try:
        yield
    finally:
        root.setLevel(level)

