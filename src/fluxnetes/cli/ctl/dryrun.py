"""The dry run behind `fluxnetes submit --dry-run FILE`: would this start, and when?

FILE holds Kubernetes workloads (Pod, Job, Deployment, ReplicaSet, StatefulSet; several YAML
documents allowed) or fluxnetes/Flux jobspecs. Nothing is created. The answer comes from the
same graph, matcher and queue code the operator runs, fed in memory with:

* the cluster (default): the resource graph from the Nodes; running FluxJobs hold their nodes
  (``status.nodes`` x per-pod request) until their duration ends; groups placed without a
  FluxJob (the operator's default, ``--fluxjobs waiting``) and pods of other schedulers hold
  theirs for an unknown time; Pending/Reserved FluxJobs wait in the queue ahead of (or
  behind, by priority) the new work;
* or, offline, ``--graph FILE`` (JGF JSON or a cluster description YAML): an empty cluster.

Then the queue is replayed forward in time: at each known job end the next cycle runs, until
the new work starts or is reserved (its expected start), or is found unsatisfiable. When it
waits only behind jobs of unknown duration the answer says so rather than guessing.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from fluxnetes.cli.ctl.common import ANN_FLUXJOB, fluxjob_keys, placed_group

WORKLOAD_KINDS = ("Pod", "Job", "Deployment", "ReplicaSet", "StatefulSet")
MAX_STEPS = (
    100_000  # forward-simulation cycles; each needs a job end, so this is never hit in practice
)


class SubmitError(ValueError):
    """Bad input file; the message names the document and the field."""


@dataclass
class Candidate:
    """One workload of FILE, as the queue will see it."""

    name: str
    kind: str
    size: int
    jobspec: Any
    duration: int
    priority: int
    per_pod: str


@dataclass
class Verdict:
    name: str
    kind: str
    size: int
    per_pod: str
    duration: int
    outcome: str  # now | later | never | unknown
    start_in: int | None = None  # seconds from now
    start: str | None = None
    nodes: list[str] = field(default_factory=list)
    reason: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "size": self.size,
            "perPod": self.per_pod,
            "duration": self.duration,
            "outcome": self.outcome,
            "startIn": self.start_in,
            "start": self.start,
            "nodes": self.nodes,
            "reason": self.reason,
        }


# -- reading FILE ------------------------------------------------------------------------------


def _fmt_req(cpu_millis: int, memory: int, gpus: int, extended: Mapping[str, int] | None = None) -> str:
    parts = [f"{max(1, math.ceil(cpu_millis / 1000))}c"]
    if memory:
        parts.append(f"{math.ceil(memory / 2**20)}Mi")
    if gpus:
        parts.append(f"{gpus}gpu")
    parts += [f"{n} {name}" for name, n in sorted((extended or {}).items()) if n]  # full names
    return ",".join(parts)


def candidates_from_docs(docs: Sequence[Any], source: str = "FILE") -> list[Candidate]:
    from fluxnetes.jobspec import JobspecError, PodRequest, jobspec_from_pods, parse_jobspec
    from fluxnetes.k8s.groups import (
        GroupError,
        default_priority,
        duration_of,
        exclusive_of,
        group_of_pod,
        jobspec_of,
        request_of,
    )
    from fluxnetes.k8s.workloads import kind_of

    out: list[Candidate] = []
    for i, doc in enumerate(docs):
        where = f"{source}: document {i + 1}"
        if doc is None:
            continue
        if not isinstance(doc, Mapping):
            raise SubmitError(f"{where}: must be a mapping (a Kubernetes object or a jobspec)")
        kind = doc.get("kind")
        try:
            if kind is None and "resources" in doc:
                js = parse_jobspec(dict(doc))
                name = f"jobspec-{i + 1}"
                out.append(Candidate(name, "Jobspec", 1, js, int(js.duration or 0), 0, "(jobspec)"))
                continue
            if kind not in WORKLOAD_KINDS:
                raise SubmitError(
                    f"{where}: kind {kind!r} is not one of {', '.join(WORKLOAD_KINDS)} (or a jobspec with 'resources')"
                )
            meta = doc.get("metadata") or {}
            name = str(
                meta.get("name") or meta.get("generateName") or f"{str(kind).lower()}-{i + 1}"
            )
            if kind == "Pod":
                pod = {**doc, "metadata": {**meta, "namespace": meta.get("namespace") or "default"}}
                g = group_of_pod(pod)
                size, req, duration = g.size, g.request, g.duration
                user_js, exclusive, priority = g.jobspec, g.exclusive, g.priority
            else:
                wk = kind_of(str(kind))
                if wk is None:
                    raise SubmitError(f"{where}: fluxnetes does not know {kind}")
                tmpl = wk.template(doc)
                tmeta, tspec = tmpl.get("metadata") or {}, tmpl.get("spec") or {}
                merged = {
                    "annotations": {
                        **(tmeta.get("annotations") or {}),
                        **(meta.get("annotations") or {}),
                    }
                }
                size = wk.size(doc)
                req = request_of(tspec)
                duration = duration_of(merged, tspec, wk.deadline(doc))
                user_js, exclusive, priority = (
                    jobspec_of(merged),
                    exclusive_of(merged),
                    default_priority(tspec),
                )
            if size < 1:
                raise SubmitError(
                    f"{where}: {kind} {name} has 0 pods to schedule (replicas/parallelism)"
                )
            if user_js:
                js = parse_jobspec(user_js)
            else:
                js = jobspec_from_pods(
                    size,
                    PodRequest(req.cpu_millis, req.memory_bytes, req.gpus, dict(req.extended)),
                    duration=duration,
                    exclusive_nodes=exclusive,
                    name=name[:60],
                )
            out.append(
                Candidate(
                    name,
                    str(kind),
                    size,
                    js,
                    duration,
                    priority,
                    _fmt_req(req.cpu_millis, req.memory_bytes, req.gpus, req.extended),
                )
            )
        except (GroupError, JobspecError) as exc:
            raise SubmitError(f"{where}: {exc}") from None
    if not out:
        raise SubmitError(f"{source}: no workload or jobspec in it")
    return out


def read_candidates(path: Path) -> list[Candidate]:
    import yaml

    try:
        text = path.read_text()
    except OSError as exc:
        raise SubmitError(f"{path}: cannot read ({exc.strerror})") from None
    try:
        docs = list(yaml.safe_load_all(text))
    except yaml.YAMLError as exc:
        raise SubmitError(f"{path}: not valid YAML: {exc}") from None
    # `kubectl get -o yaml` lists
    flat: list[Any] = []
    for d in docs:
        if isinstance(d, Mapping) and d.get("kind") == "List":
            flat.extend(d.get("items") or [])
        else:
            flat.append(d)
    return candidates_from_docs(flat, str(path))


# -- the cluster, in memory ---------------------------------------------------------------------


@dataclass
class Held:
    """Resources held now, released at ``end`` seconds from now (None = unknown)."""

    name: str
    shares: list[Any]
    end: int | None


@dataclass
class Waiting:
    id: str
    jobspec: Any
    submit: int  # seconds relative to now (negative: in the past)
    priority: int


def _pod_share(node: str, pods: Sequence[Mapping[str, Any]]) -> Any:
    from fluxnetes.k8s.resources import PodResources, ResourceError, pod_request
    from fluxnetes.k8s.scheduling import shares

    reqs = []
    for p in pods:
        try:
            reqs.append(pod_request(p.get("spec") or {}))
        except ResourceError:
            reqs.append(PodResources())
    return shares.of_pods(node, reqs)


def cluster_state(
    nodes: Sequence[Mapping[str, Any]],
    pods: Sequence[Mapping[str, Any]],
    fluxjobs: Sequence[Mapping[str, Any]],
    now: datetime,
) -> tuple[list[Held], list[Waiting], list[str]]:
    """What holds resources (running FluxJobs, groups placed without one, foreign pods) and
    what waits (queued FluxJobs)."""
    from fluxnetes.jobspec import JobspecError, PodRequest, jobspec_from_pods, parse_jobspec
    from fluxnetes.jobspec.pods import cores_for, mib_for
    from fluxnetes.k8s.scheduling.shares import Share

    def rel(ts: Any) -> int | None:
        if not isinstance(ts, str) or not ts:
            return None
        try:
            t = datetime.fromisoformat(ts.replace("Z", "+00:00"))
        except ValueError:
            return None
        return int((t - now).total_seconds())

    held: list[Held] = []
    waiting: list[Waiting] = []
    notes: list[str] = []
    known_nodes = {(n.get("metadata") or {}).get("name") for n in nodes}
    foreign: dict[str, list[Mapping[str, Any]]] = {}
    recorded = fluxjob_keys(fluxjobs)
    # groups placed at once have no FluxJob under the operator's default (--fluxjobs waiting):
    # their pods hold what they ask, for an unknown time
    unrecorded: dict[tuple[str, str], dict[str, list[Mapping[str, Any]]]] = {}
    for p in pods:
        md, spec = p.get("metadata") or {}, p.get("spec") or {}
        node = spec.get("nodeName")
        if (
            not node
            or node not in known_nodes
            or (p.get("status") or {}).get("phase") in ("Succeeded", "Failed")
        ):
            continue
        if ANN_FLUXJOB in (md.get("annotations") or {}):
            key = placed_group(p)
            if key is not None and key not in recorded:
                unrecorded.setdefault(key, {}).setdefault(str(node), []).append(p)
            continue  # (else counted through its FluxJob below)
        foreign.setdefault(str(node), []).append(p)
    for (ns, name), by_node in sorted(unrecorded.items()):
        shares = [_pod_share(node, group) for node, group in sorted(by_node.items())]
        if any(not s.empty for s in shares):
            held.append(Held(f"{ns}/{name} (no FluxJob)", [s for s in shares if not s.empty], None))
    for node, group in sorted(foreign.items()):
        share = _pod_share(node, group)
        if not share.empty:
            held.append(Held(f"{FOREIGN}{len(group)} other pod(s) on {node}", [share], None))
    for fj in fluxjobs:
        md, spec, st = fj.get("metadata") or {}, fj.get("spec") or {}, fj.get("status") or {}
        name = f"{md.get('namespace', '')}/{md.get('name', '')}"
        phase = st.get("phase")
        req = {
            str(k): int(v)
            for k, v in (spec.get("request") or {}).items()
            if isinstance(v, int | float)
        }
        duration = int(spec.get("duration") or 0)
        if phase == "Running":
            per_node: dict[str, Share] = {}
            for node in st.get("nodes") or []:
                if node not in known_nodes:
                    continue
                s = per_node.get(node, Share(node))
                per_node[node] = Share(
                    node,
                    s.cores + cores_for(req.get("cpu", 0)),
                    s.gpus + req.get("nvidia.com/gpu", 0),
                    s.memory + mib_for(req.get("memory", 0)),
                )
            started = rel(st.get("startTime"))
            end = None
            if duration and started is not None:
                end = started + duration
                if end <= 0:
                    notes.append(
                        f"{name} is running past its duration; treated as ending at an unknown time"
                    )
                    end = None
            if per_node:
                held.append(Held(name, list(per_node.values()), end))
        elif phase in ("Pending", "Reserved"):
            try:
                if spec.get("jobspec"):
                    js = parse_jobspec(spec["jobspec"])
                else:
                    js = jobspec_from_pods(
                        int(spec.get("size") or 1),
                        PodRequest(
                            req.get("cpu", 0), req.get("memory", 0), req.get("nvidia.com/gpu", 0)
                        ),
                        duration=duration,
                        exclusive_nodes=bool(spec.get("exclusive")),
                        name=str(md.get("name", "job"))[:60],
                    )
            except (JobspecError, ValueError) as exc:
                notes.append(f"{name}: skipped, its jobspec does not parse ({exc})")
                continue
            submit = rel(st.get("submitTime") or md.get("creationTimestamp"))
            waiting.append(
                Waiting(
                    name, js, submit if submit is not None else 0, int(spec.get("priority") or 0)
                )
            )
    return held, waiting, notes


# -- the forward replay ---------------------------------------------------------------------------

FOREIGN = "foreign: "


def _record_capped(
    matcher: Any, share: Any, duration: int, to_match: Any, error: type[Exception]
) -> tuple[int, Any]:
    """Record ``share`` as a new matcher job; if it does not fit, the largest fraction that
    does (binary search). Returns (job id, the share recorded or None)."""
    from fluxnetes.k8s.scheduling.shares import Share

    def scaled(f: float) -> Share:
        return Share(
            share.node,
            int(share.cores * f),
            int(share.gpus * f),
            int(share.memory * f),
            {k: int(v * f) for k, v in share.extra.items()},
        )

    def attempt(s: Share) -> int | None:
        if s.empty:
            return None
        jid = int(matcher.next_jobid)
        try:
            matcher.update_allocate(jid, to_match([s]), at=0, duration=duration)
        except error:
            return None
        return jid

    jid = attempt(share)
    if jid is not None:
        return jid, share
    lo, hi = 0.0, 1.0
    for _ in range(12):
        mid = (lo + hi) / 2
        probe = attempt(scaled(mid))
        if probe is None:
            hi = mid
        else:
            matcher.cancel(probe)
            lo = mid
    best = scaled(lo)
    jid = attempt(best) if lo > 0 else None
    return (jid, best) if jid is not None else (0, None)


def dry_run(
    graph: Any,
    candidates: Sequence[Candidate],
    *,
    held: Sequence[Held] = (),
    waiting: Sequence[Waiting] = (),
    policy: str = "easy",
    match_policy: str = "lonode",
    now: datetime | None = None,
) -> tuple[list[Verdict], list[str]]:
    """Replay the queue forward from now (t = 0) until every candidate is decided."""
    from fluxnetes.k8s.scheduling.shares import to_match
    from fluxnetes.match import Matcher, MatchError
    from fluxnetes.queue import QueuedJob, QueuePolicy, Scheduler, job_duration

    clock = now or datetime.now(UTC)
    matcher = Matcher(graph, policy=match_policy)
    sched = Scheduler(matcher, QueuePolicy.parse(policy, queue_depth=None))
    notes: list[str] = []
    ends: list[tuple[int, str, Any]] = []  # (time, kind, key)
    # FluxJobs first (the scheduler's own decisions), then pods of other schedulers. Each
    # node's share is its own record so that an overcommitted node (stale status, pods that
    # ask more than is free) is capped to what is left instead of dropping the whole job.
    for h in sorted(held, key=lambda h: h.name.startswith(FOREIGN)):
        for share in h.shares:
            jid, recorded = _record_capped(matcher, share, h.end or 0, to_match, MatchError)
            if recorded is None:
                notes.append(f"{h.name}: nothing free on {share.node} to record")
                continue
            if recorded != share:
                notes.append(
                    f"{h.name}: {share.node} is overcommitted; recorded {recorded.cores} of "
                    f"{share.cores} cores, {recorded.gpus} of {share.gpus} gpus"
                )
            if h.end is not None:
                ends.append((h.end, "held", jid))
    pending: dict[str, QueuedJob] = {}
    for w in waiting:
        pending[w.id] = QueuedJob(
            id=w.id, jobspec=w.jobspec, submit_time=w.submit, priority=w.priority
        )
    targets: dict[str, Candidate] = {}
    for i, c in enumerate(candidates):
        qid = f"~dry-run-{i}:{c.name}"
        targets[qid] = c
        pending[qid] = QueuedJob(id=qid, jobspec=c.jobspec, submit_time=0, priority=c.priority)
    verdicts: dict[str, Verdict] = {}

    def verdict(qid: str, outcome: str, **kw: Any) -> None:
        c = targets[qid]
        start_in = kw.pop("start_in", None)
        start = None
        if start_in is not None:
            start = (clock + timedelta(seconds=start_in)).strftime("%Y-%m-%dT%H:%M:%SZ")
        verdicts[qid] = Verdict(
            c.name, c.kind, c.size, c.per_pod, c.duration, outcome, start_in, start, **kw
        )

    t = 0
    for _ in range(MAX_STEPS):
        result = sched.cycle(list(pending.values()), t)
        for job, alloc in result.started:
            pending.pop(job.id, None)
            if job.id in targets and job.id not in verdicts:
                verdict(
                    job.id,
                    "now" if t == 0 else "later",
                    start_in=t,
                    nodes=[n.name for n in alloc.nodes],
                )
            d = job_duration(job)
            if d > 0:
                ends.append((t + d, "sched", job.id))
        for job, reason in result.unsatisfiable:
            pending.pop(job.id, None)
            if job.id in targets and job.id not in verdicts:
                verdict(job.id, "never", reason=reason)
        for job, res in result.reserved:
            if job.id in targets and job.id not in verdicts:
                # it stays queued: work submitted after it must not take its slot
                verdict(
                    job.id,
                    "later",
                    start_in=int(res.at),
                    nodes=[n.name for n in res.nodes],
                    reason="reserved: the queue policy holds this start time for it",
                )
        if all(q in verdicts for q in targets):
            break
        future = sorted(e for e in ends if e[0] > t)
        if not future:
            for qid in targets:
                if qid not in verdicts:
                    verdict(
                        qid,
                        "unknown",
                        reason="waits behind work of unknown duration (no duration / "
                        "activeDeadlineSeconds): no start time can be promised",
                    )
            break
        t = future[0][0]
        for e in [e for e in ends if e[0] == t]:
            ends.remove(e)
            if e[1] == "held":
                matcher.cancel(e[2])
                sched.invalidate()
            else:
                sched.release(e[2])
    return [verdicts[q] for q in targets if q in verdicts], notes
