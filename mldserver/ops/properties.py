"""The KCL MultiLangDaemon's properties file: read it as the daemon does (Java
``Properties.load``), and check it against what mldserver needs (docs/protocol.md, section 7).

The daemon silently ignores a key it does not know, and some values defeat the
server's guarantees, so ``mldserver check --properties`` and ``mldserver run`` report
each finding with its line and what to do::

    >>> import pathlib, tempfile
    >>> path = pathlib.Path(tempfile.mkdtemp(), "mld.properties")
    >>> lines = ["applicationName = orders-app", "streamName = orders", "regionName = us-east-1",
    ...          "shutdownGraceMillis = 30000", "initialPositonInStream = TRIM_HORIZON"]
    >>> _ = path.write_text("".join(line + chr(10) for line in lines))
    >>> props = read(path)
    >>> for f in check(props, Settings(), run=True):  # as ``mldserver run`` checks it
    ...     print(f.render("mld.properties"))
    error    mld.properties:5 initialPositonInStream: not a key the KCL 3.1.3 daemon knows (it ignores it silently): did you mean initialPositionInStream?

The known keys are ``mldserver.ops.kcl_keys`` (generated from the jars by
scripts/kcl-property-keys), so checking needs no Java.
"""

from __future__ import annotations

import difflib
import ipaddress
import math
import os
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

from . import kcl_keys
from ..base.config import Settings
from ..errors import ConfigError

# Headroom on top of the handler's worst case for timeoutInSeconds: starting the relay,
# checkpoint round trips, a slot wait.
TIMEOUT_MARGIN_S = 10.0
INITIAL_POSITIONS = ("TRIM_HORIZON", "LATEST", "AT_TIMESTAMP")


@dataclass(frozen=True)
class Entry:
    key: str
    value: str
    line: int  # first line of the entry (1-based)
    last_line: int  # last line (a value continued with a trailing backslash)


@dataclass
class Properties:
    path: Path
    entries: list[Entry] = field(default_factory=list)

    def get(self, key: str) -> Entry | None:
        """The entry that wins (the last one, as in Java)."""
        for entry in reversed(self.entries):
            if entry.key == key:
                return entry
        return None

    def value(self, key: str) -> str | None:
        entry = self.get(key)
        return entry.value.strip() if entry is not None else None


@dataclass(frozen=True)
class Finding:
    level: str  # "error" or "warning"
    line: int | None
    key: str
    message: str

    def render(self, path: Path | str) -> str:
        where = f"{path}:{self.line}" if self.line else str(path)
        return f"{self.level:<8} {where} {self.key}: {self.message}"


def read(path: str | Path) -> Properties:
    """Parse as ``java.util.Properties.load(InputStream)`` does (ISO-8859-1, ``#``/``!``
    comments, ``=``/``:``/whitespace separators, trailing-backslash continuations,
    ``\\uXXXX`` escapes). A file that is missing, unreadable, or that Java would refuse
    (a malformed ``\\u`` escape) is a ConfigError naming it, and the line."""
    path = Path(path)
    try:
        text = path.read_bytes().decode("latin-1")
    except FileNotFoundError:
        raise ConfigError(f"--properties {path}: no such file: give the daemon's properties file "
                          f"(deploy/mld.properties is a template)") from None
    except IsADirectoryError:
        raise ConfigError(f"--properties {path}: is a directory, not a properties file") from None
    except OSError as exc:
        raise ConfigError(f"--properties {path}: cannot read it ({exc.strerror})") from None
    props = Properties(path)
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        first = i
        logical = lines[i].rstrip("\r").lstrip(" \t\f")
        i += 1
        if not logical or logical[0] in "#!":
            continue
        while _continued(logical) and i < len(lines):
            logical = logical[:-1] + lines[i].rstrip("\r").lstrip(" \t\f")
            i += 1
        if _continued(logical):
            logical = logical[:-1]
        key, value = _split(logical)
        try:
            props.entries.append(Entry(_unescape(key), _unescape(value), first + 1, i))
        except ValueError as exc:
            raise ConfigError(f"--properties {path}:{first + 1}: does not parse ({exc}): the daemon would "
                              f"refuse the whole file; write \\u followed by four hex digits, or \\\\") from None
    return props


def _continued(line: str) -> bool:
    return (len(line) - len(line.rstrip("\\"))) % 2 == 1


def _split(line: str) -> tuple[str, str]:
    i, n = 0, len(line)
    while i < n:
        c = line[i]
        if c == "\\":
            i += 2
            continue
        if c in "=: \t\f":
            break
        i += 1
    key, rest = line[:i], line[i:]
    rest = rest.lstrip(" \t\f")
    if rest[:1] in ("=", ":"):
        rest = rest[1:].lstrip(" \t\f")
    return key, rest


_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}


def _unescape(s: str) -> str:
    if "\\" not in s:
        return s
    out, i = [], 0
    while i < len(s):
        c = s[i]
        if c != "\\" or i + 1 >= len(s):
            out.append(c)
            i += 1
            continue
        nxt = s[i + 1]
        if nxt == "u":
            digits = s[i + 2:i + 6]
            if len(digits) != 4 or any(d not in "0123456789abcdefABCDEF" for d in digits):
                raise ValueError(f"malformed \\uxxxx escape {s[i:i + 6]!r}")
            out.append(chr(int(digits, 16)))
            i += 6
        else:
            out.append(_ESCAPES.get(nxt, nxt))
            i += 2
    return "".join(out)


# -- checks ------------------------------------------------------------------------


def known(key: str) -> bool:
    return _normal(key) in kcl_keys.KEYS or key.startswith(kcl_keys.PREFIXES)


def _normal(key: str) -> str:
    """The daemon's own rewrite (KinesisClientLibConfigurator.processKey)."""
    if key.lower().startswith("awscredentialsprovider"):
        return "awsCredentialsProvider" + key[len("awscredentialsprovider"):]
    return key


def suggestion(key: str) -> str | None:
    """The nearest known key: a case slip first, then the closest spelling."""
    lower = {k.lower(): k for k in kcl_keys.KEYS}
    if key.lower() in lower:
        return lower[key.lower()]
    close = difflib.get_close_matches(key, kcl_keys.KEYS, n=1, cutoff=0.75)
    return close[0] if close else None


def handler_worst_case(settings: Settings) -> float:
    """Seconds one action can take at the server before its status: every handler try
    up to execution_timeout, the backoff between them, and a margin."""
    tries = settings.handler_retries + 1
    backoff = sum(settings.handler_backoff * 2**i for i in range(settings.handler_retries))
    return settings.execution_timeout * tries + backoff + TIMEOUT_MARGIN_S


def stream_settings(path: str | Path) -> dict[str, str]:
    """``mldserver run`` (and ``check --properties``): the stream the daemon reads, from its
    properties, as settings beneath the config file and the flags (``config.load``'s
    ``defaults``): ``stream`` from ``streamArn`` or ``streamName``, ``aws_region`` from
    ``regionName``, ``aws_endpoint_url`` from ``kinesisEndpoint``. So the coordinator
    knows the stream's shards and lineage, and the table sink its positions' stream,
    with nothing set twice (a file that cannot be read is a ConfigError, as ``read``)::

        stream_settings("app.properties")   # {"stream": "orders", "aws_region": "us-east-1"}
    """
    props = read(path)
    found = {"stream": props.value("streamArn") or props.value("streamName"),
             "aws_region": props.value("regionName"), "aws_endpoint_url": props.value("kinesisEndpoint")}
    return {k: v for k, v in found.items() if v} if found["stream"] else {}


def check(props: Properties, settings: Settings, *, run: bool = False) -> list[Finding]:
    """Every finding, in line order (file-wide ones first). ``run``: the file is for
    ``mldserver run``, which sets executableName itself."""
    found: list[Finding] = []
    error = lambda line, key, msg: found.append(Finding("error", line, key, msg))  # noqa: E731
    warning = lambda line, key, msg: found.append(Finding("warning", line, key, msg))  # noqa: E731

    seen: dict[str, Entry] = {}
    for entry in props.entries:
        if entry.key in seen:
            warning(entry.line, entry.key, f"also set on line {seen[entry.key].line}: the daemon uses the last "
                                           f"one ({entry.value!r}); keep one")
        seen[entry.key] = entry
        if not known(entry.key):
            near = suggestion(entry.key)
            hint = f"did you mean {near}?" if near else "remove it, or check the name in deploy/mld.properties"
            error(entry.line, entry.key, f"not a key the KCL {kcl_keys.KCL_VERSION} daemon knows (it ignores it "
                                         f"silently): {hint}")

    if not (props.value("streamName") or props.value("streamArn")):
        error(None, "streamName", "no stream: set streamName (or streamArn); the daemon will not start without one")
    for key, what in (("applicationName", "the consumer's name, also its lease table's"),
                      ("regionName", "the stream's AWS region, e.g. us-east-1")):
        if not props.value(key):
            entry = props.get(key)
            error(entry.line if entry else None, key, f"missing: set {key} ({what})")

    pos = props.get("initialPositionInStream")
    if pos is not None and pos.value.strip() not in INITIAL_POSITIONS:
        error(pos.line, pos.key, f"{pos.value.strip()!r} is not a position: use {' or '.join(INITIAL_POSITIONS[:2])}")

    if not run:
        found.extend(_executable(props, settings))

    timeout = props.get("timeoutInSeconds")
    if timeout is not None:
        needed = math.ceil(handler_worst_case(settings))
        try:
            seconds = int(timeout.value.strip())
        except ValueError:
            error(timeout.line, timeout.key, f"{timeout.value!r} is not a whole number of seconds")
        else:
            if seconds < needed:
                error(timeout.line, timeout.key,
                      f"{seconds} s is shorter than one handler call may take here ({needed} s: "
                      f"execution_timeout {settings.execution_timeout:g} s x {settings.handler_retries + 1} tries, "
                      f"backoff, {TIMEOUT_MARGIN_S:g} s margin) and the daemon halts the whole JVM past it: "
                      f"remove timeoutInSeconds (mldserver times handler calls itself) or set it to at least {needed}")

    grace = props.get("shutdownGraceMillis")
    if grace is None or grace.value.strip() in ("", "0"):
        error(grace.line if grace else None, "shutdownGraceMillis",
              ("missing (default 0)" if grace is None or not grace.value.strip() else "0")
              + ": on SIGTERM no shard gets shutdownRequested, so nothing is checkpointed before the leases go; "
                "set shutdownGraceMillis = 30000")
    else:
        try:
            if int(grace.value.strip()) < 0:
                raise ValueError
        except ValueError:
            error(grace.line, grace.key, f"{grace.value!r} is not a number of milliseconds: use e.g. 30000")

    empty = props.get("callProcessRecordsEvenForEmptyRecordList")
    if settings.sink and (empty is None or empty.value.strip().lower() != "true"):
        error(empty.line if empty else None, "callProcessRecordsEvenForEmptyRecordList",
              "not true: with windows (a sink), an idle shard then never reports that it is caught up, its "
              "watermark stalls and windows close only after idle_timeout; set it to true")

    return sorted(found, key=lambda f: f.line or 0)


def _executable(props: Properties, settings: Settings) -> list[Finding]:
    entry = props.get("executableName")
    if entry is None or not entry.value.strip():
        return [Finding("error", entry.line if entry else None, "executableName",
                        f"missing: set executableName = {relay_example(settings)} (or use mldserver run, which "
                        f"sets it: check its arguments with --for run)")]
    words = entry.value.split()
    problem = _relay_problem(words, settings)
    if problem:
        return [Finding("error", entry.line, entry.key, f"{problem}: use executableName = {relay_example(settings)} "
                                                        f"(or, when mldserver run starts the daemon, check with --for "
                                                        f"run: run sets executableName itself)")]
    program = words[0]
    if program == "mldserver" and relay_program() != "mldserver":
        return [Finding("warning", entry.line, entry.key,
                        f"mldserver is not on the PATH this check runs with: mldserver run sets executableName to "
                        f"this installation's relay itself, but a daemon you start must find it on its PATH, or use "
                        f"executableName = {relay_example(settings)}")]
    return []


def _relay_problem(words: list[str], settings: Settings) -> str | None:
    if len(words) < 3 or words[-2] != "connect" or "mldserver" not in " ".join(words[:-2]):
        return f"{' '.join(words)!r} is not the relay (mldserver connect HOST:PORT)"
    program = words[0]
    if program == "mldserver":
        program = relay_program()  # (on PATH, or this installation's: a warning says which)
    if not (shutil.which(program) or (os.path.isfile(program) and os.access(program, os.X_OK))):
        return (f"{program!r} is not a program the daemon can start (not on the PATH this check runs with, "
                f"not an executable file)")
    target = words[-1]
    if target.startswith("unix:"):
        if settings.unix and os.path.abspath(target[5:]) == os.path.abspath(settings.unix):
            return None
        return f"the relay reaches {target} but this server listens on {_listens(settings)}"
    host, _, port = target.rpartition(":")
    if settings.tcp_port is None or not port.isdigit():
        return f"the relay reaches {target} but this server listens on {_listens(settings)}"
    if settings.tcp_port not in (0, int(port)) or not _same_host(host.strip("[]"), settings.host):
        return f"the relay reaches {target} but this server listens on {_listens(settings)}"
    return None


def _same_host(relay: str, bound: str) -> bool:
    if relay == bound or bound in ("0.0.0.0", "::", ""):
        return True
    try:
        return ipaddress.ip_address(relay).is_loopback and ipaddress.ip_address(bound).is_loopback
    except ValueError:
        return relay == "localhost" and bound.startswith("127.")


def _listens(settings: Settings) -> str:
    where = [f"unix:{settings.unix}"] if settings.unix else []
    if settings.tcp_port is not None:
        where.append(f"{settings.host}:{settings.tcp_port}")
    return " and ".join(where)


def relay_example(settings: Settings) -> str:
    target = f"unix:{settings.unix}" if settings.unix and settings.tcp_port is None else \
        f"{'127.0.0.1' if settings.host in ('0.0.0.0', '::') else settings.host}:{settings.tcp_port}"
    return f"{relay_program()} connect {target}"


def relay_program() -> str:
    """How the daemon starts this installation's ``mldserver``: the bare name when PATH
    finds it, else its absolute path (a virtualenv not activated where the daemon runs)."""
    mine = Path(sys.executable).parent / "mldserver"
    found = shutil.which("mldserver")
    if found and (not mine.exists() or os.path.realpath(found) == os.path.realpath(mine)):
        return "mldserver"
    return str(mine) if mine.exists() else "mldserver"


