"""Where the time goes between an MPIJob's launcher ending and the next MPIJob's placement.

Issue #31 row c: fluxnetes placed the first wave of MPIJobs within seconds, but their groups
were released minutes after their 30 s launchers ended. This runs bench/mpijob_bench.py's
setup (the real MPI Operator v0.6.0, `--addons mpi`, kwok nodes, half of them taken by
whole-node pods nobody gangs) with the fluxnetes operator only, and watches pods, MPIJobs and
FluxJobs of the run's namespace, stamping every event with the wall clock. Per MPIJob:

    launcher pod Succeeded (kwok) -> MPIJob condition Succeeded (MPI Operator)
    -> first / last worker deletionTimestamp -> last worker gone (DELETED)
    -> FluxJob phase Completed (fluxnetes releases the group)
    -> the next MPIJob resumed after that release (spec.runPolicy.suspend false)
    -> its first pod created -> its last pod bound

and, after the run, the MPI Operator's log lines about client-side throttling and its work
queue metrics (client-go's workqueue_* series on its monitoring port).

    .venv/bin/python bench/mpijob_release_breakdown.py --nodes 200 --jobs 20 --run-seconds 30

Writes bench/results/mpijob_release_breakdown.json (`--output`).
"""

from __future__ import annotations

import argparse
import asyncio
import calendar
import contextlib
import json
import os
import platform
import re
import shutil
import statistics
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import mpijob_bench as mb

from fluxnetes.devcluster import Cluster, ClusterOptions, NodeShape
from fluxnetes.k8s.kube import FLUXJOBS, NAMESPACES, PODS, Kube, Resource

RESULTS = Path(__file__).resolve().parent / "results" / "mpijob_release_breakdown.json"


class Stamps:
    """First wall-clock time each (object, event) was seen by the watches."""

    def __init__(self) -> None:
        self.t: dict[tuple[str, str], float] = {}
        self.pods: dict[str, dict[str, str]] = {}  # pod name -> {job, role}

    def mark(self, key: str, what: str, now: float) -> None:
        self.t.setdefault((key, what), now)

    def pod(self, etype: str, pod: dict[str, Any], now: float) -> None:
        meta = pod.get("metadata") or {}
        labels = meta.get("labels") or {}
        job = labels.get(mb.JOB_NAME)
        if not job:
            return
        name = meta.get("name", "")
        self.pods.setdefault(name, {"job": job, "role": labels.get(mb.JOB_ROLE, "")})
        self.mark(name, "created", now)
        if (pod.get("spec") or {}).get("nodeName"):
            self.mark(name, "bound", now)
        if (pod.get("status") or {}).get("phase") == "Succeeded":
            self.mark(name, "succeeded", now)
        if meta.get("deletionTimestamp"):
            self.mark(name, "deleting", now)
        if etype == "DELETED":
            self.mark(name, "gone", now)

    def mpijob(self, obj: dict[str, Any], now: float) -> None:
        name = obj["metadata"]["name"]
        if not ((obj.get("spec") or {}).get("runPolicy") or {}).get("suspend"):
            self.mark(name, "resumed", now)
        for c in (obj.get("status") or {}).get("conditions") or []:
            if c.get("type") == "Succeeded" and c.get("status") == "True":
                self.mark(name, "mpijob_succeeded", now)

    def fluxjob(self, obj: dict[str, Any], now: float) -> None:
        phase = (obj.get("status") or {}).get("phase")
        name = obj["metadata"]["name"]  # an MPIJob's FluxJob is mpijob-<its name>
        if phase and name.startswith("mpijob-"):
            self.mark(name.removeprefix("mpijob-"), f"fluxjob_{phase}", now)


async def watch(kube: Kube, res: Resource, ns: str, on: Any, stop: asyncio.Event) -> None:
    items, rv = await kube.list(res, ns)
    for o in items:
        on("ADDED", o, time.time())
    while not stop.is_set():
        try:
            async for ev in kube.watch(res, rv, field_selector=f"metadata.namespace={ns}", timeout_seconds=60):
                obj = ev.get("object") or {}
                if ev.get("type") == "ERROR":
                    items, rv = await kube.list(res, ns)
                    for o in items:
                        on("ADDED", o, time.time())
                    break
                rv = (obj.get("metadata") or {}).get("resourceVersion", rv)
                if ev.get("type") in ("ADDED", "MODIFIED", "DELETED"):
                    on(str(ev["type"]), obj, time.time())
        except Exception as exc:  # timeouts, API errors: watch again
            print("watch:", repr(exc), file=sys.stderr)
            await asyncio.sleep(0.5)


def breakdown(s: Stamps, jobs: list[str], t0: float) -> dict[str, Any]:
    """Per MPIJob, the stamps (seconds after the first create) and the intervals between them."""
    per: dict[str, dict[str, Any]] = {}
    for job in jobs:
        pods = [p for p, v in s.pods.items() if v["job"] == job]
        workers = [p for p in pods if s.pods[p]["role"] == "worker"]
        launchers = [p for p in pods if s.pods[p]["role"] == "launcher"]

        def first(names: list[str], what: str) -> float | None:
            ts = [s.t[(p, what)] for p in names if (p, what) in s.t]
            return min(ts) if ts else None

        def last(names: list[str], what: str) -> float | None:
            ts = [s.t[(p, what)] for p in names if (p, what) in s.t]
            return max(ts) if ts and len(ts) == len(names) else None

        raw = {
            "resumed": s.t.get((job, "resumed")),
            "first_pod_created": first(pods, "created"),
            "last_pod_bound": last(pods, "bound"),
            "launcher_succeeded": first(launchers, "succeeded"),
            "mpijob_succeeded": s.t.get((job, "mpijob_succeeded")),
            "first_worker_deleting": first(workers, "deleting"),
            "last_worker_deleting": last(workers, "deleting"),
            "last_worker_gone": last(workers, "gone"),
            "fluxjob_completed": s.t.get((job, "fluxjob_Completed")),
        }
        per[job] = {k: (round(v - t0, 2) if v is not None else None) for k, v in raw.items()}
    # the next MPIJob resumed after each release: capacity given back -> used again
    resumes = sorted((v["resumed"], j) for j, v in per.items() if v["resumed"] is not None)
    for v in per.values():
        rel = v["fluxjob_completed"]
        nxt = next((j for r, j in resumes if rel is not None and r >= rel), None)
        v["next_resumed_mpijob"] = nxt
        if nxt is not None:
            n = per[nxt]
            v["next_resumed"], v["next_first_pod_created"], v["next_last_pod_bound"] = (
                n["resumed"], n["first_pod_created"], n["last_pod_bound"])
    steps = [("launcher_succeeded", "mpijob_succeeded"), ("mpijob_succeeded", "first_worker_deleting"),
             ("first_worker_deleting", "last_worker_deleting"), ("last_worker_deleting", "last_worker_gone"),
             ("last_worker_gone", "fluxjob_completed"), ("fluxjob_completed", "next_resumed"),
             ("next_resumed", "next_first_pod_created"), ("next_first_pod_created", "next_last_pod_bound"),
             ("launcher_succeeded", "fluxjob_completed"), ("resumed", "last_pod_bound")]
    for v in per.values():
        v["intervals"] = {f"{a}->{b}": (round(v[b] - v[a], 2) if v.get(a) is not None and v.get(b) is not None
                                        else None) for a, b in steps}
    summary: dict[str, Any] = {}
    for a, b in steps:
        xs = [v["intervals"][f"{a}->{b}"] for v in per.values() if v["intervals"][f"{a}->{b}"] is not None]
        if xs:
            summary[f"{a}->{b}"] = {"n": len(xs), "min": min(xs), "median": round(statistics.median(xs), 2),
                                    "max": max(xs)}
    return {"per_mpijob": per, "summary_seconds": summary}


SYNC_LINE = re.compile(r'^I(\d{4}) (\d\d:\d\d:\d\d\.\d+) .*Finished syncing job "[^/]+/([^"]+)" \(([0-9.]+)(ms|s|µs)\)')


def sync_times(log: Path, t0: float) -> dict[str, list[float]]:
    """Per MPIJob, when the MPI Operator finished a sync of it (its klog lines, UTC wall clock;
    seconds after ``t0``): a sync is when its work queue handed it the MPIJob."""
    day = time.strftime("%Y-%m-%d", time.gmtime(t0))
    out: dict[str, list[float]] = {}
    for line in log.read_text(errors="replace").splitlines():
        m = SYNC_LINE.match(line)
        if not m:
            continue
        when = calendar.timegm(time.strptime(f"{day} {m.group(2).split('.')[0]}", "%Y-%m-%d %H:%M:%S"))
        when += float("0." + m.group(2).split(".")[1])
        out.setdefault(m.group(3), []).append(round(when - t0, 2))
    return out


def sync_durations_ms(log: Path, ns: str) -> dict[str, Any]:
    """How long the MPI Operator's syncs of the run's MPIJobs took (its own log lines)."""
    unit = {"ms": 1.0, "s": 1000.0, "µs": 0.001}
    ms = [float(m.group(4)) * unit[m.group(5)] for line in log.read_text(errors="replace").splitlines()
          if (m := SYNC_LINE.match(line)) and f'"{ns}/' in line]
    if not ms:
        return {"n": 0}
    return {"n": len(ms), "median": round(statistics.median(ms), 1), "max": round(max(ms)),
            "total_seconds": round(sum(ms) / 1000, 1)}


def queue_waits(per: dict[str, dict[str, Any]], syncs: dict[str, list[float]]) -> dict[str, Any]:
    """Seconds from the launcher pod's Succeeded to the MPI Operator's next sync of that MPIJob
    (the sync that marks it Succeeded and deletes the workers), and syncs per MPIJob."""
    waits = []
    for job, v in per.items():
        end = v.get("launcher_succeeded")
        after = [t for t in syncs.get(job, []) if end is not None and t >= end]
        v["mpi_operator_syncs"] = len(syncs.get(job, []))
        v["mpi_operator_first_sync_after_launcher_succeeded"] = after[0] if after else None
        if after:
            waits.append(round(after[0] - end, 2))
    counts = [len(syncs.get(j, [])) for j in per]
    # syncs of the run's MPIJobs per 30 s: how busy its work queue let it be
    bins: dict[int, int] = {}
    for j in per:
        for t in syncs.get(j, []):
            bins[int(t // 30) * 30] = bins.get(int(t // 30) * 30, 0) + 1
    return {"launcher_succeeded_to_next_sync_seconds": sorted(waits),
            "syncs_per_mpijob": {"min": min(counts), "median": statistics.median(counts), "max": max(counts)}
            if counts else None,
            "syncs_per_30s": {str(k): bins[k] for k in sorted(bins)}}


def mpi_operator_evidence(cluster: Cluster) -> dict[str, Any]:
    """Throttling lines in the MPI Operator's log and its work-queue metrics."""
    out: dict[str, Any] = {}
    logs = sorted(Path(cluster.dir, "logs").glob("*mpi*"))
    out["log_files"] = [str(p.name) for p in logs]
    waits: list[float] = []
    for p in logs:
        for line in p.read_text(errors="replace").splitlines():
            m = re.search(r"Waited for ([0-9.]+)(ms|s) due to client-side throttling", line)
            if m:
                waits.append(float(m.group(1)) / (1000 if m.group(2) == "ms" else 1))
    out["client_side_throttling_lines"] = len(waits)
    out["client_side_throttling_max_seconds"] = max(waits) if waits else None
    ports = cluster.ports
    key = next((k for k in ports if "mpi" in k and "metrics" in k), None)
    if key:
        try:
            text = urllib.request.urlopen(f"http://127.0.0.1:{ports[key]}/metrics", timeout=10).read().decode()
            out["metrics"] = [ln for ln in text.splitlines() if not ln.startswith("#") and (
                ln.startswith("workqueue_") or ln.startswith("rest_client_requests_total")
                or ln.startswith("rest_client_rate_limiter") or ln.startswith("mpi_operator"))]
        except OSError as exc:
            out["metrics_error"] = repr(exc)
    return out


async def bench(args: argparse.Namespace, cluster: Cluster, workdir: Path, doc: dict[str, Any]) -> None:
    kube = await Kube.from_config(str(cluster.kubeconfig))
    op = None
    try:
        doc["fill_seconds"] = await mb.fill(kube, args)
        doc["mpi_operator_settle_seconds"] = await mb.settle(kube)
        op, path = mb.start_operator(cluster, workdir, "breakdown")
        await mb.wait_ready(path, op)
        ns = f"mpi-brk-{uuid.uuid4().hex[:5]}"
        await kube.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace",
                                       "metadata": {"name": ns, "labels": {"fluxnetes.io/enabled": "true"}}})
        await asyncio.sleep(1)
        s, stop = Stamps(), asyncio.Event()
        watchers = [asyncio.ensure_future(watch(kube, PODS, ns, s.pod, stop)),
                    asyncio.ensure_future(watch(kube, mb.MPIJOBS, ns, lambda e, o, n: s.mpijob(o, n), stop)),
                    asyncio.ensure_future(watch(kube, FLUXJOBS, ns, lambda e, o, n: s.fluxjob(o, n), stop))]
        await asyncio.sleep(1)
        doc["load_average_before"] = [round(x, 2) for x in os.getloadavg()]
        jobs = [f"mpi{i}" for i in range(args.jobs)]
        t0 = time.time()
        sem = asyncio.Semaphore(16)

        async def create(name: str) -> None:
            async with sem:
                await kube.create(mb.MPIJOBS, mb.mpijob_body(name, args), ns)

        await asyncio.gather(*(create(j) for j in jobs))
        while time.time() - t0 < args.timeout:
            await asyncio.sleep(2)
            done = sum(1 for j in jobs if (j, "fluxjob_Completed") in s.t)
            print(f"  {time.time() - t0:5.0f} s: {done}/{len(jobs)} groups released", flush=True)
            if done == len(jobs):
                break
        await asyncio.sleep(3)
        stop.set()
        for w in watchers:
            w.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await w
        doc["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
        doc["makespan_to_last_release_seconds"] = round(
            max((s.t[(j, "fluxjob_Completed")] for j in jobs if (j, "fluxjob_Completed") in s.t), default=t0) - t0, 2)
        doc.update(breakdown(s, jobs, t0))
        doc["mpi_operator"] = mpi_operator_evidence(cluster)
        doc["mpi_operator"]["queue"] = queue_waits(doc["per_mpijob"], sync_times(
            Path(cluster.dir, "logs", "addon-mpi.log"), t0))
        doc["mpi_operator"]["queue"]["sync_duration_ms"] = sync_durations_ms(
            Path(cluster.dir, "logs", "addon-mpi.log"), ns)
    finally:
        mb.stop_operator(op)
        await kube.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=200)
    ap.add_argument("--jobs", type=int, default=20)
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--node-cpu", default="4")
    ap.add_argument("--worker-cpu", default="4")
    ap.add_argument("--launcher-cpu", default="1")
    ap.add_argument("--busy-nodes", type=int, default=None, help="default: half")
    ap.add_argument("--run-seconds", type=int, default=30)
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--output", default=str(RESULTS))
    ap.add_argument("--keep-logs", default="", help="copy the operator and cluster logs into this directory")
    args = ap.parse_args()
    if args.busy_nodes is None:
        args.busy_nodes = args.nodes // 2
    doc: dict[str, Any] = {
        "benchmark": "mpijob_release_breakdown",
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "parameters": {"nodes": args.nodes, "busy_nodes": args.busy_nodes, "mpijobs": args.jobs,
                       "workers": args.workers, "node_cpu": args.node_cpu, "worker_cpu": args.worker_cpu,
                       "launcher_cpu": args.launcher_cpu, "launcher_run_seconds": args.run_seconds,
                       "scheduler": "fluxnetes operator (subprocess)",
                       "controllers": "real MPI Operator v0.6.0 (--addons mpi, devcluster/addons.py flags "
                                      "--kube-api-qps=200 --kube-api-burst=400 --threadiness=4), kwok timed pods",
                       "times": "seconds after the first MPIJob create, as first seen by this script's watches"},
        "machine": {"cpu_count": os.cpu_count(), "python": platform.python_version(),
                    "load_average_at_start": [round(x, 2) for x in os.getloadavg()]},
    }
    with tempfile.TemporaryDirectory(prefix="fx-mpibrk-") as tmp:
        cluster = Cluster.up(ClusterOptions(
            nodes=NodeShape(count=args.nodes, cpu=args.node_cpu, memory="16Gi"),
            dir=Path(tmp) / "cluster", die_with_parent=True, timed_pods=True, addons=("mpi",)))
        try:
            asyncio.run(bench(args, cluster, Path(tmp), doc))
        finally:
            if args.keep_logs:  # the operator's and the cluster's logs, for reading afterwards
                keep = Path(args.keep_logs)
                keep.mkdir(parents=True, exist_ok=True)
                for f in [*Path(tmp).glob("operator-*.log"), *Path(cluster.dir, "logs").glob("*")]:
                    if f.is_file():
                        shutil.copy(f, keep / f.name)
            cluster.down()
    doc["machine"]["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(doc, indent=2) + "\n")
    print(json.dumps(doc.get("summary_seconds", doc), indent=2))


if __name__ == "__main__":
    main()
