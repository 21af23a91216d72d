"""Panes: hopping windows made of the tumbling panes ``ordering`` closes. Pure: no
I/O, no clock, no asyncio.

A hopping window is ``size`` long and a new one starts every ``slide`` (``size`` a
multiple of it), aligned to multiples of ``slide`` from the epoch, so each row is in
``size / slide`` windows. ``ordering`` queues and cuts rows in panes a slide long (its
tumbling windows); a pane closed is kept here until the last window holding it has
closed, and a window is handed over once the watermark passes its end, made of the
panes it spans (their rows are shared, never copied)::

    panes = Panes(size=60_000, slide=20_000)   # a minute's windows, every 20 s
    panes.assemble(ordering.close(until=40_000), until=40_000)
    # [WindowRows(-20000, 40000, kind="hopping"), ...]: the windows ending at 20_000 and
    # 40_000 that hold rows; the panes [0, 20_000) and [20_000, 40_000) are kept
    panes.assemble(ordering.close(until=60_000), until=60_000)
    # [WindowRows(0, 60000)]: the three panes; it commits the pane [0, 20_000)

A window commits only its oldest pane (``WindowRows.commits``): that pane's rows are in
no window still to come, so the ledger lets its shards checkpoint past them and the
commit log records their positions, not those of the newer panes, whose rows the
windows to come still need (after a restart they are read again: ``resume``). Late
rows that came with a pane go in the one window that commits it, where they are older
than its start, so they sort first as a late row does.
"""

from __future__ import annotations

import math
from collections import deque

from .windows import WindowRows


class Panes:
    def __init__(self, size: int, slide: int) -> None:
        assert size % slide == 0 and size > slide, (size, slide)
        self.size = size
        self.slide = slide
        self.kept: deque[WindowRows] = deque()  # closed panes, in order, each still in a window to come
        self.emitted_until = -math.inf  # the end of the last window handed over

    def resume(self, committed_end: int) -> int:
        """The last window committed before a restart ended at ``committed_end``: the
        windows up to it are not handed over again. Returns where the panes committed
        end: rows after it are read again, for the windows to come."""
        self.emitted_until = max(self.emitted_until, committed_end)
        return committed_end - self.size + self.slide

    def drop(self, shard_id: str) -> int:
        """A shard whose lease went elsewhere: its rows leave the panes kept (the new
        owner reads them again). Returns how many."""
        dropped = 0
        for pane in self.kept:
            for group in (pane.parts, pane.late):
                dropped += sum(map(len, group.pop(shard_id, [])))
            pane.late_rows = sum(map(len, (r for rows in pane.late.values() for r in rows)))
        return dropped

    def assemble(self, closed: list[WindowRows], until: float) -> list[WindowRows]:
        """The windows whose end the watermark ``until`` has passed and that hold rows,
        in order, from the panes closed so far (``closed``: the newest)."""
        self.kept.extend(closed)
        windows = []
        while self.kept:
            end = int(max(self.emitted_until + self.slide, self.kept[0].start + self.slide))
            if end > until:
                break
            start = end - self.size
            window = WindowRows(start, end, kind="hopping", commits={})
            assert window.commits is not None
            leaving = 0
            for pane in self.kept:
                if pane.start >= end:
                    break
                for shard_id, rows in pane.parts.items():
                    window.parts.setdefault(shard_id, []).extend(rows)
                if pane.start + self.size <= end:  # this is its last window: it commits here
                    leaving += 1
                    window.late_rows += pane.late_rows
                    for group in (pane.late, pane.parts):
                        for shard_id, rows in group.items():
                            window.commits.setdefault(shard_id, []).extend(rows)
                    for shard_id, rows in pane.late.items():
                        window.late.setdefault(shard_id, []).extend(rows)
            for _ in range(leaving):
                self.kept.popleft()
            self.emitted_until = end
            windows.append(window)
        return windows
