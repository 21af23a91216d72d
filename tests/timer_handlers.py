"""Handlers and timer callbacks for the timer tests.

A record's data is a JSON list of operations the handler runs in order::

    [["create", "ref-1", 1763719260.0, {"ref": "ref-1", "v": 1}],   # self.timers.create(fired, at, ref, context)
     ["create_in", "ref-3", 2.5, {"ref": "ref-3", "v": 1}],         # at = now + 2.5 s, put in the context too
     ["cancel", "ref-2"]]                                          # self.timers.cancel(fired, ref)

A fourth item names another callback of ``CALLBACKS`` (``"slow"``, ``"failing"``...).

``fired`` appends one JSON line per call to the file named by ``MLDSERVER_TEST_FIRED``
(``os.write`` on an O_APPEND descriptor: whole lines, kept when the process is
SIGKILLed right after), with the context, the time it ran and its pid.

``Scripted`` appends to the same file a line as it calls each create or cancel and
one once it is durable (the batch's checkpoint returned: a call's timers are committed
before its checkpoints), so a test knows what was in the store when a callback fired;
a call cut short (its batch timed out, its process died) has the first line only,
though the server may have committed it::

    {"call": "create", "ref": "ref-3", "context": {"ref": "ref-3", "v": 1, "at": ...}, "asked": ..., "pid": 42}
    {"call": "create", "ref": "ref-3", "asked": ..., "returned": ..., "pid": 42}
    {"call": "cancel", "ref": "ref-2", "asked": ..., "pid": 42}
    {"call": "cancel", "ref": "ref-2", "asked": ..., "returned": ..., "pid": 42}

A callback's line has ``fired_at``, a call's ``call``.
"""

from __future__ import annotations

import asyncio
import os
import time

import orjson

import mldserver
from mldserver import timers

_fds: dict[str, int] = {}  # one descriptor per file (tests in this process name a file each)


def _append(entry: dict) -> None:
    path = os.environ["MLDSERVER_TEST_FIRED"]
    fd = _fds.get(path)
    if fd is None:
        fd = _fds[path] = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.write(fd, orjson.dumps(entry) + b"\n")


async def fired(context):
    _append({**context, "fired_at": time.time(), "pid": os.getpid()})


async def slow(context):
    await asyncio.sleep(context.get("sleep", 0.05))
    _append({**context, "fired_at": time.time(), "pid": os.getpid()})


async def lingering(context):
    """Writes its line first, then takes a while: killed meanwhile, it fires again."""
    _append({**context, "fired_at": time.time(), "pid": os.getpid()})
    await asyncio.sleep(context.get("sleep", 0.2))


async def failing(context):
    _append({**context, "fired_at": time.time(), "pid": os.getpid()})
    raise ValueError(f"no such order: {context.get('ref')}")


async def blocking(context):
    _append({**context, "fired_at": time.time(), "pid": os.getpid()})
    time.sleep(context.get("block", 3600))


async def rearm(context):
    """Creates the next timer from inside a callback (no self: the module functions)."""
    _append({**context, "fired_at": time.time(), "pid": os.getpid()})
    if context["left"] > 0:
        await timers.create(rearm, time.time(), context["ref"], {**context, "left": context["left"] - 1})


CALLBACKS = {"fired": fired, "slow": slow, "lingering": lingering, "failing": failing, "blocking": blocking, "rearm": rearm}


class Scripted(mldserver.Handler):
    checkpoints = True  # the batch's last record, once its ops ran (Unchecked: never)

    async def process_records(self, batch, checkpointer):
        made = []  # the lines for the ops made, written once they are durable
        for record in batch.records:
            for op in orjson.loads(record.data):
                if op[0] in ("create", "create_in"):
                    _, ref, at, context, *rest = op
                    asked = time.time()
                    if op[0] == "create_in":
                        at = context["at"] = asked + at
                    _append({"call": "create", "ref": ref, "context": context, "asked": asked, "pid": os.getpid()})
                    await self.timers.create(CALLBACKS[rest[0] if rest else "fired"], at, ref, context)
                elif op[0] == "cancel":
                    ref = op[1]
                    asked = time.time()
                    _append({"call": "cancel", "ref": ref, "asked": asked, "pid": os.getpid()})
                    await self.timers.cancel(CALLBACKS[op[2] if len(op) > 2 else "fired"], ref)
                else:
                    continue
                made.append({"call": op[0].removesuffix("_in"), "ref": ref, "asked": asked, "pid": os.getpid()})
        if batch.records and self.checkpoints:
            last = batch.records[-1]
            # The call's timers are committed before the checkpoint: durable once it returned.
            await checkpointer.checkpoint(last.sequence_number, last.sub_sequence_number)
            returned = time.time()
            for line in made:
                _append({**line, "returned": returned})


class Unchecked(Scripted):
    """Never checkpoints: the call's timers are committed with its end, before its status."""

    checkpoints = False
