"""Structured logs: a line is written whatever its fields hold, and a log file that
cannot be opened is a ConfigError naming it."""

from __future__ import annotations

import io
import json
import logging

import pytest

from mldserver.base import logs
from mldserver.errors import ConfigError


@pytest.fixture
def restored():
    """configure() sets the 'mldserver' logger up: put it back as it was."""
    root = logging.getLogger("mldserver")
    saved = (root.handlers[:], root.level, root.propagate)
    yield
    for handler in root.handlers:
        if handler not in saved[0]:
            handler.close()
    root.handlers[:], root.level, root.propagate = saved[0], saved[1], saved[2]


def test_an_int_past_64_bits_is_logged_as_a_string_not_lost(restored):
    out = io.StringIO()
    logs.configure("json", "info", stream=out)
    logs.get_logger("mldserver.test").info("window_committed", watermark=2**64 + 5, low=-(2**63),
                                           nested={"end": [2**70]})
    entry = json.loads(out.getvalue())
    assert entry["event"] == "window_committed"
    assert (entry["watermark"], entry["low"], entry["nested"]) == (str(2**64 + 5), -(2**63), {"end": [str(2**70)]})


def test_a_log_file_that_cannot_be_opened_is_a_config_error_naming_it(restored, tmp_path):
    path = tmp_path / "missing" / "server.log"
    with pytest.raises(ConfigError) as caught:
        logs.configure("json", "info", str(path))
    assert str(caught.value).startswith(f"--log-file {path}: cannot open it for appending (No such file or directory)")


def test_an_unknown_level_is_a_config_error(restored):
    with pytest.raises(ConfigError, match="log_level must be one of 'debug', 'info', 'warning', 'error', got 'loud'"):
        logs.configure("json", "loud")


def test_an_event_not_in_the_catalogue_raises_while_the_check_is_on():
    assert logs._CATALOGUE is not None  # tests/conftest.py turns the check on
    log = logs.get_logger("mldserver.test").bind(conn=1)
    log.debug("batch", records=1)  # catalogued, even below the level that is written
    with pytest.raises(logs.UncataloguedEvent, match="'batch_done' at level info is not in"):
        log.info("batch_done", records=1)
    with pytest.raises(logs.UncataloguedEvent, match="'batch' at level error"):
        log.error("batch")  # a level the catalogue does not give it


def test_a_handlers_own_events_are_not_checked(restored):
    stream = io.StringIO()
    logs.configure("json", "info", stream=stream)
    logs.handler_logger().bind(shard_id="s-1").info("order_seen", order=7)
    assert json.loads(stream.getvalue())["event"] == "order_seen"


def test_the_check_is_off_unless_asked_for(monkeypatch):
    monkeypatch.delenv("MLDSERVER_CHECK_EVENTS")
    assert logs.catalogue() is None
    monkeypatch.setenv("MLDSERVER_CHECK_EVENTS", "1")
    assert ("window_committed", logging.INFO) in logs.catalogue()


def test_a_log_file_moved_away_by_logrotate_is_opened_again_where_it_was(restored, tmp_path):
    path = tmp_path / "server.log"
    logs.configure("json", "info", str(path))
    log = logs.get_logger("mldserver.test")
    log.info("window_committed", window="before the rotation")
    path.rename(tmp_path / "server.log.1")  # logrotate's create mode: move, and a new file
    log.info("window_committed", window="after the rotation")
    (tmp_path / "server.log.1").unlink()  # and once it has aged out
    log.info("window_committed", window="after the deletion")
    assert [json.loads(line)["window"] for line in path.read_text().splitlines()] == ["after the rotation",
                                                                                    "after the deletion"]
