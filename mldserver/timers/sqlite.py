"""The embedded timer store: SQLite (the standard library's ``sqlite3``), in the state
dir (``timers/timers.db``) unless ``timer_store = "sqlite:PATH"``. One server owns it.

One table, keyed as a timer is named, with an index in firing order::

    CREATE TABLE timers (
        callback  TEXT    NOT NULL,   -- "handlers.orders:remind"
        reference TEXT    NOT NULL,   -- "order-7"
        due_ms    INTEGER NOT NULL,   -- 1763719260000
        context   BLOB    NOT NULL,   -- b'{"order":7}'
        version   INTEGER NOT NULL,   -- a replacement's is new: a firing finishes only its own
        attempts  INTEGER NOT NULL,   -- failed calls so far (retries survive a restart)
        PRIMARY KEY (callback, reference)
    ) WITHOUT ROWID;
    CREATE INDEX timers_due ON timers (due_ms, callback, reference);

The scheduler reads the next due timers through the index (``due``), a bounded slice
at a time, so a million pending timers cost disk, not memory. A call's creates and
cancels (``write``) run in order in one transaction: a batch's thousand creates are
one commit, and a create cancelled in the same call leaves nothing.

Durability: WAL journal, ``synchronous = FULL`` (the WAL is fsynced at each commit:
a timer survives a power cut, not only a crash). Commits are grouped: every write
asked for while one commit runs goes into the next transaction, so many shards
creating timers at once share one fsync (``Group``). All SQLite work runs on one
thread of its own; the event loop only waits for it.

The file is created at the first write: a server whose handlers never create a timer
leaves no database behind.
"""

from __future__ import annotations

import asyncio
import sqlite3
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Sequence

from .store import After, Op, Timer

SCHEMA = """
CREATE TABLE IF NOT EXISTS timers (
    callback  TEXT    NOT NULL,
    reference TEXT    NOT NULL,
    due_ms    INTEGER NOT NULL,
    context   BLOB    NOT NULL,
    version   INTEGER NOT NULL,
    attempts  INTEGER NOT NULL,
    PRIMARY KEY (callback, reference)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS timers_due ON timers (due_ms, callback, reference);
"""
_COLUMNS = "callback, reference, due_ms, context, version, attempts"
_INSERT = f"INSERT INTO timers ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING"
_UPDATE = "UPDATE timers SET due_ms = ?, context = ?, version = ?, attempts = ? WHERE callback = ? AND reference = ?"
_DELETE = "DELETE FROM timers WHERE callback = ? AND reference = ?"

GroupOp = Callable[[sqlite3.Connection], Any]


class Group:
    """Group commit: ``await group.run(op)`` runs ``op(connection)`` inside the next
    transaction, with every other op asked for meanwhile, and returns its result once
    that transaction is committed. An op that raises rolls back its own savepoint only;
    a commit that fails fails every op in it."""

    def __init__(self, executor: ThreadPoolExecutor, connection: Callable[[], sqlite3.Connection]) -> None:
        self.executor = executor
        self.connection = connection
        self._queue: list[tuple[GroupOp, asyncio.Future[Any]]] = []
        self._task: asyncio.Task[None] | None = None
        self.commits = 0  # transactions committed so far

    async def run(self, op: GroupOp) -> Any:
        future = asyncio.get_running_loop().create_future()
        self._queue.append((op, future))
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._drain(), name="timer-store-commit")
        return await future

    async def idle(self) -> None:
        """Wait until every op asked for is committed (or failed)."""
        while self._task is not None:
            await asyncio.shield(self._task)

    async def _drain(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while self._queue:
                batch, self._queue = self._queue, []
                try:
                    results = await loop.run_in_executor(self.executor, self._commit, [op for op, _ in batch])
                except BaseException as exc:  # noqa: BLE001  (each waiter gets it)
                    for _, future in batch:
                        if not future.done():
                            future.set_exception(exc if isinstance(exc, Exception) else RuntimeError(str(exc)))
                    if not isinstance(exc, Exception):
                        raise
                    continue
                self.commits += 1
                for (_, future), result in zip(batch, results):
                    if future.done():
                        continue
                    if isinstance(result, _Failed):
                        future.set_exception(result.exc)
                    else:
                        future.set_result(result)
        finally:
            self._task = None

    def _commit(self, ops: list[GroupOp]) -> list[Any]:
        conn = self.connection()
        results: list[Any] = []
        conn.execute("BEGIN IMMEDIATE")
        try:
            for op in ops:
                conn.execute("SAVEPOINT op")
                try:
                    results.append(op(conn))
                except sqlite3.DatabaseError as exc:
                    if _fatal(exc):
                        raise
                    conn.execute("ROLLBACK TO op")
                    results.append(_Failed(exc))
                conn.execute("RELEASE op")
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        return results


class _Failed:
    __slots__ = ("exc",)

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


def _fatal(exc: sqlite3.DatabaseError) -> bool:
    """A full disk, an I/O error: the whole transaction is lost, not one op."""
    return isinstance(exc, sqlite3.OperationalError)


class SqliteStore:
    shared = False

    def __init__(self, path: Path) -> None:
        self.path = path
        self.pending: int | None = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="timer-store")
        self._conn: sqlite3.Connection | None = None
        self.group = Group(self._executor, self._connection)

    def __repr__(self) -> str:
        return f"sqlite:{self.path}"

    # -- lifecycle (on the store's thread) ----------------------------------------------

    async def open(self) -> None:
        await self._run(self._open_existing)

    async def close(self) -> None:
        await self.group.idle()
        await self._run(self._close)
        self._executor.shutdown(wait=True)

    def _open_existing(self) -> None:
        if self.path.exists():
            self._connection()
        else:
            self.pending = 0

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            try:
                conn.execute("PRAGMA journal_mode = WAL")
                conn.execute("PRAGMA synchronous = FULL")
                conn.execute("PRAGMA busy_timeout = 5000")
                conn.executescript(SCHEMA)
                self.pending = conn.execute("SELECT COUNT(*) FROM timers").fetchone()[0]
            except BaseException:
                conn.close()
                raise
            self._conn = conn
        return self._conn

    def _close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    async def _run(self, fn: Callable[[], Any]) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn)

    # -- writes (grouped) --------------------------------------------------------------

    async def write(self, ops: Sequence[Op]) -> list[bool]:
        def op(conn: sqlite3.Connection) -> list[bool]:
            insert, update, delete = conn.cursor(), conn.cursor(), conn.cursor()
            found = []
            for o in ops:
                if isinstance(o, Timer):
                    row = (o.callback, o.reference, o.due_ms, o.context, o.version, o.attempts)
                    if insert.execute(_INSERT, row).rowcount:
                        self.pending = (self.pending or 0) + 1
                    else:  # a replacement: the pending count stays
                        update.execute(_UPDATE, row[2:] + row[:2])
                else:
                    n = delete.execute(_DELETE, o).rowcount
                    self.pending = (self.pending or 0) - n
                    found.append(n > 0)
            return found

        if not ops:
            return []
        if self._conn is None and not self.path.exists() and not any(isinstance(o, Timer) for o in ops):
            return [False] * len(ops)  # cancels only, and no file yet: none was there
        return await self.group.run(op)

    async def put(self, timers: Sequence[Timer]) -> None:
        await self.write(timers)

    async def delete(self, callback: str, reference: str) -> bool:
        return (await self.write([(callback, reference)]))[0]

    async def finish(self, done: Sequence[Timer], retry: Sequence[Timer], release: Sequence[Timer]) -> None:
        if not done and not retry:
            return  # released: nothing to hand back in a store of one server's own

        def op(conn: sqlite3.Connection) -> None:
            n = conn.executemany("DELETE FROM timers WHERE callback = ? AND reference = ? AND version = ?",
                                 [(t.callback, t.reference, t.version) for t in done]).rowcount
            self.pending = (self.pending or 0) - max(n, 0)
            conn.executemany("UPDATE timers SET due_ms = ?, attempts = ? WHERE callback = ? AND reference = ? "
                             "AND version = ?", [(t.due_ms, t.attempts, t.callback, t.reference, t.version)
                                                 for t in retry])

        await self.group.run(op)

    # -- reads ---------------------------------------------------------------------------

    async def due(self, until_ms: int, limit: int, after: After = None) -> list[Timer]:
        def read() -> list[Timer]:
            if self._conn is None and not self.path.exists():
                return []
            conn = self._connection()
            if after is None:
                where, args = "due_ms <= ?", (until_ms,)
            elif isinstance(after, int):
                where, args = "due_ms > ? AND due_ms <= ?", (after, until_ms)
            else:
                where, args = "(due_ms, callback, reference) > (?, ?, ?) AND due_ms <= ?", (*after, until_ms)
            rows = conn.execute(f"SELECT {_COLUMNS} FROM timers WHERE {where} "
                                f"ORDER BY due_ms, callback, reference LIMIT ?", (*args, limit)).fetchall()
            return [Timer(*row) for row in rows]

        return await self._run(read)

    async def claim(self, timers: Sequence[Timer], now_ms: int) -> list[Timer]:
        return list(timers)  # this server's own: nobody else fires them
