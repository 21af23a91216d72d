"""Amends: tumbling windows kept open to late rows for ``allowed_lateness`` after they
close. Pure: no I/O, no clock, no asyncio.

A window is handed over once the watermark passes its end, as always, and then kept:
a row that comes later for it, while the watermark is still before its end plus the
allowed lateness, amends it (``take``): the window is handed over again, all its rows
with the new ones, and the sink replaces what it wrote (``Window.version``: 1, 2, ...).
Once the watermark passes its end plus the allowed lateness the window is final: its
rows are what a handover commits (``WindowRows.commits``, the last handover of that
step, so the window's last version is written before its shards checkpoint past it),
and a row for it is late for good (``late_policy``)::

    amends = Amends(size=60_000, lateness=120_000)
    amends.assemble(ordering.close(until=60_000), until=60_000)
    # [WindowRows(0, 60000, version=1)]: handed over, kept
    amends.take("s1", late_rows)            # a row at 30_000: it amends [0, 60_000)
    amends.assemble([], until=70_000)       # [WindowRows(0, 60000, version=2)]
    amends.assemble(closed, until=180_000)  # ... the last of them commits [0, 60_000)

Until a window is final its rows are not committed, so after a restart they are read
again and the window is handed over again, whole: the sink replaces it (the same rows,
or more), so it is written once. ``final_until`` (the end of the last final window,
in each handover that commits, and in the commit log) is where a restart resumes: rows
for a window before it are late. A window with rows of a shard whose lease went
elsewhere is handed over again without them (``drop``): its new owner commits them.
Windows made final while no window is handed over commit with the next handover.
``ordering`` passes a watermark no further than the largest event time delivered, so a
stream gone quiet (every shard idle: the watermark past everything) makes no window
final; new rows do.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from .windows import Tumbling, WindowRows

if TYPE_CHECKING:
    from ..rows.batch import RowBatch


class Amends:
    def __init__(self, size: int, lateness: int, keep_late: bool = True) -> None:
        self.window = Tumbling(size)
        self.lateness = lateness
        # late rows (late for good, ``late_policy``): in every version ("next"), or handed
        # over once, to be left out and counted there, and committed with the window
        self.keep_late = keep_late
        self.spent: dict[int, dict[str, list[RowBatch]]] = {}  # start -> late rows handed over once
        self.kept: dict[int, WindowRows] = {}  # start -> a window handed over, not final yet
        self.versions: dict[int, tuple[int, int]] = {}  # start -> its last version handed over, its rows
        self.amended: set[int] = set()  # starts of windows to hand over (again) at the next step
        self.final_until = -math.inf  # windows ending at or before this are final
        self.commits: dict[str, list[RowBatch]] = {}  # rows of final windows, for the next handover
        self.amended_rows = 0

    def resume(self, final_until: int | None) -> int | None:
        """After a restart: windows up to ``final_until`` are final (rows for them are
        late); the others are read again and handed over again, whole. Returns where
        ordering's closed windows end (``final_until``)."""
        if final_until is not None:
            self.final_until = max(self.final_until, final_until)
        return None if self.final_until == -math.inf else int(self.final_until)

    def take(self, shard_id: str, rows: RowBatch) -> RowBatch:
        """Rows older than the windows closed (their times sorted): those whose window
        is not final amend it; returns the others, late for good."""
        import numpy as np

        times = rows.times
        first = int(np.searchsorted(times, self.final_until)) if self.final_until != -math.inf else 0
        i = first
        while i < len(rows):
            start = self.window.start(int(times[i]))
            j = int(np.searchsorted(times, start + self.window.size))
            window = self.kept.get(start)
            if window is None:  # a window that closed with no rows: it is made now
                window = self.kept[start] = WindowRows(start, start + self.window.size)
            window.parts.setdefault(shard_id, []).append(rows[i:j])
            self.amended.add(start)
            self.amended_rows += j - i
            i = j
        return rows[:first]

    def drop(self, shard_id: str) -> int:
        """A shard whose lease went elsewhere: its rows leave the windows kept, which are
        handed over again without them. Returns how many."""
        dropped = sum(map(len, self.commits.pop(shard_id, [])))  # final, waiting for a handover: the ledger
        for start, window in self.kept.items():                  # let them go too
            rows = [*window.parts.pop(shard_id, []), *window.late.pop(shard_id, []),
                    *self.spent.get(start, {}).pop(shard_id, [])]
            if rows:
                dropped += sum(map(len, rows))
                window.late_rows = sum(len(r) for parts in window.late.values() for r in parts)
                self.amended.add(start)
        return dropped

    def assemble(self, closed: list[WindowRows], until: float) -> list[WindowRows]:
        """The windows closed now and those amended, each handed over (a copy: the
        window is kept); the last of them commits the windows the watermark ``until``
        made final."""
        for window in closed:
            self.kept[window.start] = window
            self.amended.add(window.start)
        final = [start for start in sorted(self.kept) if self.kept[start].end + self.lateness <= until]
        out = [self._version(start) for start in sorted(self.amended)]
        self.amended.clear()
        for start in final:
            window = self.kept.pop(start)
            self.versions.pop(start, None)
            for group in (window.late, self.spent.pop(start, {}), window.parts):
                for shard_id, rows in group.items():
                    self.commits.setdefault(shard_id, []).extend(rows)
            self.final_until = max(self.final_until, window.end)
        if out and (self.commits or final):
            out[-1].commits, self.commits = self.commits, {}
            out[-1].final_until = int(self.final_until)
        return out

    def _version(self, start: int) -> WindowRows:
        window = self.kept[start]
        version, again = self.versions.get(start, (0, 0))
        handed = WindowRows(window.start, window.end, {s: list(rows) for s, rows in window.parts.items()},
                            window.late_rows, {s: list(rows) for s, rows in window.late.items()}, commits={},
                            version=version + 1, again=again)
        self.versions[start] = (version + 1, len(window))
        if not self.keep_late and window.late:  # left out of this version: never handed over again
            spent = self.spent.setdefault(start, {})
            for shard_id, rows in window.late.items():
                spent.setdefault(shard_id, []).extend(rows)
            window.late, window.late_rows = {}, 0
        return handed
