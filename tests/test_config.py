"""Settings read once: ``--sink`` parsed into a SinkSpec, its mistakes named."""

from __future__ import annotations

from pathlib import Path

import pytest

from mldserver.config import SinkSpec, load
from mldserver.errors import ConfigError


def test_a_sink_spec_names_its_kind_and_an_absolute_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert SinkSpec.parse("parquet:./out") == SinkSpec("parquet", tmp_path / "out")
    kind, directory = SinkSpec.parse("file:/data/windows")
    assert kind == "file" and directory == Path("/data/windows")


@pytest.mark.parametrize(
    "spec, says",
    [
        ("s3:bucket", "use file:DIR (JSON lines) or parquet:DIR (Spark)"),
        ("file:", "give a directory, as in file:./out"),
        ("parquet", "give a directory, as in parquet:./out"),
    ],
)
def test_a_bad_sink_spec_is_a_config_error_that_quotes_it(spec, says):
    with pytest.raises(ConfigError) as caught:
        SinkSpec.parse(spec)
    assert str(caught.value) == f"--sink {spec!r}: {says}"


def test_a_pipeline_needs_the_spark_sink(tmp_path):
    with pytest.raises(ConfigError, match="--pipeline runs in Spark"):
        load(sink=f"file:{tmp_path}", pipeline="m:p")
    assert load(pipeline="m:p", state_dir=str(tmp_path)).sink == f"parquet:{tmp_path / 'output'}"
