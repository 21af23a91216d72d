"""Memory on loan: bytes of shared memory another process owns, read in place and
given back once nothing refers to them any more.

A handler process's rows reach the server in its rows arena (``pool.arena``). The
server reads them there until their window commits instead of copying them out (a
copy, and fresh pages to fault in, for every row). Who gives the bytes back follows
Python's references, so no path has to remember it: a window committed, rows spilled
to a file, a lease lost, a sink's thread still reading a window, a batch redone::

    loan = lend(rows_map, 4096, 3_100_032, give_back)    # a read-only uint8 array over
                                                          # rows_map[4096:3_104_128]
    body = loan[:3_100_000]                               # views of it (numpy's, memoryviews,
                                                          # pyarrow's) keep it alive
    first, second = split(loan, [1_000_000])              # cut in place, nothing copied:
                                                          # each part given back on its own
    del loan, body, first                                 # the last reference to the part:
                                                          # give_back((4096, 1_000_000)), once
    lent(second) is second; lent(second[5:]) is None      # the loan itself, not a view of it

``give_back`` is called where the last reference goes, in any thread (the caller
makes it safe: ``pool.channel.Channel._give_back`` hands it to its event loop), never at
interpreter exit. A loan that has been split is given back only through its parts.

A loan held by a reference cycle is given back only at the cyclic GC's next full
collection, which may be minutes away: code a batch's rows pass through keeps none.
The usual one is an exception's: its traceback holds the frames it went through, so
a frame that keeps the future or task holding the exception (or a ``done`` set of
``asyncio.wait``) makes a cycle, which then holds every local of the frames on the
way (``HandlerProcess.call`` and ``ProcessCalls._wait`` drop theirs).
"""

from __future__ import annotations

import weakref
from typing import Any, Callable

import numpy as np

GiveBack = Callable[[tuple[int, int]], None]


class Loan(np.ndarray):
    """A read-only uint8 array over bytes on loan; ``given`` gives them back (a
    ``weakref.finalize``, run when the array is collected). Views of it are plain
    views: only the loan itself carries ``given``."""

    given: weakref.finalize
    source: Any  # the shared memory it reads (an mmap)
    at: int  # where in it


def lend(source: Any, offset: int, size: int, give_back: GiveBack) -> Loan:
    """``source[offset:offset + size]`` as a loan: ``give_back((offset, size))`` once
    nothing refers to it."""
    loan = np.frombuffer(source, dtype=np.uint8, count=size, offset=offset).view(Loan)
    loan.source, loan.at = source, offset
    loan.given = weakref.finalize(loan, give_back, (offset, size))
    loan.given.atexit = False  # (the process it came from is gone with the server)
    loan.flags.writeable = False
    return loan


def lent(buffer: Any) -> Loan | None:
    """``buffer`` if it is a loan not yet split, else None."""
    given = getattr(buffer, "given", None)
    return buffer if given is not None and given.alive else None


def split(loan: Loan, cuts: list[int]) -> list[Loan] | None:
    """The loan cut at ``cuts`` (increasing, inside it) into loans of their own, each
    given back on its own; the whole is no longer given back. None if it is not a loan
    (any more): the caller copies."""
    if lent(loan) is None:
        return None
    give_back, _, _ = loan.given.peek()[1:]  # (obj, func, args, kwargs)
    loan.given.detach()
    edges = [0, *cuts, len(loan)]
    return [lend(loan.source, loan.at + start, end - start, give_back) for start, end in zip(edges, edges[1:])]


def origin(view: Any, loan: Loan) -> int:
    """Where ``view`` (a view of ``loan``'s bytes) starts in it."""
    return int(np.frombuffer(view, dtype=np.uint8).__array_interface__["data"][0] - loan.__array_interface__["data"][0])
