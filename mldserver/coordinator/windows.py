"""Windows: which event-time window a time falls in (pure arithmetic, no state), and
what a closed window holds (``WindowRows``).

Windows are tumbling: [start, end) in epoch milliseconds, ``size`` long, back to back
and aligned to the epoch, so every server cuts the same windows and a window's id
(``start-end``, ``handoff.Window.id``) names the same rows wherever it is committed::

    minute = Tumbling(60_000)
    minute.start(61_500)          # 60_000: the window of event time 61.5 s starts here
    minute.end(61_500)            # 120_000: and ends here (not in it)
    minute.end(120_000)           # 180_000: an end belongs to the next window
    minute.start(-1)              # -60_000: before the epoch too, floored

``ordering`` asks it where a shard's queue is cut (``close``), which rows are late (a
row before ``start(closed_until)`` is in a window already closed) and how many windows
hold rows (``buffered_windows``). Times may be int or float (a watermark); the answer
is an int.

``WindowRows`` is what a closed window holds as ``ordering`` (and, for hopping windows,
``panes``; for session windows, ``sessions``) hands it over: each shard's rows, its late
rows apart, and what it commits.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

    from ..rows.batch import RowBatch
    from ..base.positions import Position


@dataclass(frozen=True, slots=True)
class Tumbling:
    size: int  # ms

    def start(self, t: float) -> int:
        """The start of the window holding ``t``."""
        return int(t - t % self.size)

    def end(self, t: float) -> int:
        """The end of the window holding ``t`` (the next window's start)."""
        return self.start(t) + self.size


@dataclass(slots=True)
class WindowRows:
    """A closed window's rows as ordering cut them: each shard's, in its order, and the
    late rows it carries apart (``merge.seal`` puts them first, each shard's before its
    others, and makes the :class:`~mldserver.base.handoff.Window` a sink gets). A
    hopping window (``panes``) commits only some of its rows, those of its oldest pane:
    ``commits``, each shard's (None: all of them)."""

    start: int
    end: int
    parts: dict[str, list[RowBatch]] = field(default_factory=dict, repr=False)  # shard -> its rows
    late_rows: int = 0  # the first ``late_rows`` rows in merged order are late
    late: dict[str, list[RowBatch]] = field(default_factory=dict, repr=False)  # shard -> its late rows
    # into a table with allowed_lateness: late rows within it, for the windows they amend (after the
    # late rows, before the others: ``Window.amends``)
    amending: dict[str, list[RowBatch]] = field(default_factory=dict, repr=False)
    commits: dict[str, list[RowBatch]] | None = field(default=None, repr=False)
    kind: str = "tumbling"
    sessions: SessionRows | None = field(default=None, repr=False)  # session windows: the rows, in sessions
    version: int = 0  # with allowed_lateness: 1, then 2, ... each time it is handed over (``amends``)
    again: int = 0  # ... of its rows, those an earlier version had
    final_until: int | None = None  # with allowed_lateness: windows ending by then are final
    # with max_out_of_orderness: per shard, a position at or below which every row is in this
    # window or an earlier one (the rows above it it hands over are told by ``output``)
    below: dict[str, Position] | None = field(default=None, repr=False)

    def __len__(self) -> int:
        held = sum(len(part) for group in (self.late, self.amending, self.parts) for parts in group.values()
                   for part in parts)
        return held + (0 if self.sessions is None else self.sessions.rows())

    def drop_late(self) -> list[RowBatch]:
        """Its late rows left out (``late_policy`` ``drop`` or ``dead-letter``), still
        committed: returns them."""
        if self.sessions is not None:
            dropped = self.sessions.drop_late()
        else:
            dropped = [part for parts in self.late.values() for part in parts]
            if dropped and self.commits is None:  # all it holds, its late rows too
                self.commits = {s: self.parts.get(s, []) + self.late.get(s, []) + self.amending.get(s, [])
                                for s in {*self.parts, *self.late, *self.amending}}
            self.late = {}
        self.late_rows = 0
        return dropped


@dataclass(slots=True)
class SessionRows:
    """The rows of the sessions handed over together (``sessions.Sessions``), copied
    out of their panes: per part, its shard, its rows, and each row's session (an index
    into ``spans``, each session's start, end and whether it is late; late ones first)."""

    parts: list[tuple[str, RowBatch, np.ndarray]]
    spans: list[tuple[int, int, bool]]

    def rows(self) -> int:
        return sum(len(rows) for _, rows, _ in self.parts)

    def late_rows(self) -> int:
        late = [i for i, (_, _, is_late) in enumerate(self.spans) if is_late]
        if not late:
            return 0
        import numpy as np

        return sum(int(np.isin(ranks, late).sum()) for _, _, ranks in self.parts)

    def drop_late(self) -> list[RowBatch]:
        """The late sessions' rows out; returns them."""
        import numpy as np

        late = [i for i, (_, _, is_late) in enumerate(self.spans) if is_late]
        if not late:
            return []
        dropped, kept = [], []
        for shard, rows, ranks in self.parts:
            mask = np.isin(ranks, late)
            if mask.any():
                dropped.append(rows.take(np.flatnonzero(mask)))
            if not mask.all():
                kept.append((shard, rows.take(np.flatnonzero(~mask)), ranks[~mask]))
        self.parts = kept
        return dropped
