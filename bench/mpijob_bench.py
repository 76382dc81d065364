"""MPIJobs (the real MPI Operator) on kwok nodes: fluxnetes vs the default scheduler alone.

Issue #15's benchmark. In one cluster and one run (`--addons mpi`, timed pods), the same
batch of MPIJobs is submitted twice: into a namespace fluxnetes does not manage (the default
kube-scheduler alone, no operator running), then into an opted-in namespace with the fluxnetes
operator running. Each MPIJob is 1 launcher (`--launcher-cpu`, a Job pod that runs
`--run-seconds` then succeeds: kwok's timed pods) + `--workers` workers of `--worker-cpu`
(plain pods, running until the MPI Operator deletes them when the MPIJob succeeds).

Contention: the nodes have `--node-cpu` cpus and a worker takes a whole node by default; before
the runs `--busy-nodes` nodes (default: half) are taken by whole-node pods of a namespace
nobody gangs, so not all MPIJobs fit at once: they have to run in waves.

Recorded per scheduler, from a pod watch of the run's namespace and a sample every second:

- pods/s: MPIJobs x (1 + workers) pods / seconds from the first MPIJob create until every one
  of those pods (by name: a re-created pod is the same one) has been bound at least once;
- seconds to all bound (None when not every pod was ever bound: e.g. the default scheduler
  left workers pending until their MPIJob ended, or the run stalled);
- partial MPIJobs: those seen at least once (per 1 s sample) with the launcher bound while a
  worker of the same MPIJob existed unbound (Pending); also those seen so for 3 samples in a
  row (not just a worker on its way to its reserved node), and those that succeeded without
  all their workers ever bound at the same time (the launcher "ran" alone: a real mpirun would
  have hung, holding its node);
- split MPIJobs: those seen with any pod bound while another of theirs was Pending (either
  role: e.g. workers holding whole nodes while their launcher cannot be placed, the deadlock
  of pod-by-pod scheduling); a run where nothing is bound and nothing ends for `--stall`
  seconds is stopped and marked stalled;
- the machine's load average (1 min) before and after each run.

    .venv/bin/python bench/mpijob_bench.py --nodes 50 --jobs 5 --run-seconds 15   # smoke, ~2 min
    .venv/bin/python bench/mpijob_bench.py                                         # 1,000 nodes, 100 MPIJobs

Writes bench/results/mpijob_bench.json (`--output`).
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
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fluxnetes.devcluster import Cluster, ClusterOptions, NodeShape
from fluxnetes.devcluster.components import TIMED_POD_ANNOTATION
from fluxnetes.k8s.kube import NAMESPACES, PODS, Kube, Resource

MPIJOBS = Resource("kubeflow.org/v2beta1", "mpijobs")
DEPLOYMENTS = Resource("apps/v1", "deployments")
RESULTS = Path(__file__).resolve().parent / "results" / "mpijob_bench.json"
JOB_NAME = "training.kubeflow.org/job-name"
JOB_ROLE = "training.kubeflow.org/job-role"
FILL_NS = "bench-fill"
PARTIAL_RUN = 3  # samples in a row that make a partial MPIJob "stuck", not just in transit


def mpijob_body(name: str, args: argparse.Namespace, labels: dict[str, str] | None = None) -> dict[str, Any]:
    """An MPIJob of 1 launcher + ``args.workers`` workers; ``labels`` on the MPIJob (e.g. the
    LocalQueue Kueue admits it through, in bench/peers.py row c)."""

    def tmpl(cname: str, cpu: str, ann: dict[str, str] | None = None) -> dict[str, Any]:
        return {"metadata": {"annotations": ann or {}},
                "spec": {"containers": [{"name": cname, "image": "mpioperator/mpi-pi:openmpi",
                                         "resources": {"requests": {"cpu": cpu, "memory": "1Gi"}}}]}}

    return {"apiVersion": "kubeflow.org/v2beta1", "kind": "MPIJob", "metadata": {"name": name, "labels": labels or {}},
            "spec": {"slotsPerWorker": 1, "runPolicy": {"cleanPodPolicy": "Running"},
                     "mpiReplicaSpecs": {
                         # the launcher is a Job's pod: kwok ends it after its annotated delay
                         "Launcher": {"replicas": 1, "template": tmpl(
                             "launcher", args.launcher_cpu, {TIMED_POD_ANNOTATION: f"{args.run_seconds}s"})},
                         "Worker": {"replicas": args.workers, "template": tmpl("worker", args.worker_cpu)}}}}


def fill_body(replicas: int, cpu: str) -> dict[str, Any]:
    labels = {"app": "bench-fill"}
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "fill"},
            "spec": {"replicas": replicas, "selector": {"matchLabels": labels},
                     "template": {"metadata": {"labels": labels},
                                  "spec": {"containers": [{"name": "c", "image": "busybox",
                                                           "resources": {"requests": {"cpu": cpu}}}]}}}}


@dataclass
class JobState:
    launcher_bound: bool = False
    workers_bound: set[str] = field(default_factory=set)
    partial_run: int = 0  # current run of partial samples (launcher bound, a worker pending)
    partial_samples: int = 0
    partial_longest: int = 0
    split_run: int = 0  # current run of split samples (some pod bound, another pending)
    split_samples: int = 0
    split_longest: int = 0
    ever_whole: bool = False
    succeeded_at: float | None = None


@dataclass
class Run:
    """What one scheduler did with the batch (filled by the pod watch and the sampler)."""

    ns: str
    jobs: int
    workers: int
    t0: float = 0.0
    pods: dict[str, dict[str, Any]] = field(default_factory=dict)  # uid -> pod (live)
    first_bound: dict[str, float] = field(default_factory=dict)  # pod name -> first bind
    states: dict[str, JobState] = field(default_factory=dict)
    last_progress: float = 0.0
    first_release: float | None = None  # the first bound pod that ended or went away

    def on_event(self, etype: str, pod: dict[str, Any], now: float) -> None:
        meta = pod.get("metadata") or {}
        uid, name = meta.get("uid", ""), meta.get("name", "")
        phase = (pod.get("status") or {}).get("phase")
        if self.first_release is None and name in self.first_bound and (
                etype == "DELETED" or phase in ("Succeeded", "Failed")):
            self.first_release = now
        if etype == "DELETED":
            self.pods.pop(uid, None)
            return
        self.pods[uid] = pod
        if (pod.get("spec") or {}).get("nodeName") and name not in self.first_bound:
            self.first_bound[name] = now
            self.last_progress = now
            self.check_whole((meta.get("labels") or {}).get(JOB_NAME))

    def check_whole(self, job: str | None) -> None:
        if job is None or job not in self.states or self.states[job].ever_whole:
            return
        launcher, workers = self._bound_of(job)
        if launcher and len(workers) >= self.workers:
            self.states[job].ever_whole = True

    def _bound_of(self, job: str) -> tuple[bool, set[str]]:
        launcher, workers = False, set()
        for p in self.pods.values():
            labels = (p.get("metadata") or {}).get("labels") or {}
            if labels.get(JOB_NAME) != job or not (p.get("spec") or {}).get("nodeName"):
                continue
            if labels.get(JOB_ROLE) == "launcher":
                launcher = True
            elif labels.get(JOB_ROLE) == "worker":
                workers.add(p["metadata"]["name"])
        return launcher, workers

    def sample(self) -> None:
        """Per MPIJob: is its launcher bound (and not over) while a worker of it is Pending
        (partial)? Is any pod of it bound while another is Pending (split: e.g. workers
        holding nodes while the launcher cannot be placed)?"""
        launcher: set[str] = set()
        pending: set[str] = set()
        some_bound: set[str] = set()
        some_pending: set[str] = set()
        for p in self.pods.values():
            meta = p.get("metadata") or {}
            labels = meta.get("labels") or {}
            job, role = labels.get(JOB_NAME), labels.get(JOB_ROLE)
            if job is None or meta.get("deletionTimestamp"):
                continue
            bound = bool((p.get("spec") or {}).get("nodeName"))
            phase = (p.get("status") or {}).get("phase")
            if role == "launcher" and bound and phase in ("Pending", "Running"):
                launcher.add(job)
            elif role == "worker" and not bound:
                pending.add(job)
            if bound and phase in ("Pending", "Running"):
                some_bound.add(job)
            elif not bound:
                some_pending.add(job)
        for job, st in self.states.items():
            if job in some_bound and job in some_pending:
                st.split_samples += 1
                st.split_run += 1
                st.split_longest = max(st.split_longest, st.split_run)
            else:
                st.split_run = 0
            if job in launcher and job in pending:
                st.partial_samples += 1
                st.partial_run += 1
                st.partial_longest = max(st.partial_longest, st.partial_run)
            else:
                st.partial_run = 0

    def summary(self, succeeded: int, end: float, stalled: bool) -> dict[str, Any]:
        total = self.jobs * (1 + self.workers)
        bound = len(self.first_bound)
        last = max(self.first_bound.values(), default=self.t0)
        all_bound = bound >= total
        secs = round(last - self.t0, 2) if all_bound else None
        sts = list(self.states.values())
        # placement speed before capacity frees up: the pods bound before the first bound pod
        # ended (all of them when none did), over the time to the last of those binds
        first_end = self.first_release
        wave = [t for t in self.first_bound.values() if first_end is None or t < first_end]
        wave_secs = max(wave, default=self.t0) - self.t0
        return {
            "pods": total,
            "pods_bound_at_least_once": bound,
            "all_bound": all_bound,
            "seconds_to_all_bound": secs,
            "pods_per_second": round(total / (last - self.t0), 2) if all_bound and last > self.t0 else None,
            # when not all were bound: the rate of those that were, up to the last bind
            "pods_per_second_of_those_bound": round(bound / (last - self.t0), 2) if last > self.t0 else None,
            "first_wave_pods": len(wave),
            "first_wave_seconds": round(wave_secs, 2),
            "pods_per_second_first_wave": round(len(wave) / wave_secs, 2) if wave_secs > 0 else None,
            "mpijobs_succeeded": succeeded,
            "seconds_to_all_succeeded": round(end - self.t0, 2) if succeeded >= self.jobs else None,
            "stalled": stalled,
            "partial_mpijobs": sum(1 for s in sts if s.partial_samples > 0),
            f"partial_mpijobs_{PARTIAL_RUN}s_or_more": sum(1 for s in sts if s.partial_longest >= PARTIAL_RUN),
            "partial_seconds_longest": max((s.partial_longest for s in sts), default=0),
            "partial_seconds_median_of_partial": (statistics.median([s.partial_samples for s in sts
                                                                      if s.partial_samples])
                                                  if any(s.partial_samples for s in sts) else 0),
            # any pod of the MPIJob bound while another of it was Pending (either role)
            "split_mpijobs": sum(1 for s in sts if s.split_samples > 0),
            f"split_mpijobs_{PARTIAL_RUN}s_or_more": sum(1 for s in sts if s.split_longest >= PARTIAL_RUN),
            "split_seconds_longest": max((s.split_longest for s in sts), default=0),
            "split_mpijobs_at_end": sum(1 for s in sts if s.split_run > 0),
            "mpijobs_ever_whole": sum(1 for s in sts if s.ever_whole),
            "mpijobs_succeeded_without_ever_whole": sum(1 for s in sts
                                                        if s.succeeded_at is not None and not s.ever_whole),
        }


async def watch_pods(kube: Kube, run: Run, stop: asyncio.Event) -> None:
    items, rv = await kube.list(PODS, run.ns)
    for p in items:
        run.on_event("ADDED", p, time.monotonic())
    while not stop.is_set():
        try:
            async for ev in kube.watch(PODS, rv, field_selector=f"metadata.namespace={run.ns}",
                                       timeout_seconds=60):
                obj = ev.get("object") or {}
                if ev.get("type") == "ERROR":  # 410 Gone: list again
                    items, rv = await kube.list(PODS, run.ns)
                    now = time.monotonic()
                    run.pods.clear()
                    for p in items:
                        run.on_event("ADDED", p, now)
                    break
                rv = (obj.get("metadata") or {}).get("resourceVersion", rv)
                if ev.get("type") in ("ADDED", "MODIFIED", "DELETED"):
                    run.on_event(str(ev["type"]), obj, time.monotonic())
                if stop.is_set():
                    return
        except Exception as exc:  # API errors, aiohttp's payload errors, timeouts: watch again
            print("watch:", repr(exc), file=sys.stderr)
            await asyncio.sleep(0.5)


async def run_batch(kube: Kube, args: argparse.Namespace, ns: str, labels: dict[str, str] | None = None,
                    submit: Callable[[dict[str, Any]], Awaitable[None]] | None = None) -> dict[str, Any]:
    """The batch into ``ns``; ``submit`` creates one MPIJob (default: as it is; bench/peers.py
    passes its own, the same MPIJob for every system)."""
    run = Run(ns, args.jobs, args.workers)
    run.states = {f"mpi{i}": JobState() for i in range(args.jobs)}
    stop = asyncio.Event()
    watcher = asyncio.ensure_future(watch_pods(kube, run, stop))
    await asyncio.sleep(0.5)
    run.t0 = run.last_progress = time.monotonic()
    sem = asyncio.Semaphore(16)

    async def create(i: int) -> None:
        async with sem:
            body = mpijob_body(f"mpi{i}", args, labels)
            await (submit(body) if submit else kube.create(MPIJOBS, body, ns))

    await asyncio.gather(*(create(i) for i in range(args.jobs)))
    created = time.monotonic() - run.t0
    succeeded, stalled, timed_out, tick = 0, False, False, 0
    while True:
        await asyncio.sleep(1)
        tick += 1
        run.sample()
        now = time.monotonic()
        if tick % 2 == 0:
            objs, _ = await kube.list(MPIJOBS, ns)
            for o in objs:
                conds = (o.get("status") or {}).get("conditions") or []
                ok = any(c.get("type") == "Succeeded" and c.get("status") == "True" for c in conds)
                st = run.states.get(o["metadata"]["name"])
                if ok and st is not None and st.succeeded_at is None:
                    st.succeeded_at = now
                    run.last_progress = now
            succeeded = sum(1 for s in run.states.values() if s.succeeded_at is not None)
            if tick % 10 == 0:
                print(f"  {ns}: {now - run.t0:6.0f} s  bound {len(run.first_bound)}/"
                      f"{args.jobs * (1 + args.workers)}  succeeded {succeeded}/{args.jobs}  "
                      f"partial now {sum(1 for s in run.states.values() if s.partial_run)}  "
                      f"split now {sum(1 for s in run.states.values() if s.split_run)}", flush=True)
        if succeeded >= args.jobs:
            break
        if now - run.t0 > args.timeout:
            timed_out = True
            break
        if now - run.last_progress > args.stall:
            stalled = True  # nothing bound and nothing ended for that long: deadlocked
            break
    stop.set()
    watcher.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await watcher
    out = run.summary(succeeded, time.monotonic(), stalled)
    out["timed_out"] = timed_out
    out["create_seconds"] = round(created, 2)
    return out


def start_operator(cluster: Cluster, workdir: Path, label: str) -> tuple[subprocess.Popen[bytes], Path]:
    path = workdir / f"operator-{label}.log"
    log = path.open("wb")
    argv = [sys.executable, "-m", "fluxnetes.k8s", "run", "--kubeconfig", str(cluster.kubeconfig),
            "--webhook-port", "0", "--log-level", "INFO"]
    return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT), path


async def wait_ready(path: Path, op: subprocess.Popen[bytes], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if op.poll() is not None:
            raise RuntimeError(f"the operator exited ({op.returncode}): see {path}")
        if "operator ready" in path.read_text(errors="replace"):
            return
        await asyncio.sleep(0.5)
    raise RuntimeError(f"the operator was not ready in {timeout:.0f} s: see {path}")


def stop_operator(op: subprocess.Popen[bytes] | None) -> None:
    if op is None or op.poll() is not None:
        return
    op.send_signal(signal.SIGTERM)
    try:
        op.wait(timeout=30)
    except subprocess.TimeoutExpired:
        op.kill()
        op.wait(timeout=10)


async def wait_gone(kube: Kube, ns: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await kube.get_or_none(NAMESPACES, ns) is None:
            return
        await asyncio.sleep(1)
    print(f"namespace {ns} still terminating after {timeout:.0f} s", file=sys.stderr)


JOBS = Resource("batch/v1", "jobs")


async def settle(kube: Kube, timeout: float = 600) -> float:
    """Wait until the MPI Operator has caught up; seconds it took. Its work queue admits ~10
    items/s (client-go's default rate limiter) and every pod event of an MPIJob queues it, so
    the previous run's deletion can delay the next run's MPIJobs by minutes: a one-pod MPIJob
    (a namespace nobody gangs) is made, and its launcher Job's creation shows the queue drained."""
    ns = f"bench-canary-{uuid.uuid4().hex[:5]}"
    await kube.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    body = mpijob_body("canary", argparse.Namespace(launcher_cpu="10m", run_seconds=1, workers=1, worker_cpu="10m"))
    t0 = time.monotonic()
    await kube.create(MPIJOBS, body, ns)
    try:
        while time.monotonic() - t0 < timeout:
            if await kube.get_or_none(JOBS, "canary-launcher", ns) is not None:
                return round(time.monotonic() - t0, 1)
            await asyncio.sleep(1)
        raise RuntimeError(f"the MPI Operator did not make a canary MPIJob's launcher in {timeout:.0f} s")
    finally:
        await kube.delete(NAMESPACES, ns)
        await wait_gone(kube, ns, 120)


async def fill(kube: Kube, args: argparse.Namespace) -> float:
    """Take ``--busy-nodes`` whole nodes (default scheduler, never ganged); seconds it took.
    The free nodes end up scattered among the busy ones (the scheduler spreads the fill pods);
    bench/peers.py row c uses the same setup."""
    t0 = time.monotonic()
    if args.busy_nodes <= 0:
        return 0.0
    await kube.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": FILL_NS}})
    await kube.create(DEPLOYMENTS, fill_body(args.busy_nodes, args.node_cpu), FILL_NS)
    while time.monotonic() - t0 < 600:
        items, _ = await kube.list(PODS, FILL_NS)
        if sum(1 for p in items if (p.get("spec") or {}).get("nodeName")) >= args.busy_nodes:
            return round(time.monotonic() - t0, 1)
        await asyncio.sleep(2)
    raise RuntimeError(f"{args.busy_nodes} fill pods not all bound in 600 s")


SUMMARY_KEYS = ("pods_per_second", "pods_per_second_first_wave", "seconds_to_all_bound", "partial_mpijobs",
                f"partial_mpijobs_{PARTIAL_RUN}s_or_more", "split_mpijobs", "mpijobs_ever_whole",
                "mpijobs_succeeded", "stalled")


def summarize(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Per scheduler, each key figure over the rounds (a list, one value per round)."""
    out: dict[str, Any] = {}
    for label in ("default_scheduler", "fluxnetes"):
        runs = [r[label] for r in rounds if label in r]
        out[label] = {k: [r.get(k) for r in runs] for k in SUMMARY_KEYS}
    return out


def write(doc: dict[str, Any], path: str) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(doc, indent=2) + "\n")


async def bench(args: argparse.Namespace, cluster: Cluster, workdir: Path, doc: dict[str, Any]) -> dict[str, Any]:
    """The rounds; ``doc`` (the JSON, ``results`` being this) is written after each run, so an
    interrupted run keeps what was measured (``complete`` says whether all rounds ran)."""
    kube = await Kube.from_config(str(cluster.kubeconfig))
    out: dict[str, Any] = {"rounds": []}
    doc["results"] = out
    op: subprocess.Popen[bytes] | None = None
    try:
        out["fill_seconds"] = await fill(kube, args)
        for rnd in range(args.rounds):
            pair: dict[str, Any] = {}
            # paired: the default scheduler, then fluxnetes, each on a quiet cluster
            for label in ("default_scheduler", "fluxnetes"):
                ns = f"mpi-{label[:7]}-{uuid.uuid4().hex[:5]}".replace("_", "-")
                settled = await settle(kube)
                print(f"MPI Operator caught up in {settled} s", flush=True)
                if label == "fluxnetes":
                    op, path = start_operator(cluster, workdir, f"{label}-{rnd}")
                    await wait_ready(path, op)
                labels = {"fluxnetes.io/enabled": "true"} if label == "fluxnetes" else {}
                await kube.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace",
                                               "metadata": {"name": ns, "labels": labels}})
                await asyncio.sleep(1)
                load0 = os.getloadavg()
                print(f"round {rnd} {label} in {ns} (load {load0[0]:.2f})", flush=True)
                r = await run_batch(kube, args, ns)
                r["load_average_before"] = [round(x, 2) for x in load0]
                r["mpi_operator_settle_seconds_before"] = settled
                r["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
                print(label, json.dumps(r), flush=True)
                pair[label] = r
                if len(out["rounds"]) == rnd:
                    out["rounds"].append(pair)
                write(doc, args.output)
                stop_operator(op)  # before the namespace goes: no group is cancelled under load
                op = None
                await kube.delete(NAMESPACES, ns)
                if rnd < args.rounds - 1 or label != "fluxnetes":  # the cluster goes anyway
                    await wait_gone(kube, ns, 600)
                    await asyncio.sleep(2)
            d, f = pair["default_scheduler"], pair["fluxnetes"]
            if d.get("pods_per_second") and f.get("pods_per_second"):
                pair["ratio_pods_per_second_fluxnetes_over_default"] = round(
                    f["pods_per_second"] / d["pods_per_second"], 2)
            if d.get("pods_per_second_first_wave") and f.get("pods_per_second_first_wave"):
                pair["ratio_first_wave_fluxnetes_over_default"] = round(
                    f["pods_per_second_first_wave"] / d["pods_per_second_first_wave"], 2)
            write(doc, args.output)
        out["summary"] = summarize(out["rounds"])
    finally:
        stop_operator(op)
        await kube.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--jobs", type=int, default=100, help="MPIJobs per scheduler")
    ap.add_argument("--workers", type=int, default=8, help="workers per MPIJob")
    ap.add_argument("--node-cpu", default="4")
    ap.add_argument("--worker-cpu", default="4", help="default: a whole node")
    ap.add_argument("--launcher-cpu", default="1")
    ap.add_argument("--busy-nodes", type=int, default=None,
                    help="nodes taken by other (never ganged) pods before the runs; default: half")
    ap.add_argument("--run-seconds", type=int, default=60, help="how long a launcher runs once started")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per scheduler at most")
    ap.add_argument("--stall", type=float, default=None,
                    help="stop a run when nothing was bound and no MPIJob ended for this long "
                         "(default: 2 x --run-seconds + 60)")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--output", default=str(RESULTS))
    args = ap.parse_args()
    if args.busy_nodes is None:
        args.busy_nodes = args.nodes // 2
    if args.stall is None:
        args.stall = 2 * args.run_seconds + 60
    if args.busy_nodes >= args.nodes:
        ap.error(f"--busy-nodes {args.busy_nodes} leaves no node free of {args.nodes}")
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    out: dict[str, Any] = {
        "benchmark": "mpijob_bench",
        "started": started,
        "complete": False,
        "parameters": {
            "nodes": args.nodes, "node_shape": {"cpu": args.node_cpu, "memory": "16Gi"},
            "busy_nodes": args.busy_nodes, "free_nodes": args.nodes - args.busy_nodes,
            "mpijobs": args.jobs, "launcher_cpu": args.launcher_cpu, "workers": args.workers,
            "worker_cpu": args.worker_cpu, "launcher_run_seconds": args.run_seconds,
            "pods_per_scheduler": args.jobs * (1 + args.workers), "rounds": args.rounds,
            "timeout_seconds": args.timeout, "stall_seconds": args.stall,
            "controllers": "real MPI Operator v0.6.0 (dev cluster --addons mpi), kwok nodes, timed pods",
            "sampling_seconds": 1, "partial_run_samples": PARTIAL_RUN,
        },
        "machine": {"cpu_count": os.cpu_count(), "python": platform.python_version(),
                    "platform": platform.platform(),
                    "load_average_at_start": [round(x, 2) for x in os.getloadavg()]},
    }
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="fx-mpibench-") as tmp:
        cluster = Cluster.up(ClusterOptions(
            nodes=NodeShape(count=args.nodes, cpu=args.node_cpu, memory="16Gi"),
            dir=Path(tmp) / "cluster", die_with_parent=True, timed_pods=True, addons=("mpi",)))
        out["cluster_up_seconds"] = round(time.monotonic() - t0, 1)
        print(f"cluster up in {out['cluster_up_seconds']} s", flush=True)
        try:
            asyncio.run(bench(args, cluster, Path(tmp), out))
        finally:
            cluster.down()
    out["complete"] = True
    out["wall_seconds"] = round(time.monotonic() - t0, 1)
    out["machine"]["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    write(out, args.output)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
