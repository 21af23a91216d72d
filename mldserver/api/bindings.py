"""Table bindings: handlers read and write DynamoDB tables by alias, with Python values
(Couchbase Eventing's bucket bindings). Declared in the config file, one table each::

    # mldserver.toml
    handler = "handlers.orders_live:OrdersLive"
    stream = "arn:aws:dynamodb:us-east-1:123456789012:table/orders/stream/2026-11-22T00:00:00.000"

    [bindings.customers]            # the alias handlers use
    table = "customers"             # the DynamoDB table
    access = "read_write"           # or "read_only" (the default)

    [bindings.orders]
    table = "orders"
    access = "read_write"
    allow_recursion = true          # writes to the stream's own table: each one is a new change

and used from any handler or timer callback, in a handler process or the server's loop::

    class OrdersLive(mldserver.ChangeHandler):
        async def on_update(self, doc, meta):
            customers = self.context.table("customers")
            await customers.update({"id": doc["customer"]}, add={"orders": 1, "total": doc["amount"]})
            row = await customers.get({"id": doc["customer"]})   # {"id": "c-7", "orders": 3, "total": Decimal("41.50")}
            await customers.put({"id": "c-8", "tags": {"new"}, "raw": b"\\x00"})
            await customers.delete({"id": "c-9"})

    async def expire(context):                       # a timer callback: no self
        await bindings.table("orders").update({"id": context["order"]}, set={"status": "expired"})

- ``get(key, consistent=False)``: the item as a dict, or None when there is none;
- ``put(item)``: writes the whole item (replacing one with the same key);
- ``update(key, set={...}, add={...}, remove=[...])``: sets attributes, adds to numbers
  (an absent one counts as 0) or sets, removes attributes (top-level names); creates
  the item if there is none; returns the item as it is after the update;
- ``delete(key)``: removes the item; returns the item that was there, or None.

Values are those of :mod:`mldserver.api.dynamodb_json`, exact both ways: ``int`` or
``Decimal`` (a float is refused), ``set``, ``bytes``, ``list``, ``dict``, ``bool``, ``None``.
A write through a ``read_only`` binding raises :class:`BindingError` naming the alias;
so does an alias not in the config. Errors from DynamoDB (a missing table, a wrong key)
are botocore's, raised as they come.

When ``stream`` is a DynamoDB stream, a ``read_write`` binding to that same table is
refused at start-up unless it says ``allow_recursion = true``: every write it makes
is a new change the handler gets, and a handler that writes on every change never
stops (the recursion Couchbase Eventing guards against).

Each process (the server, each handler process) opens its own aioboto3 client on
first use, from the usual AWS configuration (``AWS_ENDPOINT_URL_DYNAMODB``,
``aws_region`` or ``AWS_REGION``), and closes it at shutdown.
"""

from __future__ import annotations

import asyncio
from contextvars import ContextVar
from typing import Any, Iterable, Mapping

from ..base.config import BindingSpec, stream_table
from ..base.config import check_bindings as check
from ..base.config import parse_bindings as parse
from .dynamodb_json import decode_item, encode_item, encode_value
from ..errors import MldserverError

__all__ = ["BindingError", "BindingSpec", "Bindings", "Table", "check", "parse", "stream_table", "table"]


class BindingError(MldserverError):
    """A binding used as its config does not allow: the message names the alias."""


class Table:
    """One binding: ``get``, ``put``, ``update``, ``delete`` on its table."""

    def __init__(self, spec: BindingSpec, owner: "Bindings") -> None:
        self.spec = spec
        self.alias = spec.alias
        self.name = spec.table
        self._owner = owner

    def __repr__(self) -> str:
        return f"<Table {self.alias}: {self.name}, {self.spec.access}>"

    def _writable(self, what: str) -> None:
        if self.spec.access != "read_write":
            raise BindingError(f"table binding {self.alias!r} (table {self.name}) is read-only: {what} refused; "
                               f"set access = \"read_write\" in [bindings.{self.alias}] to write through it")

    async def get(self, key: Mapping[str, Any], *, consistent: bool = False) -> dict[str, Any] | None:
        c = await self._owner.client()
        got = await c.get_item(TableName=self.name, Key=encode_item(dict(key), "key"), ConsistentRead=consistent)
        item = got.get("Item")
        return None if item is None else decode_item(item, self.alias)

    async def put(self, item: Mapping[str, Any]) -> None:
        self._writable("put")
        c = await self._owner.client()
        await c.put_item(TableName=self.name, Item=encode_item(dict(item), "item"))

    async def update(self, key: Mapping[str, Any], *, set: Mapping[str, Any] | None = None,
                     add: Mapping[str, Any] | None = None, remove: Iterable[str] = ()) -> dict[str, Any]:
        self._writable("update")
        names: dict[str, str] = {}
        values: dict[str, Any] = {}
        parts: dict[str, list[str]] = {"SET": [], "ADD": [], "REMOVE": []}
        for verb, attrs in (("SET", set or {}), ("ADD", add or {})):
            for name, value in attrs.items():
                i = len(names)
                names[f"#a{i}"] = name
                values[f":v{i}"] = encode_value(value, f"{verb.lower()}.{name}")
                parts[verb].append(f"#a{i} = :v{i}" if verb == "SET" else f"#a{i} :v{i}")
        for name in remove:
            i = len(names)
            names[f"#a{i}"] = name
            parts["REMOVE"].append(f"#a{i}")
        if not names:
            raise BindingError(f"table binding {self.alias!r}: update with nothing to do: give set=, add= or remove=")
        expression = " ".join(f"{verb} {', '.join(p)}" for verb, p in parts.items() if p)
        c = await self._owner.client()
        kwargs: dict[str, Any] = {"ExpressionAttributeValues": values} if values else {}
        got = await c.update_item(TableName=self.name, Key=encode_item(dict(key), "key"), UpdateExpression=expression,
                                  ExpressionAttributeNames=names, ReturnValues="ALL_NEW", **kwargs)
        return decode_item(got.get("Attributes") or {}, self.alias)

    async def delete(self, key: Mapping[str, Any]) -> dict[str, Any] | None:
        self._writable("delete")
        c = await self._owner.client()
        got = await c.delete_item(TableName=self.name, Key=encode_item(dict(key), "key"), ReturnValues="ALL_OLD")
        item = got.get("Attributes")
        return None if item is None else decode_item(item, self.alias)


class Bindings:
    """A process's bindings and its one DynamoDB client, opened on first use."""

    def __init__(self, settings: Any) -> None:
        self.specs = parse(settings.bindings)
        self.region = settings.aws_region
        self.tables = {alias: Table(spec, self) for alias, spec in self.specs.items()}
        self._client: Any = None
        self._client_cm: Any = None
        self._opening = asyncio.Lock()

    def table(self, alias: str) -> Table:
        try:
            return self.tables[alias]
        except KeyError:
            known = ", ".join(sorted(self.tables)) or "none"
            raise BindingError(f"no table binding {alias!r} (bindings: {known}): declare it in the config as "
                               f"[bindings.{alias}] table = \"...\" access = \"read_only\"") from None

    async def client(self) -> Any:
        if self._client is None:
            async with self._opening:
                if self._client is None:
                    from ..base.aws import client

                    cm = client("dynamodb", self.region)
                    self._client = await cm.__aenter__()
                    self._client_cm = cm
        return self._client

    async def close(self) -> None:
        if self._client_cm is not None:
            cm, self._client_cm, self._client = self._client_cm, None, None
            await cm.__aexit__(None, None, None)


current: ContextVar[Bindings | None] = ContextVar("mldserver_bindings", default=None)


def table(alias: str) -> Table:
    """The binding ``alias`` of this process, for code with no ``self`` (timer callbacks)."""
    bindings = current.get()
    if bindings is None:
        raise BindingError(f"table binding {alias!r}: no bindings here (outside a server or handler process)")
    return bindings.table(alias)
