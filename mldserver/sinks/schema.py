"""A window's rows (JSON objects, as handlers emitted them) into one Arrow table.

The schema is declared in the config (``schema``: field name to Arrow type name), or
inferred from the first window and then fixed: saved as ``DIR/_schema.arrow`` so a
restart reads the same. A later row that does not fit (a field not in the schema, a
value of another type) is rejected with a clear error, never coerced silently::

    # mldserver.toml
    [schema]
    customer = "string"
    amount = "double"
    order_time = "timestamp[ms]"

    rows_to_table(JsonLines.of([b'{"customer":"c1","amount":3}']), schema)  -> (table, rejected=[])

The rows come as a window has them (``base.handoff.JsonLines``): runs of JSON lines
where they lie (``JsonLines.chunks``), which pyarrow's JSON reader (C++, the GIL
released) parses a block at a time into the table's chunks, so the window's rows are
never gathered into one buffer first (with a schema; the first window, whose schema is
inferred, is read whole). Call it off the event loop.
"""

from __future__ import annotations

from pathlib import Path

import orjson
import pyarrow as pa
import pyarrow.json as pj

from ..base.durable import atomic_write
from ..base.handoff import JsonLines
from ..errors import ConfigError

BLOCK_SIZE = 1 << 24
# Runs of lines shorter than this are gathered into one block before they are parsed:
# a parse has a fixed cost, and a window of many shards' small batches has many runs.
MIN_BLOCK = 1 << 20


def declared(fields: dict[str, str] | None) -> pa.Schema | None:
    if not fields:
        return None
    out = []
    for name, type_name in fields.items():
        try:
            out.append(pa.field(name, pa.type_for_alias(str(type_name))))
        except ValueError:
            raise ConfigError(
                f"schema: field {name!r} has unknown type {type_name!r} "
                "(use an Arrow type name: string, int64, double, bool, timestamp[ms], date32, ...)"
            ) from None
    return pa.schema(out)


def load(path: Path) -> pa.Schema | None:
    try:
        return pa.ipc.read_schema(pa.py_buffer(path.read_bytes()))
    except FileNotFoundError:
        return None


def save(schema: pa.Schema, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, schema.serialize().to_pybytes())


def rows_to_table(rows: JsonLines, schema: pa.Schema | None) -> tuple[pa.Table, list[tuple[int, str]]]:
    """The rows as a table; rows that do not fit the schema are left out and
    returned as (index, error). Without a schema, it is inferred from the rows (from
    the first row alone if they disagree)."""
    try:
        if schema is not None:
            return _parse_runs(rows, schema), []
        return typed(parse(rows.buffer(), schema)), []
    except pa.ArrowInvalid:
        if schema is None:  # the rows disagree among themselves: the first one decides
            schema = typed(parse(rows.buffer(0, 1), None)).schema
    # Slow path, only when something does not fit: find the rows, keep the others.
    rejected, kept = [], []
    for i in range(len(rows)):
        line = rows.buffer(i, i + 1)
        try:
            parse(line, schema)
            kept.append(line)
        except pa.ArrowInvalid as exc:
            rejected.append((i, _explain(rows[i], schema, exc)))
    return (parse(b"".join(kept), schema) if kept else schema.empty_table()), rejected


def typed(table: pa.Table) -> pa.Table:
    """An inferred table with no column of Arrow's ``null`` type: a field that is null in
    every row (so far) is a nullable string (at any depth), which every format and table
    takes (Iceberg has no null type); a later number there does not fit, and is said so.
    Declare the field's type in ``[schema]`` to choose another::

        typed(table of {"a": 1, "note": null})   # note: string, not null
    """
    schema = pa.schema([f.with_type(_no_null(f.type)) for f in table.schema], metadata=table.schema.metadata)
    return table if schema.equals(table.schema) else table.cast(schema)


def _no_null(t: pa.DataType) -> pa.DataType:
    if pa.types.is_null(t):
        return pa.string()
    if pa.types.is_list(t):
        return pa.list_(_no_null(t.value_type))
    if pa.types.is_struct(t):
        return pa.struct([f.with_type(_no_null(f.type)) for f in t])
    return t


def _parse_runs(rows: JsonLines, schema: pa.Schema) -> pa.Table:
    """The rows with ``schema``, parsed a run at a time where they lie (small runs
    gathered first): a table of one chunk per block."""
    tables: list[pa.Table] = []
    small = bytearray()
    for run in rows.chunks():  # each valid until the next is asked for: parsed, or copied, before
        if len(run) >= MIN_BLOCK:
            if small:
                tables.append(parse(small, schema))
                small = bytearray()
            tables.append(parse(run, schema))
        else:
            small += run
            if len(small) >= MIN_BLOCK:
                tables.append(parse(small, schema))
                small = bytearray()
    if small:
        tables.append(parse(small, schema))
    return pa.concat_tables(tables) if tables else schema.empty_table()


def _explain(row: bytes, schema: pa.Schema, exc: Exception) -> str:
    expected = ", ".join(f"{f.name} {f.type}" for f in schema)
    try:
        extra = sorted(set(orjson.loads(row)) - set(schema.names))
    except (orjson.JSONDecodeError, TypeError):
        extra = []
    what = f"fields not in the schema: {', '.join(extra)}" if extra else str(exc)
    return f"{what} (schema: {expected})"


def parse(lines: bytes | memoryview, schema: pa.Schema | None) -> pa.Table:
    """JSON lines as a table (``schema``: exactly its fields, or ``pa.ArrowInvalid``;
    None: inferred)."""
    options = pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior="error") if schema else None
    # One thread: beside the event loop, the handler processes and Spark on a few cores,
    # a pool of parsers only competes with them (bench --part spark: the loop's worst lag
    # rose, throughput did not).
    return pj.read_json(
        pa.BufferReader(pa.py_buffer(lines)),
        read_options=pj.ReadOptions(block_size=BLOCK_SIZE, use_threads=False),
        parse_options=options,
    )
