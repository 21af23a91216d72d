"""The emulators start on a port of their own even when another process takes the port
they were given first (tests start them in parallel, and ``free_port``'s port is free
only until someone binds it): the one that lost the race exits, and it is started again
on another port rather than taken for up because the winner answers on it."""

from __future__ import annotations

import pytest

from mldserver.ops import emulators
from mldserver.ops.emulators import DynamoDBLocal, KinesisLocal, listens

from ..helpers import port_taken_first


@pytest.fixture
def taken(monkeypatch):
    """A port a listener of this process holds, handed out by the first ``free_port``."""
    with port_taken_first(monkeypatch, emulators) as port:
        yield port


@pytest.mark.parametrize("component", [DynamoDBLocal, KinesisLocal])
def test_an_emulator_whose_port_was_taken_starts_again_on_another(component, taken, tmp_path):
    emulator = component(tmp_path)
    try:
        assert emulator.port != taken and emulator.proc.poll() is None
        assert listens(emulator.proc.pid, emulator.port)  # its own port, served by itself
        assert not listens(emulator.proc.pid, taken)
        assert "Address already in use" in emulator.log.read_text() or component is KinesisLocal
    finally:
        emulator.terminate()
