"""Which shard leases a server takes or steals this cycle: the rule the KCL's lease
taker follows, as one pure function (no I/O, no clock) over what a cycle saw::

    plan({"s0": "a", "s1": "a", "s2": "a", "s3": "a"}, me="b", expired=set())
    # Plan(take=(), steal=("s0",)): a holds 4, the target is ceil(4 shards / 2 servers) = 2,
    # so b steals one from a (one a cycle: ``max_steal``)

- ``leases``: each shard that may be read now (listed, not read to its end, its parents
  read to their ends) and who holds its lease (None: free, released or never held);
- the live servers are the owners of leases that are not ``expired`` (a counter that has
  not moved for a lease period), and ``me``, which may hold none yet;
- the target is ``ceil(shards / live servers)``; a server under it takes free and
  expired leases up to it (free first, then expired, each in shard id order); with none
  to take, it steals from the server that holds the most, when that one is over the
  target, or at it while this server needs two or more (so 4 shards over 3 servers
  settle at 2, 1, 1 and do not go round); at most ``max_steal`` a cycle, the holder's
  highest shard ids first (a server that just started takes the far end);
- a server at or over its target takes nothing: one over it gives leases up only as
  others steal them, one a cycle each, so a fleet settles without a shard moving twice.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Mapping, NamedTuple


class Plan(NamedTuple):
    take: tuple[str, ...]  # free or expired leases to take
    steal: tuple[str, ...]  # leases a live server holds, to take from it


def plan(leases: Mapping[str, str | None], me: str, expired: set[str], *, max_steal: int = 1) -> Plan:
    """The leases ``me`` should take and steal now (see the module's docstring)."""
    live = {owner for shard, owner in leases.items() if owner is not None and shard not in expired} | {me}
    target = math.ceil(len(leases) / len(live))
    mine = sum(1 for shard, owner in leases.items() if owner == me and shard not in expired)
    needed = target - mine
    if needed <= 0:
        return Plan((), ())
    free = sorted(s for s, owner in leases.items() if owner is None)
    stale = sorted(s for s, owner in leases.items() if owner is not None and s in expired)
    takeable = (free + stale)[:needed]
    if takeable:
        return Plan(tuple(takeable), ())
    held = Counter(owner for s, owner in leases.items() if owner not in (None, me) and s not in expired)
    if not held:
        return Plan((), ())
    most = max(held.values())
    victim = min(owner for owner, n in held.items() if n == most)  # (deterministic among equals)
    if most > target or (most == target and needed > 1):
        theirs = sorted((s for s, owner in leases.items() if owner == victim), reverse=True)
        return Plan((), tuple(theirs[:min(max_steal, needed)]))
    return Plan((), ())
