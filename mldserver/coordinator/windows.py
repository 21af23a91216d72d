"""Event-time windows: tumbling, aligned to the epoch, and what one hand-off holds.

A window is [start, end) in epoch milliseconds; its id names it in the sink::

    start = t - t % 60_000        # the window of event time t, for 60 s windows
    Window(start, start + 60_000, rows=[b'{"k":1}', ...], late=2, positions={...})
    window.id == "1700000100000-1700000160000"

``rows`` are the window's rows in merged order, each a JSON object as bytes (what the
handler passed to ``batch.emit``). The first ``late`` of them are late: rows older
than a window already closed, handed over with the next window instead of dropped
(they sort first: their event time is before this window's start). ``positions``
maps each shard to the highest (sequence number, sub-sequence number) this window
covers: the commit log of a sink records it.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class Window:
    start: int
    end: int
    rows: list[bytes] = field(default_factory=list, repr=False)
    late: int = 0
    positions: dict[str, tuple[str, int]] = field(default_factory=dict, repr=False)

    @property
    def id(self) -> str:
        return f"{self.start}-{self.end}"

    def __len__(self) -> int:
        return len(self.rows)
