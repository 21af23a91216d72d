"""The documentation site builds strictly (``mkdocs build --strict``: a broken link, an
anchor that is not there, a page missing from the nav fail it), and its generated
reference pages, read back from the built HTML, list exactly what the code has, both
ways: every setting of ``config.RULES``, every command and option of the parser, every
metric (the instruments in the source, and a live server's registry), every log event
of the catalogue and of the code's log calls, what to do about every warning and error,
every public name of the Python API with its signature (and each has a docstring). The
copies of those pages committed under ``docs/reference/`` are what the code generates."""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from html import unescape
from html.parser import HTMLParser
from pathlib import Path

import pytest

from mldserver import cli
from mldserver.base import config

from .handlers import Noop
from .helpers import docs_reference
from .harness import ROOT, running


reference = docs_reference()
EVENTS, emitted = reference.EVENTS, reference.emitted


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert done.returncode == 0, done.stderr[-4000:]
    return out


class Tables(HTMLParser):
    """The first cell of every body row of the page's tables, by the ``h2`` above it
    ("" before the first)."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: dict[str, list[str]] = {}
        self.section = ""
        self._in: str | None = None  # "h2" or "td" while reading one
        self._text = ""
        self._first = False

    def handle_starttag(self, tag, attrs):
        if tag == "h2":
            self._in, self._text = "h2", ""
        elif tag == "tr":
            self._first = True
        elif tag == "td" and self._first:
            self._in, self._text, self._first = "td", "", False

    def handle_endtag(self, tag):
        if tag == "h2" and self._in == "h2":
            self.section, self._in = self._text.replace("¶", "").strip(), None
        elif tag == "td" and self._in == "td":
            self.rows.setdefault(self.section, []).append(self._text.strip())
            self._in = None

    def handle_data(self, data):
        if self._in:
            self._text += data


def tables(html: str) -> dict[str, list[str]]:
    parser = Tables()
    parser.feed(html)
    return parser.rows


def page(site: Path, name: str) -> dict[str, list[str]]:
    return tables((site / "reference" / name / "index.html").read_text())


def differences(listed: list[str], expected: set[str]) -> tuple[set[str], set[str]]:
    """(in the code and not on the page, on the page and not in the code); a name listed
    twice counts as on the page and not in the code."""
    twice = {x for x in listed if listed.count(x) > 1}
    return expected - set(listed), (set(listed) - expected) | twice


def test_the_site_builds_strictly_with_every_page(site):
    for name in ("index.html", "quickstart/index.html", "handlers/index.html", "operations/index.html",
                 "coordinator-and-sinks/index.html", "sources/index.html", "scaling/index.html",
                 "kclpy/index.html", "protocol/index.html", "troubleshooting/index.html",
                 "reference/api/index.html", "reference/warnings-and-errors/index.html"):
        assert (site / name).is_file(), name
    assert not list(site.rglob("*.py")), "the generator is not part of the site"


def test_the_settings_page_lists_every_setting_once_with_its_flag(site):
    rows = page(site, "settings")
    listed = [name for cells in rows.values() for name in cells]
    assert differences(listed, set(config.RULES)) == (set(), set())
    serve = {a.dest: a.option_strings for a in reference._subparsers(cli._parser())["serve"]._actions}
    html = (site / "reference" / "settings" / "index.html").read_text()
    for name in ("execution_timeout", "workers", "source_from", "admin_token_file"):
        assert f"<code>{serve[name][0]}</code>" in html  # the flag is on the page (--from for source_from)


def test_the_cli_page_lists_every_command_and_option_of_the_parser(site):
    rows = page(site, "cli")
    parser = cli._parser()
    commands = {"mldserver": parser} | {f"mldserver {name}": sub for name, sub in reference._subparsers(parser).items()}
    assert set(rows) == set(commands)
    for title, sub in commands.items():
        expected = {", ".join(a.option_strings) or a.dest for a in sub._actions
                    if not isinstance(a, argparse._SubParsersAction)}
        assert differences(rows[title], expected) == (set(), set()), title
    assert "--reset-positions" in rows["mldserver run"] and "--properties" in rows["mldserver run"]


def test_the_metrics_page_lists_every_instrument_of_the_code(site):
    listed = [name for cells in page(site, "metrics").values() for name in cells]
    found = {m.name for m in reference.metrics()}
    assert len(found) > 30 and "mldserver_handler_calls_total" in found and "mldserver_pending_timers" in found
    assert differences(listed, found) == (set(), set())


async def test_every_metric_a_live_server_exposes_is_on_the_metrics_page(site, tmp_path):
    listed = {name for cells in page(site, "metrics").values() for name in cells}
    async with running(tmp_path, Noop, sink=f"file:{tmp_path / 'out'}", workers=0) as (server, _, _):
        families = list(server.metrics.registry.collect())
    exposed = {f.name + "_total" if f.type == "counter" else f.name for f in families}
    assert "mldserver_buffered_rows" in exposed and "mldserver_timer_creates_total" in exposed
    assert exposed - listed == set()


def test_the_log_events_page_lists_every_event_of_the_catalogue_and_of_the_code(site):
    rows = page(site, "log-events")
    listed = [name for cells in rows.values() for name in cells]
    assert differences(listed, set(EVENTS)) == (set(), set())
    assert set(emitted()[0]) == set(EVENTS)  # and the catalogue is what the code logs (tests/test_events.py)
    assert set(rows) == {e.area[:1].upper() + e.area[1:] for e in EVENTS.values()}


def test_a_page_missing_an_entry_or_listing_a_stale_one_is_found(site):
    html = (site / "reference" / "settings" / "index.html").read_text()
    cut = html.replace("<td><code>execution_timeout</code></td>", "<td><code>execution_timeouts</code></td>")
    assert cut != html
    listed = [name for cells in tables(cut).values() for name in cells]
    assert differences(listed, set(config.RULES)) == ({"execution_timeout"}, {"execution_timeouts"})
    assert differences(["a", "a"], {"a"}) == (set(), {"a"})


def test_the_committed_reference_pages_are_what_the_code_generates():
    stale = reference.stale()
    assert stale == [], (f"docs/reference/ is out of date with the code ({', '.join(stale)}): run "
                         f"`.venv/bin/python docs/reference.py --write` and commit docs/reference/")


def test_a_stale_committed_page_is_found(tmp_path, monkeypatch):
    monkeypatch.setattr(reference, "DOCS", tmp_path)
    assert set(reference.stale()) == set(reference.PAGES)  # none there
    assert set(reference.write()) == set(reference.PAGES) and reference.stale() == []
    page = tmp_path / "reference" / "settings.md"
    page.write_text(page.read_text().replace("execution_timeout", "execution_timeouts"))
    assert reference.stale() == ["reference/settings.md"]


def test_every_public_name_and_its_methods_have_a_docstring():
    names = reference.api()
    public = {n.public for n in names}
    assert {"mldserver.Handler", "mldserver.Batch", "mldserver.open_stream", "mldserver.CheckpointError",
            "mldserver.api.testing.FakeDaemon", "mldserver.api.testing.make_records", "mldserver.api.testing.SHARD_END"} <= public
    assert len(public) == len(names)
    assert reference.undocumented() == [], "give each a docstring that teaches its contract with an example"


def test_a_name_without_a_docstring_is_found():
    import dataclasses

    class Documented:
        """Has one."""

        def method(self):
            pass

        @property
        def value(self):
            """Has one."""

    @dataclasses.dataclass
    class Generated:  # its __doc__ is "Generated(x: int)"
        x: int

    def function():
        pass

    found = reference.undocumented([reference.Name("a.Documented", "a.Documented", Documented),
                                    reference.Name("a.Generated", "a.Generated", Generated),
                                    reference.Name("a.function", "a.function", function),
                                    reference.Name("a.SHARD_END", "mldserver.api.testing.SHARD_END", "SHARD_END"),
                                    reference.Name("a.STATUS_KEYS", "mldserver.api.testing.STATUS_KEYS", "")])
    assert found == ["a.Documented.method", "a.Generated", "a.function", "a.STATUS_KEYS"]


def test_the_api_page_shows_every_public_name_with_its_signature(site):
    html = (site / "reference" / "api" / "index.html").read_text()
    names = reference.api()
    index = [name for cells in tables(html).values() for name in cells]
    assert differences(index, {n.public for n in names}) == (set(), set())
    for name in names:
        assert f'id="{name.path}"' in html, name.public  # its section, rendered by mkdocstrings
    text = unescape(re.sub(r"<[^>]+>", "", html))
    assert "make_records(first_sequence_number: int, count: int" in text  # signatures
    assert "checkpoint(sequence_number: str | None = None" in text
    assert "make_records(7, count=3" in text  # the docstrings' examples
    assert "::</p>" not in html and ":class:" not in text  # reStructuredText's habits read as Markdown (docs/docstrings.py)


def test_the_warnings_page_says_what_to_do_about_every_warning_and_error(site):
    html = (site / "reference" / "warnings-and-errors" / "index.html").read_text()
    for name, event in EVENTS.items():
        serious = bool({"warning", "error"} & set(event.levels))
        assert (f'id="{name}"' in html) == serious, name
    text = unescape(re.sub(r"<[^>]+>", "", html))
    assert "What to do: " + EVENTS["sink_commit_failed"].todo.replace("`", "").split(" See ")[0] in text
    troubleshooting = (site / "troubleshooting" / "index.html").read_text()
    for anchor in ("windows-committed-0", "late-rows", "sink_commit_failed", "the-daemons-first-minute",
                   "a-handler-that-dead-letters"):
        assert f'id="{anchor}"' in troubleshooting, anchor
