"""fluxnetes against what users would pick instead, on the same kind of cluster, in one run.

Each system runs alone in turn (issue #31): kube-scheduler alone (a namespace fluxnetes does
not manage, no operator), fluxnetes (the operator as a subprocess, an opted-in namespace),
Kueue v0.17.0 in front of kube-scheduler (`--addons kueue`, its release's configuration as
devcluster/addons.py sets it up), scheduler-plugins v0.34.7's coscheduling (`--addons
coscheduling`: a second scheduler, `scheduler-plugins-scheduler`, that the workload pods name;
a Job of several pods is a gang, a PodGroup of minMember = its pods, named after it; an MPIJob's
PodGroup, minMember = 1 launcher + 8 workers, is made by the MPI Operator, started with
`--gang-scheduling=scheduler-plugins-scheduler` on that cluster, its documented setup). Kueue and
coscheduling each run on a cluster of their own so that their processes, webhooks and watches
are not there when the others run. Volcano is not here: see docs/comparison.md for why (the
module proxy refused it). Coscheduling has no accounts, queues or shares (the profile runs
Coscheduling only, not scheduler-plugins' CapacityScheduling with its ElasticQuotas, which are
min/max quotas, not shares): row e shows the split it gives unasked, as for kube-scheduler.

Rows (each system, same sizes):

- a. single-pod Jobs on `--nodes` kwok nodes (32 cpu each): pods/s from the first create to the
  last pod bound, API writes per pod (POST/PUT/PATCH/DELETE but Leases, as operator_bench.py
  counts them), the API server's CPU seconds per pod (and each component's). Kueue runs here
  with the release's default configuration (no waitForPodsReady): gangs do not matter.
- b. Jobs of 10 pods (gangs) on the same cluster, a third of whose nodes are first taken by
  whole-node pods nobody queues; the gangs' pods take a node each and ask for 1.5x the free
  nodes: pods/s (pods bound / seconds to the last binding; the run ends `--settle` seconds
  after it), whole gangs, gangs bound in part when the run ended (their nodes held for
  nothing). Kueue runs with `waitForPodsReady` (blockAdmission: its documented
  all-or-nothing setting) and a quota of the free nodes' cpus.
- c. `--mpijobs` MPIJobs (1 launcher of 1 cpu + 8 workers of a whole 4-cpu node, the real MPI
  Operator v0.6.0: `--addons mpi`) on a cluster of `--mpi-nodes` nodes half of which are first
  taken by whole-node pods nobody queues (free nodes scattered among them): MPIJobs partially
  started (launcher bound while a worker is Pending, 3 s or more), deadlocked (some pod bound,
  another Pending, when nothing was bound and nothing ended for 2 x the launcher's run + 60 s),
  and the makespan (first create to the last MPIJob Succeeded). bench/mpijob_bench.py's setup
  and measurement, imported. Kueue: the MPIJobs name a LocalQueue (its `kubeflow.org/mpijob`
  integration), `waitForPodsReady`, a quota of the free nodes' cpus.
- d. issue kueue#534: on `--pool-nodes` nodes (8 cpu each, pods that end after their kwok
  duration), one-node Jobs arrive at a fixed rate, `--stream-load` (1.5) times the pool's
  drain rate, from a submitter of their own (creates sent on time, not waiting for the
  sampling loop), so a backlog builds; a Job of half the pool's nodes arrives behind them: how
  long it waits (until all its pods are bound), how many small Jobs created after it started
  before it, and how many started while it waited.
- f. during d, every Job that waited: whether the system said when it would start (fluxnetes:
  the FluxJob's status.expectedStart; Kueue and kube-scheduler have no such field) and how far
  the first prediction was from the actual start.
- e. three namespaces (accounts / ClusterQueues of one cohort) with shares 50/30/20, all
  backlogged with Jobs of `--share-cpu` cpus (about ten waves of them): the running share of
  each over time (sampled every second) and its mean while all three have work waiting. Kueue
  runs this row without `waitForPodsReady` (with it, blockAdmission admits one Workload at a
  time and the ClusterQueues never fill their quotas): fair sharing, weights 50/30/20.

    .venv/bin/python bench/peers.py --quick      # 100 nodes, 200 Jobs, 20 gangs, 20 MPIJobs (not recorded)
    .venv/bin/python bench/peers.py              # 1,000 nodes, 1,000 Jobs, 100 gangs, 100 MPIJobs

Writes bench/results/peers.json (peers_quick.json with --quick). Row c needs
`hack/build-addons.sh mpi`, Kueue `hack/build-addons.sh kueue` (a cold build of close to an
hour on 2 busy cores), coscheduling `hack/build-addons.sh coscheduling`. Coscheduling, with
kube-scheduler as its pair in the same invocation, at the same sizes
(bench/results/peers_coscheduling.json):

    .venv/bin/python bench/peers.py --systems kube-scheduler,coscheduling \
        --output bench/results/peers_coscheduling.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import platform
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

import mpijob_bench
from operator_bench import api_requests, start_operator, wait_gone

from fluxnetes.devcluster import Cluster, ClusterOptions, NodeShape
from fluxnetes.devcluster import addons as addon_defs
from fluxnetes.devcluster.components import TIMED_POD_ANNOTATION
from fluxnetes.k8s.kube import NAMESPACES, PODS, Kube, Resource

JOBS = Resource("batch/v1", "jobs")
RESULTS = Path(__file__).resolve().parent / "results"
SYSTEMS = ("kube-scheduler", "fluxnetes", "kueue", "coscheduling")
WRITE_VERBS = ("POST", "PUT", "PATCH", "DELETE")
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
DURATION_ANNOTATION = "fluxnetes.io/duration"
GANG_POD_CPU = "20"  # of a node's 32: one such pod per node
GANG_POD_SECONDS = 3600  # row b's pods hold their nodes for the whole run (row a's end at once)
SHARES = {"acct-a": 50, "acct-b": 30, "acct-c": 20}
KUEUE_PLAIN = {"waitForPodsReady": None}  # row a: the release's default (no all-or-nothing)
CONTROL_PLANE = ("kube-apiserver", "etcd", "kube-controller-manager", "kube-scheduler", "kwok", "addon-kueue",
                 *addon_defs.ADDONS["coscheduling"].components)
PODGROUPS = Resource("scheduling.x-k8s.io/v1alpha1", "podgroups")
POD_GROUP_LABEL = "scheduling.x-k8s.io/pod-group"
MPI_NODE_CPU, MPI_NODE_MEMORY_GI = "4", 16  # row c: a worker (4 cpu) takes a whole node


def job_body(name: str, pods: int, cpu: str, *, queue: bool, seconds: float | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if queue:
        meta["labels"] = {QUEUE_LABEL: "lq"}
    # kwok ends the pod after `seconds`; the walltime a user declares (fluxnetes reads it for
    # its reservations; kube-scheduler and Kueue ignore the annotation) is a little above
    tmeta = {"annotations": {TIMED_POD_ANNOTATION: f"{seconds:.1f}s",
                             DURATION_ANNOTATION: f"{math.ceil(seconds) + 2}s"}} if seconds else {}
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": meta,
            "spec": {"parallelism": pods, "completions": pods, "backoffLimit": 0, "ttlSecondsAfterFinished": 3600,
                     "template": {"metadata": tmeta, "spec": {"restartPolicy": "Never", "containers": [
                         {"name": "c", "image": "busybox",
                          "resources": {"requests": {"cpu": cpu, "memory": "64Mi"}}}]}}}}


# -- systems ----------------------------------------------------------------------------------------
class System:
    """One system's cluster, namespaces and (fluxnetes) operator."""

    def __init__(self, name: str, args: argparse.Namespace, cluster: Cluster) -> None:
        self.name, self.args, self.cluster = name, args, cluster
        self.op: subprocess.Popen[bytes] | None = None

    async def start(self, kube: Kube) -> None:
        if self.name == "fluxnetes":
            self.op = await start_operator(self.args, self.cluster, "auto", ["--status-interval", "0.3"],
                                           label=f"fluxnetes-{uuid.uuid4().hex[:4]}")

    def stop(self) -> None:
        if self.op is not None:
            self.op.send_signal(signal.SIGTERM)
            try:
                self.op.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.op.kill()
            self.op = None

    def kueue_config(self, overrides: dict[str, Any] | None) -> None:
        """Restart Kueue with these Configuration fields replaced (None: the addon's own)."""
        if self.name != "kueue":
            return
        path = Path(self.args.workdir) / f"kueue-{uuid.uuid4().hex[:6]}.yaml"
        if overrides:
            path.write_text(json.dumps(overrides))
            os.environ[addon_defs.KUEUE_CONFIG_ENV] = str(path)
        else:
            os.environ.pop(addon_defs.KUEUE_CONFIG_ENV, None)
        self.cluster.restart_component("addon-kueue")

    async def create_job(self, kube: Kube, body: dict[str, Any], ns: str) -> None:
        """Create one Job. Under coscheduling its pods name scheduler-plugins' scheduler, and a
        Job of several pods is a gang: a PodGroup of minMember = its pods, named after the Job,
        and that name in the pod template's scheduling.x-k8s.io/pod-group label (the plugin's
        documented use)."""
        if self.name == "coscheduling":
            spec = body["spec"]
            spec["template"]["spec"]["schedulerName"] = addon_defs.SCHEDULER_NAME
            if spec["parallelism"] > 1:
                name = body["metadata"]["name"]
                await kube.create(PODGROUPS, {"apiVersion": PODGROUPS.api_version, "kind": "PodGroup",
                                              "metadata": {"name": name},
                                              "spec": {"minMember": spec["parallelism"]}}, ns)
                spec["template"].setdefault("metadata", {}).setdefault("labels", {})[POD_GROUP_LABEL] = name
        await kube.create(JOBS, body, ns)

    async def create_mpijob(self, kube: Kube, body: dict[str, Any], ns: str) -> None:
        """Create one MPIJob (row c), as it is for every system: under coscheduling the MPI
        Operator (started with --gang-scheduling=scheduler-plugins-scheduler, see
        devcluster/addons.py) makes its PodGroup (minMember = 1 launcher + 8 workers, named
        after it) and sets that scheduler and the PodGroup label on its pods."""
        await kube.create(mpijob_bench.MPIJOBS, body, ns)

    async def namespace(self, kube: Kube, ns: str, labels: dict[str, str] | None = None) -> None:
        lab = dict(labels or {})
        if self.name == "fluxnetes":
            lab["fluxnetes.io/enabled"] = "true"
        await kube.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns, "labels": lab}})
        if self.name == "kueue":
            await kube.create(Resource("kueue.x-k8s.io/v1beta2", "localqueues"), {
                "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue", "metadata": {"name": "lq"},
                "spec": {"clusterQueue": labels.get("cq", "bench") if labels else "bench"}}, ns)

    def cpu(self) -> dict[str, float]:
        import psutil

        out: dict[str, float] = {}
        pids = dict(self.cluster.pids)
        if self.op is not None:
            pids["operator"] = self.op.pid
        for name, pid in pids.items():
            if name in CONTROL_PLANE or name == "operator":
                with contextlib.suppress(psutil.Error):
                    p = psutil.Process(pid)
                    out[name] = sum(q.cpu_times().user + q.cpu_times().system
                                    for q in [p, *p.children(recursive=True)])
        return out


def apply(cluster: Cluster, items: list[dict[str, Any]]) -> None:
    cluster.kubectl("apply", "--server-side", "-f", "-",
                    input=json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))


def kueue_queues(cluster: Cluster, quotas: dict[str, tuple[int, str]], cohort: str | None = None) -> None:
    """A ResourceFlavor and one ClusterQueue per name with (cpu, memory) nominal quotas;
    with a cohort, fair sharing weights equal to the cpu quotas (the shares)."""
    items: list[dict[str, Any]] = [{"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor",
                                    "metadata": {"name": "default"}}]
    for name, (cpu, mem) in quotas.items():
        spec: dict[str, Any] = {"namespaceSelector": {}, "resourceGroups": [{
            "coveredResources": ["cpu", "memory"], "flavors": [{"name": "default", "resources": [
                {"name": "cpu", "nominalQuota": str(cpu)}, {"name": "memory", "nominalQuota": mem}]}]}]}
        if cohort:
            spec["cohortName"] = cohort
            spec["fairSharing"] = {"weight": str(cpu)}
            spec["preemption"] = {"reclaimWithinCohort": "Any", "withinClusterQueue": "LowerPriority"}
        items.append({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue", "metadata": {"name": name},
                      "spec": spec})
    apply(cluster, items)


def fluxaccounts(cluster: Cluster) -> None:
    apply(cluster, [{"apiVersion": "fluxnetes.io/v1alpha1", "kind": "FluxAccount", "metadata": {"name": n},
                     "spec": {"shares": s}} for n, s in SHARES.items()])


# -- rows a and b: throughput on the big cluster --------------------------------------------------
async def fill(system: System, kube: Kube, replicas: int, cpu: str) -> str:
    """Whole-node pods (a Deployment nobody queues) on ``replicas`` nodes, bound before the run."""
    ns = f"fill-{uuid.uuid4().hex[:4]}"
    await kube.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    labels = {"app": "peers-fill"}
    await kube.create(Resource("apps/v1", "deployments"), {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "fill"},
        "spec": {"replicas": replicas, "selector": {"matchLabels": labels}, "template": {
            "metadata": {"labels": labels}, "spec": {"containers": [
                {"name": "c", "image": "busybox", "resources": {"requests": {"cpu": cpu}}}]}}}}, ns)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        pods, _ = await kube.list(PODS, ns)
        if sum(1 for p in pods if (p.get("spec") or {}).get("nodeName")) >= replicas:
            return ns
        await asyncio.sleep(2)
    raise SystemExit(f"the {replicas} filler pods were not all bound in 600 s")


async def throughput(system: System, kube: Kube, jobs: int, size: int, cpu: str, timeout: float,
                     settle: float = 0.0, seconds: float | None = None, last: bool = False) -> dict[str, Any]:
    """``jobs`` Jobs of ``size`` pods of ``cpu``; the run ends when every pod is bound, or
    (``settle`` > 0: not all can be) when no pod was bound for ``settle`` seconds."""
    ns = f"peers-{uuid.uuid4().hex[:6]}"
    await system.namespace(kube, ns)
    await asyncio.sleep(1)
    load = os.getloadavg()[0]
    cpu0, req0 = system.cpu(), await api_requests(kube)
    total = jobs * size
    bound: set[str] = set()
    per_job: dict[str, int] = {}
    t_last = [time.monotonic()]
    done = asyncio.Event()
    _, rv = await kube.list(PODS, ns)

    async def watch() -> None:
        nonlocal rv
        while not done.is_set():
            try:
                async for ev in kube.watch(PODS, rv, field_selector=f"metadata.namespace={ns}", timeout_seconds=60):
                    obj = ev.get("object") or {}
                    meta = obj.get("metadata") or {}
                    rv = meta.get("resourceVersion", rv)
                    job = (meta.get("labels") or {}).get("batch.kubernetes.io/job-name", "")
                    if (obj.get("spec") or {}).get("nodeName") and meta.get("uid") not in bound:
                        bound.add(meta["uid"])
                        t_last[0] = time.monotonic()
                        per_job[job] = per_job.get(job, 0) + 1
                        if len(bound) >= total:
                            done.set()
                            return
            except Exception as exc:  # re-watch
                print("watch:", exc, file=sys.stderr)
                await asyncio.sleep(0.2)

    watcher = asyncio.ensure_future(watch())
    t0 = time.monotonic()
    sem = asyncio.Semaphore(32)

    async def create(i: int) -> None:
        async with sem:
            await system.create_job(kube, job_body(f"j{i}", size, cpu, queue=system.name == "kueue", seconds=seconds), ns)

    await asyncio.gather(*(create(i) for i in range(jobs)))
    created = time.monotonic() - t0
    while not done.is_set() and time.monotonic() - t0 < timeout:
        if settle and bound and time.monotonic() - t_last[0] >= settle:
            break
        await asyncio.sleep(0.5)
    done.set()
    watcher.cancel()
    cpu1, req1 = system.cpu(), await api_requests(kube)
    per_pod = {k: (v - req0.get(k, 0)) / total for k, v in req1.items()}
    elapsed = t_last[0] - t0 if (len(bound) >= total or settle) and bound else None
    cpus = {k: round(cpu1.get(k, 0) - cpu0.get(k, 0), 2) for k in cpu1}
    out = {
        "jobs": jobs, "pods_per_job": size, "pod_cpu": cpu, "pods": total, "bound": len(bound),
        "create_seconds": round(created, 2),
        "seconds_to_last_bound": None if elapsed is None else round(elapsed, 2),
        "pods_per_second": None if elapsed is None else round(len(bound) / elapsed, 1),
        # per pod created (in row b not every pod can be bound)
        "api_writes_per_pod": round(sum(v for k, v in per_pod.items()
                                        if k.split()[-1] in WRITE_VERBS and not k.startswith("leases")), 2),
        "api_requests_per_pod": {k: round(v, 2) for k, v in sorted(per_pod.items(), key=lambda kv: -kv[1])
                                 if v >= 0.05},
        "cpu_seconds": cpus,
        "apiserver_cpu_ms_per_pod": round(1000 * cpus.get("kube-apiserver", 0) / total, 2),
        "load_average_1m_before": round(load, 2), "load_average_1m_after": round(os.getloadavg()[0], 2),
    }
    if size > 1:
        out["whole_gangs_bound"] = sum(1 for n in per_job.values() if n >= size)
        # bound in part when the run ended: nodes held by gangs that cannot run
        out["partial_gangs"] = sum(1 for n in per_job.values() if 0 < n < size)
        out["pods_of_partial_gangs"] = sum(n for n in per_job.values() if 0 < n < size)
    await kube.delete(NAMESPACES, ns)
    if not last:  # (the next run starts on a quiet cluster; after the last, it goes down)
        out["namespace_deleted_s"] = await wait_gone(kube, ns, max(300.0, 0.15 * total))
    return out


# -- row c: MPIJobs on scattered free nodes --------------------------------------------------------
async def mpijobs(system: System, kube: Kube, args: argparse.Namespace) -> dict[str, Any]:
    """``--mpijobs`` MPIJobs (1 launcher of 1 cpu + 8 workers of a whole node) through the real
    MPI Operator, on a cluster whose other half is taken first by whole-node pods nobody queues
    (bench/mpijob_bench.py's setup and measurement: its fill, its MPI Operator settle, its run)."""
    busy = args.mpi_nodes // 2
    free = args.mpi_nodes - busy
    margs = argparse.Namespace(jobs=args.mpijobs, workers=8, launcher_cpu="1", worker_cpu=MPI_NODE_CPU,
                               node_cpu=MPI_NODE_CPU, busy_nodes=busy, run_seconds=args.mpi_run_seconds,
                               timeout=args.timeout, stall=2 * args.mpi_run_seconds + 60)
    fill_s = await mpijob_bench.fill(kube, margs)
    if system.name == "kueue":  # its quota: what is free for it (as in row b)
        kueue_queues(system.cluster, {"bench": (free * int(MPI_NODE_CPU), f"{free * MPI_NODE_MEMORY_GI}Gi")})
    settled = await mpijob_bench.settle(kube)
    ns = f"mpi-{uuid.uuid4().hex[:6]}"
    await system.namespace(kube, ns)
    await asyncio.sleep(1)
    load = os.getloadavg()[0]
    # (the operator deletes an MPIJob's PodGroup when it ends: sampled while the batch runs)
    groups: dict[str, Any] = {}

    async def podgroups() -> None:
        while True:
            with contextlib.suppress(Exception):
                for g in (await kube.list(PODGROUPS, ns))[0]:
                    groups[g["metadata"]["name"]] = (g.get("spec") or {}).get("minMember")
            await asyncio.sleep(2)

    seen = asyncio.ensure_future(podgroups()) if system.name == "coscheduling" else None
    r = await mpijob_bench.run_batch(kube, margs, ns, {QUEUE_LABEL: "lq"} if system.name == "kueue" else None,
                                     submit=lambda body: system.create_mpijob(kube, body, ns))
    ended = r["stalled"] or r["timed_out"]
    out = {
        "nodes": args.mpi_nodes, "busy_nodes": busy, "free_nodes": free, "mpijobs": args.mpijobs,
        "workers": 8, "launcher_run_seconds": args.mpi_run_seconds, "fill_seconds": fill_s,
        "mpi_operator_settle_seconds": settled,
        # the launcher bound while a worker of its MPIJob is Pending (for 3 samples in a row:
        # not one in transit); with kwok the launcher still "runs" and ends, a real mpirun would hang
        "partially_started_mpijobs": r[f"partial_mpijobs_{mpijob_bench.PARTIAL_RUN}s_or_more"],
        "partially_started_mpijobs_any_sample": r["partial_mpijobs"],
        # some pod bound, another Pending, when the run stalled (nothing bound or ended for
        # --stall seconds) or timed out: nodes held for good by MPIJobs that cannot start
        "deadlocked_mpijobs": r["split_mpijobs_at_end"] if ended else 0,
        "makespan_s": r["seconds_to_all_succeeded"],
        "mpijobs_succeeded_without_ever_whole": r["mpijobs_succeeded_without_ever_whole"],
        **{k: r[k] for k in ("mpijobs_succeeded", "stalled", "timed_out", "split_mpijobs",
                             f"split_mpijobs_{mpijob_bench.PARTIAL_RUN}s_or_more", "mpijobs_ever_whole",
                             "pods_bound_at_least_once", "pods_per_second_of_those_bound", "create_seconds")},
        "load_average_1m_before": round(load, 2), "load_average_1m_after": round(os.getloadavg()[0], 2),
    }
    if seen is not None:  # the PodGroups the MPI Operator made: one per MPIJob, 1 + 8
        seen.cancel()
        out["podgroups_made_by_mpi_operator"] = {"count": len(groups),
                                                 "min_member": sorted(set(groups.values()), key=str)}
    return out


# -- rows d and f: a large job behind a stream of small ones --------------------------------------
def fluxjob_times(cluster: Cluster, ns: str) -> dict[str, dict[str, Any]]:
    """FluxJob -> (expectedStart, startTime) of namespace ``ns`` (fluxnetes only)."""
    out = {}
    for fj in cluster.api_get(f"/apis/fluxnetes.io/v1alpha1/namespaces/{ns}/fluxjobs")["items"]:
        st = fj.get("status") or {}
        owner = next((o["name"] for o in fj["metadata"].get("ownerReferences") or [] if o.get("kind") == "Job"),
                     fj["metadata"]["name"])
        out[owner] = {"expected": st.get("expectedStart"), "start": st.get("startTime"), "phase": st.get("phase")}
    return out


def ts(text: str | None) -> float | None:
    return None if not text else datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


async def large_behind_stream(system: System, kube: Kube, args: argparse.Namespace) -> dict[str, Any]:
    ns = f"stream-{uuid.uuid4().hex[:6]}"
    await system.namespace(kube, ns)
    nodes, cpu = args.pool_nodes, str(args.pool_cpu)
    large_pods = nodes // 2
    rng = random.Random(7)
    q = system.name == "kueue"
    mean = (args.small_seconds[0] + args.small_seconds[1]) / 2
    # a small Job takes a whole node for `mean` seconds on average: the pool drains nodes/mean
    # Jobs a second; the stream arrives --stream-load times faster, so a backlog builds and the
    # large Job can only start if the system keeps nodes for it (kueue#534)
    drain_rate = nodes / mean
    interval = 1 / (drain_rate * args.stream_load)
    load = os.getloadavg()[0]
    t0 = time.time()
    end_stream = t0 + args.stream_seconds
    created: dict[str, float] = {}  # Job -> when its create was sent (wall clock)
    started: dict[str, float] = {}  # Job -> when its last pod was bound (wall clock)
    predictions: dict[str, float] = {}  # Job -> first expectedStart seen
    want: dict[str, int] = {}
    failed: list[str] = []

    async def create(name: str, body: dict[str, Any]) -> None:
        created[name], want[name] = time.time(), body["spec"]["parallelism"]
        try:
            await system.create_job(kube, body, ns)
        except Exception as exc:  # counted: a stream that lost Jobs is reported as such
            failed.append(f"{name}: {exc}")

    async def stream() -> int:
        """The small Jobs at fixed times t0 + k * interval, each create sent without waiting
        for the previous one (a slow API server does not slow the stream)."""
        sends: list[asyncio.Task[None]] = []
        k = 0
        while t0 + k * interval < end_stream:
            await asyncio.sleep(max(0.0, t0 + k * interval - time.time()))
            body = job_body(f"s{k}", 1, cpu, queue=q, seconds=rng.uniform(*args.small_seconds))
            sends.append(asyncio.ensure_future(create(f"s{k}", body)))
            k += 1
        await asyncio.gather(*sends)
        return k

    async def large() -> None:
        await asyncio.sleep(args.large_after)
        await create("large", job_body("large", large_pods, cpu, queue=q, seconds=args.large_seconds))

    streamer, larger = asyncio.ensure_future(stream()), asyncio.ensure_future(large())
    bound_pods: dict[str, set[str]] = {}
    samples = 0
    while True:
        now = time.time()
        pods, _ = await kube.list(PODS, ns)
        samples += 1
        for p in pods:
            job = (p["metadata"].get("labels") or {}).get("batch.kubernetes.io/job-name", "")
            if p["spec"].get("nodeName"):
                bound_pods.setdefault(job, set()).add(p["metadata"]["name"])
                if job not in started and len(bound_pods[job]) >= want.get(job, 1):
                    started[job] = now
        if system.name == "fluxnetes":
            # (in a thread: the stream's creates go on meanwhile)
            for job, t in (await asyncio.to_thread(fluxjob_times, system.cluster, ns)).items():
                if t["expected"] and job not in predictions and job not in started:
                    predictions[job] = ts(t["expected"]) or 0.0
        if "large" in started and now >= end_stream:
            break
        if now > end_stream + args.grace:
            break
        await asyncio.sleep(0.5)
    made = await streamer
    await larger
    large_at = created.get("large")
    large_end = started.get("large", time.time())
    large_wait = large_end - large_at if large_at else None
    passed = sum(1 for j, t in started.items() if j != "large" and large_at and created[j] > large_at
                 and t < large_end)
    meanwhile = sum(1 for j, t in started.items() if j != "large" and large_at and large_at <= t < large_end)
    errors = [abs(started[j] - p) for j, p in predictions.items() if j in started]
    waited = [j for j in started if started[j] - created[j] > 2.0]
    smalls = [j for j in created if j != "large"]
    out = {
        "pool_nodes": nodes, "large_pods": large_pods,
        "drain_rate_jobs_per_s": round(drain_rate, 2), "stream_load": args.stream_load,
        "stream_rate_jobs_per_s": round(drain_rate * args.stream_load, 2),
        "small_jobs_created": made - sum(1 for f in failed if not f.startswith("large")),
        "create_errors": failed[:5], "create_errors_n": len(failed),
        "small_jobs_started": sum(1 for j in started if j != "large"),
        "small_jobs_still_waiting_at_end": sum(1 for j in smalls if j not in started),
        "large_created_at_s": round((large_at or t0) - t0, 1),
        "large_started": "large" in started,
        # when it never started: how long it had waited when the run ended (a lower bound)
        "large_wait_s": None if large_wait is None else round(large_wait, 1),
        "observed_for_s": round(time.time() - t0, 1), "samples": samples,
        "small_jobs_created_after_large_started_before_it": passed,
        "small_jobs_started_while_large_waited": meanwhile,
        "f_prediction": {
            "system_gives_expected_start": system.name == "fluxnetes",
            "jobs_that_waited_over_2s": len(waited),
            "of_them_with_a_prediction": len([j for j in waited if j in predictions]),
            "large_job_predicted": "large" in predictions,
            "large_prediction_error_s": (round(abs(started["large"] - predictions["large"]), 1)
                                         if "large" in predictions and "large" in started else None),
            "abs_error_s": None if not errors else {"p50": round(statistics.median(errors), 1),
                                                    "max": round(max(errors), 1), "n": len(errors)},
        },
        "load_average_1m_before": round(load, 2), "load_average_1m_after": round(os.getloadavg()[0], 2),
    }
    await kube.delete(NAMESPACES, ns)
    await wait_gone(kube, ns, 300)
    return out


# -- row e: shares ----------------------------------------------------------------------------------
async def shares(system: System, kube: Kube, args: argparse.Namespace) -> dict[str, Any]:
    tag = uuid.uuid4().hex[:4]
    nss = {acct: f"{acct}-{tag}" for acct in SHARES}
    for acct, ns in nss.items():
        labels = {"fluxnetes.io/account": acct} if system.name == "fluxnetes" else {}
        if system.name == "kueue":
            labels = {"cq": acct}
        await system.namespace(kube, ns, labels)
    rng = random.Random(11)
    jobs = [(ns, job_body(f"j{i}", 1, str(args.share_cpu), queue=system.name == "kueue",
                          seconds=rng.uniform(*args.share_seconds)))
            for i in range(args.share_jobs) for ns in nss.values()]
    load = os.getloadavg()[0]
    t0 = time.monotonic()
    sem = asyncio.Semaphore(16)

    async def create(ns: str, body: dict[str, Any]) -> None:
        async with sem:
            await system.create_job(kube, body, ns)

    await asyncio.gather(*(create(ns, b) for ns, b in jobs))
    samples: list[dict[str, Any]] = []
    backlogged: list[dict[str, int]] = []
    idle = 0
    while time.monotonic() - t0 < args.share_timeout:
        running = dict.fromkeys(SHARES, 0)
        waiting = dict.fromkeys(SHARES, 0)
        listed = await asyncio.gather(*(kube.list(PODS, ns) for ns in nss.values()))
        for acct, (pods, _) in zip(nss, listed, strict=True):
            run = sum(1 for p in pods if (p.get("status") or {}).get("phase") == "Running")
            ended = sum(1 for p in pods if (p.get("status") or {}).get("phase") in ("Succeeded", "Failed"))
            running[acct], waiting[acct] = run, args.share_jobs - run - ended
        samples.append({"t": round(time.monotonic() - t0, 1), "running": running, "waiting": waiting})
        if all(waiting.values()) and sum(running.values()):
            backlogged.append(running)
        if not any(waiting.values()) and not any(running.values()):
            break
        idle = idle + 1 if not any(running.values()) else 0
        if idle >= 30:  # nothing ran for 30 s: what is left will not (a Job failed, a pod was lost)
            break
        await asyncio.sleep(1.0)
    total = sum(sum(r.values()) for r in backlogged) or 1
    mean = {a: round(sum(r[a] for r in backlogged) / total, 3) for a in SHARES}
    out = {"accounts": SHARES, "jobs_per_account": args.share_jobs, "slots": args.pool_nodes * (args.pool_cpu // args.share_cpu),
           "backlogged_samples": len(backlogged), "mean_share_while_all_backlogged": mean,
           "max_abs_error_vs_target": round(max(abs(mean[a] - s / 100) for a, s in SHARES.items()), 3),
           "seconds": round(time.monotonic() - t0, 1), "samples": samples,
           "load_average_1m_before": round(load, 2), "load_average_1m_after": round(os.getloadavg()[0], 2)}
    for ns in nss.values():  # (the last row on its cluster: no need to wait until they are gone)
        await kube.delete(NAMESPACES, ns)
    return out


# -- driver -----------------------------------------------------------------------------------------
def up(args: argparse.Namespace, system: str, count: int, cpu: str, mem: str, timed: bool,
       addons: tuple[str, ...] = ()) -> tuple[Cluster, float]:
    t = time.monotonic()
    cluster = Cluster.up(ClusterOptions(
        nodes=NodeShape(count=count, cpu=cpu, memory=mem),
        dir=Path(tempfile.mkdtemp(prefix=f"{system}-", dir=args.workdir)) / "cluster",
        die_with_parent=True, timed_pods=timed,
        addons=addons + ((system,) if system in ("kueue", "coscheduling") else ()),
        timeout=args.up_timeout))
    return cluster, round(time.monotonic() - t, 1)


async def run_big(args: argparse.Namespace, system: System) -> dict[str, Any]:
    kube = await Kube.from_config(str(system.cluster.kubeconfig))
    out: dict[str, Any] = {}
    try:
        if system.name == "kueue":
            kueue_queues(system.cluster, {"bench": (args.nodes * 32, f"{args.nodes * 256}Gi")})
        await system.start(kube)
        if args.jobs:
            system.kueue_config(KUEUE_PLAIN)
            out["a_single_pod_jobs"] = await throughput(system, kube, args.jobs, 1, "1", args.timeout,
                                                        last=not args.gangs)
            print(system.name, "a", {k: v for k, v in out["a_single_pod_jobs"].items()
                                     if k != "api_requests_per_pod"}, flush=True)
        if args.gangs:
            # a third of the nodes taken by pods nobody queues: the gangs' pods (one per node)
            # ask for 1.5x the free nodes, so some gangs must wait whole
            filled = args.nodes // 3
            ns_fill = await fill(system, kube, filled, GANG_POD_CPU)
            if system.name == "kueue":  # its quota: what is free for it (as an admin would set it)
                free = args.nodes - filled
                kueue_queues(system.cluster, {"bench": (free * int(GANG_POD_CPU), f"{free * 256}Gi")})
            system.kueue_config(None)
            out["b_gangs_of_10"] = await throughput(system, kube, args.gangs, 10, GANG_POD_CPU, args.timeout,
                                                    settle=args.settle, seconds=GANG_POD_SECONDS, last=True)
            out["b_gangs_of_10"]["nodes_taken_before"] = filled
            await kube.delete(NAMESPACES, ns_fill)
            print(system.name, "b", {k: v for k, v in out["b_gangs_of_10"].items()
                                     if k != "api_requests_per_pod"}, flush=True)
    finally:
        system.stop()
        await kube.close()
    return out


async def run_mpi(args: argparse.Namespace, system: System) -> dict[str, Any]:
    kube = await Kube.from_config(str(system.cluster.kubeconfig))
    try:
        await system.start(kube)
        out = {"c_mpijobs_scattered": await mpijobs(system, kube, args)}
        print(system.name, "c", out["c_mpijobs_scattered"], flush=True)
    finally:
        system.stop()
        await kube.close()
    return out


async def run_pool(args: argparse.Namespace, system: System) -> dict[str, Any]:
    kube = await Kube.from_config(str(system.cluster.kubeconfig))
    out: dict[str, Any] = {}
    try:
        if system.name == "kueue":
            slots = args.pool_nodes * args.pool_cpu
            kueue_queues(system.cluster, {"bench": (slots, f"{args.pool_nodes * 64}Gi")})
            kueue_queues(system.cluster, {a: (slots * s // 100, f"{args.pool_nodes * 64}Gi")
                                          for a, s in SHARES.items()}, cohort="peers")
        await system.start(kube)
        if system.name == "fluxnetes":  # (its CRD is installed by the operator)
            fluxaccounts(system.cluster)
        out["d_large_behind_stream"] = await large_behind_stream(system, kube, args)
        print(system.name, "d/f", out["d_large_behind_stream"], flush=True)
        # Kueue's fair sharing needs its ClusterQueues to fill their quotas: without
        # waitForPodsReady (with it, blockAdmission admits one Workload at a time)
        system.kueue_config(KUEUE_PLAIN)
        out["e_shares_50_30_20"] = await shares(system, kube, args)
        if system.name == "coscheduling":  # (as kube-scheduler: the split it gives with nothing to set)
            out["e_shares_50_30_20"]["note"] = ("scheduler-plugins' coscheduling has no accounts, queues or shares "
                                                "(the profile runs Coscheduling only, not CapacityScheduling): "
                                                "nothing was configured; the split is what it does unasked")
        print(system.name, "e", {k: v for k, v in out["e_shares_50_30_20"].items() if k != "samples"}, flush=True)
    finally:
        system.stop()
        await kube.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small sizes, to try it out")
    ap.add_argument("--systems", default=",".join(SYSTEMS), type=lambda t: t.split(","))
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--jobs", type=int, default=1000, help="row a: single-pod Jobs")
    ap.add_argument("--gangs", type=int, default=100, help="row b: Jobs of 10 pods")
    ap.add_argument("--mpijobs", type=int, default=100, help="row c: MPIJobs of 1 launcher + 8 workers")
    ap.add_argument("--mpi-nodes", type=int, default=None, help="row c: nodes (4 cpu; half taken first); default --nodes")
    ap.add_argument("--mpi-run-seconds", type=int, default=30, help="row c: how long a launcher runs")
    ap.add_argument("--pool-nodes", type=int, default=20, help="rows d-f: nodes of the small cluster")
    ap.add_argument("--pool-cpu", type=int, default=8)
    ap.add_argument("--stream-seconds", type=float, default=150)
    ap.add_argument("--stream-load", type=float, default=1.5, help="small-Job arrivals over the pool's drain rate")
    ap.add_argument("--small-seconds", type=float, nargs=2, default=(8, 16))
    ap.add_argument("--large-after", type=float, default=20)
    ap.add_argument("--large-seconds", type=float, default=10)
    ap.add_argument("--grace", type=float, default=120, help="how long after the stream the large Job may start")
    ap.add_argument("--share-jobs", type=int, default=150, help="row e: Jobs per account")
    ap.add_argument("--share-cpu", type=int, default=4, help="row e: cpus per Job (a few slots per node: many waves)")
    ap.add_argument("--share-seconds", type=float, nargs=2, default=(8, 16))
    ap.add_argument("--share-timeout", type=float, default=900)
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--settle", type=float, default=20, help="row b ends after this long without a new binding")
    ap.add_argument("--up-timeout", type=float, default=1200, help="seconds for a cluster to come up (loaded machine)")
    ap.add_argument("--skip-pool", action="store_true", help="without rows d, e, f")
    ap.add_argument("--skip-mpi", action="store_true", help="without row c")
    ap.add_argument("--output")
    args = ap.parse_args()
    if args.quick:
        args.nodes, args.jobs, args.gangs = 100, 200, 20
        args.pool_nodes, args.stream_seconds, args.grace, args.share_jobs = 10, 80, 80, 60
        args.mpijobs, args.mpi_run_seconds = 20, 15
    if args.mpi_nodes is None:
        args.mpi_nodes = args.nodes
    out_path = Path(args.output or RESULTS / ("peers_quick.json" if args.quick else "peers.json"))
    doc: dict[str, Any] = {
        "benchmark": "peers",
        "parameters": {k: v for k, v in vars(args).items() if k not in ("output",)},
        "peers": {
            "kube-scheduler": "v1.36.3 (the dev cluster's), default profile",
            "fluxnetes": "this checkout, operator --job-mode auto --status-interval 0.3",
            "kueue": "sigs.k8s.io/kueue v0.17.0 built by hack/build-addons.sh kueue; configuration: "
                     "devcluster/addons.py kueue_configuration (clientConnection qps 50 / burst 100 as released; "
                     "rows a and e without waitForPodsReady; rows b, c, d with waitForPodsReady timeout 5m, "
                     "blockAdmission; fairSharing; ClusterQueues BestEffortFIFO; rows b, c: quota = the free "
                     "nodes' cpus; row c: integrations.frameworks with kubeflow.org/mpijob, the MPIJobs "
                     "naming a LocalQueue; row e: one cohort, nominal quotas and fair-sharing weights 50/30/20)",
            "mpi-operator": "github.com/kubeflow/mpi-operator v0.6.0 (dev cluster --addons mpi), row c only",
            "volcano": "not run: the Go module proxy refused volcano.sh/volcano@v1.13.0 (403 Forbidden: "
                       "'This module version is not available.')",
            "coscheduling": "sigs.k8s.io/scheduler-plugins v0.34.7 (k8s.io/* v0.34.7; csi-translation-lib "
                            "v0.34.1, the proxy refuses v0.34.7) built by hack/build-addons.sh coscheduling: "
                            "its kube-scheduler as a second scheduler, profile scheduler-plugins-scheduler with "
                            "Coscheduling (multiPoint; PrioritySort off; permitWaitingTimeSeconds 10; client qps "
                            "500 / burst 1000 like the dev cluster's kube-scheduler) and its PodGroup controller; "
                            "the workload pods name that scheduler, each Job of several pods has a PodGroup "
                            "(minMember = its pods); row c: the MPI Operator v0.6.0 with --gang-scheduling="
                            "scheduler-plugins-scheduler makes each MPIJob's PodGroup (minMember = 1 + 8 workers, "
                            "scheduleTimeoutSeconds unset) and sets the scheduler on its pods; row e: no accounts, "
                            "queues or shares to set (Coscheduling only, no CapacityScheduling): the split it gives unasked",
        },
        "machine": {"cpu_count": os.cpu_count(), "python": platform.python_version(),
                    "platform": platform.platform(), "load_average_at_start": os.getloadavg()},
        "systems": {},
    }
    with tempfile.TemporaryDirectory(prefix="fx-peers-") as tmp:
        args.workdir = tmp
        for name in args.systems:
            res: dict[str, Any] = {}
            if args.jobs or args.gangs:
                cluster, secs = up(args, name, args.nodes, "32", "256Gi", True)
                res["cluster_up_s"] = secs
                try:
                    res.update(asyncio.run(run_big(args, System(name, args, cluster))))
                finally:
                    cluster.down()
            if args.mpijobs and not args.skip_mpi:
                cluster, secs = up(args, name, args.mpi_nodes, MPI_NODE_CPU, f"{MPI_NODE_MEMORY_GI}Gi", True,
                                   addons=("mpi",))
                res["mpi_cluster_up_s"] = secs
                try:
                    res.update(asyncio.run(run_mpi(args, System(name, args, cluster))))
                finally:
                    cluster.down()
            if not args.skip_pool:
                cluster, secs = up(args, name, args.pool_nodes, str(args.pool_cpu), "64Gi", True)
                res["pool_cluster_up_s"] = secs
                try:
                    res.update(asyncio.run(run_pool(args, System(name, args, cluster))))
                finally:
                    cluster.down()
            doc["systems"][name] = res
            out_path.parent.mkdir(parents=True, exist_ok=True)
            out_path.write_text(json.dumps(doc, indent=1) + "\n")  # each system as it ends
    doc["machine"]["load_average_at_end"] = os.getloadavg()
    out_path.write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps({n: {k: v for k, v in r.items()} for n, r in doc["systems"].items()}, default=str)[:4000])


if __name__ == "__main__":
    main()
