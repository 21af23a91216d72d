"""The log-event catalogue (``mldserver/base/events.toml``) against the code, both ways:
every event a log call of the package names is in it at the levels it is logged at, and
every entry is logged somewhere. The scan (``docs/reference.py``'s ``emitted``) is checked
on a planted package, and the file's reading on planted catalogues, so both can fail."""

from __future__ import annotations

from pathlib import Path

import pytest

from mldserver.base.logs import LEVELS, events
from mldserver.ops import daemon

from .helpers import docs_reference

reference = docs_reference()
COMPUTED, emitted = reference.COMPUTED, reference.emitted
EVENTS = events()


def test_every_event_the_code_logs_is_in_the_catalogue_and_the_reverse():
    found, unread = emitted()
    assert unread == [], "a log call whose event is computed: give it in docs/reference.py's COMPUTED"
    assert len(found) > 100 and "window_committed" in found  # the scan sees the real calls
    assert sorted(set(found) - set(EVENTS)) == [], "logged but not in mldserver/base/events.toml"
    assert sorted(set(EVENTS) - set(found)) == [], "in the catalogue but logged nowhere"


def test_each_event_is_catalogued_at_exactly_the_levels_it_is_logged_at():
    found, _ = emitted()
    wrong = {name: (sorted({s.level for s in sites}), EVENTS[name].levels) for name, sites in found.items()
             if {s.level for s in sites} != set(EVENTS[name].levels)}
    assert wrong == {}


def test_every_entry_has_known_levels_and_one_line_of_meaning():
    for name, event in EVENTS.items():
        assert event.levels and set(event.levels) <= set(LEVELS), name
        assert event.meaning.endswith(".") and "\n" not in event.meaning, name


def test_every_warning_and_error_says_what_to_do_and_nothing_else_does():
    serious = {name for name, event in EVENTS.items() if {"warning", "error"} & set(event.levels)}
    assert len(serious) > 80 and "sink_commit_failed" in serious
    missing = sorted(name for name in serious if not EVENTS[name].todo.strip())
    assert missing == [], ("a warning or an error without what to do: give each a todo in "
                           "mldserver/base/events.toml")
    assert all(EVENTS[name].todo.endswith((".", ")")) and "\n" not in EVENTS[name].todo for name in serious)
    assert sorted(name for name in set(EVENTS) - serious if EVENTS[name].todo) == []  # info and debug: nothing


def test_the_daemons_log_patterns_are_what_computed_says_they_emit():
    patterns = {}
    for event, level, _ in daemon.PATTERNS:
        patterns.setdefault(event, set()).add(level)
    assert {e: set(lv) for e, lv in COMPUTED["mldserver/ops/daemon.py:_told"].items()} == patterns


def test_the_scan_finds_literals_constants_and_unread_calls_and_skips_handler_events(tmp_path):
    pkg = tmp_path / "mldserver"
    pkg.mkdir()
    (pkg / "a.py").write_text(
        'EVENT = "from_constant"\n'
        "def f(log, self, name):\n"
        '    log.info("plain", records=1)\n'
        '    self.log.bind(x=1).warning("bound")\n'
        "    log.info(EVENT)\n"
        '    (log.debug if name else log.info)("either")\n'
        "    log.error(name)\n"
        '    self.context.log.info("handlers_own")\n'
        '    other.info("not_a_logger")\n')
    found, unread = emitted(pkg)
    assert sorted(found) == ["bound", "either", "from_constant", "plain"]
    assert sorted(s.level for s in found["either"]) == ["debug", "info"]
    assert found["plain"][0].fields == ("records",) and found["bound"][0].level == "warning"
    assert [u.split(": ", 1)[1] for u in unread] == ["log.error(name)"]
    assert Path(found["plain"][0].path) == Path("mldserver/a.py")


def test_the_catalogue_file_reads_in_its_order_and_refuses_an_event_twice_or_a_stray_key(tmp_path):
    path = tmp_path / "events.toml"
    path.write_text('[server.listening]\nlevels = ["info"]\nmeaning = "Up."\n\n'
                    '["state directory".state_dir_full]\nlevels = ["warning", "error"]\nmeaning = """Full: \\\n'
                    '   no room."""\ntodo = "Make room."\n')
    read = events(path)
    assert list(read) == ["listening", "state_dir_full"]
    assert read["state_dir_full"] == ("state directory", ("warning", "error"), "Full: no room.", "Make room.")
    assert read["listening"].todo == ""
    path.write_text('[server.listening]\nlevels = ["info"]\nmeaning = "Up."\n'
                    '[shard.listening]\nlevels = ["info"]\nmeaning = "Up."\n')
    with pytest.raises(ValueError, match=r"'listening' is under two areas, 'server' and 'shard'"):
        events(path)
    path.write_text('[server.listening]\nlevels = ["info"]\nmeaning = "Up."\nwhat = "typo"\n')
    with pytest.raises(ValueError, match=r"\[server.listening\] has \['levels', 'meaning', 'what'\]"):
        events(path)
