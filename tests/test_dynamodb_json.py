"""DynamoDB JSON to exact Python values: numbers never through a float, sets, binary,
nested lists and maps; anything else a DynamoDBJSONError that says where."""

from __future__ import annotations

from decimal import Decimal

import pytest

from mldserver.api.dynamodb_json import DynamoDBJSONError, decode_item, decode_value


@pytest.mark.parametrize(
    "text, value",
    [
        ("0", 0),
        ("-0", 0),
        ("3", 3),
        ("-17", -17),
        ("12345678901234567890123456789012345678", 12345678901234567890123456789012345678),
        ("-99999999999999999999999999999999999999", -99999999999999999999999999999999999999),
        ("12.50", Decimal("12.50")),
        ("0.000000000000000000000000000000000000001", Decimal("1E-39")),
        ("1234567890123456789012345678901234567.8", Decimal("1234567890123456789012345678901234567.8")),
        ("9.99E+10", 99900000000),
        ("1E+125", 10**125),
        ("1.5E-3", Decimal("0.0015")),
    ],
)
def test_numbers_are_exact_ints_or_decimals(text, value):
    decoded = decode_value({"N": text})
    assert decoded == value
    assert type(decoded) is type(value)


def test_every_type_and_nesting():
    item = decode_item({
        "s": {"S": "héllo"},
        "b": {"B": "AHJhdw=="},
        "t": {"BOOL": True},
        "f": {"BOOL": False},
        "z": {"NULL": True},
        "ss": {"SS": ["a", "b"]},
        "ns": {"NS": ["1", "2.5", "12345678901234567890123456789012345678"]},
        "bs": {"BS": ["/w==", "AAE="]},
        "m": {"M": {"l": {"L": [{"N": "1"}, {"M": {"deep": {"L": [{"S": "x"}, {"NULL": True}]}}}]}, "e": {"L": []}}},
        "em": {"M": {}},
    })
    assert item == {
        "s": "héllo",
        "b": b"\x00raw",
        "t": True,
        "f": False,
        "z": None,
        "ss": {"a", "b"},
        "ns": {1, Decimal("2.5"), 12345678901234567890123456789012345678},
        "bs": {b"\xff", b"\x00\x01"},
        "m": {"l": [1, {"deep": ["x", None]}], "e": []},
        "em": {},
    }
    assert type(item["ss"]) is set and type(item["b"]) is bytes


@pytest.mark.parametrize(
    "value, message",
    [
        ({"a": {}}, "item.a: not a DynamoDB attribute value: an empty object"),
        ({"a": {"S": "x", "N": "1"}}, "item.a: not a DynamoDB attribute value"),
        ({"a": {"X": 1}}, "item.a: unknown attribute type 'X'"),
        ({"a": {"N": 12}}, "item.a: N holds 12, expected a number as a string"),
        ({"a": {"N": "12,5"}}, "item.a: N holds '12,5', expected a number as a string"),
        ({"a": {"N": "NaN"}}, "item.a: N holds 'NaN'"),
        ({"a": {"N": "Infinity"}}, "item.a: N holds 'Infinity'"),
        ({"a": {"S": 3}}, "item.a: S holds 3, expected a string"),
        ({"a": {"B": "not base64!"}}, "item.a: B holds 'not base64!', expected base64 text"),
        ({"a": {"BOOL": "yes"}}, "item.a: BOOL holds 'yes', expected true or false"),
        ({"a": {"NULL": False}}, "item.a: NULL holds False, expected true"),
        ({"a": {"L": [{"S": "ok"}, {"N": "x"}]}}, "item.a[1]: N holds 'x'"),
        ({"a": {"M": {"b": {"M": {"c": {"Q": 1}}}}}}, "item.a.b.c: unknown attribute type 'Q'"),
        ({"a": {"SS": ["x", 2]}}, "item.a[1]: S holds 2, expected a string"),
        ({"a": {"NS": "1"}}, "item.a: NS holds '1', expected an array"),
        ({"a": "plain"}, "item.a: not a DynamoDB attribute value: 'plain'"),
    ],
)
def test_what_is_not_dynamodb_json_is_named_with_where_it_is(value, message):
    with pytest.raises(DynamoDBJSONError) as caught:
        decode_item(value)
    assert message in str(caught.value)


def test_an_item_must_be_an_object():
    with pytest.raises(DynamoDBJSONError, match=r"NewImage: an item is an object of attribute values, got \[\]"):
        decode_item([], "NewImage")
    with pytest.raises(ValueError):  # DynamoDBJSONError is a ValueError
        decode_value({"N": "x"})
