"""A bench's server is up when it listens on its own port: one whose port another
process took first (``free_port``'s port is free only until someone binds it, and tests
run benches beside other servers) exits, and is started again on another port rather
than taken for up because the other answers there."""

from __future__ import annotations

import socket

import pytest

from mldserver.ops.bench import common
from mldserver.ops.emulators import listens

from .helpers import port_taken_first


@pytest.fixture
def taken(monkeypatch):
    """A port a listener of this process holds, handed out by the first ``free_port``."""
    with port_taken_first(monkeypatch, common) as port:
        yield port


async def test_a_server_whose_port_was_taken_is_started_again_on_another(taken, tmp_path):
    server, port = await common.start_server(str(tmp_path / "state"), handler="tests.handlers:Noop")
    try:
        assert port != taken
        assert server.poll() is None and listens(server.pid, port)
    finally:
        server.terminate()
        server.wait(30)


async def test_a_server_that_never_starts_is_named_after_every_try(monkeypatch, tmp_path):
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    monkeypatch.setattr(common, "free_port", lambda: holder.getsockname()[1])  # taken every time
    try:
        with pytest.raises(RuntimeError, match="exited as it started, 3 times"):
            await common.start_server(str(tmp_path / "state"), handler="tests.handlers:Noop")
    finally:
        holder.close()
