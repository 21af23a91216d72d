"""Windows: which event-time window a time falls in. Pure arithmetic, no state.

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
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Tumbling:
    size: int  # ms

    def start(self, t: float) -> int:
        """The start of the window holding ``t``."""
        return int(t - t % self.size)

    def end(self, t: float) -> int:
        """The end of the window holding ``t`` (the next window's start)."""
        return self.start(t) + self.size
