"""Settings read once: every value checked against its setting's Rule (from the file
and the flags alike), ``--sink`` parsed into a SinkSpec, mistakes named."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from mldserver.base.config import RULES, Settings, SinkSpec, load
from mldserver.errors import ConfigError


def test_a_sink_spec_names_its_kind_and_an_absolute_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert SinkSpec.parse("parquet:./out") == SinkSpec("parquet", tmp_path / "out")
    kind, directory = SinkSpec.parse("file:/data/windows")
    assert kind == "file" and directory == Path("/data/windows")


@pytest.mark.parametrize(
    "spec, says",
    [
        ("s3:bucket", "use file:DIR (JSON lines), parquet:DIR (Spark) or iceberg:DIR (a table)"),
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


def test_every_setting_has_a_rule_that_its_default_passes():
    assert set(RULES) == {f.name for f in dataclasses.fields(Settings)}
    for f in dataclasses.fields(Settings):
        if f.default is not None:
            assert RULES[f.name].check(f.name, f.default, "test") == f.default


@pytest.mark.parametrize(
    "values, says",
    [
        ({"window": 0.0}, "window = 0.0 is out of range: use 0.1 to 86400 seconds"),
        ({"execution_timeout": -1}, "execution_timeout = -1.0 is out of range: use 0.01 to 86400 seconds"),
        ({"handler_retries": -1}, "handler_retries = -1 is out of range: use 0 to 100"),
        ({"max_line_size": 0}, "max_line_size = 0 is out of range: use 4096 to 4294967296 bytes"),
        ({"port": 99999}, "port = 99999 is out of range: use 0 to 65535"),
        ({"max_buffered_rows": 0}, "max_buffered_rows = 0 is out of range: use at least 1"),
        ({"idle_timeout": float("inf")}, "idle_timeout must be a finite number, got inf: use 0.1 to 86400 seconds"),
        ({"log_level": "verbose"}, "log_level must be one of 'debug', 'info', 'warning', 'error', got 'verbose'"),
        ({"deaggregate": "yes"}, "deaggregate must be one of 'auto', 'always', 'never', got 'yes'"),
        ({"handler_retries": 1.5}, "handler_retries must be an integer, got 1.5"),
        ({"shutdown_timeout": True}, "shutdown_timeout must be a number, got True"),
        ({"host": ""}, "host must not be empty"),
    ],
)
def test_a_value_outside_its_rule_is_refused_from_the_file_and_the_flags_alike(tmp_path, values, says):
    (name, value), = values.items()
    path = tmp_path / "mld.toml"
    path.write_text(f"{name} = {_toml(value)}\n")
    with pytest.raises(ConfigError) as from_file:
        load(str(path))
    assert str(from_file.value) == f"{path}: {says}"
    with pytest.raises(ConfigError) as from_flag:
        load(**values)
    assert str(from_flag.value) == f"--{name.replace('_', '-')} (command line): {says}"


def _toml(value) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, str):
        return f'"{value}"'
    if value == float("inf"):
        return "inf"
    return repr(value)


def test_values_inside_their_rules_are_kept_and_an_int_counts_as_a_float(tmp_path):
    path = tmp_path / "mld.toml"
    path.write_text("window = 1\nport = 0\nmax_line_size = 4096\ncheckpoint_interval = 0\nlog_level = 'debug'\n"
                    f"sink = 'file:{tmp_path / 'out'}'\n")
    settings = load(str(path), window=0.1)
    assert (settings.window, settings.port, settings.max_line_size, settings.log_level) == (0.1, 0, 4096, "debug")
    assert isinstance(load(str(path)).window, float) and load(str(path)).window == 1.0


def test_a_config_file_that_is_not_utf8_is_named_with_the_byte(tmp_path):
    path = tmp_path / "latin1.toml"
    path.write_bytes("# caf\xe9\n".encode("latin-1"))
    with pytest.raises(ConfigError) as caught:
        load(str(path))
    assert str(caught.value) == (f"config file {path} is not UTF-8 text (byte 0xe9 at offset 5): "
                                 "save it as UTF-8, as TOML requires")


def test_the_timer_store_is_sqlite_a_file_or_a_dynamodb_table():
    from mldserver.base.config import TimerStoreSpec

    assert load().timer_store == "sqlite"
    assert TimerStoreSpec.parse("sqlite") == TimerStoreSpec("sqlite", "")
    assert TimerStoreSpec.parse("sqlite:/var/lib/t.db") == TimerStoreSpec("sqlite", "/var/lib/t.db")
    assert TimerStoreSpec.parse("dynamodb:orders-timers") == TimerStoreSpec("dynamodb", "orders-timers")
    with pytest.raises(ConfigError, match=r"timer_store 'redis:x': use sqlite \(in the state dir\), sqlite:PATH or "
                                          r"dynamodb:TABLE"):
        load(timer_store="redis:x")
    with pytest.raises(ConfigError, match="give a DynamoDB table name"):
        load(timer_store="dynamodb:a")
    with pytest.raises(ConfigError, match=r"timer_context_size = 10 is out of range: use 20 to 262144 bytes"):
        load(timer_context_size=10)


def test_sources_are_a_list_from_the_file_or_repeated_flags_kept_as_a_tuple(tmp_path):
    path = tmp_path / "mld.toml"
    path.write_text('source = ["dynamodb:orders", "dynamodb:customers"]\nsource_from = "latest"\n')
    assert load(str(path)).source == ("dynamodb:orders", "dynamodb:customers")
    assert load(source=["dynamodb:orders"]).source == ("dynamodb:orders",)
    assert load().source == ()
    with pytest.raises(ConfigError, match=r"source must be a list, got 'dynamodb:orders'"):
        path.write_text('source = "dynamodb:orders"\n')
        load(str(path))
    with pytest.raises(ConfigError, match=r"source\[1\] must not be empty"):
        load(source=["dynamodb:orders", ""])


def test_a_lease_table_needs_a_source_and_a_table_name(tmp_path):
    assert load(source=["dynamodb:orders"], lease_table="orders-leases", lease_period=3.0).lease_period == 3.0
    assert load().lease_table is None and load().lease_period == 10.0
    with pytest.raises(ConfigError, match=r"--lease-table orders-leases: leases the sources .* add --source"):
        load(lease_table="orders-leases")
    with pytest.raises(ConfigError, match=r"--lease-table 'a/b': give a DynamoDB table name"):
        load(source=["dynamodb:orders"], lease_table="a/b")
    with pytest.raises(ConfigError, match=r"lease_period = 0.1 is out of range"):
        load(source=["dynamodb:orders"], lease_table="orders-leases", lease_period=0.1)


@pytest.mark.parametrize("admin", ["127.0.0.1:99999", ":7071", "7071"])
def test_an_admin_address_serve_refuses_is_refused_by_load_so_check_agrees(admin):
    with pytest.raises(ConfigError, match=rf"^--admin {admin}: use HOST:PORT"):
        load(None, admin=admin)
    assert load(None, admin="off").admin == "off" and load(None, admin="[::1]:7071").admin == "[::1]:7071"


def test_a_config_nested_too_deeply_is_a_config_error_not_a_recursion_error(tmp_path):
    path = tmp_path / "deep.toml"
    path.write_text("a = " + "[" * 5000 + "]" * 5000 + "\n")
    with pytest.raises(ConfigError, match="nests arrays or tables too deeply"):
        load(str(path))


def test_batches_in_flight_unset_are_eight_or_two_a_handler_process_where_that_is_more(tmp_path):
    from mldserver.server.assembly import build

    assert [Settings(workers=w).batches_in_flight for w in (0, 2, 4, 6, 16)] == [8, 8, 8, 12, 32]
    assert Settings(workers=6, max_batches_in_flight=3).batches_in_flight == 3
    assert Settings(workers=6, max_batches_in_flight=0).batches_in_flight == 0  # no limit
    # the slots the server's shards share: every handler process has a batch and the next one
    given = dict(handler="mldserver.examples.passthrough:Passthrough", state_dir=str(tmp_path))
    assert build(Settings(**given, workers=6)).slots.total == 12
    assert build(Settings(**given, workers=6, max_batches_in_flight=0)).slots is None
