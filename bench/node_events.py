"""What Node events cost the operator's loop at 1,000 and 5,000 nodes (no control plane).

At start the operator replays the initial list (one ADDED per node) and from then on every
node reports a heartbeat every few seconds (a MODIFIED whose only change is a condition's
time). Both arrive on the one event loop that also schedules; issue 17 saw that loop blocked
for minutes after "operator ready" at 5,000 nodes.

For each node count, in a fresh subprocess: the operator's Controller over N nodes of the dev
cluster's default shape (32 cpu, 256Gi, as kwok reports them), its graph built as at start;
then the seconds to handle N ADDED events (the replay) and N heartbeat MODIFIED events, and
(``--jobs J``) the in-process path of J single-pod Jobs as the operator sees them (Job ADDED,
a cycle, its pod ADDED, a cycle that places it; API writes go nowhere): seconds and pods
placed, i.e. the operator's own CPU per pod at that size, without the API server's.
``--compare REV`` runs the same measurement on the code of git revision REV (a temporary
worktree) in the same run, for a before/after.

    .venv/bin/python bench/node_events.py [--nodes 1000 5000] [--compare HEAD~1]

Writes bench/results/node_events.json (parameters, figures, load average, machine).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "results" / "node_events.json"


class _NoWrites:
    """The API client the Controller is given: node events write nothing; say so if they do."""

    writes = 0

    async def create(self, *a: Any, **k: Any) -> dict[str, Any]:
        self.writes += 1
        return {"metadata": {"uid": "x"}}

    async def patch(self, *a: Any, **k: Any) -> dict[str, Any]:
        self.writes += 1
        return {}

    async def request(self, *a: Any, **k: Any) -> dict[str, Any]:
        self.writes += 1
        return {}


def _job(i: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """A single-pod Job as admitted (suspended by fluxnetes, template gated) and its pod."""
    from fluxnetes.k8s import names
    from fluxnetes.k8s.workloads.job import ANN_SUSPENDED_BY

    spec = {"schedulingGates": [{"name": names.GATE}],
            "containers": [{"name": "c", "resources": {"requests": {"cpu": "1", "memory": "64Mi"}}}]}
    job = {"apiVersion": "batch/v1", "kind": "Job",
           "metadata": {"name": f"j{i}", "namespace": "bench", "uid": f"job-{i}",
                        "annotations": {ANN_SUSPENDED_BY: "fluxnetes"}},
           "spec": {"parallelism": 1, "completions": 1, "suspend": True,
                    "template": {"metadata": {"labels": {names.LABEL_MANAGED: "true"}}, "spec": spec}}}
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": f"j{i}-p", "namespace": "bench", "uid": f"pod-{i}",
                        "labels": {names.LABEL_MANAGED: "true"},
                        "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": f"j{i}",
                                             "uid": f"job-{i}", "controller": True}]},
           "spec": copy.deepcopy(spec), "status": {"phase": "Pending"}}
    return job, pod


async def _jobs(c: Any, count: int, batch: int = 100) -> tuple[float, int]:
    """J single-pod Jobs through the operator's loop, ``batch`` arrivals per cycle."""
    import asyncio

    t0 = time.perf_counter()
    made = [_job(i) for i in range(count)]
    for start in range(0, count, batch):
        for job, _ in made[start:start + batch]:
            c.handle(("Job", "ADDED", job))
        c.scheduling.run_cycle()
        for _, pod in made[start:start + batch]:
            c.handle(("Pod", "ADDED", pod))
        c.scheduling.run_cycle()
        while c._tasks:
            await asyncio.gather(*list(c._tasks), return_exceptions=True)
    placed = sum(1 for g in c.groups.values() if any(g.slot_pod))
    for _ in range(1000):  # the cycles that follow (a cycle starts a bounded number of jobs)
        c.scheduling.run_cycle()
        while c._tasks:
            await asyncio.gather(*list(c._tasks), return_exceptions=True)
        now = sum(1 for g in c.groups.values() if any(g.slot_pod))
        if now == placed and not c.dirty:
            break
        placed = now
    return time.perf_counter() - t0, placed


def measure(n: int, jobs: int = 0) -> dict[str, Any]:
    from fluxnetes.devcluster.nodes import NodeShape
    from fluxnetes.k8s.config import OperatorConfig
    from fluxnetes.k8s.controller import Controller

    nodes = NodeShape(count=n).validate().manifests()
    for m in nodes:  # as kwok reports them: Ready, with a heartbeat time
        m["status"]["conditions"] = [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                      "lastHeartbeatTime": "2026-11-26T00:00:00Z"}]
    kube = _NoWrites()
    c = Controller(kube, OperatorConfig())  # type: ignore[arg-type]
    t0 = time.perf_counter()
    for m in nodes:
        c.cluster.know_node(m)
    c.cluster.build_matcher()
    if hasattr(c, "node_view"):
        c.cluster.node_view.reset(c.cluster.nodes.values())
    build = time.perf_counter() - t0
    t0 = time.perf_counter()
    for m in nodes:
        c.handle(("Node", "ADDED", m))
    replay = time.perf_counter() - t0
    beats = []
    for m in nodes:
        b = copy.deepcopy(m)
        b["status"]["conditions"][0]["lastHeartbeatTime"] = "2026-11-26T00:00:10Z"
        beats.append(b)
    t0 = time.perf_counter()
    for b in beats:
        c.handle(("Node", "MODIFIED", b))
    heartbeat = time.perf_counter() - t0
    out_jobs: dict[str, Any] = {}
    if jobs:
        import asyncio

        c.reconciled = True
        secs, placed = asyncio.run(_jobs(c, jobs))
        out_jobs = {"jobs": jobs, "jobs_s": round(secs, 3), "pods_placed": placed,
                    "ms_per_pod": round(secs / max(placed, 1) * 1000, 2)}
    return {"nodes": n, "build_s": round(build, 3), "replay_s": round(replay, 3), **out_jobs,
            "replay_us_per_event": round(replay / n * 1e6, 1),
            "heartbeats_s": round(heartbeat, 3), "heartbeat_us_per_event": round(heartbeat / n * 1e6, 1),
            "api_writes": kube.writes}


def _child(src: Path, n: int, jobs: int) -> dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=str(src))
    out = subprocess.run([sys.executable, __file__, "--child", str(n), "--jobs", str(jobs)], env=env,
                         capture_output=True, text=True, check=True)
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, nargs="+", default=[1000, 5000])
    ap.add_argument("--compare", metavar="REV", help="also measure git revision REV (before/after)")
    ap.add_argument("--jobs", type=int, default=1000, help="single-pod Jobs through the loop (0: none)")
    ap.add_argument("--child", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--output", type=Path, default=OUT)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(measure(args.child, args.jobs)))
        return
    runs: dict[str, list[dict[str, Any]]] = {"current": []}
    rev = None
    with tempfile.TemporaryDirectory() as tmp:
        trees = {"current": ROOT / "src"}
        if args.compare:
            rev = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", args.compare],
                                 capture_output=True, text=True, check=True).stdout.strip()
            wt = Path(tmp) / "before"
            subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(wt), rev],
                           capture_output=True, check=True)
            trees = {f"before ({rev})": wt / "src", **trees}
            runs = {f"before ({rev})": [], "current": []}
        try:
            for n in args.nodes:
                for label, src in trees.items():
                    r = _child(src, n, args.jobs)
                    runs[label].append(r)
                    print(f"{label:>16}  {n:>5} nodes: replay {r['replay_s']:.3f} s "
                          f"({r['replay_us_per_event']} us/event), heartbeats {r['heartbeats_s']:.3f} s "
                          f"({r['heartbeat_us_per_event']} us/event)"
                          + (f", {r['pods_placed']}/{r['jobs']} Jobs placed in {r['jobs_s']:.2f} s "
                             f"({r['ms_per_pod']} ms/pod)" if args.jobs else ""), flush=True)
        finally:
            if args.compare:
                subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(Path(tmp) / "before")],
                               capture_output=True)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps({
        "benchmark": "node_events",
        "parameters": {"nodes": args.nodes, "jobs": args.jobs, "compare": rev, "node_shape": "dev cluster default (devcluster/nodes.py)"},
        "runs": runs,
        "machine": {"cpu_count": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform(),
                    "load_avg": list(os.getloadavg())},
        "written_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }, indent=2) + "\n")
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
