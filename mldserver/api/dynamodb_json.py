"""DynamoDB JSON (the attribute-value form of items in a DynamoDB stream record) to
exact Python values::

    decode_item({"id": {"S": "o-17"}, "amount": {"N": "12.50"}, "qty": {"N": "3"},
                 "big": {"N": "12345678901234567890123456789012345678"},
                 "tags": {"SS": ["a", "b"]}, "raw": {"B": "AHJhdw=="},
                 "lines": {"L": [{"M": {"sku": {"S": "x"}}}, {"NULL": true}, {"BOOL": false}]}})
    -> {"id": "o-17", "amount": Decimal("12.50"), "qty": 3,
        "big": 12345678901234567890123456789012345678,
        "tags": {"a", "b"}, "raw": b"\\x00raw",
        "lines": [{"sku": "x"}, None, False]}

| DynamoDB | Python |
|---|---|
| ``S`` | ``str`` |
| ``N`` | ``int`` when integral (``"3"``, ``"1E+3"``), else ``decimal.Decimal`` (exact: never a float) |
| ``B`` (base64) | ``bytes`` |
| ``BOOL``, ``NULL`` | ``bool``, ``None`` |
| ``SS``, ``NS``, ``BS`` | ``set`` of ``str``, numbers, ``bytes`` |
| ``L``, ``M`` | ``list``, ``dict`` |

An attribute value is an object with exactly one of those keys (as the KCL's DynamoDB
Streams adapter writes it, with binary as base64). Anything else raises
``DynamoDBJSONError`` naming where it is (``NewImage.lines[2]``) and what it was.
Binary may also be ``bytes`` (as botocore's client returns it).

The other way, ``encode_item`` / ``encode_value`` write Python values as attribute
values for botocore's client (``bytes`` stay bytes: botocore base64s them)::

    encode_item({"id": "c-7", "total": Decimal("12.50"), "n": 3, "tags": {"a"}, "raw": b"\\x00"})
    -> {"id": {"S": "c-7"}, "total": {"N": "12.50"}, "n": {"N": "3"}, "tags": {"SS": ["a"]}, "raw": {"B": b"\\x00"}}

A float is refused (inexact: use ``Decimal(str(x))`` or an int), as are an empty set
(DynamoDB has none), a set mixing kinds and a map key that is not a string.

Decimals and sets are not JSON: convert what you emit (``float(d)`` or ``str(d)``,
``sorted(s)``); a row orjson cannot encode is a bad row.
"""

from __future__ import annotations

import binascii
from decimal import Decimal, InvalidOperation
from typing import Any

__all__ = ["DynamoDBJSONError", "decode_item", "decode_value", "encode_item", "encode_value"]

TYPES = ("S", "N", "B", "BOOL", "NULL", "M", "L", "SS", "NS", "BS")


class DynamoDBJSONError(ValueError):
    """Not DynamoDB JSON: the message says where, what was found and what is allowed."""


class _Bad(Exception):
    """The fast path's failure: the slow path then finds where and why."""


def _number(s: Any) -> int | Decimal:
    if type(s) is not str:
        raise _Bad
    if s.isdigit() or (s[:1] == "-" and s[1:].isdigit()):
        return int(s)
    try:
        d = Decimal(s)
    except InvalidOperation:
        raise _Bad from None
    if not d.is_finite() or not s.isascii():
        raise _Bad
    if ("E" in s or "e" in s) and d.as_tuple().exponent >= 0:  # type: ignore[operator]  (finite)
        return int(d)  # integral, written with an exponent ("1E+3")
    return d


def _binary(s: Any) -> bytes:
    if type(s) is bytes:
        return s  # as botocore's client hands it over, already decoded
    if type(s) is not str:
        raise _Bad
    try:
        return binascii.a2b_base64(s, strict_mode=True)
    except binascii.Error:
        raise _Bad from None


def _value(av: Any) -> Any:
    if type(av) is not dict or len(av) != 1:
        raise _Bad
    for tag in av:
        v = av[tag]
        if tag == "S":
            if type(v) is str:
                return v
        elif tag == "N":
            return _number(v)
        elif tag == "M":
            if type(v) is dict:
                return {k: _value(x) for k, x in v.items()}
        elif tag == "L":
            if type(v) is list:
                return [_value(x) for x in v]
        elif tag == "BOOL":
            if type(v) is bool:
                return v
        elif tag == "NULL":
            if v is True:
                return None
        elif tag == "B":
            return _binary(v)
        elif tag == "SS":
            if type(v) is list and all(type(x) is str for x in v):
                return set(v)
        elif tag == "NS":
            if type(v) is list:
                return {_number(x) for x in v}
        elif tag == "BS":
            if type(v) is list:
                return {_binary(x) for x in v}
    raise _Bad


def decode_value(av: Any, where: str = "value") -> Any:
    """One attribute value (``{"N": "3"}``) as a Python value."""
    try:
        return _value(av)
    except (_Bad, RecursionError):
        _explain(av, where)
        raise DynamoDBJSONError(f"{where}: not DynamoDB JSON: {_show(av)}") from None


def decode_item(image: Any, where: str = "item") -> dict[str, Any]:
    """An item (a map of attribute names to attribute values) as a dict."""
    if type(image) is not dict:
        raise DynamoDBJSONError(f"{where}: an item is an object of attribute values, got {_show(image)}")
    try:
        return {k: _value(v) for k, v in image.items()}
    except (_Bad, RecursionError):
        for k, v in image.items():
            _explain(v, f"{where}.{k}")
        raise DynamoDBJSONError(f"{where}: not DynamoDB JSON: {_show(image)}") from None


def _explain(av: Any, where: str) -> None:
    """Raise DynamoDBJSONError for the first bad value in ``av`` (a slow walk, only
    after the fast path failed)."""
    if type(av) is not dict or len(av) != 1:
        what = "an empty object" if av == {} else _show(av)
        raise DynamoDBJSONError(
            f"{where}: not a DynamoDB attribute value: {what}; one of "
            f"{', '.join(TYPES)} with its value is expected, as in {{\"S\": \"text\"}}")
    (tag, v), = av.items()
    if tag not in TYPES:
        raise DynamoDBJSONError(f"{where}: unknown attribute type {tag!r:.40}; expected one of {', '.join(TYPES)}")
    wrong = f"{where}: {tag} holds {_show(v)}, expected "
    if tag == "M":
        if type(v) is not dict:
            raise DynamoDBJSONError(wrong + "an object of attribute values")
        for k, x in v.items():
            _explain(x, f"{where}.{k}")
    elif tag == "L":
        if type(v) is not list:
            raise DynamoDBJSONError(wrong + "an array of attribute values")
        for i, x in enumerate(v):
            _explain(x, f"{where}[{i}]")
    elif tag in ("SS", "NS", "BS"):
        if type(v) is not list:
            raise DynamoDBJSONError(wrong + "an array")
        for i, x in enumerate(v):
            _explain({tag[0]: x}, f"{where}[{i}]")
    elif tag == "N":
        try:
            _number(v)
        except _Bad:
            raise DynamoDBJSONError(wrong + "a number as a string, as in \"12.5\"") from None
    elif tag == "B":
        try:
            _binary(v)
        except _Bad:
            raise DynamoDBJSONError(wrong + "base64 text") from None
    elif tag == "S" and type(v) is not str:
        raise DynamoDBJSONError(wrong + "a string")
    elif tag == "BOOL" and type(v) is not bool:
        raise DynamoDBJSONError(wrong + "true or false")
    elif tag == "NULL" and v is not True:
        raise DynamoDBJSONError(wrong + "true")


def _show(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 80 else text[:77] + "..."


def encode_value(v: Any, where: str = "value") -> dict[str, Any]:
    """One Python value as an attribute value (``3`` -> ``{"N": "3"}``)."""
    t = type(v)
    if t is str:
        return {"S": v}
    if t is bool:
        return {"BOOL": v}
    if v is None:
        return {"NULL": True}
    if t is int:
        return {"N": str(v)}
    if isinstance(v, Decimal):
        if not v.is_finite():
            raise DynamoDBJSONError(f"{where}: {v!r} is not a finite number: DynamoDB stores finite numbers only")
        return {"N": str(v)}
    if t in (bytes, bytearray, memoryview):
        return {"B": bytes(v)}
    if isinstance(v, dict):
        out = {}
        for k, x in v.items():
            if type(k) is not str:
                raise DynamoDBJSONError(f"{where}: map key {k!r:.40} is not a string: DynamoDB map keys are strings")
            out[k] = encode_value(x, f"{where}.{k}")
        return {"M": out}
    if isinstance(v, (list, tuple)):
        return {"L": [encode_value(x, f"{where}[{i}]") for i, x in enumerate(v)]}
    if isinstance(v, (set, frozenset)):
        if not v:
            raise DynamoDBJSONError(f"{where}: an empty set: DynamoDB has no empty sets; leave the attribute out")
        kinds = {"S" if type(x) is str else "B" if type(x) in (bytes, bytearray) else
                 "N" if (type(x) is int or isinstance(x, Decimal)) else "?" for x in v}
        if len(kinds) != 1 or "?" in kinds:
            raise DynamoDBJSONError(f"{where}: a set of {_show(v)}: a set holds only strings, only numbers "
                                    f"(int or Decimal) or only bytes")
        (kind,) = kinds
        return {kind + "S": [encode_value(x, where)[kind] for x in v]}
    if t is float:
        raise DynamoDBJSONError(f"{where}: float {v!r} is inexact: use an int or a Decimal (Decimal(str(x)))")
    raise DynamoDBJSONError(f"{where}: {t.__name__} {_show(v)} has no DynamoDB type: use str, int, Decimal, bytes, "
                            f"bool, None, list, dict or set")


def encode_item(item: Any, where: str = "item") -> dict[str, dict[str, Any]]:
    """A dict of Python values as an item (attribute names to attribute values)."""
    if not isinstance(item, dict):
        raise DynamoDBJSONError(f"{where}: an item is a dict of attribute names to values, got {_show(item)}")
    return encode_value(item, where)["M"]
