"""Table bindings without DynamoDB: the config's [bindings.ALIAS] checked with clear
errors, the read-only guard, an unknown alias, the recursion guard at start-up (in
load and in the server), and the encoder's refusals."""

from __future__ import annotations

from decimal import Decimal

import pytest

from mldserver.api import bindings
from mldserver.api.bindings import BindingError, BindingSpec, Bindings
from mldserver.base.config import Settings, load
from mldserver.api.context import Context
from mldserver.api.dynamodb_json import DynamoDBJSONError, encode_item
from mldserver.errors import ConfigError
from mldserver.server.server import Server

ARN = "arn:aws:dynamodb:us-east-1:123456789012:table/orders/stream/2026-11-22T00:00:00.000"


def config(tmp_path, text: str) -> str:
    path = tmp_path / "mldserver.toml"
    path.write_text(text)
    return str(path)


def test_a_config_declares_bindings_by_alias(tmp_path):
    path = config(tmp_path, '[bindings.customers]\ntable = "customers"\naccess = "read_write"\n'
                            '[bindings.rates]\ntable = "fx.rates"\n')
    settings = load(path)
    assert bindings.parse(settings.bindings) == {
        "customers": BindingSpec("customers", "customers", "read_write", False),
        "rates": BindingSpec("rates", "fx.rates", "read_only", False),  # read_only by default
    }


@pytest.mark.parametrize("text, message", [
    ('[bindings.c]\naccess = "read_write"\n', 'c]: table = None: give the DynamoDB table\'s name'),
    ('[bindings.c]\ntable = "x"\n', "table = 'x': give the DynamoDB table's name (3 to 255"),
    ('[bindings.c]\ntable = "customers"\naccess = "rw"\n', "access = 'rw': use \"read_only\" or \"read_write\""),
    ('[bindings.c]\ntable = "customers"\nallow_recursion = "yes"\n', "allow_recursion = 'yes': use true or false"),
    ('[bindings.c]\ntable = "customers"\nacess = "read_only"\n', "unknown key(s) acess: use table, access"),
    ('bindings = {c = "customers"}\n', "[bindings.c] must be a table, as in [bindings.c] table = "),
    ('bindings = 3\n', "bindings must be a table, got 3"),
])
def test_a_bad_binding_says_what_where_and_what_to_do(tmp_path, text, message):
    path = config(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        load(path)
    assert message in str(err.value)
    assert path in str(err.value)


def test_a_read_write_binding_to_the_streams_own_table_is_refused_unless_allowed(tmp_path):
    rw = '[bindings.orders]\ntable = "orders"\naccess = "read_write"\n'
    with pytest.raises(ConfigError, match=r"\[bindings.orders\] writes to table orders, whose stream this server "
                                          r"reads .*allow_recursion = true"):
        load(config(tmp_path, f'stream = "{ARN}"\n{rw}'))
    load(config(tmp_path, f'stream = "{ARN}"\n{rw}allow_recursion = true\n'))  # allowed
    load(config(tmp_path, f'stream = "{ARN}"\n[bindings.orders]\ntable = "orders"\n'))  # read-only: fine
    load(config(tmp_path, f'stream = "{ARN.replace("/orders/", "/other/")}"\n{rw}'))  # another table's stream
    load(config(tmp_path, f'stream = "orders"\n{rw}'))  # a Kinesis stream named like the table


def test_the_server_refuses_the_recursion_at_start_up(tmp_path):
    settings = Settings(handler="tests.pool_handlers:RecordChanges", state_dir=str(tmp_path), stream=ARN,
                        bindings={"orders": {"table": "orders", "access": "read_write"}})
    with pytest.raises(ConfigError, match="allow_recursion"):
        Server(settings)


async def test_a_write_through_a_read_only_binding_is_refused_naming_the_alias():
    context = Context(Settings(bindings={"rates": {"table": "fx-rates"}}))
    rates = context.table("rates")
    for call in (rates.put({"id": "x"}), rates.update({"id": "x"}, set={"a": 1}), rates.delete({"id": "x"})):
        with pytest.raises(BindingError, match=r"table binding 'rates' \(table fx-rates\) is read-only: "
                                               r"\w+ refused; set access = \"read_write\" in \[bindings.rates\]"):
            await call
    assert context.bindings is not None and context.bindings._client is None  # refused before any client


def test_an_unknown_alias_names_the_known_ones():
    b = Bindings(Settings(bindings={"rates": {"table": "fx-rates"}}))
    with pytest.raises(BindingError, match=r"no table binding 'rate' \(bindings: rates\): declare it"):
        b.table("rate")
    with pytest.raises(BindingError, match="no bindings here"):
        bindings.table("rates")  # outside a server or handler process


@pytest.mark.parametrize("item, message", [
    ({"x": 1.5}, "item.x: float 1.5 is inexact: use an int or a Decimal"),
    ({"x": set()}, "item.x: an empty set"),
    ({"x": {1, "a"}}, "item.x: a set of"),
    ({"x": {"m": [Decimal("NaN")]}}, "item.x.m[0]: Decimal('NaN') is not a finite number"),
    ({"x": {1: "a"}}, "item.x: map key 1 is not a string"),
    ({"x": object()}, "item.x: object"),
])
def test_what_dynamodb_cannot_hold_exactly_is_refused(item, message):
    with pytest.raises(DynamoDBJSONError) as err:
        encode_item(item)
    assert message in str(err.value)
