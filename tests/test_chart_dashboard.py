"""deploy/grafana/fluxnetes-dashboard.json covers every metric the operator exports.

tests/test_metrics.py checks the other direction (the dashboard queries only metrics that
exist). Here: each `fluxnetes_*` family of `fluxnetes.metrics.Metrics` (what the operator's
/metrics serves besides the Python runtime collectors) is drawn by at least one panel, and
the dashboard is well formed (unique panel ids, panels do not overlap, every query filters
on the `$job` variable and uses the `$datasource` one).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from fluxnetes.metrics import Metrics

DASHBOARD = Path(__file__).resolve().parents[1] / "deploy/grafana/fluxnetes-dashboard.json"


def panels() -> list[dict[str, Any]]:
    return list(json.loads(DASHBOARD.read_text())["panels"])


def exported_families() -> set[str]:
    registry = CollectorRegistry()
    Metrics(registry)
    return {m.name for m in registry.collect() if m.name.startswith("fluxnetes_")}


def test_every_exported_metric_has_a_panel() -> None:
    exprs = " ".join(t["expr"] for p in panels() for t in p["targets"])
    drawn = {name for name in exported_families() if re.search(rf"\b{name}(_bucket|_total|_count|_sum)?\b", exprs)}
    missing = sorted(exported_families() - drawn)
    assert len(exported_families()) >= 14
    assert missing == [], f"metrics with no panel in {DASHBOARD.name}: {missing}"


def test_the_issue_list_is_in_the_dashboard() -> None:
    """Issue 6: queue length by state, cycle duration and match latency histograms,
    allocations, releases, foreign allocations, sync lag, webhook latency, reconcile errors."""
    exprs = " ".join(t["expr"] for p in panels() for t in p["targets"])
    for needle in (
        "sum by (state) (fluxnetes_queue_jobs",
        "histogram_quantile(0.99, sum by (le) (rate(fluxnetes_scheduling_cycle_duration_seconds_bucket",
        "histogram_quantile(0.99, sum by (le) (rate(fluxnetes_match_duration_seconds_bucket",
        "rate(fluxnetes_allocations_total",
        "rate(fluxnetes_releases_total",
        "rate(fluxnetes_foreign_allocations_total",
        "fluxnetes_sync_lag_seconds_bucket",
        "fluxnetes_webhook_duration_seconds_bucket",
        "rate(fluxnetes_reconcile_errors_total",
    ):
        assert needle in exprs, needle


def test_dashboard_is_well_formed() -> None:
    doc = json.loads(DASHBOARD.read_text())
    variables = {v["name"] for v in doc["templating"]["list"]}
    assert {"datasource", "job"} <= variables
    ids = [p["id"] for p in panels()]
    assert len(ids) == len(set(ids))
    cells: dict[tuple[int, int], str] = {}
    for p in panels():
        g = p["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24, p["title"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"{p['title']} overlaps {cells[(x, y)]}"
                cells[(x, y)] = p["title"]
        assert p["datasource"]["uid"] == "${datasource}", p["title"]
        assert p["targets"], p["title"]
        for t in p["targets"]:
            assert '{job=~"$job"}' in t["expr"], (p["title"], t["expr"])
            assert t["expr"].count("(") == t["expr"].count(")"), t["expr"]
