"""The MultiLangDaemon protocol, sans-IO: framing, events, states, the connection. See
``connection.py`` for how it is driven and docs/protocol.md for the rules it keeps.

- ``connection.py``: the core, bytes in, events out; events in, bytes out.
- ``framing.py``: bytes in, whole lines out.
- ``messages.py``: the daemon's lines decoded into events, ours encoded into lines.
- ``events.py``: the events of the conversation, small frozen value types.
- ``state.py``: the states and the one table of transitions between them.
- ``errors.py``: the protocol errors, classed by who broke the protocol.
- ``dynamodb_records.py``: DynamoDB stream records as the KCL's Streams adapter hands them
  to the daemon (what ``--source dynamodb:`` feeds and ``api.testing`` builds).
- ``lazy.py``: a ``processRecords`` line read without a Python object per record.
- ``_scan.c``: for the server, the line checked and its size, last record and
  ``millisBehindLatest`` read (``_check.h``), and its records' sequence numbers and
  arrival times, each in one native pass (pysimdjson where it was not built); its JSON
  cursor (``_cursor.h``) is ``pool/_b64.c``'s too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..faces import lazy_attributes

__all__ = [
    "NEED_DATA", "Connection", "action_in", "MALFORMED_REPLY", "LocalProtocolError", "ProtocolError", "RemoteProtocolError",
    "Action", "Checkpoint", "CheckpointReply", "ConnectionClosed", "Event", "Initialize",
    "LeaseLost", "ProcessRecords", "ShardEnded", "Shutdown", "ShutdownRequested", "Status",
    "DEFAULT_MAX_LINE_SIZE", "Dialect", "UnknownAction", "State",
]

if TYPE_CHECKING:
    from .connection import NEED_DATA, Connection, action_in
    from .errors import LocalProtocolError, ProtocolError, RemoteProtocolError
    from .events import (
        Action,
        Checkpoint,
        CheckpointReply,
        ConnectionClosed,
        Event,
        MALFORMED_REPLY,
        Initialize,
        LeaseLost,
        ProcessRecords,
        ShardEnded,
        Shutdown,
        ShutdownRequested,
        Status,
    )
    from .framing import DEFAULT_MAX_LINE_SIZE
    from .messages import Dialect, UnknownAction
    from .state import State


_MODULES = {
    "NEED_DATA": ".connection",
    "Connection": ".connection",
    "action_in": ".connection",
    "LocalProtocolError": ".errors",
    "ProtocolError": ".errors",
    "RemoteProtocolError": ".errors",
    "Action": ".events",
    "Checkpoint": ".events",
    "CheckpointReply": ".events",
    "ConnectionClosed": ".events",
    "Event": ".events",
    "MALFORMED_REPLY": ".events",
    "Initialize": ".events",
    "LeaseLost": ".events",
    "ProcessRecords": ".events",
    "ShardEnded": ".events",
    "Shutdown": ".events",
    "ShutdownRequested": ".events",
    "Status": ".events",
    "DEFAULT_MAX_LINE_SIZE": ".framing",
    "Dialect": ".messages",
    "UnknownAction": ".messages",
    "State": ".state",
}


# Imported when asked for: ``Settings`` needs ``DEFAULT_MAX_LINE_SIZE`` alone, and a
# handler process nothing else of the protocol.
__getattr__ = lazy_attributes(__name__, _MODULES)
