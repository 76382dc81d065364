"""Where the operator's time goes: each single-pod Job's path through its stages.

Creates ``--jobs`` single-pod Jobs in an opted-in namespace of a fresh local control plane
(kwok nodes) with the operator running, watches Jobs and pods, and stamps (local clock) when
each Job was created, resumed (suspend false), its pod created, ungated (placed by fluxnetes)
and bound. Reports, per stage, the median / p90 of the step and the time at which the last
Job passed it, plus the operator's CPU seconds and the API requests it made per Job (from its
/metrics if served, else not reported).

    .venv/bin/python bench/operator_stages.py --nodes 100 --jobs 500 [--operator-arg=--job-mode=gate]

Writes bench/results/operator_stages.json.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from operator_bench import JOBS, _cpu_seconds, api_requests, job_body

from fluxnetes.devcluster import Cluster, ClusterOptions, NodeShape
from fluxnetes.k8s.kube import NAMESPACES, PODS, Kube

RESULTS = Path(__file__).resolve().parent / "results" / "operator_stages.json"
STAGES = ("created", "resumed", "pod_created", "ungated", "bound")


async def watch(kube: Kube, res: Any, ns: str, on: Any, stop: asyncio.Event) -> None:
    _, rv = await kube.list(res, ns)
    while not stop.is_set():
        try:
            async for ev in kube.watch(res, rv, timeout_seconds=60):
                obj = ev.get("object") or {}
                rv = str((obj.get("metadata") or {}).get("resourceVersion", rv))
                if ev.get("type") in ("ADDED", "MODIFIED"):
                    on(obj)
                if stop.is_set():
                    return
        except Exception:
            await asyncio.sleep(0.2)


async def run(args: argparse.Namespace, cluster: Cluster) -> dict[str, Any]:
    kube = await Kube.from_config(str(cluster.kubeconfig))
    log = Path(args.workdir) / "operator.log"
    op = subprocess.Popen(
        [sys.executable, "-m", "fluxnetes.k8s", "run", "--kubeconfig", str(cluster.kubeconfig),
         "--webhook-port", "0", *args.operator_arg],
        stdout=log.open("wb"), stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and "operator ready" not in log.read_text():
            await asyncio.sleep(0.5)
        ns = f"stages-{uuid.uuid4().hex[:6]}"
        await kube.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace",
                                       "metadata": {"name": ns, "labels": {"fluxnetes.io/enabled": "true"}}})
        await asyncio.sleep(1)
        t: dict[str, dict[str, float]] = {}
        stop = asyncio.Event()

        def on_job(obj: dict[str, Any]) -> None:
            name = obj["metadata"]["name"]
            if obj["spec"].get("suspend") is False or not obj["spec"].get("suspend"):
                t.setdefault(name, {}).setdefault("resumed", time.monotonic())

        def on_pod(obj: dict[str, Any]) -> None:
            name = (obj["metadata"].get("labels") or {}).get("job-name")
            if not name:
                return
            now = time.monotonic()
            st = t.setdefault(name, {})
            st.setdefault("pod_created", now)
            if not obj["spec"].get("schedulingGates"):
                st.setdefault("ungated", now)
            if obj["spec"].get("nodeName"):
                st.setdefault("bound", now)
                if sum(1 for v in t.values() if "bound" in v) >= args.jobs:
                    stop.set()

        watchers = [asyncio.ensure_future(watch(kube, JOBS, ns, on_job, stop)),
                    asyncio.ensure_future(watch(kube, PODS, ns, on_pod, stop))]
        await asyncio.sleep(0.5)
        cpu0 = _cpu_seconds(op)
        req0 = await api_requests(kube)
        t0 = time.monotonic()
        sem = asyncio.Semaphore(32)

        async def create(i: int) -> None:
            name = f"s-{i}"
            async with sem:
                await kube.create(JOBS, job_body(name, 1), ns)
            t.setdefault(name, {})["created"] = time.monotonic()

        await asyncio.gather(*(create(i) for i in range(args.jobs)))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), args.timeout)
        stop.set()
        for w in watchers:
            w.cancel()
        cpu = _cpu_seconds(op) - cpu0
        req1 = await api_requests(kube)
        per_job = {k: round((v - req0.get(k, 0)) / args.jobs, 2) for k, v in req1.items()}
        per_job = dict(sorted(((k, v) for k, v in per_job.items() if v >= 0.05), key=lambda kv: -kv[1]))
        out: dict[str, Any] = {"jobs": args.jobs, "bound": sum(1 for v in t.values() if "bound" in v),
                               "seconds_to_all_bound": round(max(v.get("bound", 0) for v in t.values()) - t0, 3),
                               "operator_cpu_seconds": round(cpu, 2), "stages": {},
                               "api_requests_per_job": per_job}
        prev = None
        for stage in STAGES:
            at = [v[stage] - t0 for v in t.values() if stage in v]
            entry: dict[str, Any] = {"last_at_s": round(max(at), 3) if at else None,
                                     "median_at_s": round(statistics.median(at), 3) if at else None}
            if prev is not None:
                steps = sorted(v[stage] - v[prev] for v in t.values() if stage in v and prev in v)
                if steps:
                    entry["step_median_s"] = round(statistics.median(steps), 3)
                    entry["step_p90_s"] = round(steps[int(len(steps) * 0.9) - 1], 3)
            out["stages"][stage] = entry
            prev = stage
        await kube.delete(NAMESPACES, ns)
        return out
    finally:
        op.send_signal(signal.SIGTERM)
        op.wait(timeout=30)
        await kube.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=100)
    ap.add_argument("--jobs", type=int, default=500)
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--operator-arg", action="append", default=[], help="extra `fluxnetes run` argument")
    ap.add_argument("--output", default=str(RESULTS))
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="fx-stages-") as tmp:
        args.workdir = tmp
        cluster = Cluster.up(ClusterOptions(nodes=NodeShape(count=args.nodes, cpu="32", memory="256Gi"),
                                            dir=Path(tmp) / "cluster", die_with_parent=True))
        try:
            result = asyncio.run(run(args, cluster))
        finally:
            cluster.down()
    out = {"benchmark": "operator_stages",
           "parameters": {"nodes": args.nodes, "jobs": args.jobs, "operator_args": args.operator_arg},
           "machine": {"cpu_count": os.cpu_count(), "python": platform.python_version(),
                       "platform": platform.platform()},
           "result": result}
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
