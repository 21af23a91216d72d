"""Change handlers: one callback per record, Couchbase Eventing's ``OnUpdate`` and
``OnDelete``, over a DynamoDB stream or a Kinesis stream::

    import mldserver

    class Orders(mldserver.ChangeHandler):
        async def on_update(self, doc, meta):      # INSERT and MODIFY: doc is the new image
            self.emit({"order": doc["id"], "amount": str(doc["amount"])})
        async def on_delete(self, meta):           # REMOVE: meta.keys, meta.old, meta.expired
            self.emit({"order": meta.keys["id"], "deleted": True, "ttl": meta.expired})

``mldserver serve --handler pkg.orders:Orders``: one instance per shard, with the
context, settings and lifecycle of a :class:`~mldserver.Handler` (``initialize``,
``shutdown_requested``, ... as there). Its ``process_records`` calls the callbacks,
once per record, in order; don't override it.

What a record is, from its data alone (no setting):

- A DynamoDB stream record as the KCL's DynamoDB Streams adapter delivers it to the
  MultiLangDaemon: the data is the DynamoDB Streams ``Record`` as JSON (its
  ``RecordObjectMapper``), recognised by ``"eventSource": "aws:dynamodb"`` and a
  ``dynamodb`` object::

      {"eventID":"4bc5...","eventName":"MODIFY","eventVersion":"1.1","eventSource":"aws:dynamodb",
       "awsRegion":"us-east-1","dynamodb":{"ApproximateCreationDateTime":1763719200000,
       "Keys":{"id":{"S":"o-17"}},"NewImage":{"id":{"S":"o-17"},"amount":{"N":"12.50"}},
       "OldImage":{...},"SequenceNumber":"000000000000000000002","SizeBytes":124,
       "StreamViewType":"NEW_AND_OLD_IMAGES"},
       "userIdentity":{"principalId":"dynamodb.amazonaws.com","type":"Service"}}

  (the record's ``sequenceNumber`` is the stream's ``SequenceNumber``, its
  ``approximateArrivalTimestamp`` the creation time in ms, and binary values are
  base64). ``INSERT`` and ``MODIFY`` call ``on_update(doc, meta)`` with the new image
  decoded to exact Python values (:mod:`mldserver.api.dynamodb_json`: ``int`` or
  ``Decimal``, never a float; ``set``, ``bytes``, ``list``, ``dict``), or ``None``
  when the stream carries no new images (``KEYS_ONLY``, ``OLD_IMAGE``). ``REMOVE``
  calls ``on_delete(meta)``.
- Anything else is a Kinesis record: ``on_update(doc, meta)`` with ``doc`` the decoded
  JSON when the data is JSON (by orjson: an integer past 64 bits becomes a float;
  override ``kinesis_doc`` to decode otherwise), else the data as bytes.

``meta`` (:class:`Meta`) carries the record (``meta.record``), its partition key,
positions and arrival time, and for a DynamoDB change the keys, event id and name,
the stream sequence number, the approximate creation time, the old image when the
stream has it, and ``expired`` (a deletion made by TTL).

``self.emit(row, event_time_ms=None)`` inside a callback emits a row for the record
being handled (the coordinator and sink as with ``batch.emit``); the event time
defaults to the record's arrival time, which for a DynamoDB change is its creation time
(where a record has none, the change's ``ApproximateCreationDateTime`` is given).

A callback that raises is retried for that record alone (``handler_retries`` times,
with ``handler_backoff``, inside the batch's call and so within its
``execution_timeout``), the rows of a failed attempt dropped; after the last attempt
the record is given up (``batch.fail``: the server dead-letters it with its data and
the error) and the batch goes on. A record that cannot be decoded (not DynamoDB JSON,
an unknown ``eventName``) is given up at once. Either is logged as ``record_failed``.

The handler checkpoints everything done at most every ``checkpoint_interval``
(``checkpoint()`` at the end of a batch: held short of a failed record until it is
dead-lettered, and kept to what the sink committed when there is one), and on
``shutdown_requested`` and ``shard_ended`` as every handler does.

Callbacks may be ``async def`` (awaited) or plain ``def`` (called: cheaper for work
that never waits). Every attempt counts in the statistics ``on_update_success``,
``on_update_failure``, ``on_delete_success``, ``on_delete_failure``
(``mldserver_callbacks_total`` on ``/metrics``).
"""

from __future__ import annotations

import asyncio
import time
from operator import itemgetter
from typing import TYPE_CHECKING, Any

import orjson

from ..base.backoff import CallPolicy
from .dynamodb_json import decode_item
from .handler import Handler
from ..base.logs import get_logger
from .records import valid_event_time

if TYPE_CHECKING:
    from .checkpointer import Checkpointer
    from .records import Batch, Record

__all__ = ["ChangeHandler", "ChangeError", "Meta", "parse_change"]

UPDATE, DELETE = "on_update", "on_delete"
STATS = ("on_update_success", "on_update_failure", "on_delete_success", "on_delete_failure")
DYNAMODB, KINESIS = "dynamodb", "kinesis"
TTL_PRINCIPAL = "dynamodb.amazonaws.com"  # userIdentity of a deletion made by Time to Live
_SECONDS_BELOW = 100_000_000_000  # an ApproximateCreationDateTime under this is in seconds (the API's form)
_loads = orjson.loads
_JSONDecodeError = orjson.JSONDecodeError
_new = tuple.__new__
_log = get_logger("mldserver.handler")


class ChangeError(ValueError):
    """A record a change handler cannot make a change of: given up without a retry."""


class Meta(tuple):
    """What a callback knows of its record besides the document: ``meta.record`` and,
    for a DynamoDB change, ``meta.change`` (the Streams record, parsed JSON), read
    through the properties below. Keys and images are decoded on each access (keep
    what you use in a variable). Made at C speed, once a record."""

    __slots__ = ()

    def __new__(cls, record: Record, change: dict[str, Any] | None = None) -> "Meta":
        return _new(cls, (record, change))

    record = property(itemgetter(0), doc="The record (``mldserver.Record``).")
    change = property(itemgetter(1), doc="The DynamoDB Streams record (parsed JSON), None for Kinesis.")

    # -- every record --------------------------------------------------------------

    @property
    def source(self) -> str:
        """``"dynamodb"`` or ``"kinesis"``."""
        return KINESIS if self.change is None else DYNAMODB

    @property
    def partition_key(self) -> str | None:
        """The record's partition key (``meta.record.partition_key``)."""
        return self.record.partition_key

    @property
    def sequence_number(self) -> str:
        """The stream's sequence number (for a DynamoDB change, its ``SequenceNumber``)."""
        if self.change is not None:
            seq = self.change["dynamodb"].get("SequenceNumber")
            if type(seq) is str:
                return seq
        return self.record.sequence_number

    @property
    def sub_sequence_number(self) -> int | None:
        """The record's sub-sequence number (its index in a KPL aggregate, else 0)."""
        return self.record.sub_sequence_number

    @property
    def position(self) -> Any:
        """The record's :class:`~mldserver.base.positions.Position` (sequence and sub-sequence
        numbers, compared as integers)."""
        return self.record.position

    @property
    def arrival_time_ms(self) -> int | None:
        """The record's ``approximateArrivalTimestamp`` (epoch ms)."""
        return self.record.approximate_arrival_timestamp

    # -- a DynamoDB change (None or False for a Kinesis record) ------------------------

    @property
    def event_name(self) -> str | None:
        """``INSERT``, ``MODIFY`` or ``REMOVE``."""
        return None if self.change is None else self.change.get("eventName")

    @property
    def event_id(self) -> str | None:
        """The DynamoDB change's ``eventID`` (None for a Kinesis record)."""
        return None if self.change is None else self.change.get("eventID")

    @property
    def keys(self) -> dict[str, Any] | None:
        """The item's primary key attributes, decoded."""
        keys = None if self.change is None else self.change["dynamodb"].get("Keys")
        return decode_item(keys, "dynamodb.Keys") if keys else None

    @property
    def old(self) -> dict[str, Any] | None:
        """The item before the change, decoded, when the stream has old images
        (``OLD_IMAGE``, ``NEW_AND_OLD_IMAGES``); else None."""
        old = None if self.change is None else self.change["dynamodb"].get("OldImage")
        return decode_item(old, "dynamodb.OldImage") if old else None

    @property
    def creation_time_ms(self) -> int | None:
        """``ApproximateCreationDateTime`` as epoch ms (the adapter writes ms; seconds,
        the Streams API's own form, are converted), or None."""
        if self.change is None:
            return None
        t = self.change["dynamodb"].get("ApproximateCreationDateTime")
        if type(t) is int:
            ms = t * 1000 if t < _SECONDS_BELOW else t
        elif type(t) is float and t == t and abs(t) < 1e16:
            ms = int(t * 1000) if t < _SECONDS_BELOW else int(t)
        else:
            return None
        return ms if valid_event_time(ms) else None

    @property
    def expired(self) -> bool:
        """A deletion made by Time to Live (``userIdentity`` type ``Service``, principal
        ``dynamodb.amazonaws.com``)."""
        if self.change is None:
            return False
        who = self.change.get("userIdentity")
        if type(who) is not dict:
            return False
        kind = who.get("type", who.get("Type"))
        principal = who.get("principalId", who.get("PrincipalId"))
        return kind == "Service" and principal == TTL_PRINCIPAL

    @property
    def stream_view_type(self) -> str | None:
        """``NEW_AND_OLD_IMAGES``, ``NEW_IMAGE``, ``OLD_IMAGE`` or ``KEYS_ONLY`` (None for Kinesis)."""
        return None if self.change is None else self.change["dynamodb"].get("StreamViewType")

    @property
    def aws_region(self) -> str | None:
        """The table's region, ``"eu-west-1"`` (None for a Kinesis record)."""
        return None if self.change is None else self.change.get("awsRegion")

    def __repr__(self) -> str:
        if self.change is None:
            return (f"Meta(kinesis, sequence_number={self.sequence_number!r}, "
                    f"partition_key={self.partition_key!r})")
        return (f"Meta(dynamodb, {self.event_name}, sequence_number={self.sequence_number!r}, "
                f"keys={self.keys!r})")


def parse_change(record: Record, kinesis_doc: Any = None) -> tuple[str, Any, Meta]:
    """``(callback, doc, meta)`` for one record: ``"on_update"`` or ``"on_delete"``.
    ``ChangeError`` (or ``dynamodb_json.DynamoDBJSONError``) when it cannot be made one."""
    data = record.data
    try:
        obj = _loads(data)
    except _JSONDecodeError:
        return UPDATE, data if kinesis_doc is None else kinesis_doc(data), _new(Meta, (record, None))
    if type(obj) is dict and obj.get("eventSource") == "aws:dynamodb":
        ddb = obj.get("dynamodb")
        if type(ddb) is dict:
            name = obj.get("eventName")
            if name == "INSERT" or name == "MODIFY":
                image = ddb.get("NewImage")
                return UPDATE, decode_item(image, "dynamodb.NewImage") if image else None, _new(Meta, (record, obj))
            if name == "REMOVE":
                return DELETE, None, _new(Meta, (record, obj))
            raise ChangeError(f"eventName {name!r:.60}: a DynamoDB stream record's is INSERT, MODIFY or REMOVE")
    return UPDATE, obj if kinesis_doc is None else kinesis_doc(data), _new(Meta, (record, None))


_DEFAULTS: Any = None


def _settings(context: Any) -> Any:
    settings = getattr(context, "settings", None)
    if settings is None:
        global _DEFAULTS
        if _DEFAULTS is None:
            from ..base.config import Settings

            _DEFAULTS = Settings()
        settings = _DEFAULTS
    return settings


class ChangeHandler(Handler):
    """A handler with one callback per record: ``on_update(doc, meta)``,
    ``on_delete(meta)``; ``self.emit(row)`` inside them."""

    # The record being handled (set while a callback runs): class defaults, so that a
    # subclass's __init__ need not call ours.
    _batch: Batch | None = None
    _meta: Meta | None = None  # (its record is the one being handled)
    _checkpointed_at: float | None = None

    async def on_update(self, doc: Any, meta: Meta) -> None:
        """An item was inserted or modified (DynamoDB), or a Kinesis record arrived."""

    async def on_delete(self, meta: Meta) -> None:
        """An item was deleted (``meta.expired``: by Time to Live)."""

    def kinesis_doc(self, data: bytes) -> Any:
        """A Kinesis record's ``doc``; None: the default (orjson's JSON, else the bytes)."""
        return None

    def emit(self, row: dict[str, Any], event_time_ms: int | None = None) -> None:
        """Emit ``row`` for the record being handled (see ``Batch.emit``); the event
        time defaults to the record's arrival time, which for a DynamoDB change is its
        creation time (the KCL adapter and ``--source`` set it so; where a record has
        none, the change's ``ApproximateCreationDateTime`` is given)."""
        batch = self._batch
        if batch is None:
            raise RuntimeError(
                "self.emit(row) is for inside on_update/on_delete: the row belongs to the record being handled "
                "(in process_records of a Handler, use batch.emit(record, row))")
        rows = batch.rows
        if rows is None:
            batch.discarded()  # no sink: rows are not collected
            return
        meta = self._meta
        if event_time_ms is None and meta[1] is not None and meta[0].approximate_arrival_timestamp is None:  # type: ignore[index]
            # A DynamoDB change's record whose arrival time is not set: its creation time. Where it
            # is set (the KCL adapter and --source set it from the creation time) it stands in as
            # the stream's own clock, so a caught-up shard's watermark still follows the wall clock.
            event_time_ms = meta.creation_time_ms  # type: ignore[union-attr]
        rows.add(meta[0], row, event_time_ms)  # type: ignore[index]

    async def process_records(self, batch: Batch, checkpointer: Checkpointer) -> None:
        await self.dispatch(batch)
        interval = _settings(self.context).checkpoint_interval
        now = time.monotonic()
        if self._checkpointed_at is None or now - self._checkpointed_at >= interval:
            self._checkpointed_at = now
            await checkpointer.checkpoint()

    async def dispatch(self, batch: Batch) -> None:
        """Call ``on_update``/``on_delete`` once per record of ``batch``, in order, each
        record retried alone and given up with ``batch.fail`` (see the module)."""
        settings = _settings(self.context)
        policy = CallPolicy.from_settings(settings)
        retries, backoff = policy.retries, policy.backoff
        on_update, on_delete = self.on_update, self.on_delete
        kinesis_doc = None if type(self).kinesis_doc is ChangeHandler.kinesis_doc else self.kinesis_doc
        rows = batch.rows
        update_ok = update_failed = delete_ok = delete_failed = 0
        self._batch = batch
        try:
            for record in batch.records:
                attempt = 0
                while True:
                    try:
                        callback, doc, meta = parse_change(record, kinesis_doc)
                    except Exception as exc:  # (ChangeError, DynamoDBJSONError, bad base64, not an object...)
                        self._give_up(batch, record, exc, callback=None, attempts=1)
                        break
                    self._meta = meta
                    mark = len(rows) if rows is not None else 0
                    try:
                        if callback is UPDATE:
                            started = on_update(doc, meta)
                        else:
                            started = on_delete(meta)
                        if started is not None:
                            await started
                    except Exception as exc:
                        if callback is UPDATE:
                            update_failed += 1
                        else:
                            delete_failed += 1
                        if rows is not None:
                            rows.truncate(mark)  # no row of a failed attempt
                        attempt += 1
                        if attempt > retries:
                            self._give_up(batch, record, exc, callback=callback, attempts=attempt)
                            break
                        self._log().warning("record_retry", shard_id=batch.shard.shard_id, callback=callback,
                                            sequence_number=record.sequence_number,
                                            sub_sequence_number=record.sub_sequence_number,
                                            error=f"{type(exc).__name__}: {exc}", attempt=attempt,
                                            attempts=retries + 1)
                        await asyncio.sleep(backoff.delay(attempt - 1))
                        continue
                    if callback is UPDATE:
                        update_ok += 1
                    else:
                        delete_ok += 1
                    break
        finally:
            self._batch = self._meta = None
            stats = batch.stats
            if stats is None:
                stats = batch.stats = {}
            for name, n in zip(STATS, (update_ok, update_failed, delete_ok, delete_failed)):
                if n:
                    stats[name] = stats.get(name, 0) + n

    def _give_up(self, batch: Batch, record: Record, exc: BaseException, *, callback: str | None,
                 attempts: int) -> None:
        error = f"{type(exc).__name__}: {exc}"
        batch.fail(record, error, attempts)
        raw = getattr(record, "_raw", None)
        self._log().error(
            "record_failed",
            shard_id=batch.shard.shard_id,
            callback=callback,
            sequence_number=raw.get("sequenceNumber") if hasattr(raw, "get") else None,
            sub_sequence_number=raw.get("subSequenceNumber") if hasattr(raw, "get") else None,
            error=error,
            attempts=attempts,
            what_to_do="the record is dead-lettered with its data and this error; the batch goes on"
            if callback is not None else
            "not a change this handler can read: the record is dead-lettered with its data, not retried",
            exc_info=exc if callback is not None else None,
        )

    def _log(self) -> Any:
        return getattr(self.context, "log", None) or _log
