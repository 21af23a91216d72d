"""What deploy/ ships for operations: the Grafana dashboard (``grafana/mldserver.json``)
and the Prometheus alerting rules (``prometheus/mldserver-rules.yml``). promtool checks
the rules and runs their unit tests (``mldserver-rules.test.yml``); every metric name
the dashboard's queries and the rules read is one that ``mldserver serve`` exports on
/metrics, scraped from a real server after a little traffic; a counter or a histogram
is only ever read through a range (``rate``, ``increase``)::

    selectors('sum by (le) (rate(mldserver_x_bucket{job=~"$job"}[5m])) > on (job) mldserver_y')
    # [("mldserver_x_bucket", True), ("mldserver_y", False)]
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
import urllib.request
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from mldserver.api.testing import FakeDaemon, make_records

from .harness import ROOT, ServerProcess, relay_command

DASHBOARD = ROOT / "deploy" / "grafana" / "mldserver.json"
RULES = ROOT / "deploy" / "prometheus" / "mldserver-rules.yml"
RULE_TESTS = ROOT / "deploy" / "prometheus" / "mldserver-rules.test.yml"
ARRIVAL = 1476889707000  # make_records' arrival time, their rows' event time


# -- PromQL: the metric names an expression reads -----------------------------------------

STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
LABEL_LIST = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
NAME = re.compile(r"(?<![\w.$])[A-Za-z_:][A-Za-z0-9_:]*")
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "bool",
            "offset", "inf", "nan"}


def selectors(expr: str) -> list[tuple[str, bool]]:
    """The metric names ``expr`` selects, each with whether it is read through a range
    (``name[5m]``, ``name{...}[$__rate_interval]``): what is left once strings, label
    matchers, ranges and the clauses ``by (...)``, ``on (...)`` are blanked, less
    keywords and what is called (functions, aggregations)."""
    text = STRING.sub('""', expr)
    text = re.sub(r"\{[^}]*\}", "{}", text)
    text = re.sub(r"\[[^\]]*\]", "[]", text)
    text = LABEL_LIST.sub(" ", text)  # so that sum by (le) (...) reads as a call
    found = []
    for m in NAME.finditer(text):
        rest = text[m.end():].lstrip()
        if m.group().lower() in KEYWORDS or rest.startswith("("):
            continue
        found.append((m.group(), bool(re.match(r"(\{\})?\s*\[\]", rest))))
    return found


def misread(expressions: list[str], exposition: str) -> list[str]:
    """What is wrong with ``expressions`` against a scrape: each name no sample of it has
    (a histogram is read by its ``_bucket``, ``_sum``, ``_count``, a counter by its
    ``_total``, as the samples are named), and each counter or histogram sample read
    without a range."""
    samples, cumulative = set(), set()
    for family in text_string_to_metric_families(exposition):
        for sample in family.samples:
            samples.add(sample.name)
            if family.type in ("counter", "histogram"):
                cumulative.add(sample.name)
    wrong = []
    for expr in expressions:
        for name, ranged in selectors(expr):
            if name not in samples:
                wrong.append(f"{name}: not in /metrics (in {expr})")
            elif name in cumulative and not ranged:
                wrong.append(f"{name}: a counter read without a range (in {expr})")
    return wrong


def dashboard_expressions(dashboard: dict) -> list[str]:
    """Every panel target's ``expr``, and the metric a template variable's
    ``label_values(METRIC, label)`` reads."""
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            query = variable["query"] if isinstance(variable["query"], str) else variable["query"]["query"]
            m = re.fullmatch(r"label_values\((.*),\s*\w+\)", query)
            assert m, f"variable {variable['name']}: not a label_values(METRIC, label) query"
            exprs.append(m.group(1))
    return exprs


def rule_expressions() -> list[str]:
    return [rule["expr"] for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]


EXPOSITION = """\
# TYPE mldserver_records_total counter
mldserver_records_total{shard_id="shardId-1"} 5.0
# TYPE mldserver_commit_seconds histogram
mldserver_commit_seconds_bucket{le="+Inf"} 1.0
mldserver_commit_seconds_count 1.0
mldserver_commit_seconds_sum 0.5
# TYPE mldserver_paused gauge
mldserver_paused 0.0
"""


def test_selectors_are_the_names_read_not_labels_functions_or_variables():
    expr = ('histogram_quantile(0.99, sum by (le, callback) (rate(mldserver_x_bucket{job=~"$job", '
            'outcome="a_b"}[$__rate_interval]))) > on (job, instance) group_left mldserver_y offset 5m '
            "unless ignoring(le) sum(mldserver_z) without (shard_id) and 1e3 < bool mldserver_w[5m:1m]")
    assert selectors(expr) == [("mldserver_x_bucket", True), ("mldserver_y", False), ("mldserver_z", False),
                               ("mldserver_w", True)]


def test_a_name_the_server_does_not_export_is_caught():
    assert misread(['sum(rate(mldserver_records_total{job=~"$job"}[5m]))', "max(mldserver_paused)",
                    "histogram_quantile(0.9, sum by (le) (rate(mldserver_commit_seconds_bucket[5m])))"],
                   EXPOSITION) == []
    assert misread(["sum(rate(mldserver_record_total[5m]))"], EXPOSITION) == [
        "mldserver_record_total: not in /metrics (in sum(rate(mldserver_record_total[5m])))"]
    # A histogram's family name is no series: histogram_quantile needs its _bucket.
    assert len(misread(["histogram_quantile(0.9, rate(mldserver_commit_seconds[5m]))"], EXPOSITION)) == 1
    # A counter's value alone says how long the server has been up, not what it did.
    assert misread(["mldserver_records_total > 0"], EXPOSITION) == [
        "mldserver_records_total: a counter read without a range (in mldserver_records_total > 0)"]


# -- the rules: promtool ---------------------------------------------------------------------

def promtool() -> str:
    """scripts/setup --test puts promtool in .deps/ (from Debian's prometheus package)
    unless one is on PATH."""
    local = ROOT / ".deps" / "promtool"
    found = str(local) if os.access(local, os.X_OK) else shutil.which("promtool")
    if found is None:
        pytest.fail("promtool not found (in .deps/ or on PATH): scripts/setup --test installs it, from the "
                    "Debian package prometheus")
    return found


def test_promtool_checks_the_rules_and_their_unit_tests_pass():
    check = subprocess.run([promtool(), "check", "rules", "--lint=all", "--lint-fatal", str(RULES)],
                           capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
    tests = subprocess.run([promtool(), "test", "rules", str(RULE_TESTS)], capture_output=True, text=True,
                           timeout=120)
    assert tests.returncode == 0, tests.stdout + tests.stderr
    assert "SUCCESS" in tests.stdout


def test_each_alert_is_tested_firing_and_not_firing_with_a_severity_and_what_to_do():
    rules = [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]
    tested = yaml.safe_load(RULE_TESTS.read_text())["tests"]
    cases = [case for test in tested for case in test["alert_rule_test"]]
    for rule in rules:
        name = rule["alert"]
        assert rule["labels"]["severity"] in ("critical", "warning"), name
        assert "for" in rule and {"summary", "description", "runbook"} <= rule["annotations"].keys(), name
        mine = [c for c in cases if c["alertname"] == name]
        assert any(c["exp_alerts"] for c in mine), f"{name}: no test where it fires"
        assert any(not c["exp_alerts"] for c in mine), f"{name}: no test where it does not fire"


# -- the dashboard -----------------------------------------------------------------------------

def test_the_dashboard_reads_its_data_source_variable_and_sets_units():
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["schemaVersion"] >= 39
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    assert {"job", "instance"} <= variables.keys()
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert panel["fieldConfig"]["defaults"].get("unit"), f"{panel['title']}: no unit"
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}", panel["title"]
            assert 'job=~"$job", instance=~"$instance"' in target["expr"], panel["title"]
            if "_bucket" in target["expr"]:
                assert re.search(r"histogram_quantile\(.*by \((le|[^)]*, le|le, [^)]*)\)", target["expr"]), \
                    f"{panel['title']}: a histogram's buckets are read by histogram_quantile, summed by le"
    cells = set()  # no two panels on the same grid cell
    for panel in dashboard["panels"]:
        g = panel["gridPos"]
        assert g["x"] + g["w"] <= 24, panel["title"]
        mine = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not cells & mine, f"{panel['title']} overlaps another panel"
        cells |= mine


# -- against a running server --------------------------------------------------------------------

def scrape(server: ServerProcess) -> str:
    with urllib.request.urlopen(server.admin_url + "/metrics", timeout=10) as response:
        return response.read().decode()


async def test_every_metric_the_dashboard_and_the_rules_read_is_one_a_running_server_exports(tmp_path):
    """A server with a sink and a handler process, one connected shard that handled
    records, failed one (a dead letter), timed out on another, and went on into later
    windows until one committed and a checkpoint was stored: every series the dashboard
    and the rules read then has a sample, labelled ones included."""
    config = tmp_path / "mldserver.toml"
    config.write_text("handler_retries = 0\nexecution_timeout = 0.5\ncheckpoint_interval = 0.0\n")
    server = ServerProcess("tests.pool_handlers:SlowChanges", tmp_path, "--config", str(config), "--workers", "1",
                           "--sink", f"file:{tmp_path / 'out'}", "--window", "60")
    try:
        daemon = FakeDaemon(relay_command(server.port))
        shard = await daemon.shard("shardId-000000000001")
        await shard.process_records(make_records(1, 5), millis_behind_latest=1500)  # arriving at ARRIVAL
        await shard.process_records(make_records(6, 1, partition_key="poison"))
        await shard.process_records(make_records(7, 1, partition_key="slow"))
        wanted = ("mldserver_handler_timeouts_total{", "mldserver_checkpoints_total{")
        text = ""
        for n in range(1, 100):  # later windows, until the first commits and its checkpoint is stored
            text = await asyncio.to_thread(scrape, server)
            if all(series in text for series in wanted):
                break
            await shard.process_records(make_records(7 + n, 1, approximate_arrival_timestamp=ARRIVAL + n * 120_000),
                                        millis_behind_latest=500)
            await asyncio.sleep(0.2)
        assert all(series in text for series in wanted), text
        wrong = misread(dashboard_expressions(json.loads(DASHBOARD.read_text())), text)
        wrong += misread(rule_expressions(), text)
        assert wrong == []
        await shard.close()
    finally:
        assert server.stop() == 0
