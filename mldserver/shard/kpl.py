"""KPL aggregate decoding, exactly as the KCL's AggregatorUtil does it.

KCL 2.x/3.x daemons de-aggregate before sending; a KCL 1.x (v1) daemon may deliver a
Kinesis record that is still a KPL aggregate::

    F3 89 9A C2 | protobuf AggregatedRecord | MD5(protobuf bytes) (16 bytes)

    message AggregatedRecord { repeated string partition_key_table = 1;
                               repeated string explicit_hash_key_table = 2;
                               repeated Record records = 3; }
    message Record { required uint64 partition_key_index = 1;
                     optional uint64 explicit_hash_key_index = 2;
                     required bytes data = 3; repeated Tag tags = 4; }
    message Tag { required string key = 1; optional string value = 2; }

``deaggregate(data, partition_key)`` returns ``UserRecords``. A blob that does not
start with the magic, is too short (16 bytes or fewer after the magic), fails the MD5
check or is not a valid protobuf message is an ordinary record (``aggregated`` false,
one user record, unchanged). User record ``k`` has sub-sequence ``k``. Like the KCL,
a bad table index stops the expansion and keeps what came before it (``error`` says
why, so the caller can dead-letter the original); with a shard hash range, one user
record outside it drops the whole aggregate. ``tests/data/kpl-vectors.json`` holds the
vectors this is tested against.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

MAGIC = b"\xf3\x89\x9a\xc2"
_DIGEST = 16


@dataclass(frozen=True, slots=True)
class UserRecord:
    sub_sequence_number: int
    partition_key: str | None
    explicit_hash_key: str | None
    data: bytes
    aggregated: bool

    @property
    def effective_hash_key(self) -> int:
        if self.explicit_hash_key is not None:
            return int(self.explicit_hash_key)
        return int.from_bytes(hashlib.md5((self.partition_key or "").encode("utf-8")).digest(), "big")


@dataclass(frozen=True, slots=True)
class UserRecords:
    records: list[UserRecord]
    aggregated: bool
    error: str | None = None


@dataclass
class _Aggregate:
    partition_keys: list[str] = field(default_factory=list)
    hash_keys: list[str] = field(default_factory=list)
    records: list[tuple[int, int | None, bytes]] = field(default_factory=list)


class _Invalid(Exception):
    pass


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(buf) or shift > 63:
            raise _Invalid("truncated or over-long varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result & 0xFFFFFFFFFFFFFFFF, pos
        shift += 7


def _fields(buf: bytes):
    """Yield (field number, wire type, value) of a protobuf message; value is int or bytes."""
    pos = 0
    while pos < len(buf):
        key, pos = _varint(buf, pos)
        number, wire = key >> 3, key & 7
        if number == 0:
            raise _Invalid("field number 0")
        if wire == 0:
            value, pos = _varint(buf, pos)
        elif wire == 1:
            value, pos = int.from_bytes(buf[pos : pos + 8], "little"), pos + 8
        elif wire == 5:
            value, pos = int.from_bytes(buf[pos : pos + 4], "little"), pos + 4
        elif wire == 2:
            size, pos = _varint(buf, pos)
            value, pos = buf[pos : pos + size], pos + size
        else:
            raise _Invalid(f"unsupported wire type {wire}")
        if pos > len(buf):
            raise _Invalid("truncated field")
        yield number, wire, value


def _text(value: bytes) -> str:
    return value.decode("utf-8", "replace")


def _parse(body: bytes) -> _Aggregate:
    agg = _Aggregate()
    for number, wire, value in _fields(body):
        if wire != 2:
            continue  # a known number with another wire type is an unknown field
        if number == 1:
            agg.partition_keys.append(_text(value))
        elif number == 2:
            agg.hash_keys.append(_text(value))
        elif number == 3:
            agg.records.append(_parse_record(value))
    return agg


def _parse_record(buf: bytes) -> tuple[int, int | None, bytes]:
    pk_index: int | None = None
    hk_index: int | None = None
    data: bytes | None = None
    for number, wire, value in _fields(buf):
        if number == 1 and wire == 0:
            pk_index = value
        elif number == 2 and wire == 0:
            hk_index = value
        elif number == 3 and wire == 2:
            data = bytes(value)
        elif number == 4 and wire == 2:
            if not any(n == 1 and w == 2 for n, w, _ in _fields(value)):
                raise _Invalid("tag without its required key")
    if pk_index is None or data is None:
        raise _Invalid("record without its required partition_key_index or data")
    return pk_index, hk_index, data


def _raw(data: bytes, partition_key: str | None, explicit_hash_key: str | None) -> UserRecords:
    return UserRecords([UserRecord(0, partition_key, explicit_hash_key, data, False)], aggregated=False)


def is_aggregate(data: bytes) -> bool:
    """Cheap check: starts with the magic and has room for a digest."""
    return len(data) > len(MAGIC) + _DIGEST and data[:4] == MAGIC


def deaggregate(
    data: bytes,
    partition_key: str | None = None,
    explicit_hash_key: str | None = None,
    hash_range: tuple[int, int] | None = None,
) -> UserRecords:
    if not is_aggregate(data):
        return _raw(data, partition_key, explicit_hash_key)
    body, digest = data[4:-_DIGEST], data[-_DIGEST:]
    if hashlib.md5(body).digest() != digest:
        return _raw(data, partition_key, explicit_hash_key)
    try:
        agg = _parse(body)
    except _Invalid:
        return _raw(data, partition_key, explicit_hash_key)
    users: list[UserRecord] = []
    for sub, (pk_index, hk_index, payload) in enumerate(agg.records):
        try:
            pk = agg.partition_keys[pk_index]
            hk = agg.hash_keys[hk_index] if hk_index is not None else None
        except IndexError:
            error = f"user record {sub} refers to a missing table entry; later user records were not expanded"
            return UserRecords(users, aggregated=True, error=error)
        user = UserRecord(sub, pk, hk, payload, True)
        if hash_range is not None and not hash_range[0] <= user.effective_hash_key <= hash_range[1]:
            return UserRecords(
                [], aggregated=True, error=f"user record {sub} hashes outside the shard: aggregate dropped"
            )
        users.append(user)
    return UserRecords(users, aggregated=True)
