"""How long a real MPIJob takes from creation until its ranks run, on the real-node dev cluster:
placed by fluxnetes (held, allocated as one gang, resumed) against kube-scheduler (the same
MPIJob in a namespace fluxnetes does not manage), paired and alternating in one run
(docs/real-nodes.md, "An MPIJob on the real nodes").

Each sample creates examples/k8s/realnode-mpijob.yaml (a launcher and 3 workers of the MPI
image on 2 real nodes; the launcher runs `mpirun -n 3` of an allreduce) and polls its pods
every 100 ms. Recorded per sample, in seconds from the create request:
  pods_running  all 4 pods seen Running (the launcher may already be done: Succeeded counts);
  ranks_done    the launcher's log line "allreduce OK" (every rank ran the allreduce), by the
                kubelet's timestamp of that line (`kubectl logs --timestamps`, this machine's clock);
  succeeded     the MPIJob's Succeeded condition seen.
The MPIJob is deleted and its pods gone before the next sample. Needs root,
hack/build-realnode.sh (with the MPI image) and hack/build-addons.sh mpi.

    sudo .venv/bin/python bench/realnode_mpijob.py --pairs 3

Writes bench/results/realnode_mpijob.json (samples, medians, parameters, machine load).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from fluxnetes.devcluster import Cluster, ClusterOptions, NodeShape, realnode

sys.path.insert(0, str(Path(__file__).resolve().parent))
from realnode_pod_start import start_operator

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "realnode_mpijob.json"
EXAMPLE = ROOT / "examples" / "k8s" / "realnode-mpijob.yaml"
JOB_NAME = "training.kubeflow.org/job-name"
OP_NS = "fluxnetes-bench"


def _succeeded(obj: dict[str, Any]) -> bool | None:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("status") == "True" and c.get("type") in ("Succeeded", "Failed"):
            return c["type"] == "Succeeded"
    return None


def one(cluster: Cluster, ns: str, name: str, by_fluxnetes: bool, timeout: float = 240.0) -> dict[str, float]:
    job = yaml.safe_load(EXAMPLE.read_text())
    job["metadata"]["name"] = name
    base = f"/apis/kubeflow.org/v2beta1/namespaces/{ns}/mpijobs"
    start_wall = time.time()
    start = time.perf_counter()
    cluster.api_call("POST", base, job)
    out: dict[str, float] = {}
    deadline = time.monotonic() + timeout
    while "succeeded" not in out:
        if "pods_running" not in out:
            pods = cluster.api_get(f"/api/v1/namespaces/{ns}/pods?labelSelector={JOB_NAME}%3D{name}")["items"]
            if len(pods) == 4 and all(p["status"].get("phase") in ("Running", "Succeeded") for p in pods):
                out["pods_running"] = round(time.perf_counter() - start, 3)
                placed = {"fluxnetes.io/fluxjob" in (p["metadata"].get("annotations") or {}) for p in pods}
                if placed != {by_fluxnetes}:
                    raise SystemExit(f"MPIJob {ns}/{name}: placed by fluxnetes {placed}, expected {by_fluxnetes}")
        done = _succeeded(cluster.api_get(f"{base}/{name}"))
        if done is not None:
            if not done:
                raise SystemExit(f"MPIJob {ns}/{name} failed")
            out["succeeded"] = round(time.perf_counter() - start, 3)
        if time.monotonic() > deadline:
            raise SystemExit(f"MPIJob {ns}/{name} not done after {timeout:.0f} s: {out}")
        time.sleep(0.1)
    log = cluster.kubectl("logs", "-n", ns, f"job/{name}-launcher", "--timestamps").stdout
    ok = [ln for ln in log.splitlines() if "allreduce OK: 3 ranks" in ln]
    if not ok:
        raise SystemExit(f"MPIJob {ns}/{name}: no 'allreduce OK' in the launcher's log:\n{log}")
    stamp = datetime.datetime.fromisoformat(ok[0].split()[0].replace("Z", "+00:00"))
    out["ranks_done"] = round(stamp.timestamp() - start_wall, 3)
    cluster.kubectl("delete", "mpijob", name, "-n", ns, "--wait=true", timeout=120)
    gone = time.monotonic() + 120
    while cluster.api_get(f"/api/v1/namespaces/{ns}/pods?labelSelector={JOB_NAME}%3D{name}")["items"]:
        if time.monotonic() > gone:
            raise SystemExit(f"pods of MPIJob {ns}/{name} not gone")
        time.sleep(0.2)
    return out


def summary(xs: list[float]) -> dict[str, float]:
    s = sorted(xs)
    return {"median_s": round(statistics.median(s), 3), "min_s": round(s[0], 3), "max_s": round(s[-1], 3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--output", type=Path, default=RESULTS)
    args = ap.parse_args()
    archive = realnode.images_dir(Path.home() / ".cache" / "fluxnetes" / "k8s") / "mpi.tar"
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="fluxnetes-bench-mpijob-") as tmp:
        t0 = time.monotonic()
        cluster = Cluster.up(ClusterOptions(nodes=NodeShape(count=1), dir=Path(tmp) / "c",
                                            die_with_parent=True, real_nodes=2, addons=("mpi",)))
        up_s = time.monotonic() - t0
        op = None
        try:
            t0 = time.monotonic()
            realnode.import_images(cluster, archive)
            import_s = time.monotonic() - t0
            op = start_operator(cluster, Path(tmp) / "operator.log")
            samples: dict[str, list[dict[str, float]]] = {"fluxnetes": [], "kube-scheduler": []}
            for i in range(args.pairs):
                order = [("fluxnetes", "bench-flux"), ("kube-scheduler", "bench-default")]
                for path, ns in (order if i % 2 == 0 else order[::-1]):
                    got = one(cluster, ns, f"mpi{i}", by_fluxnetes=path == "fluxnetes")
                    print(path, got, flush=True)
                    samples[path].append(got)
        finally:
            if op is not None and op.poll() is None:
                op.terminate()
                op.wait(timeout=30)
            cluster.down()
    metrics = ("pods_running", "ranks_done", "succeeded")
    result = {
        "benchmark": "realnode_mpijob",
        "what": "seconds from MPIJob create to: all 4 pods Running, the allreduce done on every "
                "rank (launcher log 'allreduce OK', kubelet timestamp), MPIJob Succeeded",
        "parameters": {"pairs": args.pairs, "poll_s": 0.1, "real_nodes": 2, "kwok_nodes": 1,
                       "mpijob": "examples/k8s/realnode-mpijob.yaml (launcher + 3 workers, mpirun -n 3)",
                       "operator": "python -m fluxnetes.k8s run (default modes, webhook on)"},
        "samples": samples,
        **{path: {m: summary([s[m] for s in samples[path]]) for m in metrics} for path in samples},
        "cluster_up_s": round(up_s, 1),
        "mpi_image_import_s": round(import_s, 1),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                    "loadavg_before": load_before, "loadavg_after": os.getloadavg()},
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({p: result[p] for p in samples}, indent=2))


if __name__ == "__main__":
    main()
