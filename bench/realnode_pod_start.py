"""How long a real pod takes from creation to Running on a real (kubelet) node: placed by
fluxnetes (the operator from the shell, its webhook and default modes) against kube-scheduler,
paired and alternating in one run on one dev cluster (docs/real-nodes.md).

Each sample creates one pod (busybox `sleep`, 100m cpu, on the real node) and polls it every
50 ms until its phase is Running; the pod is then deleted and gone before the next sample. The
order of the two paths alternates every pair. Needs root and hack/build-realnode.sh.

    sudo .venv/bin/python bench/realnode_pod_start.py --pairs 10

Writes bench/results/realnode_pod_start.json (samples, medians, parameters, machine load).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
from pathlib import Path
from typing import Any

from fluxnetes.devcluster import Cluster, ClusterOptions, NodeShape, realnode_config

RESULTS = Path(__file__).resolve().parent / "results" / "realnode_pod_start.json"
OP_NS = "fluxnetes-bench"


def pod_body(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {
            "nodeSelector": {realnode_config.REAL_NODE_LABEL: "true"},
            "terminationGracePeriodSeconds": 0,
            "containers": [{
                "name": "c", "image": realnode_config.BUSYBOX_IMAGE, "imagePullPolicy": "Never",
                "command": ["sleep", "3600"],
                "resources": {"requests": {"cpu": "100m", "memory": "16Mi"}},
            }],
        },
    }


def one(cluster: Cluster, ns: str, name: str, timeout: float = 120.0,
        by_fluxnetes: bool = False) -> float:
    """Seconds from the create request to phase Running seen. by_fluxnetes: the pod must carry
    the operator's placement (annotation fluxnetes.io/fluxjob), else the sample is refused."""
    start = time.perf_counter()
    cluster.api_call("POST", f"/api/v1/namespaces/{ns}/pods", pod_body(name))
    deadline = time.monotonic() + timeout
    while True:
        pod = cluster.api_get(f"/api/v1/namespaces/{ns}/pods/{name}")
        if (pod.get("status") or {}).get("phase") == "Running":
            took = time.perf_counter() - start
            placed = "fluxnetes.io/fluxjob" in (pod["metadata"].get("annotations") or {})
            if placed != by_fluxnetes:
                raise SystemExit(f"pod {ns}/{name}: placed by fluxnetes is {placed}, expected "
                                 f"{by_fluxnetes}: {pod['metadata']}")
            break
        if time.monotonic() > deadline:
            raise SystemExit(f"pod {ns}/{name} not Running after {timeout:.0f} s: {pod.get('status')}")
        time.sleep(0.05)
    cluster.api_call("DELETE", f"/api/v1/namespaces/{ns}/pods/{name}", {"gracePeriodSeconds": 0})
    while True:
        try:
            cluster.api_get(f"/api/v1/namespaces/{ns}/pods/{name}")
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return took
            raise
        if time.monotonic() > deadline + 60:
            raise SystemExit(f"pod {ns}/{name} not deleted")
        time.sleep(0.1)


def summary(xs: list[float]) -> dict[str, float]:
    s = sorted(xs)
    return {"median_s": round(statistics.median(s), 3), "min_s": round(s[0], 3),
            "max_s": round(s[-1], 3), "p90_s": round(s[min(len(s) - 1, int(0.9 * len(s)))], 3)}


def start_operator(cluster: Cluster, log: Path) -> subprocess.Popen[bytes]:
    """The operator from the shell, once ready, and the two namespaces the runs compare:
    bench-flux (opted in) and bench-default (kube-scheduler), each with its service account."""
    op = subprocess.Popen([sys.executable, "-m", "fluxnetes.k8s", "run", "--kubeconfig",
                           str(cluster.kubeconfig), "--webhook-port", "0", "--namespace", OP_NS],
                          stdout=log.open("wb"), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 90
    while "operator ready" not in log.read_text():
        if op.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"operator did not start:\n{log.read_text()[-2000:]}")
        time.sleep(0.2)
    cluster.kubectl("create", "namespace", "bench-flux")
    cluster.kubectl("label", "namespace", "bench-flux", "fluxnetes.io/enabled=true")
    cluster.kubectl("create", "namespace", "bench-default")
    for ns in ("bench-flux", "bench-default"):  # the service account exists
        cluster.wait_for(f"{ns}/default", lambda ns=ns: cluster._exists(
            f"/api/v1/namespaces/{ns}/serviceaccounts/default"), time.monotonic() + 60)
    return op


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", type=int, default=10)
    ap.add_argument("--output", type=Path, default=RESULTS)
    args = ap.parse_args()
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="fluxnetes-bench-realnode-") as tmp:
        t0 = time.monotonic()
        cluster = Cluster.up(ClusterOptions(nodes=NodeShape(count=2), dir=Path(tmp) / "c",
                                            die_with_parent=True, real_nodes=1))
        up_s = time.monotonic() - t0
        op = None
        try:
            op = start_operator(cluster, Path(tmp) / "operator.log")
            one(cluster, "bench-flux", "warm-flux", by_fluxnetes=True)  # first pays setup
            one(cluster, "bench-default", "warm-default")
            samples: dict[str, list[float]] = {"fluxnetes": [], "kube-scheduler": []}
            for i in range(args.pairs):
                order = [("fluxnetes", "bench-flux"), ("kube-scheduler", "bench-default")]
                for path, ns in (order if i % 2 == 0 else order[::-1]):
                    samples[path].append(round(one(cluster, ns, f"p{i}",
                                                   by_fluxnetes=path == "fluxnetes"), 4))
        finally:
            if op is not None and op.poll() is None:
                op.terminate()
                op.wait(timeout=30)
            cluster.down()
    result = {
        "benchmark": "realnode_pod_start",
        "what": "seconds from pod create to phase Running on a real kubelet node (busybox sleep)",
        "parameters": {"pairs": args.pairs, "poll_s": 0.05, "real_nodes": 1, "kwok_nodes": 2,
                       "operator": "python -m fluxnetes.k8s run (default modes, webhook on)"},
        "samples": samples,
        "fluxnetes": summary(samples["fluxnetes"]),
        "kube-scheduler": summary(samples["kube-scheduler"]),
        "ratio_median": round(statistics.median(samples["fluxnetes"])
                              / statistics.median(samples["kube-scheduler"]), 2),
        "cluster_up_s": round(up_s, 1),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                    "loadavg_before": load_before, "loadavg_after": os.getloadavg()},
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("fluxnetes", "kube-scheduler", "ratio_median")}, indent=2))


if __name__ == "__main__":
    main()
