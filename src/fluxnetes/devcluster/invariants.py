"""Cluster-level invariants of fluxnetes, judged from the API server alone (Nodes, Pods, Jobs,
FluxJobs): what the chaos soak (`bench/chaos.py`) checks about once a second while faults hit.

The truth is the cluster, not the operator: pods bound to a node and not finished hold what
they request there. Checked on every snapshot:

- **overbooked**: per node, the bound unfinished pods' requests (cpu, memory, GPUs, pod
  count) never exceed its allocatable.
- **partial-group**: a group (a Job of several pods, a label group) never has some pods bound
  and others waiting unbound for longer than `group_grace` seconds.
- **shares**: what a Running FluxJob holds on a node (`status.shares`, the operator's graph)
  equals the requests of its pods bound and unfinished there, within `share_grace` seconds.
- **refused-placement**: a pod fluxnetes placed (annotated, ungated) that kube-scheduler finds
  no room for (the operator's view had room the node has not) for longer than `group_grace`.
- **duplicate-run**: no completion index of a Job runs twice (a second pod bound after one
  succeeded, or two bound at once), and no FluxJob of a finished Job is allocated again.
- **bypassed-queue**: no pod in a managed namespace is bound without fluxnetes placing it.

Durations count only time in which the API server answered (a poll adds at most `max_step`
seconds), so an API server outage never turns a transient state into a violation.

`Checker.observe(snapshot)` is pure (unit-testable with hand-made objects); `Poller` feeds it
from a live cluster in a thread.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

ANN_FLUXJOB = "fluxnetes.io/fluxjob"
GATE = "fluxnetes.io/gate"
LABEL_GROUP = "fluxnetes.io/group"
JOB_UID_LABEL = "batch.kubernetes.io/controller-uid"
JOB_INDEX_ANN = "batch.kubernetes.io/job-completion-index"
MIB = 1024 * 1024
FINISHED = ("Succeeded", "Failed")


@dataclass(frozen=True)
class Snapshot:
    """One consistent-enough read of the cluster (each list is one LIST call)."""

    at: float  # wall clock (time.time()) of the read
    nodes: Sequence[Mapping[str, Any]]
    pods: Sequence[Mapping[str, Any]]
    fluxjobs: Sequence[Mapping[str, Any]] = ()
    jobs: Sequence[Mapping[str, Any]] = ()


@dataclass
class Violation:
    kind: str
    subject: str  # node, pod, group or FluxJob it is about
    detail: str
    first_seen: float  # wall clock
    reported: float  # wall clock (first_seen + the grace for durable ones)
    evidence: dict[str, Any] = field(default_factory=dict)
    preceding_fault: dict[str, Any] | None = None  # filled in by the soak

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


def _key(obj: Mapping[str, Any]) -> str:
    md = _meta(obj)
    return f"{md.get('namespace', '')}/{md.get('name', '')}"


def _unfinished(pod: Mapping[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") not in FINISHED


def _bound(pod: Mapping[str, Any]) -> str | None:
    node = (pod.get("spec") or {}).get("nodeName")
    return str(node) if node else None


def _gated(pod: Mapping[str, Any]) -> bool:
    return any(g.get("name") == GATE for g in (pod.get("spec") or {}).get("schedulingGates") or [])


def _pinned_node(pod: Mapping[str, Any]) -> str | None:
    """The node a required node affinity on metadata.name pins the pod to (fluxnetes' placement)."""
    aff = ((pod.get("spec") or {}).get("affinity") or {}).get("nodeAffinity") or {}
    terms = (aff.get("requiredDuringSchedulingIgnoredDuringExecution") or {}).get("nodeSelectorTerms") or []
    for term in terms:
        for f in term.get("matchFields") or []:
            if f.get("key") == "metadata.name" and f.get("values"):
                return str(f["values"][0])
    return None


def _request(pod: Mapping[str, Any]) -> tuple[int, int, int]:
    """(cpu millis, memory bytes, gpus) the pod asks for; a malformed pod counts as nothing."""
    from fluxnetes.k8s.resources import ResourceError, pod_request

    try:
        r = pod_request(pod.get("spec") or {})
    except ResourceError:
        return (0, 0, 0)
    return (r.cpu_millis, r.memory_bytes, r.gpus)


def _allocatable(node: Mapping[str, Any]) -> tuple[int, int, int, int]:
    from fluxnetes.k8s.resources import ResourceError, node_allocatable, parse_quantity

    try:
        a = node_allocatable(node)
        raw = (node.get("status") or {}).get("allocatable") or {}
        pods = int(parse_quantity(raw.get("pods", "110"), "pods"))
    except ResourceError:
        return (0, 0, 0, 0)
    return (a.cpu_millis, a.memory_bytes, a.gpus, pods)


def _time(text: Any) -> float | None:
    if not text:
        return None
    try:
        return datetime.fromisoformat(str(text).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _cores(cpu_millis: int) -> int:
    return max(1, -(-cpu_millis // 1000))


@dataclass
class _Episode:
    first_seen: float
    age: float = 0.0  # seconds of answered polls it has lasted
    reported: bool = False
    evidence: dict[str, Any] = field(default_factory=dict)


@dataclass
class Checker:
    """Judges snapshots; collects `violations` and the facts the soak reports on."""

    managed_namespaces: Callable[[], Iterable[str]] = lambda: ()
    group_grace: float = 10.0
    share_grace: float = 30.0
    # the operator runs with --fluxjobs waiting: pods of a group without any FluxJob are not
    # judged by the shares check (no record to compare), only by the checks of every pod
    fluxjobs_waiting: bool = False
    max_step: float = 2.0  # seconds a poll may add to an episode's age (API outages do not count)
    violations: list[Violation] = field(default_factory=list)
    binds: list[tuple[float, str]] = field(default_factory=list)  # (bind time, pod) of placed pods
    snapshots: int = 0
    _last: float | None = None
    _episodes: dict[tuple[str, str], _Episode] = field(default_factory=dict)
    _seen_bound: dict[str, tuple[str, str, str]] = field(default_factory=dict)  # pod uid -> (job, index, node)
    _succeeded: dict[tuple[str, str], str] = field(default_factory=dict)  # (job uid, index) -> pod uid
    _runs: dict[tuple[str, str], set[str]] = field(default_factory=dict)  # (job uid, index) -> pod uids
    _disrupted: set[str] = field(default_factory=set)  # groups that lost a pod to a node or failure
    _instant: set[tuple[str, str]] = field(default_factory=set)  # instant violations already reported
    _lock: threading.Lock = field(default_factory=threading.Lock)

    # -- the entry point ------------------------------------------------------------------------
    def observe(self, snap: Snapshot) -> list[Violation]:
        """Judge one snapshot; returns the violations it newly found (also kept in `violations`)."""
        with self._lock:
            step = 0.0 if self._last is None else max(0.0, min(snap.at - self._last, self.max_step))
            self._last = snap.at
            self.snapshots += 1
            nodes = {str(_meta(n).get("name")): n for n in snap.nodes}
            managed = set(self.managed_namespaces())
            found: list[Violation] = []
            durable: dict[tuple[str, str], tuple[str, str, dict[str, Any]]] = {}
            found += self._overbooked(snap, nodes)
            self._groups(snap, nodes, durable)
            self._shares(snap, nodes, durable)
            self._refused(snap, nodes, durable)
            found += self._exactly_once(snap, nodes)
            found += self._bypass(snap, managed)
            found += self._advance(snap.at, step, durable)
            self.violations.extend(found)
            return found

    def _instant_violation(self, kind: str, subject: str, detail: str, at: float,
                           evidence: dict[str, Any]) -> list[Violation]:
        if (kind, subject) in self._instant:
            return []
        self._instant.add((kind, subject))
        return [Violation(kind, subject, detail, at, at, evidence)]

    def _advance(self, at: float, step: float,
                 durable: dict[tuple[str, str], tuple[str, str, dict[str, Any]]]) -> list[Violation]:
        """Age the conditions seen again, forget those that ended, report those past grace."""
        found = []
        for key in list(self._episodes):
            if key not in durable:
                del self._episodes[key]
        for key, (detail, grace_kind, evidence) in durable.items():
            ep = self._episodes.get(key)
            if ep is None:
                ep = self._episodes[key] = _Episode(first_seen=at)
            else:
                ep.age += step
            ep.evidence = evidence
            grace = self.group_grace if grace_kind == "group" else self.share_grace
            if ep.age > grace and not ep.reported:
                ep.reported = True
                found.append(Violation(key[0], key[1], f"{detail} (for {ep.age:.0f} s)",
                                       ep.first_seen, at, evidence))
        return found

    # -- the invariants -------------------------------------------------------------------------
    def _overbooked(self, snap: Snapshot, nodes: Mapping[str, Mapping[str, Any]]) -> list[Violation]:
        used: dict[str, list[int]] = {}
        who: dict[str, list[str]] = {}
        for p in snap.pods:
            node = _bound(p)
            if node is None or not _unfinished(p) or node not in nodes:
                continue
            cpu, mem, gpu = _request(p)
            u = used.setdefault(node, [0, 0, 0, 0])
            u[0] += cpu
            u[1] += mem
            u[2] += gpu
            u[3] += 1
            who.setdefault(node, []).append(_key(p))
        found = []
        for node, u in used.items():
            alloc = _allocatable(nodes[node])
            over = [name for name, have, cap in zip(("cpu", "memory", "gpus", "pods"), u, alloc,
                                                    strict=True) if have > cap]
            if over:
                detail = (f"node {node}: bound unfinished pods ask {u[0]}m cpu, {u[1] // MIB} MiB, "
                          f"{u[2]} gpus, {u[3]} pods > allocatable {alloc[0]}m, {alloc[1] // MIB} MiB, "
                          f"{alloc[2]} gpus, {alloc[3]} pods ({', '.join(over)})")
                found += self._instant_violation("overbooked", f"{node}@{int(snap.at)}", detail, snap.at,
                                                 {"node": node, "used": u, "allocatable": list(alloc),
                                                  "pods": sorted(who[node])})
        return found

    def _groups(self, snap: Snapshot, nodes: Mapping[str, Mapping[str, Any]],
                durable: dict[tuple[str, str], tuple[str, str, dict[str, Any]]]) -> None:
        """Gangs (Jobs of several pods, label groups): never some bound and some waiting."""
        members: dict[str, list[Mapping[str, Any]]] = {}
        for p in snap.pods:
            md = _meta(p)
            labels = md.get("labels") or {}
            ns = md.get("namespace", "")
            if labels.get(JOB_UID_LABEL):
                group = f"{ns}/job:{labels[JOB_UID_LABEL]}"
            elif labels.get(LABEL_GROUP):
                group = f"{ns}/group:{labels[LABEL_GROUP]}"
            else:
                continue
            members.setdefault(group, []).append(p)
        for group, ps in members.items():
            if len(ps) < 2:
                continue
            for p in ps:
                node = _bound(p)
                conds = (p.get("status") or {}).get("conditions") or []
                if ((node is not None and node not in nodes)
                        or (p.get("status") or {}).get("phase") == "Failed"
                        or any(c.get("type") == "DisruptionTarget" and c.get("status") == "True"
                               for c in conds)):
                    self._disrupted.add(group)  # a replacement pod waiting is not a partial bind
            if group in self._disrupted:
                continue
            live = [p for p in ps if not _meta(p).get("deletionTimestamp")]
            bound = [p for p in live if _bound(p) and _unfinished(p)]
            waiting = [p for p in live if not _bound(p) and _unfinished(p)]
            if bound and waiting:
                durable[("partial-group", group)] = (
                    f"group {group}: {len(bound)} pod(s) bound, {len(waiting)} waiting unbound",
                    "group",
                    {"bound": sorted(f"{_key(p)}@{_bound(p)}" for p in bound),
                     "waiting": sorted(_key(p) + (" (gated)" if _gated(p) else "") for p in waiting)},
                )

    def _shares(self, snap: Snapshot, nodes: Mapping[str, Mapping[str, Any]],
                durable: dict[tuple[str, str], tuple[str, str, dict[str, Any]]]) -> None:
        """Running FluxJobs' status.shares against their pods bound and unfinished, per node
        (nodes that exist: a pod left on a deleted node holds nothing anywhere)."""
        held: dict[tuple[str, str], tuple[int, int, int]] = {}
        running: set[str] = set()
        awaiting: set[str] = set()  # Running FluxJobs of Jobs whose pods are not all created yet
        created = self._job_pods(snap)
        # a group failed by node loss keeps its surviving pods' shares in the operator's graph
        # until they end (or, after a restart, counts them as foreign pods), while its FluxJob
        # says Failed without shares: its pods are not judged here (overbooked and
        # refused-placement still judge every pod on every node)
        # (so does a group cancelled while its pods run: its Job deleted, its pods still
        # terminating)
        failed = {_key(fj) for fj in snap.fluxjobs if (fj.get("status") or {}).get("phase") in ("Failed", "Cancelled")}
        for fj in snap.fluxjobs:
            st = fj.get("status") or {}
            if st.get("phase") != "Running" or not isinstance(st.get("shares"), list):
                continue
            name = _key(fj)
            running.add(name)
            spec = fj.get("spec") or {}
            wl = spec.get("workload") or {}
            if wl.get("kind") == "Job" and created.get(str(wl.get("uid")), 0) < int(spec.get("size") or 0):
                # the Job controller has not made every pod yet (it lags after API server
                # restarts): holding their share is right until they exist
                awaiting.add(name)
            for s in st["shares"]:
                k = (name, str(s.get("node")))
                c, g, m = held.get(k, (0, 0, 0))
                held[k] = (c + int(s.get("cores", 0)), g + int(s.get("gpus", 0)), m + int(s.get("memory", 0)))
        bound: dict[tuple[str, str], tuple[int, int, int]] = {}
        pods_of: dict[tuple[str, str], list[str]] = {}
        for p in snap.pods:
            md = _meta(p)
            fjname = (md.get("annotations") or {}).get(ANN_FLUXJOB)
            node = _bound(p)
            if not fjname or node is None or not _unfinished(p):
                continue
            k = (f"{md.get('namespace', '')}/{fjname}", node)
            cpu, mem, gpu = _request(p)
            c, g, m = bound.get(k, (0, 0, 0))
            bound[k] = (c + _cores(cpu), g + gpu, m + -(-mem // MIB))
            pods_of.setdefault(k, []).append(_key(p))
        # under --fluxjobs waiting a group placed at once has no FluxJob at all, so no shares to
        # judge here: its pods are judged by overbooked and refused placement, as every pod is
        existing = {_key(fj) for fj in snap.fluxjobs}
        for k in set(held) | set(bound):
            if k[1] not in nodes or k[0] in failed or (self.fluxjobs_waiting and k[0] not in existing):
                continue
            # pods of a FluxJob that is not Running (or has no status yet) hold what they ask
            # while the graph holds nothing for them: graph use below the truth
            h = held.get(k, (0, 0, 0))
            b = bound.get(k, (0, 0, 0))
            if k[0] in awaiting and all(x >= y for x, y in zip(h, b, strict=True)):
                continue
            if h != b:
                durable[("shares", f"{k[0]}@{k[1]}")] = (
                    f"FluxJob {k[0]} on node {k[1]}: the graph holds {h[0]} cores, {h[1]} gpus, "
                    f"{h[2]} MiB; its pods bound there ask {b[0]} cores, {b[1]} gpus, {b[2]} MiB",
                    "share",
                    {"fluxjob": k[0], "node": k[1], "held": list(h), "bound": list(b),
                     "pods": sorted(pods_of.get(k, [])), "running": k[0] in running},
                )

    @staticmethod
    def _job_pods(snap: Snapshot) -> dict[str, int]:
        """Per Job uid: pods that exist and have not failed (running, waiting or succeeded),
        plus everything of a Job that is finished (a finished Job makes no more pods)."""
        out: dict[str, int] = {}
        for p in snap.pods:
            uid = ((_meta(p).get("labels") or {}).get(JOB_UID_LABEL))
            if uid and (p.get("status") or {}).get("phase") != "Failed" and not _meta(p).get("deletionTimestamp"):
                out[str(uid)] = out.get(str(uid), 0) + 1
        for j in snap.jobs:
            conds = (j.get("status") or {}).get("conditions") or []
            if any(c.get("type") in ("Complete", "Failed") and c.get("status") == "True" for c in conds):
                out[str(_meta(j).get("uid"))] = 1 << 30
        return out

    def _refused(self, snap: Snapshot, nodes: Mapping[str, Mapping[str, Any]],
                 durable: dict[tuple[str, str], tuple[str, str, dict[str, Any]]]) -> None:
        for p in snap.pods:
            md = _meta(p)
            if (not (md.get("annotations") or {}).get(ANN_FLUXJOB) or _bound(p) or _gated(p)
                    or not _unfinished(p) or md.get("deletionTimestamp")):
                continue
            for c in (p.get("status") or {}).get("conditions") or []:
                if c.get("type") == "PodScheduled" and c.get("reason") == "Unschedulable":
                    target = _pinned_node(p)
                    where = (f" (pinned to {target}, which "
                             f"{'exists' if target in nodes else 'is not a Node'})" if target else "")
                    durable[("refused-placement", _key(p))] = (
                        f"pod {_key(p)} placed by fluxnetes{where} is refused by kube-scheduler: "
                        f"{str(c.get('message', ''))[:200]}",
                        "group",
                        {"pod": _key(p), "fluxjob": (md.get("annotations") or {}).get(ANN_FLUXJOB),
                         "node": target, "node_exists": target in nodes, "message": c.get("message", "")},
                    )

    def _exactly_once(self, snap: Snapshot, nodes: Mapping[str, Mapping[str, Any]]) -> list[Violation]:
        found: list[Violation] = []
        live: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
        for p in snap.pods:
            md = _meta(p)
            labels = md.get("labels") or {}
            job = labels.get(JOB_UID_LABEL)
            node = _bound(p)
            if not job or node is None:
                continue
            index = str((md.get("annotations") or {}).get(JOB_INDEX_ANN, "-"))
            uid = str(md.get("uid"))
            k = (str(job), index)
            if uid not in self._seen_bound:
                self._seen_bound[uid] = (str(job), index, node)
                runs = self._runs.setdefault(k, set())
                runs.add(uid)
                done = self._succeeded.get(k)
                if done is not None and done != uid:
                    found += self._instant_violation(
                        "duplicate-run", f"{_key(p)}",
                        f"Job pod {_key(p)} (completion index {index}) bound to {node} after pod "
                        f"{done} of the same index had succeeded", snap.at,
                        {"job_uid": job, "index": index, "pod": _key(p), "node": node,
                         "succeeded_pod": done})
            if (p.get("status") or {}).get("phase") == "Succeeded":
                self._succeeded.setdefault(k, uid)
            if (_unfinished(p) and not md.get("deletionTimestamp") and node in nodes):
                live.setdefault(k, []).append(p)
        for k, ps in live.items():
            if len(ps) > 1 and k[1] != "-":
                found += self._instant_violation(
                    "duplicate-run", f"job:{k[0]}#{k[1]}",
                    f"{len(ps)} pods of one completion index ({k[1]}) run at once: "
                    f"{', '.join(sorted(_key(p) + '@' + str(_bound(p)) for p in ps))}", snap.at,
                    {"job_uid": k[0], "index": k[1], "pods": sorted(_key(p) for p in ps)})
        # a FluxJob of a finished Job allocated again after the Job completed
        done_at: dict[str, float] = {}
        for j in snap.jobs:
            t = _time((j.get("status") or {}).get("completionTime"))
            if t is not None:
                done_at[str(_meta(j).get("uid"))] = t
        for fj in snap.fluxjobs:
            st = fj.get("status") or {}
            owner = ((fj.get("spec") or {}).get("workload") or {}).get("uid")
            start = _time(st.get("startTime"))
            if st.get("phase") != "Running" or not owner or start is None or owner not in done_at:
                continue
            if start > done_at[owner] + 1:
                found += self._instant_violation(
                    "duplicate-run", f"{_key(fj)}@{st.get('startTime')}",
                    f"FluxJob {_key(fj)} allocated at {st.get('startTime')} after its Job completed",
                    snap.at, {"fluxjob": _key(fj), "job_uid": owner, "start": st.get("startTime"),
                              "nodes": st.get("nodes")})
        return found

    def _bypass(self, snap: Snapshot, managed: set[str]) -> list[Violation]:
        found: list[Violation] = []
        for p in snap.pods:
            md = _meta(p)
            if md.get("namespace") not in managed or _bound(p) is None:
                continue
            if (md.get("annotations") or {}).get(ANN_FLUXJOB):
                continue
            found += self._instant_violation(
                "bypassed-queue", _key(p),
                f"pod {_key(p)} in managed namespace {md.get('namespace')} bound to {_bound(p)} "
                "without fluxnetes placing it (the webhook let it through ungated)", snap.at,
                {"pod": _key(p), "node": _bound(p), "created": md.get("creationTimestamp")})
        return found

    # -- what the soak reads --------------------------------------------------------------------
    def record_binds(self, snap: Snapshot) -> None:
        """Remember when each fluxnetes-placed pod was bound (its PodScheduled transition)."""
        with self._lock:
            seen = {p for _, p in self.binds}
            for p in snap.pods:
                md = _meta(p)
                if not (md.get("annotations") or {}).get(ANN_FLUXJOB) or _bound(p) is None:
                    continue
                uid = str(md.get("uid"))
                if uid in seen:
                    continue
                for c in (p.get("status") or {}).get("conditions") or []:
                    if c.get("type") == "PodScheduled" and c.get("status") == "True":
                        t = _time(c.get("lastTransitionTime"))
                        if t is not None:
                            self.binds.append((t, uid))
                            seen.add(uid)

    def runs_per_index(self) -> dict[tuple[str, str], int]:
        with self._lock:
            return {k: len(v) for k, v in self._runs.items()}

    def open_episodes(self) -> list[dict[str, Any]]:
        """Conditions seen but not (yet) past their grace: what a final report shows as pending."""
        with self._lock:
            return [{"kind": k[0], "subject": k[1], "age": round(e.age, 1), "evidence": e.evidence}
                    for k, e in self._episodes.items() if e.age > 0]  # seen once: a moment in passing


def read_snapshot(api_get: Callable[[str, float], Any]) -> Snapshot:
    """One snapshot through `api_get(path, timeout)` (Cluster.api_get), from the API server's
    watch cache (resourceVersion=0: cheap, and at most a moment behind)."""
    at = time.time()
    nodes = api_get("/api/v1/nodes?resourceVersion=0", 20)["items"]
    pods = api_get("/api/v1/pods?resourceVersion=0", 20)["items"]
    jobs = api_get("/apis/batch/v1/jobs?resourceVersion=0", 20)["items"]
    try:
        fluxjobs = api_get("/apis/fluxnetes.io/v1alpha1/fluxjobs?resourceVersion=0", 20)["items"]
    except Exception as exc:  # the CRD is not installed before the first operator starts
        if "404" not in str(exc):
            raise
        fluxjobs = []
    return Snapshot(at=at, nodes=nodes, pods=pods, fluxjobs=fluxjobs, jobs=jobs)


class Poller:
    """Reads a snapshot every `interval` seconds in a thread and feeds the checker; failed reads
    (API server down) are counted and skipped. `latest` is the last good snapshot."""

    def __init__(self, api_get: Callable[[str, float], Any], checker: Checker,
                 interval: float = 1.0,
                 on_violation: Callable[[Violation], None] | None = None) -> None:
        self.api_get = api_get
        self.checker = checker
        self.interval = interval
        self.on_violation = on_violation
        self.latest: Snapshot | None = None
        self.failed_reads = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="invariants", daemon=True)

    def start(self) -> Poller:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def poll_once(self) -> Snapshot | None:
        try:
            snap = read_snapshot(self.api_get)
        except Exception:
            self.failed_reads += 1
            return None
        self.latest = snap
        for v in self.checker.observe(snap):
            if self.on_violation is not None:
                self.on_violation(v)
        self.checker.record_binds(snap)
        return snap

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            self.poll_once()
            self._stop.wait(max(0.0, self.interval - (time.monotonic() - started)))
