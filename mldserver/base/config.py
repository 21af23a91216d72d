"""Server settings: defaults, then a TOML file (``--config``), then command-line flags.

Read once at start-up into a frozen ``Settings``. A config file uses the same names
as the fields below, at the top level::

    # mldserver.toml
    handler = "handlers.passthrough:Passthrough"
    port = 7070
    execution_timeout = 30.0
    handler_retries = 2

Each field carries its Rule (type, range, choices; floats finite), the one table both
the file and the flags are checked against, here and by ``mldserver check``. A mistake
is a ConfigError naming the setting, the value, where it came from and what is allowed::

    load(window=0.0)  ->  ConfigError("--window (command line): window = 0.0 is out of
                                       range: use 0.1 to 86400 seconds")

``--sink`` is read here too, into a ``SinkSpec``, and ``timer_store`` into a
``TimerStoreSpec``::

    SinkSpec.parse("parquet:./out")  ->  SinkSpec(kind="parquet", directory=Path("/abs/out"))
    SinkSpec.parse("iceberg:/data/lake")  ->  SinkSpec(kind="iceberg", directory=Path("/data/lake"))
    TimerStoreSpec.parse("dynamodb:orders-timers")  ->  TimerStoreSpec(kind="dynamodb", where="orders-timers")

Table bindings (``mldserver.api.bindings``) are TOML tables, checked by ``check_bindings``
(with the recursion guard: a read-write binding to the table whose DynamoDB stream
``stream`` names needs ``allow_recursion = true``)::

    [bindings.customers]
    table = "customers"
    access = "read_write"     ->  BindingSpec("customers", "customers", "read_write", False)
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Mapping, NamedTuple

from ..errors import ConfigError
from . import secrets
from ..protocol.framing import DEFAULT_MAX_LINE_SIZE


class SinkSpec(NamedTuple):
    """Where closed windows go: ``file:DIR`` (JSON lines), ``parquet:DIR`` (Spark) or
    ``iceberg:DIR`` (an Iceberg table several servers share; DIR is its warehouse)."""

    kind: Literal["file", "parquet", "iceberg"]
    directory: Path | None  # absolute; None for ``iceberg:`` whose [table_catalog] names its warehouse

    @classmethod
    def parse(cls, spec: str) -> "SinkSpec":
        kind, _, where = spec.partition(":")
        if kind not in ("file", "parquet", "iceberg"):
            raise ConfigError(
                f"--sink {spec!r}: use file:DIR (JSON lines), parquet:DIR (Spark) or iceberg:DIR (a table)"
            )
        if not where:
            if kind == "iceberg":  # the catalog ([table_catalog]) names the warehouse: config.load checks
                return cls(kind, None)
            raise ConfigError(f"--sink {spec!r}: give a directory, as in {kind}:./out")
        return cls(kind, Path(where).resolve())  # type: ignore[arg-type]


class TimerStoreSpec(NamedTuple):
    """Where durable timers are kept (``mldserver.timers``): ``sqlite`` (the state
    dir's ``timers/timers.db``), ``sqlite:PATH``, or ``dynamodb:TABLE`` (shared by
    every server that names it)."""

    kind: Literal["sqlite", "dynamodb"]
    where: str  # the database file ("" for the state dir's) or the table name

    @classmethod
    def parse(cls, spec: str) -> "TimerStoreSpec":
        kind, colon, where = spec.partition(":")
        if kind == "sqlite":
            if colon and not where:
                raise ConfigError(f"timer_store {spec!r}: give a file, as in sqlite:/var/lib/mldserver/timers.db, "
                                  f"or just sqlite (the state dir's timers/timers.db)")
            return cls("sqlite", where)
        if kind == "dynamodb":
            if not _DYNAMODB_TABLE.fullmatch(where):
                raise ConfigError(f"timer_store {spec!r}: give a DynamoDB table name (3 to 255 of A-Z a-z 0-9 _ - .), "
                                  f"as in dynamodb:orders-timers")
            return cls("dynamodb", where)
        raise ConfigError(f"timer_store {spec!r}: use sqlite (in the state dir), sqlite:PATH or dynamodb:TABLE")


_DYNAMODB_TABLE = re.compile(r"[A-Za-z0-9_.-]{3,255}")
MINUTE, HOUR, DAY = 60.0, 3600.0, 86400.0


BINDING_ACCESS = ("read_only", "read_write")
BINDING_KEYS = {"table", "access", "allow_recursion"}


class BindingSpec(NamedTuple):
    """A table binding, ``[bindings.ALIAS]`` in the config (``mldserver.api.bindings``)."""

    alias: str
    table: str
    access: str  # "read_only" or "read_write"
    allow_recursion: bool = False


def parse_bindings(raw: Mapping[str, Any] | None, where: str = "config") -> dict[str, BindingSpec]:
    """The ``[bindings.ALIAS]`` tables, checked; a ConfigError says what, where and what to do."""
    out: dict[str, BindingSpec] = {}
    for alias, body in (raw or {}).items():
        at = f"{where}: [bindings.{alias}]"
        if not isinstance(body, dict):
            raise ConfigError(f"{at} must be a table, as in [bindings.{alias}] table = \"customers\" "
                              f"access = \"read_only\"; got {body!r:.60}")
        unknown = set(body) - BINDING_KEYS
        if unknown:
            raise ConfigError(f"{at}: unknown key(s) {', '.join(sorted(unknown))}: use table, access, allow_recursion")
        table = body.get("table")
        if not isinstance(table, str) or not _DYNAMODB_TABLE.fullmatch(table):
            raise ConfigError(f"{at}: table = {table!r:.60}: give the DynamoDB table's name "
                              f"(3 to 255 of A-Z a-z 0-9 _ - .), as in table = \"customers\"")
        access = body.get("access", "read_only")
        if access not in BINDING_ACCESS:
            raise ConfigError(f"{at}: access = {access!r:.60}: use \"read_only\" or \"read_write\"")
        recursion = body.get("allow_recursion", False)
        if not isinstance(recursion, bool):
            raise ConfigError(f"{at}: allow_recursion = {recursion!r:.60}: use true or false")
        out[alias] = BindingSpec(alias, table, access, recursion)
    return out


def stream_table(stream: str | None) -> str | None:
    """The table of a DynamoDB stream ARN (``arn:aws:dynamodb:R:A:table/T/stream/L``), else None."""
    if not stream or ":dynamodb:" not in stream or "/stream/" not in stream:
        return None
    return stream.partition(":table/")[2].partition("/stream/")[0] or None


def check_bindings(settings: Any, where: str = "config") -> dict[str, BindingSpec]:
    """``parse`` plus the recursion guard: a read-write binding to the stream's own
    table needs ``allow_recursion = true``."""
    specs = parse_bindings(settings.bindings, where)
    own = stream_table(settings.stream)
    for spec in specs.values():
        if own is not None and spec.table == own and spec.access == "read_write" and not spec.allow_recursion:
            raise ConfigError(
                f"{where}: [bindings.{spec.alias}] writes to table {own}, whose stream this server reads "
                f"({settings.stream}): every write is a new change for the handler, which may write again, "
                f"forever. Make it access = \"read_only\", or add allow_recursion = true if the handler "
                f"stops itself (writes only when something changes)")
    return specs


@dataclass(frozen=True)
class Rule:
    """What one setting accepts: its type, a range (inclusive; for a string, whether it
    may be empty) or a set of choices, and the unit the message quotes. Floats are
    always finite. ``check`` returns the value (an int given for a float, as a float)
    or raises a ConfigError naming the setting, the value, where it came from and what
    is allowed."""

    kind: type
    low: float | None = None
    high: float | None = None
    choices: tuple[str, ...] = ()
    unit: str = ""
    empty: bool = True  # may a string be ""?
    item: "Rule | None" = None  # a list setting (kind tuple): each item's rule

    def check(self, name: str, value: Any, where: str) -> Any:
        kind = self.kind
        if self.item is not None:  # a list (TOML array, a repeated flag), kept as a tuple
            if not isinstance(value, (list, tuple)):
                raise ConfigError(f"{where}: {name} must be a list, got {value!r}")
            return tuple(self.item.check(f"{name}[{i}]", v, where) for i, v in enumerate(value))
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise ConfigError(f"{where}: {name} must be {_KIND_NAMES.get(kind, kind.__name__)}, got {value!r}")
        if kind is float and not math.isfinite(value):
            raise ConfigError(f"{where}: {name} must be a finite number, got {value!r}: use {self.allowed()}")
        if self.choices and value not in self.choices:
            raise ConfigError(f"{where}: {name} must be one of {', '.join(map(repr, self.choices))}, got {value!r}")
        if kind is str and not self.empty and not value:
            raise ConfigError(f"{where}: {name} must not be empty")
        if kind in (int, float) and not (
            (self.low is None or value >= self.low) and (self.high is None or value <= self.high)
        ):
            raise ConfigError(f"{where}: {name} = {value!r} is out of range: use {self.allowed()}")
        return value

    def allowed(self) -> str:
        if self.item is not None:
            return "a list, each item " + self.item.allowed()
        unit = f" {self.unit}" if self.unit else ""
        if self.high is None:
            return f"at least {_number(self.low)}{unit}"
        return f"{_number(self.low)} to {_number(self.high)}{unit}"


_KIND_NAMES = {int: "an integer", float: "a number", str: "a string", dict: "a table"}


def _number(x: float | None) -> str:
    return f"{x:g}" if isinstance(x, float) else str(x)


def setting(default: Any, kind: type | None = None, **rule: Any) -> Any:
    """A Settings field and its Rule (in the field's metadata): the range sits next
    to the field it constrains. ``item=Rule(str, empty=False)`` makes a list setting
    (a tuple of checked items)."""
    rule_ = Rule(kind or type(default), **rule)
    if default is not None:
        rule_.check("default", default, "Settings")  # a default out of its own range is a bug here
    return dataclasses.field(default=default, metadata={"rule": rule_})


@dataclass(frozen=True)
class Settings:
    """Every setting with its range: what ``load`` accepts from a file and from flags."""

    handler: str = setting("")  # MODULE:ATTR (checked by importing it)
    host: str = setting("127.0.0.1", empty=False)  # 0.0.0.0 for every interface (logged as a warning)
    port: int | None = setting(None, int, low=0, high=65535)  # 7070 unless only --unix; 0: a free port
    unix: str | None = setting(None, str, empty=False)
    log_format: str = setting("json", choices=("json", "console"))
    log_file: str | None = setting(None, str, empty=False)
    log_level: str = setting("info", choices=("debug", "info", "warning", "error"))
    state_dir: str = setting("./mldserver-state", empty=False)  # created and probed at start-up
    # protocol: the longest line from the daemon (a 10,000-record batch is some 15 MB)
    max_line_size: int = setting(DEFAULT_MAX_LINE_SIZE, low=4096, high=1 << 32, unit="bytes")
    # handler calls: time-out per call, then retries with backoff before a dead letter
    execution_timeout: float = setting(60.0, low=0.01, high=DAY, unit="seconds")
    handler_retries: int = setting(2, low=0, high=100)
    handler_backoff: float = setting(0.1, low=0.0, high=MINUTE, unit="seconds")
    # handler processes (mldserver.pool): how many (0: handlers run in the server's loop),
    # the memory (MiB, 0: no limit) past which one is replaced between actions, and how
    # long a handler may block its process's loop before its stack is logged (seconds)
    workers: int = setting(2, low=0, high=256)
    max_handler_memory: int = setting(0, low=0, high=1 << 24, unit="MiB")
    handler_block_warning: float = setting(1.0, low=0.01, high=DAY, unit="seconds")
    # checkpoints: retriable daemon errors retried with jittered exponential backoff
    checkpoint_retries: int = setting(6, low=0, high=100)
    checkpoint_backoff: float = setting(0.1, low=0.0, high=MINUTE, unit="seconds")
    checkpoint_backoff_cap: float = setting(2.0, low=0.0, high=HOUR, unit="seconds")  # at least checkpoint_backoff
    # shard end: SHARD_END is retried for up to this many seconds before giving up loudly
    shard_end_budget: float = setting(300.0, low=0.0, high=DAY, unit="seconds")
    # de-aggregate KPL records: "auto" (only from v1 daemons), "always", "never"
    deaggregate: str = setting("auto", choices=("auto", "always", "never"))
    # memory: actions being decoded or handled at once, across all shards; the others
    # wait with their bytes still in the kernel's socket buffers (0: no limit; unset: 8,
    # or two a handler process where that is more, so every process has its next one)
    max_batches_in_flight: int | None = setting(None, int, low=0, high=1_000_000)
    # shutdown: how long in-flight actions get to finish after SIGTERM
    shutdown_timeout: float = setting(30.0, low=0.0, high=HOUR, unit="seconds")
    # pipeline (the coordinator, then the sink: docs/coordinator-and-sinks.md). With no sink, rows are not collected.
    window: float = setting(60.0, low=0.1, high=DAY, unit="seconds")  # event-time windows: their size
    # hopping windows: a new window every `slide` seconds (window a multiple of it); unset: tumbling
    slide: float | None = setting(None, float, low=0.1, high=DAY, unit="seconds")
    # session windows: a key's rows (its field `session_key`, at the top of each row) less than
    # `session_gap` seconds apart are one session; unset: tumbling or hopping windows
    session_gap: float | None = setting(None, float, low=0.1, high=DAY, unit="seconds")
    session_key: str | None = setting(None, str, empty=False)
    sink: str | None = setting(None, str)  # file:DIR (JSON lines), parquet:DIR (Spark) or iceberg:DIR (a table)
    # a row whose window has closed: "next" (committed with the next window, counted late),
    # "drop" (counted), "dead-letter" (with its data, <state-dir>/dead-letters/rows.jsonl)
    late_policy: str = setting("next", choices=("next", "drop", "dead-letter"))
    # a window stays open to late rows this long after it closes: such a row amends it (the sink
    # replaces the window; its shards checkpoint past it only then; a table adds the row to the
    # window where it is). Tumbling windows
    allowed_lateness: float = setting(0.0, low=0.0, high=DAY, unit="seconds")
    # rows of a shard may come this much out of event-time order and still land in their own
    # window: a shard's watermark is its largest event time minus this (tumbling windows)
    max_out_of_orderness: float = setting(0.0, low=0.0, high=DAY, unit="seconds")
    # watermarks: a caught-up shard stands at the wall clock minus this margin
    watermark_margin: float = setting(5.0, low=0.0, high=DAY, unit="seconds")
    # a shard silent this long stops holding the watermark back
    idle_timeout: float = setting(60.0, low=0.1, high=DAY, unit="seconds")
    # a shard checkpoints what is committed at most this often, sparing the lease table (0: at once)
    checkpoint_interval: float = setting(10.0, low=0.0, high=DAY, unit="seconds")
    # back-pressure: from three quarters of either cap, shards running ahead of the watermark
    # wait, so the rows buffered stay below it (bytes: the memory they hold, JSON and columns;
    # what must land past it waits in files, <state-dir>/spill/)
    max_buffered_rows: int = setting(1_000_000, low=1)
    max_buffered_bytes: int = setting(256 * 1024 * 1024, low=1, unit="bytes")
    # lineage from the stream itself: a Kinesis stream name or ARN, or a DynamoDB stream ARN
    stream: str | None = setting(None, str, empty=False)
    aws_region: str | None = setting(None, str, empty=False)
    aws_endpoint_url: str | None = setting(None, str, empty=False)
    # Spark (a child process, the Spark process, owns the session; see mldserver.spark)
    # MODULE:ATTR, pipeline(df, window); implies --sink parquet:<state-dir>/output
    pipeline: str | None = setting(None, str)
    spark_master: str | None = setting(None, str)  # default local[*]
    spark_remote: str | None = setting(None, str)  # sc://host:port (Spark Connect)
    spark_conf: dict | None = setting(None, dict)  # extra Spark settings, {"spark.driver.memory" = "2g"}
    spark_start_timeout: float = setting(180.0, low=1.0, high=HOUR, unit="seconds")  # for the session to come up
    sink_format: str = setting("parquet", empty=False)  # what Spark writes per window: parquet, json, orc, csv
    schema: dict | None = setting(None, dict)  # row schema, field = Arrow type name; default: inferred, then fixed
    # the table sink (--sink iceberg:DIR): the table, NAMESPACE.NAME; its catalog, pyiceberg's
    # properties ({type = "rest", uri = "..."}, sql, glue, dynamodb; default: SQLite in DIR/catalog.db;
    # its name = "..." is the catalog's name, default "mldserver"); the name each commit carries
    # (--server-id; default: the host's name and its state dir's, stable across restarts)
    table: str = setting("mldserver.windows", empty=False)
    table_catalog: dict | None = setting(None, dict)
    server_id: str | None = setting(None, str, empty=False)
    # snapshots a commit keeps (older ones expire: the metadata read back stays small)
    table_snapshots_kept: int = setting(16, low=1, high=1_000_000)
    # table maintenance (sinks/maintenance.py): how often a server runs it (0: never; `mldserver
    # table maintain` runs it by hand), and how old a file named by nothing must be to go
    table_maintenance_interval: float = setting(3600.0, low=0.0, high=7 * DAY, unit="seconds")
    table_orphan_age: float = setting(3600.0, low=60.0, high=365 * DAY, unit="seconds")
    # the admin endpoint (metrics, health, status, pause/resume/reload): HOST:PORT or "off";
    # `mldserver serve` uses DEFAULT_ADMIN when unset, an embedded Server none
    admin: str | None = setting(None, str, empty=False)
    # the file holding the admin endpoint's bearer token, which POST /pause, /resume and /reload
    # then require (GETs stay open); beyond loopback one is required: without this file, the
    # state dir's admin-token (generated at the first start) is used (mldserver.server.admin_token)
    admin_token_file: str | None = setting(None, str, empty=False)
    # durable timers (mldserver.timers): where they are kept (sqlite, sqlite:PATH or
    # dynamodb:TABLE) and the largest context a timer may carry (its JSON, in bytes)
    timer_store: str = setting("sqlite", empty=False)
    timer_context_size: int = setting(1024, low=20, high=256 * 1024, unit="bytes")
    # table bindings (mldserver.api.bindings): [bindings.ALIAS] table = "T", access = "read_only"
    # or "read_write", allow_recursion = true (a read-write binding to the stream's own table)
    bindings: dict | None = setting(None, dict)
    # sources read by the server itself (mldserver.sources): dynamodb:TABLE|STREAM_ARN, kinesis:STREAM|ARN,
    # repeatable; where a source with no saved position starts (trim_horizon, latest, or an
    # ISO-8601 time with its zone; default trim_horizon); how long a shard waits after an empty
    # read (a partial one waits a quarter of it, a full one not at all); how often shards are listed
    source: tuple = setting((), tuple, item=Rule(str, empty=False))
    source_from: str | None = setting(None, str, empty=False)
    source_poll_interval: float = setting(1.0, low=0.01, high=MINUTE, unit="seconds")
    source_discovery_interval: float = setting(60.0, low=0.1, high=DAY, unit="seconds")
    # a source's shards spread over the servers sharing it (mldserver.sources.shard_leases): the DynamoDB
    # table of the shards' leases, which also keeps their positions (created if absent); the lease period,
    # renewed every third of it: the others take a dead server's shards over after about one period
    lease_table: str | None = setting(None, str, empty=False)
    lease_period: float = setting(10.0, low=1.0, high=HOUR, unit="seconds")

    @property
    def tcp_port(self) -> int | None:
        """The TCP port to bind, or None when only a unix socket was asked for."""
        if self.port is None:
            return None if self.unix else DEFAULT_PORT
        return self.port

    @property
    def batches_in_flight(self) -> int:
        """``max_batches_in_flight`` as the server uses it (0: no limit): unset, 8, or two
        a handler process where that is more (``Settings(workers=6)``: 12)."""
        if self.max_batches_in_flight is not None:
            return self.max_batches_in_flight
        return max(DEFAULT_BATCHES_IN_FLIGHT, 2 * self.workers)

    def replace(self, **changes: Any) -> "Settings":
        """A copy with ``changes``: ``settings.replace(workers=0, sink="file:./windows")``
        (not checked against the rules: ``load`` checks a file and flags)."""
        return dataclasses.replace(self, **changes)


RULES: dict[str, Rule] = {f.name: f.metadata["rule"] for f in dataclasses.fields(Settings)}
DEFAULT_PORT = 7070
DEFAULT_BATCHES_IN_FLIGHT = 8  # max_batches_in_flight unset, with two handler processes or fewer
DEFAULT_ADMIN = "127.0.0.1:7071"  # `mldserver serve`'s admin endpoint (--admin off disables it)


def admin_address(value: str) -> tuple[str, int] | None:
    """``--admin``: HOST:PORT (``[::1]:7071`` for IPv6), or ``off`` (None)::

        admin_address("127.0.0.1:0") == ("127.0.0.1", 0)    # port 0 picks a free one
        admin_address("off") is None
        admin_address("7071")  ->  ConfigError("--admin 7071: use HOST:PORT (...) or off")
    """
    if value.strip().lower() == "off":
        return None
    host, sep, port = value.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ConfigError(f"--admin {value}: use HOST:PORT (as in 127.0.0.1:7071; port 0 picks a free one) or off")
    return host, int(port)


def load(path: str | None = None, *, defaults: dict[str, Any] | None = None, **overrides: Any) -> Settings:
    """Settings' own defaults, then ``defaults`` (what ``mldserver run`` reads from the
    daemon's properties), then the TOML file at ``path``, then ``overrides`` (the command
    line's flags; None means unset), each value checked against its Rule."""
    values: dict[str, Any] = {name: RULES[name].check(name, value, "the daemon's properties file")
                              for name, value in (defaults or {}).items()}
    if path:
        for key, value in _read(path).items():
            name = key.replace("-", "_")
            if name not in RULES:
                import difflib  # (only here: a handler process reads no config file)

                near = difflib.get_close_matches(name, sorted(RULES), n=1, cutoff=0.6)
                hint = f"did you mean {near[0]!r}?" if near else "the settings are the fields of mldserver.base.config.Settings"
                raise ConfigError(f"{path}: unknown setting {key!r}: {hint}")
            if isinstance(value, dict):  # [table_catalog], [spark_conf]: before any error could quote them
                secrets.learn_values(secrets.values_in(value))
            values[name] = RULES[name].check(name, value, path)
    for name, value in overrides.items():
        if value is not None:
            values[name] = RULES[name].check(name, value, f"--{name.replace('_', '-')} (command line)")
    settings = Settings(**values)
    secrets.learn(settings)
    if settings.admin:
        admin_address(settings.admin)  # what serve refuses, check refuses: one parse
    if settings.pipeline and not settings.sink:
        settings = settings.replace(sink=f"parquet:{state_path(settings, 'output')}")
    if settings.slide is not None:
        size, slide = round(settings.window * 1000), round(settings.slide * 1000)
        if slide > size or size % slide:
            raise ConfigError(f"slide = {settings.slide:g}: hopping windows start every slide seconds and are "
                              f"window = {settings.window:g} long, a whole number of slides: give a slide that "
                              f"divides the window (say --window 60 --slide 10), or leave slide out for tumbling "
                              f"windows")
        if not settings.sink:
            raise ConfigError(f"slide = {settings.slide:g}: windows collect the rows handlers emit, but no sink "
                              f"keeps them: add --sink parquet:DIR (or file:DIR, iceberg:DIR), or leave slide out")
    if settings.allowed_lateness:
        lateness = f"allowed_lateness = {settings.allowed_lateness:g}"
        if settings.slide is not None or settings.session_gap is not None:
            raise ConfigError(f"{lateness}: windows are amended with late rows only when tumbling, for now: leave "
                              f"slide and session_gap out, or allowed_lateness")
        if not settings.sink:
            raise ConfigError(f"{lateness}: windows collect the rows handlers emit, but no sink keeps them: add "
                              f"--sink parquet:DIR (or file:DIR), or leave it out")
    if settings.max_out_of_orderness:
        disorder = f"max_out_of_orderness = {settings.max_out_of_orderness:g}"
        if settings.slide is not None or settings.session_gap is not None or settings.allowed_lateness:
            raise ConfigError(f"{disorder}: rows out of order are taken into tumbling windows only, for now: leave "
                              f"slide, session_gap and allowed_lateness out, or max_out_of_orderness")
        if not settings.sink:
            raise ConfigError(f"{disorder}: windows collect the rows handlers emit, but no sink keeps them: add "
                              f"--sink parquet:DIR (or file:DIR), or leave it out")
    if (settings.session_gap is None) != (settings.session_key is None):
        given = "session_gap" if settings.session_key is None else "session_key"
        raise ConfigError(f"{given} is set alone: session windows need both a gap and the field of each row that "
                          f"names its session (say --session 1800 --session-key user)")
    if settings.session_gap is not None:
        if settings.slide is not None:
            raise ConfigError(f"session_gap = {settings.session_gap:g} and slide = {settings.slide:g}: a pipeline "
                              f"has one kind of window: leave slide out for session windows, or session_gap out")
        if not settings.sink:
            raise ConfigError(f"session_gap = {settings.session_gap:g}: windows collect the rows handlers emit, but "
                              f"no sink keeps them: add --sink parquet:DIR (or file:DIR), or leave it out")
    if "window" in values and not settings.sink:
        raise ConfigError(f"window = {settings.window:g}: windows collect the rows handlers emit, but no sink keeps "
                          f"them: add --sink parquet:DIR (or file:DIR, iceberg:DIR), or leave window out")
    TimerStoreSpec.parse(settings.timer_store)
    if settings.lease_table is not None:
        if not _DYNAMODB_TABLE.fullmatch(settings.lease_table):
            raise ConfigError(f"--lease-table {settings.lease_table!r}: give a DynamoDB table name (3 to 255 of "
                              f"A-Z a-z 0-9 _ - .), as in orders-leases")
        if not settings.source:
            raise ConfigError(f"--lease-table {settings.lease_table}: leases the sources a server reads itself, "
                              f"and none is given: add --source dynamodb:TABLE or kinesis:STREAM, or leave "
                              f"--lease-table out (the KCL daemon keeps its own leases)")
    check_bindings(settings, path or "settings")
    if settings.sink:
        kind = SinkSpec.parse(settings.sink).kind
        if kind == "file" and settings.pipeline:
            raise ConfigError("--pipeline runs in Spark: use --sink parquet:DIR (or leave --sink out)")
        if kind == "iceberg":
            if settings.slide is not None:
                raise ConfigError(f"slide = {settings.slide:g}: the table sink (--sink {settings.sink}) commits "
                                  f"tumbling windows only for now (it keeps each row once, and a hopping window's "
                                  f"rows are in several): use --sink parquet:DIR for hopping windows, or leave "
                                  f"slide out")
            if settings.allowed_lateness and settings.pipeline:
                raise ConfigError(f"allowed_lateness = {settings.allowed_lateness:g} with --pipeline: the table sink "
                                  f"(--sink {settings.sink}) amends a window with its late rows where they are, and "
                                  f"a pipeline's output for the window cannot be made again there yet: use --sink "
                                  f"parquet:DIR with a pipeline and allowed_lateness, or leave one out")
            if settings.max_out_of_orderness:
                raise ConfigError(f"max_out_of_orderness = {settings.max_out_of_orderness:g}: the table sink (--sink "
                                  f"{settings.sink}) takes rows in their shard's order only for now: use --sink "
                                  f"parquet:DIR (or file:DIR) with max_out_of_orderness, or leave it out")
            if settings.session_gap is not None:
                raise ConfigError(f"session_gap = {settings.session_gap:g}: the table sink (--sink {settings.sink}) "
                                  f"commits tumbling windows only for now: use --sink parquet:DIR for session "
                                  f"windows, or leave session_gap out")
            if not positions_stream(settings):
                raise ConfigError(
                    f"--sink {settings.sink}: the table keeps committed positions per stream and shard, and no "
                    "stream is set: give --stream STREAM (stream = \"...\" in --config; under mldserver run, the "
                    "properties file's streamName or streamArn), the Kinesis stream name or ARN or the DynamoDB stream "
                    "ARN, the same on every server; or read the stream with --source"
                )
            if SinkSpec.parse(settings.sink).directory is None and not (settings.table_catalog or {}).get("warehouse"):
                raise ConfigError(f"--sink {settings.sink}: no folder, and [table_catalog] names no warehouse: give "
                                  f"one (iceberg:/data/lake, or warehouse = \"s3://bucket/lake\" in [table_catalog])")
            namespace, _, name = settings.table.rpartition(".")
            if not namespace or not name:
                raise ConfigError(f"table = {settings.table!r}: name the table as NAMESPACE.NAME (mldserver.windows)")
    return settings


def positions_stream(settings: Settings) -> str | None:
    """What a table keys its committed positions by, beside each shard's id: ``stream``,
    else the ``--source`` text (``dynamodb:orders``; several joined with ``+``), the same
    on every server that shares the table. None: neither is set."""
    return settings.stream or ("+".join(sorted(settings.source)) if settings.source else None)


def _read(path: str) -> dict[str, Any]:
    import tomllib  # (only here: a handler process reads no config file)

    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"config file {path} is not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset {exc.start}): "
            f"save it as UTF-8, as TOML requires"
        ) from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
    except RecursionError:
        raise ConfigError(f"config file {path} nests arrays or tables too deeply to read: no setting takes more "
                          f"than a few levels") from None


def uses_spark(settings: Settings) -> bool:
    """Does this server start the Spark process (for its sink, or for context.sql)?"""
    return bool(
        settings.pipeline
        or (settings.sink or "").startswith("parquet:")
        or settings.spark_master
        or settings.spark_remote
    )


def state_path(settings: Settings, *parts: str) -> Path:
    return Path(settings.state_dir).joinpath(*parts)
