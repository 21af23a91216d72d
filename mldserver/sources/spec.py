"""What ``--source`` and ``--from`` say, parsed once at start-up (a mistake is a
ConfigError: one line, exit 2)::

    SourceSpec.parse("dynamodb:orders")
    -> SourceSpec(kind="dynamodb", name="orders", text="dynamodb:orders")          # a table: its latest stream
    SourceSpec.parse("dynamodb:arn:aws:dynamodb:us-east-1:123456789012:table/orders/stream/2026-01-30T10:00:00.000")
    -> SourceSpec(kind="dynamodb", name="arn:aws:...", ...)                         # that stream exactly
    SourceSpec.parse("kinesis:clicks")
    -> SourceSpec(kind="kinesis", name="clicks", text="kinesis:clicks")             # a stream, or its ARN

    Start.parse("trim_horizon")               -> Start("trim_horizon", None)   # the oldest record kept (the default)
    Start.parse("latest")                     -> Start("latest", None)         # what is written from now on
    Start.parse("2026-01-30T10:00:00Z")       -> Start("time", 1769767200000)  # records created at or after it

A time needs its zone (``Z``, ``+02:00``): a time without one would mean something
else on each machine.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Literal, NamedTuple

from ..errors import ConfigError

_TABLE = re.compile(r"[A-Za-z0-9_.-]{3,255}")
_KINESIS = re.compile(r"[A-Za-z0-9_.-]{1,128}|arn:aws[a-z-]*:kinesis:[a-z0-9-]+:\d{12}:stream/[A-Za-z0-9_.-]{1,128}")
_STREAM_ARN = re.compile(r"arn:aws[a-z-]*:dynamodb:[a-z0-9-]+:\d{12}:table/[A-Za-z0-9_.-]{3,255}/stream/\S+")


class SourceSpec(NamedTuple):
    kind: Literal["dynamodb", "kinesis"]
    name: str  # the table's name, or the stream's ARN
    text: str  # as given: the source's name in logs and in the state dir

    @property
    def is_arn(self) -> bool:
        return self.name.startswith("arn:")

    @classmethod
    def parse(cls, text: str) -> "SourceSpec":
        kind, _, name = text.partition(":")
        if kind == "kinesis":
            if not _KINESIS.fullmatch(name):
                raise ConfigError(f"--source {text!r}: give a Kinesis stream name (1 to 128 of A-Z a-z 0-9 _ - .) "
                                  f"or its ARN (arn:aws:kinesis:REGION:ACCOUNT:stream/NAME)")
            return cls("kinesis", name, text)
        if kind != "dynamodb":
            raise ConfigError(f"--source {text!r}: use dynamodb:TABLE, dynamodb:STREAM_ARN, kinesis:STREAM or "
                              f"kinesis:STREAM_ARN")
        if not (_TABLE.fullmatch(name) or _STREAM_ARN.fullmatch(name)):
            raise ConfigError(f"--source {text!r}: give a DynamoDB table name (3 to 255 of A-Z a-z 0-9 _ - .) or "
                              f"a stream ARN (arn:aws:dynamodb:REGION:ACCOUNT:table/TABLE/stream/LABEL)")
        return cls("dynamodb", name, text)


class Start(NamedTuple):
    kind: Literal["trim_horizon", "latest", "time"]
    at_ms: int | None = None  # epoch ms, for "time"

    @classmethod
    def parse(cls, text: str | None) -> "Start":
        if text is None or text.lower() == "trim_horizon":
            return cls("trim_horizon")
        if text.lower() == "latest":
            return cls("latest")
        try:
            at = datetime.fromisoformat(text)
        except ValueError:
            raise ConfigError(f"--from {text!r}: use trim_horizon, latest or an ISO-8601 time with its zone, "
                              f"as in 2026-01-30T10:00:00Z") from None
        if at.tzinfo is None:
            raise ConfigError(f"--from {text!r}: give the time's zone, as in {text}Z or {text}+01:00")
        return cls("time", round(at.timestamp() * 1000))


def parse_sources(sources: tuple[str, ...], start: str | None) -> tuple[list[SourceSpec], Start]:
    """Every ``--source`` and the ``--from``; the same source twice, or ``--from``
    without a source, is a ConfigError."""
    specs = [SourceSpec.parse(text) for text in sources]
    seen = set()
    for spec in specs:
        if spec.text in seen:
            raise ConfigError(f"--source {spec.text}: given twice: read each source once")
        seen.add(spec.text)
    if start is not None and not specs:
        raise ConfigError(f"--from {start}: says where a --source starts, and none is given: add "
                          f"--source dynamodb:TABLE or kinesis:STREAM, or leave --from out")
    return specs, Start.parse(start)
