"""The MultiLangDaemon protocol, sans-IO: framing, events, states, the connection.

See :mod:`.connection` for how it is driven and docs/protocol.md for the rules it keeps.
"""

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

__all__ = [
    "NEED_DATA", "Connection", "action_in", "MALFORMED_REPLY", "LocalProtocolError", "ProtocolError", "RemoteProtocolError",
    "Action", "Checkpoint", "CheckpointReply", "ConnectionClosed", "Event", "Initialize",
    "LeaseLost", "ProcessRecords", "ShardEnded", "Shutdown", "ShutdownRequested", "Status",
    "DEFAULT_MAX_LINE_SIZE", "Dialect", "UnknownAction", "State",
]
