"""The server's metrics alone: outcome and kind labels, a registry of its own, and
Prometheus text that prometheus_client's parser reads back."""

from __future__ import annotations

from prometheus_client import REGISTRY, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from mldserver.server.metrics import Metrics, call_outcome, kind_of


def test_call_outcomes_from_either_seams_outcome():
    assert call_outcome("ok", None) == "success"
    assert call_outcome("checkpoint_failed", "ThrottlingException") == "failure"
    assert call_outcome("failed", "ValueError: bad") == "failure"
    assert call_outcome("failed", "timed out after 0.5 s (execution_timeout)") == "timeout"
    assert call_outcome("failed", "timed out after 60 s (execution_timeout): its process was killed") == "timeout"
    assert call_outcome("failed", "abandoned: still running 1.0 s after its time-out cancelled it") == "timeout"


def test_dead_letter_reasons_become_label_values():
    assert kind_of("handler failed") == "handler_failed"
    assert kind_of("invalid KPL aggregate") == "invalid_kpl_aggregate"


def test_two_servers_metrics_do_not_share_a_registry_nor_touch_the_global_one():
    a, b = Metrics(), Metrics()
    a.batch("shardId-1", 5)
    a.handler_call("process_records", "success", 0.002)
    a.checkpoint("stored")
    assert b.registry.get_sample_value("mldserver_checkpoints_total", {"outcome": "stored"}) is None
    assert a.registry.get_sample_value("mldserver_checkpoints_total", {"outcome": "stored"}) == 1
    assert REGISTRY.get_sample_value("mldserver_handler_calls_total",
                                     {"callback": "process_records", "outcome": "success"}) is None
    names = {f.name for f in text_string_to_metric_families(generate_latest(a.registry).decode())}
    assert {"mldserver_handler_calls", "mldserver_handler_call_duration_seconds", "mldserver_dead_letters",
            "mldserver_checkpoints", "mldserver_window_commit_duration_seconds",
            "mldserver_event_loop_lag_seconds"} <= names


def test_what_a_handler_counted_becomes_callback_and_timeout_series():
    m = Metrics()
    m.handler_stats("process_records", {"on_update_success": 999, "on_update_failure": 3, "on_delete_success": 2,
                                        "timeout_count": 1, "timer_callback_success": 4, "junk": 5,
                                        "on_delete_failure": 0})
    m.handler_stats("process_records", {"on_update_success": 1})
    value = m.registry.get_sample_value
    assert value("mldserver_callbacks_total", {"callback": "on_update", "outcome": "success"}) == 1000
    assert value("mldserver_callbacks_total", {"callback": "on_update", "outcome": "failure"}) == 3
    assert value("mldserver_callbacks_total", {"callback": "on_delete", "outcome": "success"}) == 2
    assert value("mldserver_callbacks_total", {"callback": "timer_callback", "outcome": "success"}) == 4
    assert value("mldserver_callbacks_total", {"callback": "on_delete", "outcome": "failure"}) is None
    assert value("mldserver_handler_timeouts_total", {"callback": "process_records"}) == 1
    names = {f.name for f in text_string_to_metric_families(generate_latest(m.registry).decode())}
    assert {"mldserver_callbacks", "mldserver_handler_timeouts"} <= names
