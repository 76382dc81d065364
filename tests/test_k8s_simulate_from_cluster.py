"""`fluxnetes simulate --from-cluster KUBECONFIG` on a real control plane (issue #32, item 3):
the machine is the graph the operator builds from the cluster's Nodes, and a trace replays on
it through the operator's engine (the matcher is called)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

# two single-node jobs and one that needs every core of the cluster's nodes (it waits for both)
TRACE = ("1 0 -1 100 3 -1 -1 3 100 -1 1 1 1 -1 1 -1 -1 -1\n"
         "2 1 -1 100 2 -1 -1 2 100 -1 1 1 1 -1 1 -1 -1 -1\n"
         "3 2 -1 50 {all} -1 -1 {all} 50 -1 1 1 1 -1 1 -1 -1 -1\n")


def _ready_cores(nodes: dict[str, Any]) -> int:
    total = 0
    for node in nodes["items"]:
        ready = any(c.get("type") == "Ready" and c.get("status") == "True"
                    for c in node.get("status", {}).get("conditions") or [])
        unschedulable = node.get("spec", {}).get("unschedulable", False)
        if ready and not unschedulable:
            total += math.floor(float(node["status"]["allocatable"]["cpu"]))
    return total


def test_simulate_from_cluster_replays_a_trace_on_the_clusters_nodes(k8s_cluster: Any, tmp_path: Path) -> None:
    cores = _ready_cores(k8s_cluster.kubectl_json("get", "nodes", "-o", "json"))
    assert cores > 0
    trace = tmp_path / "trace.swf"
    trace.write_text(TRACE.format(all=cores))
    run = subprocess.run(
        [sys.executable, "-m", "fluxnetes", "simulate", str(trace), "--from-cluster", str(k8s_cluster.kubeconfig),
         "--json"],
        capture_output=True, text=True, timeout=300,
    )
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout)
    assert out["engine"] == "queue"
    assert out["cores"] == cores  # the cluster's schedulable cores, not the trace header's machine
    assert out["matcher_calls"] > 0
    assert out["rejected"] == 0 and not out["dropped"]
    # the job asking for every core starts only once the first two have ended (100 s after start)
    assert out["max_wait"] >= 98


def test_simulate_from_cluster_names_an_unreadable_kubeconfig(tmp_path: Path) -> None:
    trace = tmp_path / "trace.swf"
    trace.write_text(TRACE.format(all=4))
    run = subprocess.run(
        [sys.executable, "-m", "fluxnetes", "simulate", str(trace), "--from-cluster", str(tmp_path / "missing")],
        capture_output=True, text=True, timeout=120,
    )
    assert run.returncode != 0
    assert "--from-cluster" in run.stderr and "Traceback" not in run.stderr
