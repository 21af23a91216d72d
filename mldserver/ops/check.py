"""``mldserver check``: what ``mldserver serve`` (or, with ``--for run``, ``mldserver
run``) would find at start-up, without serving.

It takes every flag ``serve`` and ``run`` take (the CLI adds them from one list), and
goes the same code path: the settings through ``config.load`` (every value against its
Rule), the handler and the pipeline through the importer, the state directory created
and probed by ``preflight``, the log file opened as ``logs`` opens it. It neither binds
nor starts Spark, so it can run beside a live server (before a restart, in a deploy
script)::

    $ mldserver check --config /etc/mldserver.toml --sink file:/var/lib/mldserver/out
    config      /etc/mldserver.toml (execution_timeout=30.0, handler_retries=4, sink='file:...')
    handler     handlers.orders:Orders (class)
    pipeline    handlers.orders:pipeline (function)
    state_dir   /var/lib/mldserver (writable)
    listen      127.0.0.1:7070
    sink        file:/var/lib/mldserver/out (writable)
    ok

With ``--properties FILE`` (the daemon's), each finding of ``mldserver.ops.properties``
follows, with its line and what to do, and a summary line::

    properties  mld.properties (16 keys, KCL 3.1.3)
    error    mld.properties:14 initialPositonInStream: not a key the KCL 3.1.3 daemon knows ...
    warning  mld.properties:20 metricsLevel: also set on line 9: ...
    1 error, 1 warning

``--for run`` checks the arguments as ``mldserver run`` takes them: the stream, its
region and endpoint from the properties file (beneath ``--config`` and the flags), a
handler required, the daemon built as run builds it (``Daemon``: the file read, Java
17, the jars) and the file checked as run reports it (``executableName`` is run's to
set, not checked)::

    $ mldserver check --for run --properties sample.properties --handler app:Processor
    ...
    daemon      /usr/bin/java, the KCL jars in .../amazon_kclpy/jars
    properties  sample.properties (9 keys, KCL 3.1.3)

Exit 0 when all is well (warnings printed either way), 1 when the properties have an
error (``run`` starts anyway, logging each as ``properties_error``); a mistake the
command would stop on (in the settings, a properties file that is missing or does not
parse, no Java) is the ConfigError ``serve`` or ``run`` stops on: one line on stderr,
exit 2. Each check is one function of ``CHECKS`` taking what was ``Given``.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import logging.handlers
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, TextIO

from . import kcl_keys
from ..base import logs
from ..server import admin_token, preflight
from . import properties as daemon_properties
from ..base.config import Settings, SinkSpec
from ..base.logs import EventLogger
from ..base.secrets import scrub
from ..api.context import Context
from ..api.checks import check_handler, emits
from ..api.loading import load_handler
from ..base.importer import import_from_string


@dataclass(frozen=True)
class Given:
    """What the command line gave ``check``; the properties check adds its findings."""

    settings: Settings
    config: str | None  # the --config file
    properties: str | None = None  # the daemon's properties file (--properties)
    command: str = "serve"  # checked for serve or for run (--for)
    reset_positions: bool = False  # --reset-positions: it needs a --source (check deletes nothing)
    findings: list[daemon_properties.Finding] = dataclasses.field(default_factory=list)


def config(given: Given) -> tuple[str, str]:
    s = given.settings
    changed = [
        f"{f.name}={getattr(s, f.name)!r}"
        for f in dataclasses.fields(Settings)
        if f.name != "handler" and getattr(s, f.name) != f.default
    ]
    return "config", (given.config or "(no file)") + (f" ({', '.join(changed)})" if changed else " (all defaults)")


def handler(given: Given) -> tuple[str, str] | None:
    spec = given.settings.handler
    if not spec:
        return None  # checking only --properties
    factory = load_handler(spec)
    handler = check_handler(factory, Context(given.settings), spec)  # as each handler process does at start-up
    version = getattr(factory, "api_version", None)
    kind = (f"{_kind(factory)}; its callbacks and constructor checked" if version is None  # (else wrapped:)
            else f"an amazon_kclpy v{version} processor class: one per shard, built with no arguments, "
                 f"its calls in a thread of the shard's own")
    return "handler", f"{spec} ({kind})" + (
        "; it emits rows, but no sink keeps them: add --sink" if emits(type(handler)) and not given.settings.sink
        else "")


def pipeline(given: Given) -> tuple[str, str] | None:
    spec = given.settings.pipeline
    return None if not spec else ("pipeline", f"{spec} ({_kind(import_from_string(spec, 'pipeline'))})")


def state_dir(given: Given) -> tuple[str, str]:
    path = preflight.writable_state_dir(Path(given.settings.state_dir))
    return "state_dir", f"{path.resolve()} (writable)"


def log_file(given: Given) -> tuple[str, str] | None:
    path = given.settings.log_file
    if not path:
        return None
    logs.file_handler(path).close()
    return "log_file", f"{path} (appendable)"


def listen(given: Given) -> tuple[str, str]:
    s = given.settings
    where = [f"unix:{s.unix}"] if s.unix else []
    if s.tcp_port is not None:
        where.append(f"{s.host}:{s.tcp_port}")
    return "listen", " and ".join(where)


def admin_token_file(given: Given) -> tuple[str, str] | None:
    """``admin_token_file``: read as ``serve`` reads it (the token itself never printed)."""
    path = given.settings.admin_token_file
    if not path:
        return None
    admin_token.read(Path(path), "--admin-token-file")
    return "admin_token", f"{path} (readable; POST /pause, /resume, /reload need it)"


def sink(given: Given) -> tuple[str, str]:
    preflight.extras(given.settings)  # the sink's (or the pipeline's) extra is installed
    spec = SinkSpec.parse(given.settings.sink) if given.settings.sink else None
    if spec is not None and spec.kind == "iceberg":
        from ..sinks.iceberg import probe

        preflight.writable_sink(given.settings)
        return "sink", f"{given.settings.sink} ({probe(given.settings, spec.directory)})"
    if preflight.writable_sink(given.settings) is not None:
        return "sink", f"{given.settings.sink} (writable)"
    return "sink", given.settings.sink or "(none: rows are not collected)"


def sources(given: Given) -> tuple[str, str] | None:
    """``--source``, ``--from`` and ``--reset-positions`` as the server parses them (no
    stream is reached, no position deleted)."""
    s = given.settings
    if not (s.source or s.source_from or given.reset_positions):
        return None
    from ..sources import resettable
    from ..sources.spec import parse_sources

    if given.reset_positions:
        resettable(s)
    specs, _ = parse_sources(s.source, s.source_from)
    said = ", ".join(spec.text for spec in specs) + f" (from {s.source_from or 'trim_horizon'}"
    return "source", said + ("; their saved positions deleted at start)" if given.reset_positions else ")")


def daemon(given: Given) -> tuple[str, str] | None:
    """``--for run``: the daemon built as ``run`` builds it (its file, Java, the jars),
    not started; what it would log at start-up (no JAXB jar) said on the line; the state
    dir's ``daemon.pid`` read as run reads it: run's ConfigError when the ``run`` that
    wrote it still runs, and a daemon an earlier run left (run stops it first) named."""
    if given.command != "run" or not given.properties:
        return None
    from .daemon import Daemon, jars

    said = logging.handlers.BufferingHandler(capacity=100)
    quiet = logging.Logger("mldserver.check.daemon")  # not the process's loggers: check prints, it does not log
    quiet.addHandler(said)
    built = Daemon(given.settings, given.properties, log=EventLogger(quiet))
    warnings = [getattr(r, "fields", {}).get("what_to_do", r.getMessage()) for r in said.buffer]
    left = built.pidfile.left()
    if left is not None:
        warnings.append(f"a daemon an earlier run of this state dir left runs (pid {left['pid']}): "
                        f"run stops it (SIGKILL) before it listens, logged as daemon_leftover_stopped")
    return "daemon", f"{built.java}, the KCL jars in {jars()}" + "".join(f"; warning: {w}" for w in warnings)


def properties(given: Given) -> tuple[str, str] | None:
    """The daemon's properties file: its findings go to ``given.findings`` (for run,
    the ones run logs as ``properties_error`` and ``properties_warning``)."""
    if not given.properties:
        return None
    props = daemon_properties.read(given.properties)
    given.findings.extend(daemon_properties.check(props, given.settings, run=given.command == "run"))
    return "properties", f"{given.properties} ({len(props.entries)} keys, KCL {kcl_keys.KCL_VERSION})"


CHECKS: list[Callable[[Given], tuple[str, str] | None]] = [
    config, handler, pipeline, state_dir, log_file, listen, admin_token_file, sink, sources, daemon, properties,
]


def run(given: Given, out: TextIO) -> int:
    """Run every check, printing what each found; the first that fails raises its
    ConfigError (the CLI prints it and exits 2). Then the properties' findings; returns
    how many are errors (the CLI exits 1 when there is one)."""
    for check in CHECKS:
        found = check(given)
        if found is not None:
            out.write(scrub(f"{found[0]:<11} {found[1]}\n"))  # (the config line shows [table_catalog])
    for finding in given.findings:
        out.write(finding.render(given.properties or "") + "\n")
    errors = sum(f.level == "error" for f in given.findings)
    warnings = len(given.findings) - errors
    if errors or warnings:
        out.write(f"{_plural(errors, 'error')}, {_plural(warnings, 'warning')}\n")
    if not errors:
        out.write("ok\n")
    return errors


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _kind(obj: Any) -> str:
    return "class" if inspect.isclass(obj) else "function" if inspect.isfunction(obj) else type(obj).__name__
