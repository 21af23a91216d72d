"""A ``processRecords`` line read lazily: what the conversation needs, without a
Python object per record.

With handler processes the server never looks inside most records: the line goes
to the handler process as it arrived, and the server needs the action, the batch's
size, ``millisBehindLatest`` and the last record's position (what ``checkpoint()``
with no argument stores). The line is checked whole in C (JSON and UTF-8), and
Python objects are made only for what is asked::

    line = b'{"action":"processRecords","records":[{"data":"bWVvdw==",' \\
           b'"sequenceNumber":"7","subSequenceNumber":0}],"millisBehindLatest":5}\\n'
    records = LazyRecords.parse(line)          # None: not a line this reads (see below)
    records.millis_behind_latest == 5
    len(records) == 1; records.last() == {"data": "bWVvdw==", "sequenceNumber": "7", ...}
    records.column("sequenceNumber") == ["7"]  # one field of every record (None where absent)
    records.sequence_numbers() == ("7", 1, None, b"...")  # every sequence number, one native
                                                # pass (and each arrival time: n int64, -1: none)
    LazyRecords.parse(line, positions=True)     # the same, read by the check's own pass
    records.obj(0).get("data") == "bWVvdw=="   # one record, still lazy (a Mapping-like view)
    records[0]                                  # a dict: the first such use parses the line
                                                # whole with orjson, as the eager path does

``parse`` returns None for a line it does not read (invalid JSON or UTF-8, an integer
beyond 64 bits, ``records`` not an array): the eager decoder then reads it, with its
own tolerance (invalid UTF-8 replaced) and its own error messages, so both paths
accept and refuse the same lines. A record that is not a JSON object is ``None`` in
``column`` and in ``obj``.

The server's ``parse`` checks the line natively (``_check.h``, one pass: the line
accepted, its size, where its last record is, ``millisBehindLatest``) and parses only
the last record, with orjson; pysimdjson reads a line the check leaves to it (a byte
past ASCII, a ``\\u`` escape, a number that is not a plain integer: ``_check.h``
lists them) and ``parse(keep=True)``'s. A 1.5 MB line of 1,000 x 1 KiB is checked in 0.10
ms, where pysimdjson took 0.22 (it copies the line, then builds its structure).

The parsed line (some 2.4 times the line's size) is never kept by the server: it holds
every line waiting for a handler process, and reads its positions from the bytes
(``sequence_numbers``). ``obj``, ``objects`` and
``column`` parse it again, once, and keep it, until ``release``; so does
``parse(keep=True)``, for a handler process whose handler reads the records. Parsers are
reused (``POOLED_PARSERS`` of them), each only once nothing refers to its previous
document: a document stays valid as long as anything refers to it.
"""

from __future__ import annotations

import threading
from typing import Any, Iterator, Sequence

import orjson
import simdjson

from ..native import load_native

# The native scan of a line's sequence numbers (setup.py builds it); None without a C
# compiler, or with MLDSERVER_NO_EXTENSIONS set: ``columns`` serve.
_scan = load_native("mldserver.protocol._scan")
_sequence_numbers = _scan.sequence_numbers if _scan is not None else None
_head = _scan.head if _scan is not None else None  # the line checked (_check.h), else pysimdjson
_UNREAD = object()  # LazyRecords._scanned: the check did not read the positions


class LazyRecords(Sequence[Any]):
    __slots__ = ("line", "millis_behind_latest", "_n", "_last", "_array", "_list", "_scanned")

    def __init__(self, line: bytes, n: int, last: Any, millis_behind_latest: int | None) -> None:
        self.line = line
        self.millis_behind_latest = millis_behind_latest
        self._n = n
        self._last = last
        # The parsed line (larger than the line) is not kept: read again if asked.
        self._array: Any = None
        self._list: list[Any] | None = None
        self._scanned: Any = _UNREAD  # what ``sequence_numbers`` says, when the check read it

    @classmethod
    def parse(cls, line: bytes, keep: bool = False, positions: bool = False) -> LazyRecords | None:
        """The line's records, or None: the eager decoder reads it. ``keep``: the
        parsed line is kept (the records will be read). ``positions``: every record's
        position will be read (a sink is downstream): the native check reads them in its
        own pass over the line, for ``sequence_numbers`` (a second pass cost the server
        a tenth of its time with a sink)."""
        if not keep and _head is not None:
            head = _head(line, positions)
            if head is not None:  # checked natively: the last record alone is parsed
                n, start, end, mbl = head[:4]
                records = cls(line, n, orjson.loads(memoryview(line)[start:end]) if n else None, mbl)
                if positions:
                    records._scanned = head[4]
                return records
        try:
            document = _parse(line)
        except (ValueError, RuntimeError):  # UnicodeDecodeError is a ValueError
            return None
        if not isinstance(document, simdjson.Object):
            return None
        keys = list(document.keys())
        if len(keys) != len(set(keys)):  # a key twice: orjson keeps the last, simdjson the first
            return None
        array = document.get("records")
        if not isinstance(array, simdjson.Array) or document.get("action") != "processRecords":
            return None
        mbl = document.get("millisBehindLatest")
        if mbl is not None and type(mbl) is not int:  # the eager decoder says what is wrong
            return None
        n = len(array)
        records = cls(line, n, _plain(array[n - 1]) if n else None, mbl)
        if keep:
            records._array = array
        return records

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i: Any) -> Any:
        return self.records()[i]

    def __iter__(self) -> Iterator[Any]:
        return iter(self.records())

    def records(self) -> list[Any]:
        """Every record as a dict (or what the daemon sent in its place)."""
        if self._list is None:
            try:
                self._list = orjson.loads(self.line)["records"]
            except orjson.JSONDecodeError:  # pragma: no cover  (simdjson read it: so does orjson)
                self._list = orjson.loads(self.line.decode("utf-8", "replace"))["records"]
        return self._list

    def last(self) -> Any:
        """The last record as a dict (or what the daemon sent in its place)."""
        return self._last

    def _records(self) -> Any:
        if self._array is None:
            self._array = _parse(self.line)["records"]
        return self._array

    def release(self) -> None:
        """Let the parsed line go (kept by ``parse(keep=True)``); read again if asked."""
        self._array = None

    def objects(self) -> Iterator[Any]:
        """Every record as a lazy mapping (or what the daemon sent in its place)."""
        return iter(self._records())

    def obj(self, i: int) -> Any:
        """Record ``i`` as a lazy mapping (``get``, ``[]``), or None if not an object."""
        value = self._records()[i]
        return value if isinstance(value, simdjson.Object) else None

    def column(self, key: str) -> list[Any]:
        """``key`` of every record (None where absent, or where a record is not an object)."""
        return self.columns(key)[0]

    def sequence_numbers(self) -> tuple[str, int, bytes | None, bytes] | None:
        """Every record's ``sequenceNumber`` in one native pass over the line
        (``_scan.c``, no Python object per record): the numbers joined, how many,
        where each ends when their widths differ (n + 1 native int64s), and each
        record's ``approximateArrivalTimestamp`` (n native int64s: ``NO_TIME`` where
        absent or null, ``ODD_TIME`` where not a plain integer); None when the
        batch is not the usual one (a record that is not an object with one
        ``sequenceNumber`` of ASCII digits and a ``subSequenceNumber`` absent, null or 0;
        a key written with an escape) or the package was built without a C compiler:
        read ``columns`` then, which says what is there."""
        scanned, self._scanned = self._scanned, _UNREAD  # (read once: not held with the line)
        if scanned is not _UNREAD:
            return scanned
        if _sequence_numbers is None:  # pragma: no cover  (not built, or MLDSERVER_NO_EXTENSIONS set)
            return None
        return _sequence_numbers(self.line)

    def columns(self, *keys: str) -> list[list[Any]]:
        """Several keys' columns, the records read once (some 0.2 us a value)."""
        Object = simdjson.Object
        objects = [r if isinstance(r, Object) else None for r in self._records()]
        return [[None if r is None else r.get(key) for r in objects] for key in keys]


# Parsers kept for reuse: a parser's buffers (some 8 MiB for a 3 MB line) are
# allocated at its first parse, and allocating them again for every line (their pages
# fresh from mmap: ``pool/malloc.py``) cost 6 ms a line against 1 ms for the parse itself.
# A parser is reused only when nothing refers to its last document any more (pysimdjson
# refuses otherwise); a line that finds none free gets a parser of its own, not kept.
POOLED_PARSERS = 4
_IN_USE = "re-use a parser"  # pysimdjson's RuntimeError for a parser whose document lives on
_local = threading.local()  # each thread its own parsers: a parser is never shared across threads


def _parse(line: bytes) -> Any:
    parsers = getattr(_local, "parsers", None)
    if parsers is None:
        parsers = _local.parsers = []
    for parser in parsers:
        try:
            return parser.parse(line)
        except RuntimeError as exc:
            if _IN_USE not in str(exc):
                raise
    parser = simdjson.Parser()
    if len(parsers) < POOLED_PARSERS:
        parsers.append(parser)
    return parser.parse(line)


def _plain(value: Any) -> Any:
    if isinstance(value, simdjson.Object):
        return value.as_dict()
    if isinstance(value, simdjson.Array):
        return value.as_list()
    return value
