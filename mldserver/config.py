"""Server settings: defaults, then a TOML file (``--config``), then command-line flags.

Read once at start-up into a frozen ``Settings``. A config file uses the same names
as the fields below, at the top level::

    # mldserver.toml
    handler = "handlers.passthrough:Passthrough"
    port = 7070
    execution_timeout = 30.0
    handler_retries = 2

An unknown key or a value of the wrong type is a ConfigError naming the key, the file
and what was expected. ``--sink`` is read here too, into a ``SinkSpec``::

    SinkSpec.parse("parquet:./out")  ->  SinkSpec(kind="parquet", directory=Path("/abs/out"))
"""

from __future__ import annotations

import dataclasses
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, NamedTuple

from .errors import ConfigError
from .protocol.framing import DEFAULT_MAX_LINE_SIZE


class SinkSpec(NamedTuple):
    """Where closed windows go: ``file:DIR`` (JSON lines) or ``parquet:DIR`` (Spark)."""

    kind: Literal["file", "parquet"]
    directory: Path  # absolute

    @classmethod
    def parse(cls, spec: str) -> "SinkSpec":
        kind, _, where = spec.partition(":")
        if kind not in ("file", "parquet"):
            raise ConfigError(f"--sink {spec!r}: use file:DIR (JSON lines) or parquet:DIR (Spark)")
        if not where:
            raise ConfigError(f"--sink {spec!r}: give a directory, as in {kind}:./out")
        return cls(kind, Path(where).resolve())  # type: ignore[arg-type]


@dataclass(frozen=True)
class Settings:
    handler: str = ""
    host: str = "127.0.0.1"
    port: int | None = None  # 7070 unless only --unix is given; 0 picks a free port
    unix: str | None = None
    log_format: str = "json"
    log_file: str | None = None
    log_level: str = "info"
    state_dir: str = "./mldserver-state"
    # protocol
    max_line_size: int = DEFAULT_MAX_LINE_SIZE
    # handler calls: time-out per call, then retries with backoff before a dead letter
    execution_timeout: float = 60.0
    handler_retries: int = 2
    handler_backoff: float = 0.1
    # handler processes (mldserver.pool): how many (0: handlers run in the server's loop),
    # the memory (MiB, 0: no limit) past which one is replaced between actions, and how
    # long a handler may block its process's loop before its stack is logged (seconds)
    workers: int = 2
    max_handler_memory: int = 0
    handler_block_warning: float = 1.0
    # checkpoints: retriable daemon errors retried with jittered exponential backoff
    checkpoint_retries: int = 6
    checkpoint_backoff: float = 0.1
    checkpoint_backoff_cap: float = 2.0
    # shard end: SHARD_END is retried for up to this many seconds before giving up loudly
    shard_end_budget: float = 300.0
    # de-aggregate KPL records: "auto" (only from v1 daemons), "always", "never"
    deaggregate: str = "auto"
    # memory: actions being decoded or handled at once, across all shards; the others
    # wait with their bytes still in the kernel's socket buffers (0: no limit)
    max_batches_in_flight: int = 8
    # shutdown: how long in-flight actions get to finish after SIGTERM
    shutdown_timeout: float = 30.0
    # pipeline (coordinator and Spark; see DESIGN.md). With no sink, rows are not collected.
    window: float = 60.0  # tumbling event-time windows, seconds
    sink: str | None = None  # file:DIR (JSON lines) or parquet:DIR (Spark)
    # watermarks: a caught-up shard stands at the wall clock minus this margin (seconds)
    watermark_margin: float = 5.0
    # a shard silent this long (seconds) stops holding the watermark back
    idle_timeout: float = 60.0
    # a shard checkpoints what is committed at most this often (seconds), sparing the lease table
    checkpoint_interval: float = 10.0
    # back-pressure: past either cap, shards running ahead of the watermark wait
    max_buffered_rows: int = 1_000_000
    max_buffered_bytes: int = 512 * 1024 * 1024
    # lineage from the stream itself: a Kinesis stream name or ARN, or a DynamoDB stream ARN
    stream: str | None = None
    aws_region: str | None = None
    aws_endpoint_url: str | None = None
    # Spark (a child process, the Spark process, owns the session; see mldserver.spark)
    pipeline: str | None = None  # MODULE:ATTR, pipeline(df, window); implies --sink parquet:<state-dir>/output
    spark_master: str | None = None  # default local[*]
    spark_remote: str | None = None  # sc://host:port (Spark Connect)
    spark_conf: dict | None = None  # extra Spark settings, {"spark.driver.memory" = "2g"}
    spark_start_timeout: float = 180.0  # seconds for the session to come up
    sink_format: str = "parquet"  # what Spark writes per window: parquet, json, orc, csv
    schema: dict | None = None  # row schema, field = Arrow type name; default: inferred, then fixed

    @property
    def tcp_port(self) -> int | None:
        """The TCP port to bind, or None when only a unix socket was asked for."""
        if self.port is None:
            return None if self.unix else DEFAULT_PORT
        return self.port

    def replace(self, **changes: Any) -> "Settings":
        return dataclasses.replace(self, **changes)


_FIELDS = {f.name: f for f in dataclasses.fields(Settings)}


_NONE_DEFAULT_TYPES = {"port": int, "spark_conf": dict, "schema": dict}
DEFAULT_PORT = 7070


def _check(name: str, value: Any, where: str) -> Any:
    default = getattr(Settings, name, None)
    kind = type(default) if default is not None else _NONE_DEFAULT_TYPES.get(name, str)
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ConfigError(f"{where}: {name} must be {kind.__name__}, got {value!r}")
    if name == "log_format" and value not in ("json", "console"):
        raise ConfigError(f"{where}: log_format must be 'json' or 'console', got {value!r}")
    if name == "deaggregate" and value not in ("auto", "always", "never"):
        raise ConfigError(f"{where}: deaggregate must be 'auto', 'always' or 'never', got {value!r}")
    return value


def load(path: str | None = None, **overrides: Any) -> Settings:
    """Defaults, then the TOML file at ``path``, then ``overrides`` (None means unset)."""
    values: dict[str, Any] = {}
    if path:
        try:
            with open(path, "rb") as f:
                data = tomllib.load(f)
        except OSError as exc:
            raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
        for key, value in data.items():
            name = key.replace("-", "_")
            if name not in _FIELDS:
                known = ", ".join(sorted(_FIELDS))
                raise ConfigError(f"{path}: unknown setting {key!r} (known: {known})")
            values[name] = _check(name, value, path)
    for name, value in overrides.items():
        if value is not None:
            values[name] = _check(name, value, "command line")
    settings = Settings(**values)
    if settings.pipeline and not settings.sink:
        settings = settings.replace(sink=f"parquet:{state_path(settings, 'output')}")
    if settings.sink:
        if SinkSpec.parse(settings.sink).kind == "file" and settings.pipeline:
            raise ConfigError("--pipeline runs in Spark: use --sink parquet:DIR (or leave --sink out)")
    return settings


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
