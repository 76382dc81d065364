"""Leadership on the local control plane: how long work waits when the leader goes.

Two operator replicas. Modes (``--modes``, comma-separated; each writes its own keys of
bench/results/leader_failover.json, the others' figures are kept):

- ``sigkill``: the leader is SIGKILLed, a pod is created in an opted-in namespace a second
  later (admitted and held by the follower's webhook), and the time from the kill until that
  pod is bound by the follower (now leader) is measured; the killed replica is restarted as
  the next follower. (Replicas share one webhook port, no store.)
- ``sigterm``: the leader's every scheduling cycle holds its event loop 12 s (more than the
  10 s lease, FLUXNETES_DEBUG_SLOW_CYCLE), it is sent SIGTERM in the middle of one, and the
  time until it exits and until the follower holds the Lease are measured.
- ``stream`` (issue 17, item 5): a steady stream of Jobs (single pods, and every
  ``--gang-every``-th a gang of ``--gang-size`` pods, Indexed) into an opted-in namespace,
  scheduled by two replicas sharing a PostgreSQL store behind one webhook address (the chart's
  shape); the leader is SIGKILLed when half the stream is submitted. Measured: kill -> the
  first bind of a pod of a Job created after the kill (the other replica's work), kill -> the
  other replica holds the Lease, the drain. Judged: every Job completes with exactly its pods,
  each bound once (a watch sees every pod), no node ever holds more than its allocatable (at
  every pod transition, from the watch, and once a second over all pods by
  `devcluster.invariants`, which also checks partial gangs, FluxJob shares, duplicate runs
  and queue bypass), one FluxJob per Job, Completed. tests/test_k8s_ha_stream.py runs a short
  form of the same round (`stream_round`).

    .venv/bin/python bench/leader_failover.py --modes sigkill,sigterm --rounds 5
    .venv/bin/python bench/leader_failover.py --modes stream --rounds 3 --jobs 500
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import uuid
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from fluxnetes.devcluster import Cluster, ClusterOptions, NodeShape
from fluxnetes.devcluster.apicalls import urlopen
from fluxnetes.devcluster.components import TIMED_POD_ANNOTATION
from fluxnetes.devcluster.invariants import JOB_INDEX_ANN, JOB_UID_LABEL, Checker, Poller
from fluxnetes.devcluster.soak_processes import LEASE, OPERATOR_NAMESPACE, Postgres, Replicas

RESULTS = Path(__file__).resolve().parent / "results" / "leader_failover.json"
OP_NS = "fluxnetes-bench"
FINISHED = ("Succeeded", "Failed")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait(what: str, cond: Callable[[], Any], timeout: float = 120, interval: float = 0.1) -> Any:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            out = cond()
        except Exception:
            out = None
        if out:
            return out
        time.sleep(interval)
    raise RuntimeError(f"timed out waiting for {what}")


def machine() -> dict[str, Any]:
    return {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform(),
            "loadavg": [round(x, 2) for x in os.getloadavg()]}


TAKEOVER = re.compile(r"taking over: caches made current in ([0-9.]+) s \((.*)\)")


def takeover_of(log: Path) -> dict[str, Any] | None:
    """The new leader's catch-up at takeover (Controller.catch_up's INFO line), if it logged one."""
    m = TAKEOVER.search(log.read_text(errors="replace"))
    return None if m is None else {"seconds": float(m.group(1)), "informers": m.group(2)}


def _say(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# -- sigkill / sigterm: bare pods, replicas sharing a webhook port ---------------------------
# the tests' hook (tests/crashhook) makes FLUXNETES_DEBUG_SLOW_CYCLE hold each cycle
CRASH_HOOK = str(Path(__file__).resolve().parent.parent / "tests" / "crashhook")


class Replica:
    def __init__(self, cluster: Cluster, port: int, log: Path, env: dict[str, str] | None = None) -> None:
        self.log = log
        if env and "FLUXNETES_DEBUG_SLOW_CYCLE" in env:
            env = {**env, "PYTHONPATH": os.pathsep.join(p for p in (CRASH_HOOK, os.environ.get("PYTHONPATH")) if p)}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "fluxnetes.k8s", "run", "--kubeconfig", str(cluster.kubeconfig),
             "--webhook-port", str(port), "--webhook-share-port", "--namespace", OP_NS, "--log-format", "text"],
            stdout=log.open("wb"), stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
        wait("webhook serving", lambda: "webhook serving" in log.read_text())

    @property
    def identity(self) -> str:
        return f"{socket.gethostname()}-{self.proc.pid}"

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(30)


def holder(cluster: Cluster) -> str:
    return str(cluster.kubectl_json("get", "lease", "-n", OP_NS, "fluxnetes-leader")["spec"].get("holderIdentity"))


def pod(name: str) -> str:
    return json.dumps({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
                       "spec": {"containers": [{"name": "c", "image": "x", "resources": {"requests": {"cpu": "1"}}}]}})


def opted_in_namespace(cluster: Cluster, prefix: str = "fx") -> str:
    ns = f"{prefix}-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "namespace", ns)
    cluster.kubectl("label", "namespace", ns, "fluxnetes.io/enabled=true")
    return ns


def remove_webhooks(cluster: Cluster) -> None:
    for kind in ("mutatingwebhookconfiguration", "validatingwebhookconfiguration"):
        cluster.kubectl("delete", kind, "fluxnetes.io", "--ignore-not-found", check=False)
    for kind in ("validatingadmissionpolicybinding", "validatingadmissionpolicy"):
        cluster.kubectl("delete", kind, "fluxnetes.io-gate", "--ignore-not-found", check=False)


def run_kill_modes(cluster: Cluster, work: Path, rounds: int, modes: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {"parameters": {"rounds": rounds, "lease_seconds": 10, "renew_deadline": 7,
                                          "retry_period": 2, "slow_cycle_seconds": 12},
                           "machine": machine()}
    replicas: list[Replica] = []
    try:
        ns = opted_in_namespace(cluster)
        port = free_port()
        replicas = [Replica(cluster, port, work / "a.log"), Replica(cluster, port, work / "b.log")]
        if "sigkill" in modes:
            kill_to_bound, takeovers = [], []
            for i in range(rounds):
                leader = next(r for r in replicas if wait("a leader", lambda: holder(cluster)) == r.identity)
                follower = next(r for r in replicas if r is not leader)
                leader.stop(signal.SIGKILL)
                killed = time.monotonic()
                time.sleep(1)
                name = f"k{i}"
                cluster.kubectl("create", "-n", ns, "-f", "-", input=pod(name))
                wait("bound", lambda: cluster.kubectl_json("get", "pod", "-n", ns, name)["spec"].get("nodeName"))  # noqa: B023
                kill_to_bound.append(time.monotonic() - killed)
                takeovers.append(takeover_of(follower.log))
                _say(f"sigkill round {i}: kill -> bound {kill_to_bound[-1]:.1f} s; takeover {takeovers[-1]}")
                replicas = [follower, Replica(cluster, port, work / f"a{i}.log")]
            out["sigkill_to_bound_seconds"] = {"all": [round(x, 2) for x in kill_to_bound],
                                               "median": round(statistics.median(kill_to_bound), 2),
                                               "max": round(max(kill_to_bound), 2), "target": 15}
            out["sigkill_takeover_catch_up"] = takeovers
            out["machine_after"] = machine()
        if "sigterm" in modes:
            exit_s, handover = [], []
            for i in range(rounds):
                for r in replicas:
                    r.stop()
                slow = Replica(cluster, port, work / f"slow{i}.log", {"FLUXNETES_DEBUG_SLOW_CYCLE": "12"})
                wait("slow leader", lambda: holder(cluster) == slow.identity)  # noqa: B023
                other = Replica(cluster, port, work / f"f{i}.log")
                wait("a slow cycle", lambda: "holding the event loop" in slow.log.read_text())  # noqa: B023
                time.sleep(3)
                sent = time.monotonic()
                slow.proc.send_signal(signal.SIGTERM)
                slow.proc.wait(30)
                exit_s.append(time.monotonic() - sent)
                wait("handover", lambda: holder(cluster) == other.identity, timeout=30)  # noqa: B023
                handover.append(time.monotonic() - sent)
                _say(f"sigterm round {i}: exit {exit_s[-1]:.2f} s, follower holds the lease after "
                     f"{handover[-1]:.1f} s")
                replicas = [other]
            out["sigterm_mid_cycle_exit_seconds"] = {"all": [round(x, 2) for x in exit_s],
                                                     "max": round(max(exit_s), 2), "target": 2}
            out["sigterm_to_follower_lease_seconds"] = {"all": [round(x, 2) for x in handover],
                                                        "max": round(max(handover), 2)}
        cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)
    finally:
        for r in replicas:
            r.stop()
        remove_webhooks(cluster)
    return out


# -- stream: a stream of Jobs, the leader SIGKILLed in the middle ------------------------------
@dataclass
class StreamOptions:
    jobs: int = 500
    rate: float = 4.0  # Jobs created per second (steady)
    gang_every: int = 10  # every N-th Job is a gang (0: none)
    gang_size: int = 3
    cpu_millis: int = 1000  # per pod
    memory_mib: int = 512  # per pod
    run_seconds: int = 5  # each pod runs this long (kwok timed pods)
    kill_at: float = 0.5  # the leader is SIGKILLed when this fraction of the Jobs is submitted
    lease_seconds: int = 10  # the replicas' --lease-duration (the failover bound is this + 5 s)
    drain_seconds: float = 600.0  # after the last submission, every Job must be Complete within
    settle_seconds: float = 120.0  # then every FluxJob Completed within
    poll_seconds: float = 1.0  # devcluster.invariants' poll interval
    group_grace: float = 20.0  # as bench/chaos.py: a gang half placed by a killed leader waits for the next
    share_grace: float = 30.0


@dataclass
class PodSeen:
    uid: str
    name: str
    job_uid: str
    index: str
    first_seen: float  # monotonic
    node: str | None = None
    bound: float | None = None  # monotonic, when the watch first saw spec.nodeName
    phase: str = ""
    deleted: bool = False


class PodWatch:
    """Every state of every pod of one namespace, from a watch (nothing sampled): when each pod
    appeared and was bound, and after every change whether its node still holds at most its
    allocatable (cpu, memory, pod count; bound pods not finished, as kube-scheduler counts)."""

    def __init__(self, cluster: Cluster, ns: str, nodes: list[Mapping[str, Any]]) -> None:
        from fluxnetes.k8s.resources import node_allocatable, parse_quantity

        self.cluster, self.ns = cluster, ns
        self.alloc: dict[str, tuple[int, int, int]] = {}
        for n in nodes:
            a = node_allocatable(n)
            pods = int(parse_quantity(((n.get("status") or {}).get("allocatable") or {}).get("pods", "110"), "pods"))
            self.alloc[str(n["metadata"]["name"])] = (a.cpu_millis, a.memory_bytes, pods)
        self.pods: dict[str, PodSeen] = {}
        self.held: dict[str, dict[str, tuple[int, int]]] = {}  # node -> pod uid -> (cpu m, memory B)
        self.overbooked: list[dict[str, Any]] = []
        self.peak: dict[str, list[int]] = {}  # node -> highest [cpu m, memory B, pods] held at once
        self.events = 0
        self.relists = 0
        self.lock = threading.Lock()
        self._stop = threading.Event()
        self._resp: Any = None
        self._thread = threading.Thread(target=self._run, name="pod-watch", daemon=True)

    def start(self) -> PodWatch:
        self._thread.start()
        return self

    def stop(self) -> None:
        # not closing the response: that waits for the reader's lock, held by a read blocked
        # until the next event or the socket timeout; the thread ends at its next line instead
        self._stop.set()
        self._thread.join(timeout=1)

    def _see(self, obj: Mapping[str, Any], deleted: bool = False) -> None:
        from fluxnetes.k8s.resources import ResourceError, pod_request

        now = time.monotonic()
        md, spec, status = obj.get("metadata") or {}, obj.get("spec") or {}, obj.get("status") or {}
        uid = str(md.get("uid"))
        with self.lock:
            self.events += 1
            rec = self.pods.get(uid)
            if rec is None:
                rec = self.pods[uid] = PodSeen(
                    uid, str(md.get("name")), str((md.get("labels") or {}).get(JOB_UID_LABEL, "")),
                    str((md.get("annotations") or {}).get(JOB_INDEX_ANN, "-")), now)
            node = spec.get("nodeName")
            if node and rec.node is None:
                rec.node, rec.bound = str(node), now
            rec.phase = str(status.get("phase", ""))
            rec.deleted = rec.deleted or deleted
            if rec.node is None:
                return
            held = self.held.setdefault(rec.node, {})
            if rec.deleted or rec.phase in FINISHED:
                held.pop(uid, None)
                return
            if uid in held:
                return
            try:
                r = pod_request(spec)
                held[uid] = (r.cpu_millis, r.memory_bytes)
            except ResourceError:
                held[uid] = (0, 0)
            used = [sum(c for c, _ in held.values()), sum(m for _, m in held.values()), len(held)]
            peak = self.peak.setdefault(rec.node, [0, 0, 0])
            self.peak[rec.node] = [max(a, b) for a, b in zip(peak, used, strict=True)]
            cap = self.alloc.get(rec.node)
            if cap is not None and any(u > c for u, c in zip(used, cap, strict=True)):
                self.overbooked.append({"node": rec.node, "pod": rec.name, "used": used, "allocatable": list(cap),
                                        "pods": sorted(self.pods[u].name for u in held)})

    def _run(self) -> None:
        base = f"/api/v1/namespaces/{self.ns}/pods"
        while not self._stop.is_set():
            try:
                listed = self.cluster.api_get(base, 30)
                self.relists += 1
                for p in listed["items"]:
                    self._see(p)
                rv = listed["metadata"]["resourceVersion"]
                url = f"{self.cluster.api_url}{base}?watch=1&resourceVersion={rv}&timeoutSeconds=600"
                self._resp = urlopen(url, self.cluster.ssl_context(), 60)
                for line in self._resp:
                    if self._stop.is_set():
                        return
                    ev = json.loads(line)
                    if ev.get("type") == "ERROR":
                        break  # e.g. 410 Gone: list again
                    self._see(ev["object"], deleted=ev.get("type") == "DELETED")
            except Exception:
                if self._stop.is_set():
                    return
                time.sleep(0.5)
            finally:
                with contextlib.suppress(Exception):
                    if self._resp is not None:
                        self._resp.close()


class LeaseWatch:
    """After a kill: when another identity holds the Lease (polled every 0.1 s)."""

    def __init__(self, cluster: Cluster, old: str, since: float) -> None:
        self.cluster, self.old, self.since = cluster, old, since
        self.taken: float | None = None  # monotonic
        self.holder = ""
        self._thread = threading.Thread(target=self._run, name="lease-watch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        path = f"/apis/coordination.k8s.io/v1/namespaces/{OPERATOR_NAMESPACE}/leases/{LEASE}"
        while time.monotonic() - self.since < 300:
            with contextlib.suppress(Exception):
                h = (self.cluster.api_get(path, 5).get("spec") or {}).get("holderIdentity") or ""
                if h and h != self.old:
                    self.taken, self.holder = time.monotonic(), str(h)
                    return
            time.sleep(0.1)


def job_body(name: str, size: int, o: StreamOptions) -> dict[str, Any]:
    req = {"cpu": f"{o.cpu_millis}m", "memory": f"{o.memory_mib}Mi"}
    spec: dict[str, Any] = {
        "parallelism": size, "completions": size, "backoffLimit": 6,
        "template": {"metadata": {"annotations": {TIMED_POD_ANNOTATION: f"{o.run_seconds}s"}},
                     "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 0,
                              "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10",
                                              "resources": {"requests": req, "limits": req}}]}}}
    if size > 1:
        spec["completionMode"] = "Indexed"  # every index is judged on its own (runs once)
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name}, "spec": spec}


def create(cluster: Cluster, path: str, body: dict[str, Any], patience: float = 60) -> tuple[dict[str, Any], int]:
    """POST, riding out the moment the killed replica's webhook connections fail (the API
    server answers 500 for a failed webhook call) and API server hiccups; returns the object
    and how many tries failed first."""
    deadline = time.monotonic() + patience
    retried = 0
    while True:
        try:
            return dict(cluster.api_call("POST", path, body)), retried
        except urllib.error.HTTPError as exc:
            if exc.code == 409 and retried:  # an earlier try got through
                return dict(cluster.api_get(f"{path}/{body['metadata']['name']}")), retried
            if exc.code not in (429, 500, 502, 503, 504) or time.monotonic() > deadline:
                raise
        except (urllib.error.URLError, OSError):
            if time.monotonic() > deadline:
                raise
        retried += 1
        time.sleep(0.2)


@dataclass
class Submitted:
    name: str
    uid: str
    size: int
    created: float  # monotonic, when the create returned
    failed_tries: int = 0  # creates refused first (the killed replica's webhook connections)


def _done(job: Mapping[str, Any]) -> str:
    for c in (job.get("status") or {}).get("conditions") or []:
        if c.get("status") == "True" and c.get("type") in ("Complete", "Failed"):
            return str(c["type"])
    return ""


@dataclass
class StreamRound:
    """One round's facts; `result()` is what the JSON and the test read."""

    opts: StreamOptions
    ns: str
    jobs: list[Submitted] = field(default_factory=list)
    kill_index: int = 0
    killed: str = ""
    kill_at: float = 0.0  # monotonic
    lease_taken: float | None = None
    new_leader: str = ""
    t0: float = 0.0
    submitted_at: float = 0.0
    drained_at: float | None = None
    settled_at: float | None = None
    load_before: tuple[float, float, float] = (0.0, 0.0, 0.0)
    load_after: tuple[float, float, float] = (0.0, 0.0, 0.0)
    final_jobs: dict[str, Mapping[str, Any]] = field(default_factory=dict)  # uid -> Job
    fluxjobs: list[Mapping[str, Any]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def result(self, watch: PodWatch, checker: Checker) -> dict[str, Any]:
        o = self.opts
        after_kill = {j.uid for j in self.jobs if j.created > self.kill_at}
        with watch.lock:
            pods = list(watch.pods.values())
        by_job: dict[str, list[PodSeen]] = {}
        for p in pods:
            by_job.setdefault(p.job_uid, []).append(p)
        new_binds = [p.bound - self.kill_at for p in pods if p.bound is not None and p.job_uid in after_kill]
        any_binds = [p.bound - self.kill_at for p in pods if p.bound is not None and p.bound > self.kill_at]
        not_once: list[dict[str, Any]] = []
        complete = failed = 0
        for j in self.jobs:
            job = self.final_jobs.get(j.uid) or {}
            st = job.get("status") or {}
            mine = by_job.get(j.uid, [])
            state = _done(job)
            complete += state == "Complete"
            failed += state == "Failed"
            ok = (len(mine) == j.size and all(p.bound is not None for p in mine)
                  and int(st.get("succeeded") or 0) == j.size and not st.get("failed")
                  and (j.size == 1 or len({p.index for p in mine}) == j.size))
            if not ok:
                not_once.append({"job": j.name, "size": j.size, "state": state or "unfinished",
                                 "pods": sorted(f"{p.name}[{p.index}]@{p.node}:{p.phase}" for p in mine),
                                 "succeeded": st.get("succeeded"), "failed": st.get("failed")})
        fj_of: dict[str, list[Mapping[str, Any]]] = {}
        for fj in self.fluxjobs:
            uid = str(((fj.get("spec") or {}).get("workload") or {}).get("uid", ""))
            fj_of.setdefault(uid, []).append(fj)
        phases: dict[str, int] = {}
        for fj in self.fluxjobs:
            ph = str((fj.get("status") or {}).get("phase", "(none)"))
            phases[ph] = phases.get(ph, 0) + 1
        wrong = [{"job": j.name, "fluxjobs": [
            f"{(f.get('metadata') or {}).get('name')}:{(f.get('status') or {}).get('phase')}" for f in fj_of.get(j.uid, [])]}
            for j in self.jobs
            if len(fj_of.get(j.uid, [])) != 1 or (fj_of[j.uid][0].get("status") or {}).get("phase") != "Completed"]
        violations: dict[str, int] = {}
        for v in checker.violations:
            violations[v.kind] = violations.get(v.kind, 0) + 1
        runs = checker.runs_per_index()
        mine_uids = {j.uid for j in self.jobs}
        twice = sorted(f"{k[0]}#{k[1]}" for k, n in runs.items() if n > 1 and k[0] in mine_uids)
        end = self.drained_at or time.monotonic()

        def r(x: float | None) -> float | None:
            return None if x is None else round(x, 2)

        return {
            "namespace": self.ns,
            "jobs": len(self.jobs),
            "gangs": sum(1 for j in self.jobs if j.size > 1),
            "pods_expected": sum(j.size for j in self.jobs),
            "failover": {
                "killed_at_job": self.kill_index, "killed": self.killed, "new_leader": self.new_leader,
                "kill_to_lease_taken_s": r(None if self.lease_taken is None else self.lease_taken - self.kill_at),
                "kill_to_first_bind_of_a_job_created_after_the_kill_s": r(min(new_binds, default=None)),
                "kill_to_first_bind_of_any_pod_s": r(min(any_binds, default=None)),
                "jobs_created_after_the_kill": len(after_kill),
                "bound_s": o.lease_seconds + 5,
            },
            "jobs_complete": complete,
            "jobs_failed": failed,
            "jobs_run_once": len(self.jobs) - len(not_once),
            "jobs_not_run_once": not_once[:20],
            "pods_created": sum(len(by_job.get(j.uid, [])) for j in self.jobs),
            "pods_bound": sum(1 for j in self.jobs for p in by_job.get(j.uid, []) if p.bound is not None),
            "indexes_run_twice": twice,
            "overbooked_transitions": len(watch.overbooked),
            "overbooked_examples": watch.overbooked[:5],
            "peak_cpu_millis_per_node": {n: p[0] for n, p in sorted(watch.peak.items())},
            "invariant_violations": violations,
            "invariant_violation_examples": [v.as_dict() for v in checker.violations[:10]],
            "invariant_polls": checker.snapshots,
            "pod_watch_events": watch.events,
            "fluxjob_phases": phases,
            "jobs_without_one_completed_fluxjob": wrong[:20],
            "jobs_without_one_completed_fluxjob_count": len(wrong),
            "creates_refused_then_retried": sum(j.failed_tries for j in self.jobs),
            "submit_seconds": r(self.submitted_at - self.t0),
            "drain_seconds": r(None if self.drained_at is None else self.drained_at - self.submitted_at),
            "total_seconds": r(end - self.t0),
            "fluxjobs_settled_after_drain_s": r(None if self.settled_at is None or self.drained_at is None
                                                else self.settled_at - self.drained_at),
            "load_before": [round(x, 2) for x in self.load_before],
            "load_after": [round(x, 2) for x in self.load_after],
            "errors": self.errors,
        }


def stream_round(cluster: Cluster, replicas: Replicas, ns: str, o: StreamOptions,
                 log: Callable[[str], None] = _say) -> dict[str, Any]:
    """One stream of ``o.jobs`` Jobs into ``ns`` (opted in) with the leader SIGKILLed at
    ``o.kill_at``; the killed replica is not restarted here. Returns `StreamRound.result()`."""
    nodes = cluster.api_get("/api/v1/nodes")["items"]
    rnd = StreamRound(o, ns, kill_index=int(o.jobs * o.kill_at))
    rnd.load_before = os.getloadavg()
    watch = PodWatch(cluster, ns, nodes).start()
    checker = Checker(managed_namespaces=lambda: [ns], group_grace=o.group_grace, share_grace=o.share_grace)
    poller = Poller(cluster.api_get, checker, o.poll_seconds,
                    on_violation=lambda v: log(f"VIOLATION {v.kind}: {v.detail}")).start()
    lease: LeaseWatch | None = None
    jobs_path = f"/apis/batch/v1/namespaces/{ns}/jobs"
    try:
        leader = wait("a leader among the replicas", replicas.leader, timeout=120)
        rnd.t0 = time.monotonic()
        for i in range(o.jobs):
            time.sleep(max(0.0, rnd.t0 + i / o.rate - time.monotonic()))
            if i == rnd.kill_index:
                rnd.killed = leader.identity
                rnd.kill_at = time.monotonic()
                assert leader.proc is not None
                leader.proc.send_signal(signal.SIGKILL)
                leader.proc.wait(30)
                lease = LeaseWatch(cluster, rnd.killed, rnd.kill_at)
                log(f"{ns}: SIGKILLed the leader ({rnd.killed}) after {i} Jobs")
            size = o.gang_size if o.gang_every and (i + 1) % o.gang_every == 0 else 1
            name = f"{'gang' if size > 1 else 'job'}-{i:04d}"
            obj, failed_tries = create(cluster, jobs_path, job_body(name, size, o))
            rnd.jobs.append(Submitted(name, str(obj["metadata"]["uid"]), size, time.monotonic(), failed_tries))
        rnd.submitted_at = time.monotonic()
        log(f"{ns}: {o.jobs} Jobs submitted in {rnd.submitted_at - rnd.t0:.1f} s; draining")
        deadline = rnd.submitted_at + o.drain_seconds
        while time.monotonic() < deadline:
            listed = cluster.api_get(jobs_path, 30)["items"]
            rnd.final_jobs = {str(j["metadata"]["uid"]): j for j in listed}
            if all(_done(rnd.final_jobs.get(j.uid) or {}) for j in rnd.jobs):
                rnd.drained_at = time.monotonic()
                break
            time.sleep(1.0)
        else:
            rnd.errors.append(f"not every Job finished within {o.drain_seconds:.0f} s of the last submission")
        log(f"{ns}: drained after {(rnd.drained_at or time.monotonic()) - rnd.submitted_at:.1f} s; "
            "waiting for the FluxJobs")
        uids = {j.uid for j in rnd.jobs}
        deadline = time.monotonic() + o.settle_seconds
        while time.monotonic() < deadline:
            rnd.fluxjobs = [f for f in cluster.api_get(f"/apis/fluxnetes.io/v1alpha1/namespaces/{ns}/fluxjobs", 30)["items"]
                            if str(((f.get("spec") or {}).get("workload") or {}).get("uid", "")) in uids]
            if (len(rnd.fluxjobs) == len(uids)
                    and all((f.get("status") or {}).get("phase") == "Completed" for f in rnd.fluxjobs)):
                rnd.settled_at = time.monotonic()
                break
            time.sleep(1.0)
        time.sleep(min(3.0, 2 * o.poll_seconds))  # the last transitions reach the watch and the poller
    except Exception as exc:
        rnd.errors.append(f"{type(exc).__name__}: {exc}")
        log(f"{ns}: round error: {exc}")
    finally:
        poller.stop()
        watch.stop()
    if lease is not None:
        rnd.lease_taken, rnd.new_leader = lease.taken, lease.holder
    rnd.load_after = os.getloadavg()
    return rnd.result(watch, checker)


def stream_replicas(cluster: Cluster, store: str, log_dir: Path, o: StreamOptions,
                    extra: tuple[str, ...] = ()) -> Replicas:
    """Two replicas as the chart runs them: one store, one webhook address (a proxy standing in
    for the Service), the Lease timings of ``o``."""
    deadline = max(1.0, o.lease_seconds * 0.7)
    retry = min(2.0, deadline / 3)
    reps = Replicas(cluster, store, log_dir, 2, ("--lease-duration", str(o.lease_seconds),
                                                 "--renew-deadline", f"{deadline:g}", "--retry-period", f"{retry:g}",
                                                 *extra))
    reps.start_all()
    return reps


def summarize_stream(rounds: list[dict[str, Any]], o: StreamOptions) -> dict[str, Any]:
    fo = [r["failover"]["kill_to_first_bind_of_a_job_created_after_the_kill_s"] for r in rounds]
    fo_ok = [x for x in fo if x is not None]
    lease = [r["failover"]["kill_to_lease_taken_s"] for r in rounds if r["failover"]["kill_to_lease_taken_s"] is not None]
    return {
        "kill_to_first_bind_s": {"all": fo, "median": round(statistics.median(fo_ok), 2) if fo_ok else None,
                                 "max": max(fo_ok) if fo_ok else None, "target": o.lease_seconds + 5,
                                 "within_target": all(x is not None and x <= o.lease_seconds + 5 for x in fo)},
        "kill_to_lease_taken_s": {"all": lease, "max": max(lease) if lease else None},
        "jobs": sum(r["jobs"] for r in rounds),
        "jobs_run_once": sum(r["jobs_run_once"] for r in rounds),
        "jobs_complete": sum(r["jobs_complete"] for r in rounds),
        "pods_expected": sum(r["pods_expected"] for r in rounds),
        "pods_bound": sum(r["pods_bound"] for r in rounds),
        "double_booking_violations": sum(r["overbooked_transitions"] + r["invariant_violations"].get("overbooked", 0)
                                         for r in rounds),
        "invariant_violations": sum(sum(r["invariant_violations"].values()) for r in rounds),
        "indexes_run_twice": sum(len(r["indexes_run_twice"]) for r in rounds),
        "fluxjobs_wrong": sum(r["jobs_without_one_completed_fluxjob_count"] for r in rounds),
        "drain_seconds": [r["drain_seconds"] for r in rounds],
        "total_seconds": [r["total_seconds"] for r in rounds],
    }


def run_stream(work: Path, rounds: int, o: StreamOptions, nodes: NodeShape) -> dict[str, Any]:
    cluster = Cluster.up(ClusterOptions(nodes=nodes, dir=work / "stream-cluster", timed_pods=True,
                                        die_with_parent=True))
    pg = Postgres().start()
    reps: Replicas | None = None
    results: list[dict[str, Any]] = []
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    try:
        reps = stream_replicas(cluster, pg.url, work, o)
        previous = ""
        for i in range(rounds):
            for rep in reps.replicas:
                if not rep.alive():
                    reps.start(rep)  # the replica killed last round comes back as a follower
            if previous:
                cluster.kubectl("delete", "namespace", previous, "--wait=true", timeout=600, check=False)
            time.sleep(5)  # a moment of quiet before the next stream
            ns = previous = opted_in_namespace(cluster, "ha")
            res = stream_round(cluster, reps, ns, o)
            results.append(res)
            f = res["failover"]
            _say(f"stream round {i}: kill -> lease {f['kill_to_lease_taken_s']} s, -> first bind "
                 f"{f['kill_to_first_bind_of_a_job_created_after_the_kill_s']} s; {res['jobs_run_once']}/"
                 f"{res['jobs']} Jobs run once, overbooked {res['overbooked_transitions']}, violations "
                 f"{res['invariant_violations']}, FluxJobs wrong {res['jobs_without_one_completed_fluxjob_count']}, "
                 f"drain {res['drain_seconds']} s, load {res['load_before']} -> {res['load_after']}")
    finally:
        if reps is not None:
            reps.stop_all()
        remove_webhooks(cluster)
        cluster.down()
        pg.stop()
    return {"started_at": started, "parameters": {**asdict(o), "rounds": rounds, "nodes": asdict(nodes),
                                                  "store": "postgresql (private server)",
                                                  "webhook": "one address (proxy) in front of both replicas"},
            "machine": machine(), "summary": summarize_stream(results, o), "rounds": results}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--modes", default="sigkill,sigterm", help="comma-separated: sigkill, sigterm, stream")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--jobs", type=int, default=500, help="stream: Jobs per round")
    ap.add_argument("--rate", type=float, default=4.0, help="stream: Jobs created per second")
    ap.add_argument("--gang-every", type=int, default=10, help="stream: every N-th Job is a gang")
    ap.add_argument("--gang-size", type=int, default=3)
    ap.add_argument("--run-seconds", type=int, default=5, help="stream: how long each pod runs")
    ap.add_argument("--nodes", type=int, default=8, help="stream: kwok nodes")
    ap.add_argument("--node-cpu", type=int, default=8, help="stream: cpu per node")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = [m for m in modes if m not in ("sigkill", "sigterm", "stream")]
    if unknown:
        ap.error(f"--modes: unknown {', '.join(unknown)} (known: sigkill, sigterm, stream)")
    out: dict[str, Any] = json.loads(args.out.read_text()) if args.out.exists() else {}
    work = Path(tempfile.mkdtemp(prefix="fx-failover-"))
    ok = True
    if "sigkill" in modes or "sigterm" in modes:
        cluster = Cluster.up(ClusterOptions(nodes=NodeShape(count=4, cpu="16", memory="64Gi"), dir=work / "cluster",
                                            die_with_parent=True))
        try:
            out.update(run_kill_modes(cluster, work, args.rounds, modes))
        finally:
            cluster.down()
    if "stream" in modes:
        o = StreamOptions(jobs=args.jobs, rate=args.rate, gang_every=args.gang_every, gang_size=args.gang_size,
                          run_seconds=args.run_seconds)
        shape = NodeShape(count=args.nodes, cpu=str(args.node_cpu), memory=f"{4 * args.node_cpu}Gi")
        out["stream"] = run_stream(work, args.rounds, o, shape)
        s = out["stream"]["summary"]
        ok = (s["kill_to_first_bind_s"]["within_target"] and s["jobs_run_once"] == s["jobs"]
              and s["double_booking_violations"] == 0 and s["invariant_violations"] == 0 and s["fluxjobs_wrong"] == 0)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out.get("stream", {}).get("summary", out), indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
