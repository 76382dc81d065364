"""fluxnetes.metrics and fluxnetes.logging: names, labels, the HTTP endpoints, JSON log lines."""

from __future__ import annotations

import io
import json
import logging
import urllib.error
import urllib.request

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from fluxnetes.logging import configure_logging, current_context, log_context
from fluxnetes.metrics import QUEUE_STATES, Health, Metrics, serve


@pytest.fixture
def metrics() -> Metrics:
    return Metrics(CollectorRegistry())


def samples(m: Metrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(m.exposition().decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_queue_length_by_state_reports_every_state(metrics: Metrics) -> None:
    metrics.set_queue_lengths({"Pending": 3, "Running": 2})
    got = samples(metrics)
    assert got[("fluxnetes_queue_jobs", (("state", "Pending"),))] == 3
    assert got[("fluxnetes_queue_jobs", (("state", "Running"),))] == 2
    for state in QUEUE_STATES:
        assert ("fluxnetes_queue_jobs", (("state", state),)) in got
    # a state that empties goes back to 0 rather than keeping its last value
    metrics.set_queue_lengths({"Running": 1})
    assert samples(metrics)[("fluxnetes_queue_jobs", (("state", "Pending"),))] == 0
    # a state outside QUEUE_STATES follows its count too, not only its first one
    metrics.set_queue_lengths({"Odd": 4})
    metrics.set_queue_lengths({"Odd": 7})
    assert samples(metrics)[("fluxnetes_queue_jobs", (("state", "Odd"),))] == 7
    metrics.set_queue_lengths({})
    assert samples(metrics)[("fluxnetes_queue_jobs", (("state", "Odd"),))] == 0


def test_histograms_and_counters_have_expected_names_and_labels(metrics: Metrics) -> None:
    with metrics.time_cycle():
        pass
    with metrics.time_match():
        pass
    with metrics.time_webhook("Pod"):
        pass
    metrics.match_outcomes.labels(outcome="reserved").inc()
    metrics.allocations.inc(2)
    metrics.release("partial")
    metrics.foreign_allocations.inc()
    metrics.observe_sync_lag("node", event_time=100.0, now=100.5)
    metrics.reconcile_error("pod")
    metrics.reconcile_error("pod")
    got = samples(metrics)
    assert got[("fluxnetes_scheduling_cycle_duration_seconds_count", ())] == 1
    assert got[("fluxnetes_match_duration_seconds_count", ())] == 1
    assert (
        got[("fluxnetes_webhook_duration_seconds_count", (("kind", "Pod"), ("webhook", "mutate")))]
        == 1
    )
    assert got[("fluxnetes_match_outcomes_total", (("outcome", "reserved"),))] == 1
    assert got[("fluxnetes_allocations_total", ())] == 2
    assert got[("fluxnetes_releases_total", (("kind", "partial"),))] == 1
    assert got[("fluxnetes_foreign_allocations_total", ())] == 1
    assert got[("fluxnetes_sync_lag_seconds_sum", (("source", "node"),))] == pytest.approx(0.5)
    # 0.5 s falls in the 0.5 bucket, not in the 0.25 one
    assert got[("fluxnetes_sync_lag_seconds_bucket", (("le", "0.5"), ("source", "node")))] == 1
    assert got[("fluxnetes_sync_lag_seconds_bucket", (("le", "0.25"), ("source", "node")))] == 0
    assert got[("fluxnetes_reconcile_errors_total", (("controller", "pod"),))] == 2


def test_timers_record_even_when_the_block_raises(metrics: Metrics) -> None:
    with pytest.raises(RuntimeError), metrics.time_match():
        raise RuntimeError("boom")
    assert samples(metrics)[("fluxnetes_match_duration_seconds_count", ())] == 1


def test_sync_lag_never_negative(metrics: Metrics) -> None:
    metrics.observe_sync_lag("pod", event_time=200.0, now=199.0)  # clock skew between hosts
    assert samples(metrics)[("fluxnetes_sync_lag_seconds_sum", (("source", "pod"),))] == 0


def test_two_instances_do_not_share_state() -> None:
    a, b = Metrics(CollectorRegistry()), Metrics(CollectorRegistry())
    a.allocations.inc()
    assert samples(b)[("fluxnetes_allocations_total", ())] == 0


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def test_server_serves_metrics_health_and_readiness(metrics: Metrics) -> None:
    metrics.allocations.inc()
    health = Health(ready=False)
    server = serve(0, host="127.0.0.1", metrics=metrics, health=health)
    try:
        base = f"http://127.0.0.1:{server.port}"
        code, body = _get(base + "/metrics")
        assert code == 200 and "fluxnetes_allocations_total 1.0" in body
        assert _get(base + "/healthz")[0] == 200
        assert _get(base + "/readyz")[0] == 503
        health.ready = True
        assert _get(base + "/readyz")[0] == 200
        health.checks["store"] = lambda: False
        code, body = _get(base + "/healthz")
        assert code == 503 and "store" in body
        assert _get(base + "/nope")[0] == 404
    finally:
        server.close()


def test_json_logs_carry_job_and_group() -> None:
    stream = io.StringIO()
    handler = configure_logging("DEBUG", "json", stream)
    try:
        log = logging.getLogger("fluxnetes.test")
        with log_context(job="default/train", group="train"):
            with log_context(pod="train-0", node=None):
                log.info("scheduled %s", "train-0", extra={"nodes": ["n1", "n2"]})
            assert current_context() == {"job": "default/train", "group": "train"}
        log.warning("outside")
        try:
            raise ValueError("bad")
        except ValueError:
            log.exception("failed")
    finally:
        logging.getLogger().removeHandler(handler)
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert lines[0]["msg"] == "scheduled train-0"
    assert lines[0]["job"] == "default/train" and lines[0]["group"] == "train"
    assert lines[0]["pod"] == "train-0" and "node" not in lines[0]
    assert lines[0]["nodes"] == ["n1", "n2"] and lines[0]["level"] == "info"
    assert lines[0]["logger"] == "fluxnetes.test" and lines[0]["ts"].endswith("+00:00")
    assert "job" not in lines[1]
    assert "ValueError: bad" in lines[2]["exc"]


def test_text_logs_and_bad_configuration() -> None:
    stream = io.StringIO()
    handler = configure_logging("info", "text", stream)
    try:
        with log_context(job="j1"):
            logging.getLogger("x").info("hello")
        logging.getLogger("x").debug("hidden")
    finally:
        logging.getLogger().removeHandler(handler)
    out = stream.getvalue()
    assert "hello job=j1" in out and "hidden" not in out
    with pytest.raises(ValueError, match="log format"):
        configure_logging("INFO", "xml")
    with pytest.raises(ValueError, match="log level"):
        configure_logging("LOUD", "json")


def test_grafana_dashboard_uses_only_metrics_that_exist(metrics: Metrics) -> None:
    import re
    from pathlib import Path

    dash = json.loads(
        (
            Path(__file__).resolve().parents[1] / "deploy/grafana/fluxnetes-dashboard.json"
        ).read_text()
    )
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    used = {m for e in exprs for m in re.findall(r"\b(fluxnetes_[a-z_]+?)(?:_bucket)?\{", e)}
    families = {f.name for f in metrics.registry.collect()}
    known = families | {f"{name}_total" for name in families}
    assert used, "no fluxnetes metric found in the dashboard"
    assert used <= known, f"dashboard uses unknown metrics: {sorted(used - known)}"
    assert len({p["id"] for p in dash["panels"]}) == len(dash["panels"])


def test_serve_and_log_configuration_from_the_environment() -> None:
    from fluxnetes.logging import configure_from_env
    from fluxnetes.metrics import serve_from_env

    assert serve_from_env(environ={}) is None
    assert serve_from_env(environ={"FLUXNETES_METRICS_PORT": "0"}) is None
    with pytest.raises(ValueError, match="FLUXNETES_METRICS_PORT"):
        serve_from_env(environ={"FLUXNETES_METRICS_PORT": "http"})
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = serve_from_env(Health(ready=True), environ={"FLUXNETES_METRICS_PORT": str(port)})
    assert server is not None
    try:
        code, body = _get(f"http://127.0.0.1:{port}/metrics")
        assert code == 200 and "fluxnetes_build_info" in body
    finally:
        server.close()
    handler = configure_from_env("INFO", environ={"FLUXNETES_LOG_FORMAT": "text"})
    try:
        assert type(handler.formatter).__name__ == "TextFormatter"
    finally:
        logging.getLogger().removeHandler(handler)
    with pytest.raises(ValueError, match="log format"):
        configure_from_env("INFO", environ={"FLUXNETES_LOG_FORMAT": "xml"})


def test_gc_pauses_are_counted_by_generation(metrics: Metrics) -> None:
    import gc

    metrics.track_gc()
    metrics.track_gc()  # once only, however often asked
    try:
        assert gc.callbacks.count(metrics._on_gc) == 1
        assert metrics.gc_total() == 0.0
        gc.collect(2)
        got = samples(metrics)
        assert got[("fluxnetes_gc_seconds_total", (("generation", "2"),))] > 0
        assert metrics.gc_total() == pytest.approx(got[("fluxnetes_gc_seconds_total", (("generation", "2"),))])
    finally:
        gc.callbacks.remove(metrics._on_gc)


def test_json_logs_with_a_value_orjson_cannot_write() -> None:
    stream = io.StringIO()
    handler = configure_logging("INFO", "json", stream)
    try:
        logging.getLogger("fluxnetes.test").info("big", extra={"n": 2**70, "word": "Grüße"})
    finally:
        logging.getLogger().removeHandler(handler)
    line = json.loads(stream.getvalue())
    assert line["n"] == 2**70 and line["word"] == "Grüße" and line["msg"] == "big"
