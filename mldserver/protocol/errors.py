"""Protocol errors, h11 style: who broke the protocol decides the class.

``RemoteProtocolError``: the daemon sent something we cannot accept (not JSON, a
bare ``null``, an action out of order, a line past ``max_line_size``). The state is
unchanged. When the offending line was a daemon action (never a checkpoint reply),
``action`` names it: the daemon is
now waiting for a status for it, and the connection lets exactly one
``Status(response_for=action)`` through so the daemon neither hangs nor exits.
``names_no_action``: the line names no action at all (not JSON and no ``"action"`` in
its first bytes, not an object, an object without a string ``action``): no status can
answer it, and the daemon, if it sent it, waits for one.

``LocalProtocolError``: our side tried something the daemon would not accept (a
second status, a checkpoint between a status and the next action, ...). Nothing is
written and the state is unchanged.
"""

from __future__ import annotations

from ..errors import MldserverError


class ProtocolError(MldserverError):
    """Base of the protocol core's errors (not retriable: the same line fails again)."""


class RemoteProtocolError(ProtocolError):
    def __init__(self, message: str, *, line: bytes = b"", action: str | None = None,
                 too_long: bool = False, names_no_action: bool = False) -> None:
        super().__init__(message)
        self.line = line
        self.action = action
        self.too_long = too_long  # over max_line_size: ``line`` is its first bytes only
        self.names_no_action = names_no_action


class LocalProtocolError(ProtocolError):
    pass
