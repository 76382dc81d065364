"""The chaos soak: a stream of mixed work on a dev cluster, two operator replicas, and faults at
seeded random moments, judged throughout by `invariants.Checker` (see `bench/chaos.py`).

Parts, each usable alone: `soak_processes` (a private PostgreSQL, the webhook's Service
stand-in, the operator replicas) and `soak_stream` (the workloads, their lifecycle and
judgement). Here: the faults and `Soak`, which puts them together, injects the faults (leader SIGKILL, node replaced, PostgreSQL
  restart, API server restart with etcd kept, a running Job deleted while its pods take their
  time to terminate) and writes the result.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import platform
import random
import signal
import statistics
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from fluxnetes.devcluster.cluster import Cluster
from fluxnetes.devcluster.components import TIMED_POD_ANNOTATION
from fluxnetes.devcluster.invariants import Checker, Poller, Violation
from fluxnetes.devcluster.nodes import DEV_NODE_LABEL, RACK_LABEL, ZONE_LABEL, NodeShape
from fluxnetes.devcluster.soak_processes import (
    Postgres,
    Replicas,
    _say,
)
from fluxnetes.devcluster.soak_stream import (
    WORKLOAD_LABEL,
    Stream,
    Workload,
    _belongs,
    _container,
)
from fluxnetes.devcluster.state import ClusterOptions

FAULT_KINDS = ("leader-kill", "node-replace", "postgres-restart", "apiserver-restart", "job-delete")
# job-delete: a running Job is deleted while a finalizer keeps its pods Terminating this long
# (a kubelet stopping slow containers): their room must stay taken until they are gone
HOLD_FINALIZER = "chaos.fluxnetes.io/hold"
HOLD_SECONDS = 12.0


# -- faults -------------------------------------------------------------------------------------------
@dataclass
class Fault:
    kind: str
    planned: float  # seconds after the stream started
    at: float = 0.0  # wall clock when injected
    done: float = 0.0  # wall clock when the injection (and the component's return) finished
    detail: str = ""
    error: str = ""
    next_bind_after: float | None = None  # seconds from `at` to the next fluxnetes bind

    def as_dict(self, t0: float) -> dict[str, Any]:
        d = asdict(self)
        d["at_s"] = round(self.at - t0, 1) if self.at else None
        d["duration_s"] = round(self.done - self.at, 2) if self.at and self.done else None
        for k in ("at", "done"):
            d[k] = round(d[k], 3)
        return d


def plan_faults(rng: random.Random, kinds: tuple[str, ...], each: int, start: float, end: float,
                min_gap: float) -> list[Fault]:
    """`each` faults of every kind at random moments in [start, end), at least `min_gap` apart
    (evenly spaced slots, shuffled kinds, jittered within the slot), sorted by time."""
    order = [k for k in kinds for _ in range(each)]
    rng.shuffle(order)
    if not order:
        return []
    slot = (end - start) / len(order)
    jitter = max(0.0, slot - min_gap)
    return [Fault(kind, round(start + i * slot + rng.uniform(0, jitter), 1)) for i, kind in enumerate(order)]


# -- the soak ------------------------------------------------------------------------------------------
@dataclass
class SoakOptions:
    minutes: float = 30.0
    faults_each: int = 20
    nodes: int = 50
    node_cpu: int = 8
    seed: int = 1
    arrival_seconds: float = 1.0  # mean time between submissions
    # a gang's pods are placed one patch each: a leader killed between them leaves the gang
    # partially placed until the next leader takes over (lease 10 s + its start) and ends it
    group_grace: float = 20.0
    share_grace: float = 30.0
    drain_seconds: float = 300.0
    warmup_seconds: float = 20.0
    cooldown_seconds: float = 30.0
    replicas: int = 2
    store: str = "postgres"  # postgres (our own server) or a store URL
    operator_args: tuple[str, ...] = ()
    kinds: tuple[str, ...] = FAULT_KINDS
    cluster_dir: Path | None = None  # attach to a running cluster instead of starting one
    work_dir: Path | None = None
    probe: bool = True  # end with a gang asking every core of every node (finds leaked capacity)
    log: Callable[[str], None] = _say


def fluxjobs_mode(operator_args: tuple[str, ...]) -> str:
    """The operator's ``--fluxjobs`` as these arguments set it: the last one given, else the
    operator's default (``waiting``: a group placed at once has no FluxJob, so the shares
    invariant cannot ask one for its pods)."""
    args = " ".join(operator_args).replace("=", " ").split()
    mode = "waiting"
    for a, b in itertools.pairwise(args):
        if a == "--fluxjobs":
            mode = b
    return mode


class Soak:
    def __init__(self, opts: SoakOptions) -> None:
        self.opts = opts
        self.rng = random.Random(opts.seed)  # the workloads
        self.fault_rng = random.Random(opts.seed + 1_000_003)  # the faults' moments and victims
        self.work = opts.work_dir or Path(tempfile.mkdtemp(prefix="fluxnetes-chaos."))
        self.work.mkdir(parents=True, exist_ok=True)
        self.cluster: Cluster | None = None
        self.own_cluster = False
        self.pg: Postgres | None = None
        self.replicas: Replicas | None = None
        self.stream: Stream | None = None
        self.namespaces = ["chaos-a", "chaos-b"]
        self.checker = Checker(managed_namespaces=lambda: self.namespaces,
                               group_grace=opts.group_grace, share_grace=opts.share_grace,
                               fluxjobs_waiting=fluxjobs_mode(opts.operator_args) == "waiting")
        self.poller: Poller | None = None
        self.faults: list[Fault] = []
        self.shape = NodeShape(count=opts.nodes, cpu=str(opts.node_cpu), memory=f"{4 * opts.node_cpu}Gi",
                               pods=110, zones=2, racks=2)
        self._node_seq = opts.nodes
        self.t0 = 0.0
        self.load_at_start = os.getloadavg()
        self.probe: dict[str, Any] = {}
        self.errors: list[str] = []
        self._lost_evidence: list[dict[str, Any]] | None = None
        self._faults_done = threading.Event()
        self._release = threading.Event()
        self._lifts: list[threading.Timer] = []  # job-delete: finalizers still to be lifted
        self._injector: threading.Thread | None = None

    # -- setup and teardown ---------------------------------------------------------------------
    def setup(self) -> None:
        o = self.opts
        if o.cluster_dir is not None:
            self.cluster = Cluster.attach(o.cluster_dir)
        else:
            o.log(f"starting a dev cluster with {o.nodes} nodes in {self.work / 'cluster'}")
            self.cluster = Cluster.up(ClusterOptions(nodes=self.shape, dir=self.work / "cluster",
                                                     timed_pods=True, die_with_parent=True))
            self.own_cluster = True
        c = self.cluster
        if o.store == "postgres":
            o.log("starting a private PostgreSQL")
            self.pg = Postgres().start()
            store = self.pg.url
        else:
            store = o.store
        for ns in self.namespaces:
            with contextlib.suppress(urllib.error.HTTPError):
                c.api_call("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                                          "metadata": {"name": ns, "labels": {
                                                              "fluxnetes.io/enabled": "true"}}})
        o.log(f"starting {o.replicas} operator replicas (store {store.split('@')[-1]})")
        self.replicas = Replicas(c, store, self.work, o.replicas, o.operator_args)
        self.replicas.start_all()
        self.stream = Stream(c, self.rng, self.namespaces, o.node_cpu)
        self.poller = Poller(c.api_get, self.checker, 1.0, on_violation=self._on_violation).start()

    def teardown(self) -> None:
        if self.poller is not None:
            self.poller.stop()
        if self.replicas is not None:
            self.replicas.stop_all()
        if self.cluster is not None:
            for kind in ("mutatingwebhookconfigurations", "validatingwebhookconfigurations"):
                with contextlib.suppress(urllib.error.URLError, OSError):
                    self.cluster.api_call("DELETE", f"/apis/admissionregistration.k8s.io/v1/{kind}/fluxnetes.io")
            if self.own_cluster:
                self.cluster.down()
            else:
                for ns in self.namespaces:
                    with contextlib.suppress(urllib.error.URLError, OSError):
                        self.cluster.api_call("DELETE", f"/api/v1/namespaces/{ns}")
        if self.pg is not None:
            self.pg.stop()
        self._release.set()
        if self._injector is not None:
            self._injector.join(timeout=10)

    def _on_violation(self, v: Violation) -> None:
        before = [f for f in self.faults if f.at and f.at <= v.first_seen]
        if before:
            f = before[-1]
            v.preceding_fault = {"kind": f.kind, "at_s": round(f.at - self.t0, 1),
                                 "seconds_before": round(v.first_seen - f.at, 1), "detail": f.detail}
        self.opts.log(f"VIOLATION {v.kind}: {v.detail}"
                      + (f" [after {v.preceding_fault['kind']} at {v.preceding_fault['at_s']} s]"
                         if v.preceding_fault else ""))

    # -- faults ---------------------------------------------------------------------------------
    def inject(self, f: Fault) -> None:
        assert self.cluster is not None and self.replicas is not None
        f.at = time.time()
        try:
            if f.kind == "leader-kill":
                with self.replicas.lock:
                    r = self.replicas.leader()
                    if r is None:
                        r = next((x for x in self.replicas.replicas if x.alive()), self.replicas.replicas[0])
                        f.detail = f"no Lease holder among the replicas; killed replica {r.slot}"
                    else:
                        f.detail = f"killed leader replica {r.slot} (pid {r.proc.pid if r.proc else '?'})"
                    self.replicas.kill(r, signal.SIGKILL)
                    self.replicas.start(r, wait=60)
            elif f.kind == "node-replace":
                f.detail = self._replace_node()
            elif f.kind == "postgres-restart":
                if self.pg is None:
                    f.detail = "skipped: the store is not our PostgreSQL"
                else:
                    self.pg.restart()
                    f.detail = "pg_ctl restart -m fast"
            elif f.kind == "job-delete":
                f.detail = self._delete_running_job()
            elif f.kind == "apiserver-restart":
                self.cluster.restart_component("kube-apiserver")
                f.detail = "kube-apiserver stopped (SIGTERM) and started again, etcd kept"
            else:
                raise ValueError(f"unknown fault kind {f.kind}")
        except Exception as exc:  # a fault that could not be injected is reported, never fatal
            f.error = f"{type(exc).__name__}: {exc}"
        f.done = time.time()
        self.opts.log(f"fault {f.kind}: {f.detail or ''}{' ERROR ' + f.error if f.error else ''}"
                      f" ({f.done - f.at:.1f} s)")

    def _delete_running_job(self) -> str:
        """Delete a Job whose pods all run, a finalizer holding them Terminating for
        HOLD_SECONDS (then lifted, from a timer): the room they use is not free until they
        are gone, and the checker counts them meanwhile."""
        assert self.stream is not None
        pods_of: dict[str, list[Mapping[str, Any]]] = {}
        running: list[Workload] = []
        deadline = time.time() + 20.0  # (none running now: one soon)
        while not running:
            snap = self.poller.latest if self.poller else None
            pods_of = {}
            for p in snap.pods if snap else ():
                wid = ((p.get("metadata") or {}).get("labels") or {}).get(WORKLOAD_LABEL)
                if wid:
                    pods_of.setdefault(wid, []).append(p)
            running = [w for w in self.stream.workloads
                       if w.kind in ("job", "gang") and not w.done and w.deleted is None
                       and len(pods_of.get(w.id, [])) == w.size
                       and all((p.get("status") or {}).get("phase") == "Running"
                               and (p.get("spec") or {}).get("nodeName")
                               and not (p.get("metadata") or {}).get("deletionTimestamp") for p in pods_of[w.id])]
            if not running and time.time() > deadline:
                raise RuntimeError("no Job had all its pods running for 20 s")
            if not running:
                time.sleep(1.0)
        w = self.fault_rng.choice(sorted(running, key=lambda x: x.id))
        held = [str(p["metadata"]["name"]) for p in pods_of[w.id]]
        base = f"/api/v1/namespaces/{w.namespace}/pods"
        for name in held:
            self.stream.call("PATCH", f"{base}/{name}", {"metadata": {"finalizers": [HOLD_FINALIZER]}},
                             patch=True, patience=30)
        self.stream.call("DELETE", f"/apis/batch/v1/namespaces/{w.namespace}/jobs/{w.name}",
                         {"propagationPolicy": "Background"}, patience=30)
        now = time.time()
        w.deleted = w.finished = now  # its user ended it: done, not lost

        def lift() -> None:
            for name in held:
                with contextlib.suppress(urllib.error.HTTPError):  # (404: gone already)
                    self.stream.call("PATCH", f"{base}/{name}", {"metadata": {"finalizers": None}},  # type: ignore[union-attr]
                                     patch=True, patience=120)

        timer = threading.Timer(HOLD_SECONDS, lift)
        timer.daemon = True
        timer.start()
        self._lifts.append(timer)
        nodes = sorted({str(p["spec"]["nodeName"]) for p in pods_of[w.id]})
        return (f"deleted Job {w.namespace}/{w.name} with {len(held)} running pod(s) on {', '.join(nodes)}, "
                f"held Terminating {HOLD_SECONDS:.0f} s")

    def _replace_node(self) -> str:
        assert self.cluster is not None
        snap = self.poller.latest if self.poller else None
        names = sorted(str(n["metadata"]["name"]) for n in (snap.nodes if snap else ())
                       if (n["metadata"].get("labels") or {}).get(DEV_NODE_LABEL) == "true")
        if not names:
            names = sorted(n["metadata"]["name"] for n in self.cluster.api_get(
                f"/api/v1/nodes?labelSelector={DEV_NODE_LABEL}%3Dtrue")["items"])
        busy = sorted({str(p["spec"]["nodeName"]) for p in (snap.pods if snap else ())
                       if (p.get("spec") or {}).get("nodeName") in names
                       and ((p.get("metadata") or {}).get("labels") or {}).get(WORKLOAD_LABEL)
                       and (p.get("status") or {}).get("phase") == "Running"})
        victim = self.fault_rng.choice(busy or names)
        node = self.cluster.api_get(f"/api/v1/nodes/{victim}")
        labels = node["metadata"].get("labels") or {}
        self.cluster.delete_node(victim)
        new = f"{self.shape.prefix}-{self._node_seq}"
        self._node_seq += 1
        self.cluster.add_node(self.shape, new, zone=labels.get(ZONE_LABEL), rack=labels.get(RACK_LABEL))
        return f"deleted {victim} ({'running work' if busy else 'idle'}), added {new}"

    # -- the run --------------------------------------------------------------------------------
    def _list(self, path: str) -> list[dict[str, Any]]:
        assert self.cluster is not None
        try:
            return list(self.cluster.api_get(path + "?resourceVersion=0", 20)["items"])
        except (urllib.error.URLError, OSError):
            return []

    def _follow(self, draining: bool = False) -> None:
        assert self.stream is not None and self.poller is not None
        snap = self.poller.latest
        if snap is None:
            return
        deps: list[dict[str, Any]] = []
        for ns in self.namespaces:
            deps += self._list(f"/apis/apps/v1/namespaces/{ns}/deployments")
        self.stream.follow(snap.pods, snap.jobs, deps, snap.fluxjobs, time.time(), draining)

    def run(self) -> dict[str, Any]:
        o = self.opts
        try:
            self.setup()
            self._stream_phase()
            self._drain_phase()
            if o.probe:
                self._probe_phase()
        except KeyboardInterrupt:
            self.errors.append("interrupted")
        except Exception as exc:
            self.errors.append(f"{type(exc).__name__}: {exc}")
            o.log(f"soak error: {exc}")
        finally:
            result = self.result()
            self.teardown()
        return result

    def _stream_phase(self) -> None:
        o = self.opts
        assert self.stream is not None and self.replicas is not None
        duration = o.minutes * 60
        self.t0 = time.time()
        self.faults = plan_faults(self.fault_rng, o.kinds, o.faults_each, o.warmup_seconds,
                                  max(o.warmup_seconds + 1, duration - o.cooldown_seconds), 8.0)
        o.log(f"stream for {duration:.0f} s with {len(self.faults)} faults")
        stop = threading.Event()
        self._injector = threading.Thread(target=self._inject_all, args=(stop, duration), name="faults",
                                          daemon=True)
        self._injector.start()
        try:
            self._submit_until(duration)
        finally:
            stop.set()
            self._faults_done.wait(timeout=300)

    def _inject_all(self, stop: threading.Event, duration: float) -> None:
        """The faults, one after the other at their planned moments (in their own thread, so the
        stream goes on while a component is down)."""
        for f in self.faults:
            while not stop.is_set() and time.time() - self.t0 < f.planned:
                stop.wait(0.2)
            if stop.is_set() or time.time() - self.t0 >= duration:
                f.error = "not injected: the stream ended first"
                continue
            self.inject(f)
        self._faults_done.set()
        # a component restarted from this thread gets SIGTERM when the thread ends (the dev
        # cluster's die_with_parent is per thread): live until the soak has stopped everything
        self._release.wait()

    def _submit_until(self, duration: float) -> None:
        o = self.opts
        assert self.stream is not None and self.replicas is not None
        next_submit = 0.0
        last_follow = 0.0
        mix = ("pod", "job", "job", "gang", "gang", "group", "deploy")
        while (now := time.time() - self.t0) < duration:
            if now >= next_submit:
                self.stream.submit(self.rng.choice(mix))
                next_submit = now + self.rng.expovariate(1.0 / o.arrival_seconds)
            if now - last_follow >= 1.0:
                self._follow()
                for e in self.replicas.check_exits():
                    o.log(f"operator replica {e['slot']} exited by itself (status {e['exit']}): {e['log']}")
                last_follow = now
            time.sleep(0.1)

    def _drain_phase(self) -> None:
        o = self.opts
        assert self.stream is not None
        o.log(f"draining (up to {o.drain_seconds:.0f} s)")
        deadline = time.time() + o.drain_seconds
        for timer in self._lifts:  # every pod a job-delete held Terminating is let go
            timer.join(timeout=max(1.0, deadline - time.time()))
        while time.time() < deadline:
            self._follow(draining=True)
            if all(w.done and (w.kind in ("job", "gang") or w.deleted is not None or w.failed)
                   for w in self.stream.workloads):
                break
            time.sleep(1.0)
        # a final look after the status writes and the last grace periods
        time.sleep(min(5.0, o.share_grace))
        self._follow(draining=True)
        if self.poller is not None and self.poller.latest is not None:
            self.stream.judge_unfinished(self.poller.latest.fluxjobs)
            # what the lost ones look like now, before the probe's clean-up deletes them
            self._lost_evidence = [self._evidence(w, self.poller.latest)
                                   for w in self.stream.workloads if not w.done]

    def _probe_phase(self) -> None:
        """Every workload is gone: a gang asking every core of every node must start now. If the
        operator's graph kept anything (a leak) or lost a node, it cannot."""
        o = self.opts
        assert self.cluster is not None and self.stream is not None and self.poller is not None
        # whatever is left (lost work included) goes first: the probe needs empty nodes
        for ns in self.namespaces:
            for coll in (f"/apis/apps/v1/namespaces/{ns}/deployments", f"/apis/batch/v1/namespaces/{ns}/jobs",
                         f"/api/v1/namespaces/{ns}/pods"):
                with contextlib.suppress(urllib.error.URLError, OSError):
                    self.stream.call("DELETE", coll, {"propagationPolicy": "Background"}, patience=30)
        deadline = time.time() + 120
        while time.time() < deadline:
            snap = self.poller.latest
            left = [p for p in (snap.pods if snap else [{}])
                    if (p.get("metadata") or {}).get("namespace") in self.namespaces
                    and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")]
            if snap is not None and not left:
                break
            time.sleep(1.0)
        else:
            self.probe = {"skipped": "pods of the soak were still there 120 s after deleting them"}
            return
        nodes = [n for n in self._list("/api/v1/nodes")
                 if (n["metadata"].get("labels") or {}).get(DEV_NODE_LABEL) == "true"]
        count = len(nodes)
        ns = self.namespaces[0]
        name = "capacity-probe"
        body = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name, "labels": {WORKLOAD_LABEL: name}},
                "spec": {"parallelism": count, "completions": count, "completionMode": "Indexed",
                         "template": {"metadata": {"labels": {WORKLOAD_LABEL: name},
                                                   "annotations": {TIMED_POD_ANNOTATION: "2s"}},
                                      "spec": {"restartPolicy": "Never",
                                               "containers": _container(o.node_cpu),
                                               "terminationGracePeriodSeconds": 0}}}}
        o.log(f"capacity probe: {count} pods of {o.node_cpu} cpu (every core of every node)")
        started = time.time()
        self.probe = {"pods": count, "cpu_each": o.node_cpu, "ok": False}
        try:
            self.stream.call("POST", f"/apis/batch/v1/namespaces/{ns}/jobs", body)
        except (urllib.error.URLError, OSError) as exc:
            self.probe["error"] = str(exc)
            return
        while time.time() - started < 120:
            try:
                job = self.cluster.api_get(f"/apis/batch/v1/namespaces/{ns}/jobs/{name}")
            except (urllib.error.URLError, OSError):
                time.sleep(1)
                continue
            if any(c.get("type") == "Complete" and c.get("status") == "True"
                   for c in (job.get("status") or {}).get("conditions") or []):
                self.probe.update(ok=True, seconds=round(time.time() - started, 1))
                return
            time.sleep(1.0)
        fjs = [f for f in self._list(f"/apis/fluxnetes.io/v1alpha1/namespaces/{ns}/fluxjobs")]
        mine = [f for f in fjs if name in f["metadata"]["name"]]
        holding = [f"{f['metadata']['namespace']}/{f['metadata']['name']}"
                   for f in self._list("/apis/fluxnetes.io/v1alpha1/fluxjobs")
                   if (f.get("status") or {}).get("phase") == "Running"
                   and name not in f["metadata"]["name"]]
        self.probe["fluxjob"] = [{"name": f["metadata"]["name"], "phase": (f.get("status") or {}).get("phase"),
                                  "reason": (f.get("status") or {}).get("reason")} for f in mine]
        self.probe["running_fluxjobs_left"] = holding
        v = Violation("leaked-capacity", name,
                      f"a gang asking all {count * o.node_cpu} cores of the {count} empty nodes did not "
                      f"complete within 120 s (its FluxJob: {self.probe['fluxjob']}; FluxJobs still "
                      f"Running: {holding[:10]})", started, time.time(), dict(self.probe))
        self.checker.violations.append(v)
        self._on_violation(v)

    # -- the result -----------------------------------------------------------------------------
    def result(self) -> dict[str, Any]:
        o = self.opts
        binds = sorted(t for t, _ in self.checker.binds)
        for f in self.faults:
            if f.at:
                nxt = next((t for t in binds if t >= f.at), None)
                f.next_bind_after = None if nxt is None else round(nxt - f.at, 2)
        per_kind: dict[str, list[float]] = {}
        for f in self.faults:
            if f.next_bind_after is not None:
                per_kind.setdefault(f.kind, []).append(f.next_bind_after)
        workloads = self.stream.workloads if self.stream else []
        lost = [w for w in workloads if not w.done]
        dup_jobs = {str(v.evidence.get("job_uid")) for v in self.checker.violations if v.kind == "duplicate-run"}
        duplicated = [w for w in workloads if w.uid and w.uid in dup_jobs]
        snap = self.poller.latest if self.poller else None
        violations = [v.as_dict() for v in self.checker.violations]
        counts: dict[str, int] = {}
        for v in self.checker.violations:
            counts[v.kind] = counts.get(v.kind, 0) + 1
        injected = [f for f in self.faults if f.at and not f.error]
        return {
            "benchmark": "chaos",
            "parameters": {**{k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(o).items()
                              if k != "log"},
                           # the operator's mode, as its arguments (or its default) set it
                           "fluxjobs": fluxjobs_mode(o.operator_args)},
            "machine": {"cpu_count": os.cpu_count(), "python": platform.python_version(),
                        "platform": platform.platform(), "load_avg_at_start": self.load_at_start,
                        "load_avg_at_end": os.getloadavg()},
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.t0 or time.time())),
            "stream_seconds": round(o.minutes * 60, 1),
            "wall_seconds": round(time.time() - self.t0, 1) if self.t0 else 0,
            "faults": [f.as_dict(self.t0) for f in self.faults],
            "faults_injected": {k: sum(1 for f in injected if f.kind == k) for k in o.kinds},
            "faults_failed": [f.as_dict(self.t0) for f in self.faults if f.error],
            "time_to_next_bind_s": {k: {"median": round(statistics.median(v), 2), "max": round(max(v), 2),
                                        "count": len(v)} for k, v in per_kind.items()},
            "workloads": {
                "submitted": len(workloads),
                "finished": sum(1 for w in workloads if w.finished is not None),
                "failed_with_reason": sum(1 for w in workloads if w.failed and w.finished is None),
                "lost": len(lost),
                "duplicated": len(duplicated),
                "by_kind": self.stream.summary() if self.stream else {},
            },
            "lost": (self._lost_evidence if self._lost_evidence is not None
                     else [self._evidence(w, snap) for w in lost]),
            "failed": [{"id": w.id, "kind": w.kind, "reason": w.failed} for w in workloads if w.failed][:50],
            "duplicated": [w.id for w in duplicated],
            "violations": violations,
            "violation_counts": counts,
            "open_conditions_at_end": self.checker.open_episodes(),
            "probe": self.probe,
            "operator_exits": self.replicas.exits if self.replicas else [],
            "operator_logs": str(self.work),
            "invariant_polls": self.checker.snapshots,
            "failed_polls": self.poller.failed_reads if self.poller else 0,
            "api_retries": self.stream.api_errors if self.stream else 0,
            "errors": self.errors,
            "ok": (not violations and not lost and not duplicated and not self.errors
                   and len(injected) == len(self.faults)),
        }

    def _evidence(self, w: Workload, snap: Any) -> dict[str, Any]:
        pods = []
        fluxjobs = []
        if snap is not None:
            for p in snap.pods:
                md = p.get("metadata") or {}
                if (md.get("labels") or {}).get(WORKLOAD_LABEL) != w.id:
                    continue
                pods.append({"name": md.get("name"), "phase": (p.get("status") or {}).get("phase"),
                             "node": (p.get("spec") or {}).get("nodeName"),
                             "gated": bool((p.get("spec") or {}).get("schedulingGates")),
                             "fluxjob": (md.get("annotations") or {}).get("fluxnetes.io/fluxjob")})
            for f in snap.fluxjobs:
                if _belongs(f, w):
                    st = f.get("status") or {}
                    fluxjobs.append({"name": f["metadata"].get("name"), "phase": st.get("phase"),
                                     "reason": st.get("reason")})
        return {"id": w.id, "kind": w.kind, "namespace": w.namespace, "size": w.size, "cpu": w.cpu,
                "submitted_s": round(w.submitted - self.t0, 1), "deleted": w.deleted is not None,
                "pods": pods, "fluxjobs": fluxjobs}


def write_result(result: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1, default=str) + "\n")
