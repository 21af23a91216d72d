"""``--source`` and ``--from`` as the server reads them: what is accepted, and the one
line a mistake gets."""

from __future__ import annotations

import pytest

from mldserver.errors import ConfigError
from mldserver.sources.spec import SourceSpec, Start, parse_sources

ARN = "arn:aws:dynamodb:us-east-1:123456789012:table/orders/stream/2026-01-30T10:00:00.000"


def test_a_table_name_or_a_stream_arn_is_a_dynamodb_source():
    assert SourceSpec.parse("dynamodb:orders") == SourceSpec("dynamodb", "orders", "dynamodb:orders")
    spec = SourceSpec.parse(f"dynamodb:{ARN}")
    assert spec.name == ARN and spec.is_arn and not SourceSpec.parse("dynamodb:orders").is_arn


def test_a_stream_name_or_its_arn_is_a_kinesis_source():
    assert SourceSpec.parse("kinesis:clicks") == SourceSpec("kinesis", "clicks", "kinesis:clicks")
    arn = "arn:aws:kinesis:eu-west-1:123456789012:stream/clicks"
    assert SourceSpec.parse(f"kinesis:{arn}") == SourceSpec("kinesis", arn, f"kinesis:{arn}")


@pytest.mark.parametrize("text, says", [
    ("orders", "use dynamodb:TABLE"),
    ("dynamodb:", "give a DynamoDB table name"),
    ("dynamodb:o", "give a DynamoDB table name"),
    ("dynamodb:arn:aws:kinesis:us-east-1:1:stream/x", "a stream ARN"),
    ("kinesis:", "give a Kinesis stream name"),
    ("kinesis:a/b", "give a Kinesis stream name"),
    ("kinesis:arn:aws:kinesis:us-east-1:1:stream/x", "or its ARN"),
])  # fmt: skip
def test_a_source_that_cannot_be_read_says_what_to_give(text, says):
    with pytest.raises(ConfigError, match=says):
        SourceSpec.parse(text)


def test_from_takes_the_two_edges_and_a_time_with_its_zone():
    assert Start.parse(None) == Start("trim_horizon") == Start.parse("TRIM_HORIZON")
    assert Start.parse("latest") == Start("latest")
    assert Start.parse("2026-01-30T10:00:00Z") == Start("time", 1769767200000)
    assert Start.parse("2026-01-30T11:00:00.250+01:00") == Start("time", 1769767200250)


@pytest.mark.parametrize("text, says", [("yesterday", "ISO-8601"), ("2026-01-30T10:00:00", "give the time's zone")])
def test_from_a_time_without_a_zone_or_no_time_is_refused(text, says):
    with pytest.raises(ConfigError, match=says):
        Start.parse(text)


def test_the_same_source_twice_or_from_without_a_source_is_refused():
    with pytest.raises(ConfigError, match="given twice"):
        parse_sources(("dynamodb:orders", "dynamodb:orders"), None)
    with pytest.raises(ConfigError, match="add --source"):
        parse_sources((), "latest")
    specs, start = parse_sources(("dynamodb:orders", f"dynamodb:{ARN}"), "latest")
    assert [s.name for s in specs] == ["orders", ARN] and start == Start("latest")


def test_serve_with_from_and_no_source_stops_with_one_line(tmp_path):
    import os
    import subprocess

    from ..harness import MLDSERVER, ROOT

    done = subprocess.run([MLDSERVER, "serve", "--handler", "tests.handlers:Noop", "--from", "latest", "--port", "0",
                           "--admin", "off", "--state-dir", str(tmp_path / "state")],
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "add --source" in done.stderr, done
