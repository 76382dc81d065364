"""The operator's state machine: cluster view -> groups -> queue -> placement -> release.

One asyncio task consumes every watch event in order (no locks: all state lives here), then
runs a scheduling cycle if anything changed. API writes (placements, Job resumes, FluxJob
status, Events) go out as background tasks; their outcome comes back as ordinary watch
events, so the state machine never waits for the network.

State and where it comes from:
- graph + matcher: built from Nodes; node changes update it in place (no rebuild);
- foreign allocations: pods bound to nodes that fluxnetes did not place (other schedulers,
  DaemonSets, static pods), summed per node, re-recorded when they change;
- groups: one per FluxJob; their allocation (what is still held per node) is persisted in
  the FluxJob status, so a restarted operator re-records it (update_allocate) before
  scheduling anything.

Restart windows (each forced by a test with FLUXNETES_DEBUG_EXIT_AT): an allocation the store
recorded but the cluster does not show yet (no FluxJob status, no pod placed, Job still held)
is taken up again on exactly the store's nodes (``adopt_allocation``), or matched again when
one of them is gone; a Running FluxJob whose pods were never placed gets them placed and its
Job resumed (``reconcile``); a group the store lost is recorded again from the cluster.
What no record shows, the cluster does (``recover_from_cluster``, before any replayed event):
a finished workload is never queued again and gets its final FluxJob; pods placed for a group
no record shows allocated give its allocation back (``adopt_placed``). ``check_accounting``
compares the graph with the bound pods (logged after every recovery). Owners are matched by
uid (a Job created again under its old name is a new workload: ``drop_earlier_owner``).

Scaling: a ReplicaSet (so a Deployment) or StatefulSet that grows after its group was
allocated gets a new group "<group>-scale-N" (its own FluxJob) for the added pods, queued
and matched all-or-nothing like any group while those pods stay gated; the running pods are
untouched. Growing or shrinking before a group started resizes it. Shrinking gives back the
removed pods' shares (empty slots at once, the others as the controller deletes the pods),
counting the base group and its scale groups together. A StatefulSet with the default
``podManagementPolicy: OrderedReady`` (pod N+1 is created only once pod N is Ready) grows
this way one pod at a time (workloads/statefulset.py); a Parallel one is one group.

Node loss (``node_lost``): exactly the lost node's shares are given back; a failed group's
surviving pods keep theirs until they end. Unsatisfiable is judged for every queued group
each cycle (k8s/satisfiable.py) and looked at again when nodes change.

Memory: a group that is over (final phase, no pod left, final FluxJob status written) is
forgotten (``prune_finished``); its FluxJob keeps what ``kubectl get fluxjobs`` shows.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from fluxnetes.k8s import fluxjob, hold, names, nodefit, shares
from fluxnetes.k8s.config import OperatorConfig
from fluxnetes.k8s.fluxjob import Phase
from fluxnetes.k8s.groups import (
    GroupError,
    GroupSpec,
    OwnerRef,
    controller_of,
    default_priority,
    duration_of,
    exclusive_of,
    explicit_group,
    group_of_pod,
    jobspec_of,
    locality_of,
    object_name,
    request_of,
)
from fluxnetes.k8s.hold import is_held
from fluxnetes.k8s.informer import Event, Informer
from fluxnetes.k8s.kube import (
    EVENTS,
    FLUXJOBS,
    JSON_PATCH,
    NODES,
    PODS,
    PRIORITY_CLASSES,
    ApiError,
    Kube,
    Resource,
)
from fluxnetes.k8s.placement import ANN_SLOT, assigned_node, binding, place_patch, placed_jobid
from fluxnetes.k8s.resources import GPU, PodResources
from fluxnetes.k8s.satisfiable import Judge
from fluxnetes.k8s.workloads import KINDS, WorkloadKind, kind_of
from fluxnetes.logging import log_context
from fluxnetes.metrics import METRICS

log = logging.getLogger(__name__)

OWNER_RESOURCES = {k.kind: Resource(k.api_version, k.plural) for k in KINDS.values() if k.owns_pods}
QUEUED = (Phase.PENDING, Phase.RESERVED)
# FLUXNETES_DEBUG_EXIT_AT=<point>: the process exits (status 137, like SIGKILL) at that point,
# so tests can stop the operator deterministically inside a crash window (see start_group)
DEBUG_EXIT_AT = "FLUXNETES_DEBUG_EXIT_AT"
# FLUXNETES_DEBUG_CHECK_SECONDS=<s>: log the accounting check (graph use == bound pods) every s
CHECK_EVERY = "FLUXNETES_DEBUG_CHECK_SECONDS"
# the group formed by the pods added when a workload scales up after its group was allocated
SCALE_SEP = "-scale-"
# Normal Events per second, burst (Warnings are never dropped); --event-rate overrides the rate
EVENT_RATE, EVENT_BURST = 20.0, 200.0


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


def _gated(pod: Mapping[str, Any]) -> bool:
    """Is the pod held for fluxnetes (its gate, or its scheduler name: k8s/hold.py)?"""
    return is_held(pod)


def _terminal(pod: Mapping[str, Any]) -> bool:
    return bool(_meta(pod).get("deletionTimestamp")) or (pod.get("status") or {}).get("phase") in (
        "Succeeded", "Failed")


def _parse_time(s: object) -> int | None:
    if not isinstance(s, str) or not s:
        return None
    try:
        return int(datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp())
    except ValueError:
        return None


class TimedMatcher:
    """The matcher as the queue sees it: every match it asks for is timed and its outcome
    counted (fluxnetes_match_duration_seconds, fluxnetes_match_outcomes_total); everything
    else goes straight through."""

    def __init__(self, matcher: Any) -> None:
        self._m = matcher

    def __getattr__(self, name: str) -> Any:
        return getattr(self._m, name)

    def _timed(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            res = fn(*args, **kwargs)
        except Exception:
            METRICS.match_outcomes.labels(outcome="error").inc()
            raise
        finally:
            METRICS.match_seconds.observe(time.perf_counter() - t0)
        status = str(getattr(res, "status", "")).rsplit(".", 1)[-1].lower()
        METRICS.match_outcomes.labels(outcome=status or "unknown").inc()
        return res

    def allocate(self, *args: Any, **kwargs: Any) -> Any:
        return self._timed(self._m.allocate, *args, **kwargs)

    def allocate_orelse_reserve(self, *args: Any, **kwargs: Any) -> Any:
        return self._timed(self._m.allocate_orelse_reserve, *args, **kwargs)


def _event_time(obj: Mapping[str, Any], etype: str) -> int | None:
    """When the change a watch event reports happened (seconds; None if unknown)."""
    meta = obj.get("metadata") or {}
    if etype == "ADDED":
        return _parse_time(meta.get("creationTimestamp"))
    times = [_parse_time(meta.get("deletionTimestamp"))]
    times += [_parse_time(c.get("lastTransitionTime")) for c in (obj.get("status") or {}).get("conditions") or []]
    known = [t for t in times if t is not None]
    return max(known) if known else None


@dataclass
class Group:
    spec: GroupSpec
    kind: WorkloadKind | None = None
    phase: Phase = Phase.PROVISIONAL
    reason: str = ""
    jobspec: Any = None
    submit: int | None = None
    expected_start: int | None = None
    start: int | None = None
    end: int | None = None
    jobid: Any = None
    members: dict[str, dict[str, Any]] = field(default_factory=dict)  # uid -> pod
    slots: list[str] = field(default_factory=list)  # node of each slot
    slot_pod: list[str | None] = field(default_factory=list)  # uid in each slot
    released: set[int] = field(default_factory=set)
    held: dict[str, shares.Share] = field(default_factory=dict)  # node -> what is still held
    failed_pods: int = 0
    deleted_pods: int = 0  # pods deleted before they finished (their shares given back)
    resumed: bool = False
    fj_exists: bool = False
    fj_dirty: bool = True
    # when the FluxJob first needed a write since the last one (monotonic): writes wait
    # `status_interval` so that a burst of transitions becomes one write (see flush_fluxjobs)
    fj_since: float | None = None
    jobspec_yaml: str | None = None  # the jobspec as text, made once (FluxJob spec, store row)
    fj_status: dict[str, Any] = field(default_factory=dict)
    fj_uid: str = ""
    store_uid: str = ""
    store_id: int | None = None
    alloc: list[shares.Share] = field(default_factory=list)  # what it was given when it started
    note: str = ""  # said again with its next start (e.g. why it was matched again)
    recovered: bool = False  # its allocation was made before a restart (pods carry older job ids)

    @property
    def key(self) -> tuple[str, str]:
        return self.spec.key

    @property
    def qid(self) -> str:
        return f"{self.spec.namespace}/{self.spec.name}"

    def ref(self) -> dict[str, str]:
        return {"apiVersion": f"{names.API_GROUP}/{names.API_VERSION}", "kind": names.FLUXJOB_KIND,
                "name": self.spec.name, "namespace": self.spec.namespace}


class Controller:
    def __init__(self, kube: Kube, config: OperatorConfig, *, clock: Callable[[], float] = time.time) -> None:
        self.kube, self.config, self.clock = kube, config, clock
        self.queue: asyncio.Queue[Event] = asyncio.Queue()
        self.informers = [
            Informer(kube, NODES, "Node", self.queue),
            Informer(kube, PODS, "Pod", self.queue),
            Informer(kube, PRIORITY_CLASSES, "PriorityClass", self.queue),
            Informer(kube, FLUXJOBS, "FluxJob", self.queue),
            *(Informer(kube, res, kind, self.queue) for kind, res in OWNER_RESOURCES.items()),
        ]
        self.nodes: dict[str, dict[str, Any]] = {}
        self.node_down: dict[str, bool] = {}
        self.owners: dict[tuple[str, str, str], dict[str, Any]] = {}
        self.priority_classes: dict[str, int] = {}
        self.groups: dict[tuple[str, str], Group] = {}
        self.member_of: dict[str, tuple[str, str]] = {}
        self.parked: dict[str, dict[str, Any]] = {}  # pods waiting for their owner to be seen
        self.foreign: dict[str, dict[str, PodResources]] = {}  # node -> uid -> request
        self.foreign_node: dict[str, str] = {}  # uid -> node
        self.foreign_jobs: dict[str, Any] = {}  # node -> matcher job id
        self.foreign_dirty: set[str] = set()
        self.matcher: Any = None
        self.scheduler: Any = None
        self.dirty = True
        self.ready = asyncio.Event()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._wake = asyncio.Event()
        self._informer_runs: list[asyncio.Task[Any]] = []
        self._counts_dirty = True
        self.store_ok = True  # False while a configured store cannot be reached (/readyz)
        self.cycles = 0
        self._flushing = False
        self.reconciled = False
        self._tokens, self._tokens_at, self.events_dropped = float(EVENT_BURST), time.monotonic(), 0
        self.journal: Any = None
        if config.store:
            from fluxnetes.k8s.journal import Journal

            self.journal = Journal(config.store)
        # live store rows no group has claimed yet (after a restart): (namespace, name) -> record
        self.store_only: dict[tuple[str, str], Any] = {}
        self.store_allocs: dict[int, Any] = {}  # store allocations read at start, by store id
        # scale-up groups of a workload: base group key -> keys of its "-scale-N" groups
        self.scale_groups: dict[tuple[str, str], list[tuple[str, str]]] = {}
        # groups that reached a final phase (candidates for pruning) and counts of pruned ones
        self.finished: set[tuple[str, str]] = set()
        self.pruned: dict[str, int] = {}
        self._hold_placement = False  # debug exit point "fluxjob-running": never place
        # the pods' own node rules (nodeSelector, required affinity, taints): see fit_groups
        self.node_view = nodefit.NodeView()
        self.fitted: dict[tuple[str, str], tuple[int, Any, Any]] = {}  # key -> (version, base, fitted)
        self.judge = Judge()  # can a queued group ever run? (k8s/satisfiable.py, run_cycle)
        from fluxnetes.k8s.topology import Topologies, TopologySource

        self.topologies = Topologies()  # NodeResourceTopology by node (k8s/topology.py)
        self.topology_source = TopologySource(kube, self.queue)

    # ---------------------------------------------------------------- helpers
    def now(self) -> int:
        return int(self.clock())

    def spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def event(self, ref: Mapping[str, Any], etype: str, reason: str, message: str) -> None:
        # a token bucket (like client-go's event recorder) keeps a burst of thousands of jobs
        # from flooding the API server; every decision is also in the FluxJob's conditions
        now = time.monotonic()
        self._tokens = min(EVENT_BURST, self._tokens + (now - self._tokens_at) * self.config.event_rate)
        self._tokens_at = now
        if self._tokens < 1 and etype == "Normal":
            self.events_dropped += 1
            return
        self._tokens -= 1
        ns = ref.get("namespace") or "default"
        ts = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        body = {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"generateName": f"{ref.get('name')}.", "namespace": ns},
            "involvedObject": {k: ref[k] for k in ("apiVersion", "kind", "name", "namespace", "uid") if ref.get(k)},
            "type": etype, "reason": reason, "message": message[:1024],
            "source": {"component": "fluxnetes"}, "reportingComponent": "fluxnetes",
            "reportingInstance": self.config.identity,
            "firstTimestamp": ts, "lastTimestamp": ts, "eventTime": None, "count": 1,
        }
        del body["eventTime"]

        async def post() -> None:
            try:
                await self.kube.create(EVENTS, body, ns, background=True)
            except Exception as exc:
                log.debug("event not recorded: %r", exc)

        self.spawn(post())

    def pod_ref(self, pod: Mapping[str, Any]) -> dict[str, str]:
        m = _meta(pod)
        return {"apiVersion": "v1", "kind": "Pod", "name": m.get("name", ""), "namespace": m.get("namespace", ""),
                "uid": m.get("uid", "")}

    def group_event(self, g: Group, etype: str, reason: str, message: str, pods: bool = True) -> None:
        self.event(g.ref(), etype, reason, message)
        if pods:
            for pod in list(g.members.values())[:50]:
                self.event(self.pod_ref(pod), etype, reason, message)

    def set_phase(self, g: Group, phase: Phase, reason: str) -> None:
        if g.phase != phase or g.reason != reason:
            changed = g.phase != phase
            before = g.phase
            if changed:
                self.keep_condition(g, before, g.reason)
            g.phase, g.reason = phase, reason
            g.fj_dirty = True
            if phase.final:
                self.finished.add(g.key)
            self._wake.set()
            self._counts_dirty = True
            if changed and before == Phase.RUNNING:
                METRICS.releases.labels(kind="full").inc()  # the group gave everything back
            if changed:
                with log_context(job=g.qid, group=g.spec.name, namespace=g.spec.namespace):
                    log.info("%s: %s -> %s: %s", g.qid, before, phase, reason,
                             extra={"phase": str(phase), "previous": str(before), "reason": reason,
                                    "size": g.spec.size, "jobid": g.jobid})
            if changed and self.journal is not None:
                self.journal.record(self.group_record(g), self.now())

    def keep_condition(self, g: Group, phase: Phase, reason: str) -> None:
        """The group leaves ``phase``: if no status write showed it yet (status writes are
        coalesced, so a short job can go Pending -> Running -> Completed between two), its
        condition is added to the last written status, which the next write builds on
        (fluxjob.status keeps earlier conditions): every decision stays on the FluxJob."""
        if phase not in (Phase.PENDING, Phase.RESERVED, Phase.RUNNING):
            return
        conds = list(g.fj_status.get("conditions") or [])
        if g.fj_status.get("phase") == str(phase) or any(
                c.get("type") == str(phase) and c.get("message") == reason for c in conds):
            return
        at = g.start if phase == Phase.RUNNING and g.start else self.now()
        conds = [c for c in conds if c.get("type") != str(phase)]
        conds.append({"type": str(phase), "status": "False", "reason": str(phase), "message": reason,
                      "lastTransitionTime": fluxjob.rfc3339(at)})
        g.fj_status = {**g.fj_status, "conditions": conds}

    def group_record(self, g: Group) -> Any:
        """A snapshot of the group for the store (see journal.GroupRecord)."""
        from fluxnetes.k8s.journal import GroupRecord

        if not g.store_uid:
            g.store_uid = g.spec.owner.uid if g.spec.owner else next(iter(g.members), "")
        return GroupRecord(
            namespace=g.spec.namespace, name=g.spec.name, uid=g.store_uid,
            kind=g.spec.owner.kind if g.spec.owner else "Pod", jobspec=self.jobspec_text(g),
            size=g.spec.size, duration=g.spec.duration, priority=g.spec.priority, submit=g.submit or self.now(),
            phase=g.phase, reason=g.reason, start=g.start or 0,
            shares=tuple(g.held.values()) if g.held else tuple(g.alloc), store_id=g.store_id)

    def jobspec_text(self, g: Group) -> str:
        # dumped once per group: YAML emitting costs milliseconds, and the text goes into the
        # FluxJob and into every store row of the group
        if g.jobspec_yaml is None:
            g.jobspec_yaml = _dump_jobspec(g.jobspec)
        return g.jobspec_yaml

    def owner_obj(self, ref: OwnerRef | None, namespace: str) -> dict[str, Any] | None:
        if ref is None:
            return None
        obj = self.owners.get((ref.kind, namespace, ref.name))
        if obj is not None and ref.uid and _meta(obj).get("uid") not in (None, "", ref.uid):
            return None  # another object of the same name: the group's own owner is gone
        return obj

    @staticmethod
    def same_owner(g: Group, uid: str) -> bool:
        """Does the workload object ``uid`` own group ``g`` (owners are matched by uid: a Job
        deleted and created again with the same name is a new workload)?"""
        o = g.spec.owner
        return o is None or not o.uid or not uid or o.uid == uid

    def priority_of(self, spec: Mapping[str, Any]) -> int:
        if isinstance(spec.get("priority"), int):
            return default_priority(spec)
        pc = spec.get("priorityClassName")
        if pc:
            return self.priority_classes.get(str(pc), 0)
        return self.priority_classes.get("", 0)  # the globalDefault class, if any

    # ---------------------------------------------------------------- matcher
    def build_matcher(self) -> None:
        from fluxnetes.k8s.topology import build_graph
        from fluxnetes.match.matcher import Matcher
        from fluxnetes.queue.cycle import Scheduler
        from fluxnetes.queue.policy import QueuePolicy

        graph, _ = build_graph(list(self.nodes.values()), self.topologies, rack_label=self.config.rack_label)
        self.matcher = Matcher(graph, policy=self.config.match_policy)
        self.scheduler = Scheduler(TimedMatcher(self.matcher), QueuePolicy.parse(self.config.policy))
        self.node_down = {n: _node_down(obj) for n, obj in self.nodes.items()}
        self.update_node_gauge()

    def make_jobspec(self, g: Group) -> Any:
        from fluxnetes.jobspec import PodRequest, jobspec_from_pods, parse_jobspec

        if g.spec.jobspec:
            return parse_jobspec(g.spec.jobspec)
        r = g.spec.request
        req = PodRequest(r.cpu_millis, r.memory_bytes, r.gpus, dict(r.extended))
        return jobspec_from_pods(g.spec.size, req, duration=g.spec.duration, exclusive_nodes=g.spec.exclusive,
                                 name=g.spec.name[:60], locality=g.spec.locality)

    # ---------------------------------------------------------------- foreign pods
    def add_foreign(self, uid: str, pod: Mapping[str, Any], node: str) -> None:
        try:
            req = request_of(pod.get("spec") or {})
        except GroupError:
            req = PodResources()
        if self.foreign_node.get(uid) == node and self.foreign.get(node, {}).get(uid) == req:
            return
        self.remove_foreign(uid)
        self.foreign.setdefault(node, {})[uid] = req
        self.foreign_node[uid] = node
        self.foreign_dirty.add(node)
        METRICS.foreign_allocations.inc()
        METRICS.foreign_pods.set(len(self.foreign_node))

    def remove_foreign(self, uid: str) -> None:
        node = self.foreign_node.pop(uid, None)
        if node is not None:
            self.foreign.get(node, {}).pop(uid, None)
            self.foreign_dirty.add(node)
            METRICS.foreign_pods.set(len(self.foreign_node))

    def flush_foreign(self) -> None:
        """Re-record the foreign allocation of every node whose foreign pods changed."""
        if not self.foreign_dirty or self.matcher is None:
            return
        now = self.now()
        for node in sorted(self.foreign_dirty):
            old = self.foreign_jobs.pop(node, None)
            if old is not None:
                with contextlib.suppress(Exception):
                    self.matcher.cancel(old)
            pods = self.foreign.get(node) or {}
            if not pods or node not in self.nodes:
                continue
            share = shares.of_pods(node, pods.values())
            if share.empty:
                continue
            jobid = self.matcher.next_jobid
            try:
                self.matcher.update_allocate(jobid, shares.to_match([share]), at=now, duration=0)
                self.foreign_jobs[node] = jobid
            except Exception as exc:
                log.warning("foreign pods on %s (%s) could not be recorded: %s", node, share, exc)
        self.foreign_dirty.clear()
        self.scheduler.invalidate()
        self.dirty = True

    # ---------------------------------------------------------------- groups
    def new_group(self, spec: GroupSpec, kind: WorkloadKind | None) -> Group:
        g = Group(spec=spec, kind=kind)
        try:
            g.jobspec = self.make_jobspec(g)
        except Exception as exc:
            g.phase, g.reason = Phase.UNSATISFIABLE, f"invalid jobspec: {exc}"
            self.finished.add(spec.key)
            self.group_event(g, "Warning", "InvalidJobspec", g.reason, pods=False)
        self.groups[spec.key] = g
        self.index_scale_group(g)
        return g

    def enqueue(self, g: Group) -> None:
        if g.phase != Phase.PROVISIONAL:
            return
        if self.store_only:
            self.claim_store_record(g)
            if g.phase != Phase.PROVISIONAL:
                return  # allocated before the restart (the store knew): running again
        g.submit = g.submit or self.now()
        self.set_phase(g, Phase.PENDING, "queued")
        self.group_event(g, "Normal", "Queued", f"group of {g.spec.size} pods queued")
        self.dirty = True

    def group_for_workload(self, kind: WorkloadKind, obj: Mapping[str, Any]) -> GroupSpec:
        meta = _meta(obj)
        tmpl = kind.template(obj)
        tmeta, tspec = tmpl.get("metadata") or {}, tmpl.get("spec") or {}
        ns = meta.get("namespace") or "default"
        owner = OwnerRef(kind.api_version, kind.kind, meta.get("name", ""), meta.get("uid", ""))
        ann = {**(tmeta.get("annotations") or {}), **(meta.get("annotations") or {})}
        merged = {"annotations": ann}
        return GroupSpec(
            namespace=ns, name=object_name(f"{kind.kind.lower()}-{meta.get('name', '')}"), size=kind.size(obj),
            request=request_of(tspec), duration=duration_of(merged, tspec, kind.deadline(obj)),
            priority=self.priority_of(tspec), owner=owner, jobspec=jobspec_of(merged),
            exclusive=exclusive_of(merged), labels=dict(tmeta.get("labels") or {}), locality=locality_of(merged),
        )

    def on_owner(self, kind_name: str, etype: str, obj: dict[str, Any]) -> None:
        meta = _meta(obj)
        ns, name, uid = meta.get("namespace") or "default", meta.get("name", ""), str(meta.get("uid", ""))
        kind = kind_of(kind_name)
        assert kind is not None
        key = (kind_name, ns, name)
        gkey = (ns, object_name(f"{kind_name.lower()}-{name}"))
        if etype == "DELETED":
            cached = self.owners.get(key)
            if cached is None or _meta(cached).get("uid") in (None, "", uid):
                self.owners.pop(key, None)  # (a re-list may show the new object first: keep it)
            for k in [gkey, *self.scale_groups.get(gkey, ())]:
                g = self.groups.get(k)
                if g is not None and not g.phase.final and self.same_owner(g, uid):
                    self.cancel_group(g, f"{kind_name} {name} was deleted")
            return
        self.owners[key] = obj
        g = self.groups.get(gkey)
        if g is not None and not self.same_owner(g, uid):
            self.drop_earlier_owner(gkey, f"{kind_name} {name} was deleted (a new one has its name)")
            g = None
        managed = ((kind.template(obj).get("metadata") or {}).get("labels") or {}).get(names.LABEL_MANAGED) == "true"
        if g is None and managed and kind.resume_patch(obj) is not None and not kind.finished(obj):
            # a Job: its group is known without any pod (its template was gated at admission;
            # a Job created while the webhook was away has no managed template and runs alone)
            try:
                spec = self.group_for_workload(kind, obj)
            except GroupError as exc:
                self.event({"apiVersion": kind.api_version, "kind": kind_name, "name": name, "namespace": ns,
                            "uid": uid}, "Warning", "InvalidGroup", str(exc))
                return
            if spec.size < 1:
                return  # parallelism 0: nothing to schedule until it is raised
            g = self.new_group(spec, kind)
            if g.phase == Phase.PROVISIONAL:
                self.enqueue_workload(g, kind, obj)
        elif g is not None and not g.phase.final and kind.finished(obj):
            self.workload_finished(g, kind, obj)  # whatever the group's phase: never queued again
        elif g is not None and kind.resume_patch(obj) is not None:
            if g.kind is not None and (g.phase == Phase.PROVISIONAL or g.phase in QUEUED):
                self.enqueue_workload(g, kind, obj)  # resumed (or suspended) by its user
            elif g.phase == Phase.RUNNING and kind.size(obj) < self.capacity(g):
                self.rescale(gkey, kind, obj)  # parallelism lowered: give back empty slots
        elif kind.owns_pods and (g is not None or gkey in self.scale_groups):
            self.rescale(gkey, kind, obj)  # replicas changed
        # pods that arrived before their owner (matched by the owner's uid)
        for puid, pod in list(self.parked.items()):
            owner = controller_of(_meta(pod))
            if owner and owner.kind == kind_name and owner.name == name and _meta(pod).get("namespace") == ns \
                    and (not owner.uid or owner.uid == uid):
                del self.parked[puid]
                self.on_pod("MODIFIED", pod)

    def drop_earlier_owner(self, gkey: tuple[str, str], reason: str) -> None:
        """Owners are matched by uid: a workload object with an earlier one's name (deleted and
        created again) is a new workload. The earlier one's groups are over (what they hold is
        given back) and forgotten, so they never answer for the new one."""
        for k in [*self.scale_groups.get(gkey, ()), gkey]:
            old = self.groups.get(k)
            if old is None:
                continue
            if not old.phase.final:
                self.cancel_group(old, reason)
            self.drop_group(old)

    def workload_finished(self, g: Group, kind: WorkloadKind, obj: Mapping[str, Any]) -> None:
        """The group's workload is over (a Job's Complete/Failed condition). A running group
        gives everything back; a group not allocated (in this operator's life: its Job ran
        before a restart, or was resumed by someone else) is never queued again and ends with
        its workload's outcome."""
        if g.phase == Phase.RUNNING:
            self.finish_group(g)
            return
        if g.phase in QUEUED:
            self.scheduler.withdraw(g.qid)
        failed = kind.failed(obj)
        g.end = self.now()
        phase = Phase.FAILED if failed else Phase.COMPLETED
        self.set_phase(g, phase, f"{kind.kind} {_meta(obj).get('name', '')} "
                                 f"{'failed' if failed else 'completed'} before this operator allocated it "
                                 f"(it ran before a restart); nothing is held")
        self.group_event(g, "Warning" if failed else "Normal", str(phase), g.reason, pods=False)
        self.dirty = True

    def enqueue_workload(self, g: Group, kind: WorkloadKind, obj: Mapping[str, Any]) -> None:
        """A workload group enters the queue, unless its user holds the workload (a Job created
        with ``spec.suspend: true``): then it waits, and fluxnetes will not resume it."""
        if kind.held_by_user(obj):
            if g.phase in QUEUED:
                self.scheduler.withdraw(g.qid)
            reason = (f"{kind.kind} {_meta(obj).get('name', '')} is suspended by its user "
                      f"(spec.suspend=true): waiting until it is resumed")
            if g.phase != Phase.PROVISIONAL or g.reason != reason:
                self.set_phase(g, Phase.PROVISIONAL, reason)
                g.fj_dirty = True
                self.group_event(g, "Normal", "SuspendedByUser", reason, pods=False)
            return
        if g.phase == Phase.PROVISIONAL:
            self.enqueue(g)

    # ---------------------------------------------------------------- scaling
    # A ReplicaSet (so a Deployment) or StatefulSet whose group was allocated may scale. Up:
    # the added pods form a new group "<group>-scale-N" of the difference, queued and matched
    # all-or-nothing like any group (its pods stay gated until then; the running pods are
    # untouched). Before a group starts, scaling just resizes it. Down: the workload's
    # controller deletes pods, each gives back its share (or an empty slot is given back at
    # once), across the base group and its scale groups.
    def base_key(self, g: Group) -> tuple[str, str] | None:
        o = g.spec.owner
        if o is None or kind_of(o.kind) is None:
            return None
        return (g.spec.namespace, object_name(f"{o.kind.lower()}-{o.name}"))

    def index_scale_group(self, g: Group) -> None:
        base = self.base_key(g)
        if base is not None and g.spec.name.startswith(base[1] + SCALE_SEP):
            keys = self.scale_groups.setdefault(base, [])
            if g.key not in keys:
                keys.append(g.key)

    def family(self, base: tuple[str, str]) -> list[Group]:
        """The live groups of one workload: its base group, then its scale groups."""
        out = []
        for k in (base, *self.scale_groups.get(base, ())):
            g = self.groups.get(k)
            if g is not None and not g.phase.final:
                out.append(g)
        return out

    @staticmethod
    def capacity(g: Group) -> int:
        """Pods the group stands for: unreleased slots once started, its size before."""
        if g.phase == Phase.RUNNING:
            return len(g.slots) - len(g.released)
        return 0 if g.phase.final else g.spec.size

    def rescale(self, base: tuple[str, str], kind: WorkloadKind, obj: Mapping[str, Any]) -> None:
        """Follow the workload's replica count (see the comment above)."""
        fam = self.family(base)
        if not fam:
            return  # nothing live: new pods form a new group (join_group)
        diff = kind.size(obj) - sum(self.capacity(g) for g in fam)
        # the newest group that has not started yet absorbs the change
        while diff and fam and fam[-1].phase != Phase.RUNNING and fam[-1].spec.jobspec is None:
            g = fam[-1]
            size = g.spec.size + diff
            if size >= 1:
                self.resize(g, size)
                return
            diff = size
            fam.pop()
            strays = list(g.members.items())
            for uid in g.members:
                self.member_of.pop(uid, None)
            g.members.clear()
            self.cancel_group(g, f"{kind.kind} {_meta(obj).get('name', '')} scaled down before the group started")
            for uid, pod in strays:
                self.join_group(uid, pod)
        if diff > 0 and any(g.phase == Phase.RUNNING for g in fam):
            self.new_scale_group(base, fam[0], kind, diff)
        elif diff < 0:
            # scaled down: give back empty slots now (newest groups first); slots with a pod
            # are given back when the controller deletes that pod (member_gone)
            extra = -diff
            for g in reversed(fam):
                for slot in range(len(g.slots)):
                    if extra <= 0 or g.phase != Phase.RUNNING:
                        break
                    if g.slot_pod[slot] is None and slot not in g.released:
                        self.release_slot(g, slot)
                        extra -= 1
                if g.phase == Phase.RUNNING and not g.held:
                    self.finish_group(g)

    def resize(self, g: Group, size: int) -> None:
        """A group that has not started takes the workload's new size."""
        if size == g.spec.size:
            return
        if g.phase in QUEUED:
            self.scheduler.withdraw(g.qid)
            g.phase = Phase.PROVISIONAL  # enqueued again below once complete
        g.spec = replace(g.spec, size=size)
        try:
            g.jobspec = self.make_jobspec(g)
        except Exception as exc:
            self.set_phase(g, Phase.UNSATISFIABLE, f"invalid jobspec: {exc}")
            return
        g.fj_dirty = True
        self.dirty = True
        if g.fj_exists:  # the FluxJob's spec is written once: say the new size there too
            self.spawn(self._patch_fluxjob_spec(g, {"size": size, "jobspec": _dump_jobspec(g.jobspec)}))
        if len(g.members) >= size or (g.kind is not None and g.kind.resume_patch({}) is not None):
            self.enqueue(g)
        else:
            g.reason = f"waiting for the group: {len(g.members)}/{size} pods"

    async def _patch_fluxjob_spec(self, g: Group, spec: dict[str, Any]) -> None:
        try:
            await self.kube.patch(FLUXJOBS, g.spec.name, {"spec": spec}, g.spec.namespace, background=True)
        except ApiError as exc:
            log.info("FluxJob %s spec: %s", g.qid, exc)

    def new_scale_group(self, base: tuple[str, str], like: Group, kind: WorkloadKind, size: int) -> Group:
        used = {int(k[1].rsplit(SCALE_SEP, 1)[-1]) for k in self.scale_groups.get(base, ())
                if k[1].rsplit(SCALE_SEP, 1)[-1].isdigit()}
        n = max(used, default=0) + 1
        spec = replace(like.spec, name=f"{base[1]}{SCALE_SEP}{n}", size=size)
        g = self.new_group(spec, kind)
        g.reason = f"waiting for the group: 0/{size} pods"
        self.event(like.ref(), "Normal", "ScaledUp",
                   f"{size} added pod(s) form group {spec.name}, queued all-or-nothing")
        # pods that arrived before the new replica count was seen wait in a running group
        # without a slot: they belong to the new group
        for other in self.family(base):
            if other.phase != Phase.RUNNING or other is g:
                continue
            free = sum(1 for i, u in enumerate(other.slot_pod) if u is None and i not in other.released)
            strays = [uid for uid, pod in sorted(other.members.items(), key=lambda kv: _meta(kv[1]).get("name", ""))
                      if uid not in other.slot_pod and _gated(pod) and not _terminal(pod)]
            for uid in strays[free:]:
                pod = other.members.pop(uid)
                if g.phase == Phase.PROVISIONAL and len(g.members) < g.spec.size:
                    self.add_member(g, uid, pod)
                else:
                    other.members[uid] = pod
        return g

    def route_pod(self, base: tuple[str, str], kind: WorkloadKind, pod: Mapping[str, Any]) -> Group | None:
        """The group a new gated pod of a replicated workload joins (None: a new base group)."""
        owner = controller_of(_meta(pod))
        obj = self.owners.get((owner.kind, str(_meta(pod).get("namespace") or "default"), owner.name)) \
            if owner else None
        if obj is not None:
            self.rescale(base, kind, obj)
        fam = self.family(base)
        if not fam:
            return None
        for g in fam:  # a started group with a free slot: a replacement
            if g.phase == Phase.RUNNING:
                free = sum(1 for i, u in enumerate(g.slot_pod) if u is None and i not in g.released)
                waiting = sum(1 for u, p in g.members.items() if u not in g.slot_pod and _gated(p)
                              and not _terminal(p))
                if free > waiting:
                    return g
        for g in reversed(fam):  # the group still collecting its pods
            if g.phase == Phase.PROVISIONAL and len(g.members) < g.spec.size:
                return g
        return fam[0]  # more pods than the workload asks for (racing a release): it waits

    # ---------------------------------------------------------------- pruning
    def prune_finished(self) -> None:
        """Forget groups that are over: final phase, no pod left, FluxJob status written (it
        keeps what ``kubectl get fluxjobs`` shows), and no live owner that would bring the
        group back (an unfinished Job stays, e.g. Unsatisfiable, so it is not queued again)."""
        if not self.finished or not self.reconciled:
            return
        for key in list(self.finished):
            g = self.groups.get(key)
            if g is None or not g.phase.final:
                self.finished.discard(key)
                continue
            if g.members or g.fj_dirty or (g.fj_exists and g.fj_status.get("phase") != str(g.phase)):
                continue
            if g.kind is not None and g.spec.owner is not None and g.kind.resume_patch({}) is not None:
                owner = self.owner_obj(g.spec.owner, g.spec.namespace)
                if owner is not None and not g.kind.finished(owner):
                    continue
            self.drop_group(g)

    def drop_group(self, g: Group) -> None:
        key = g.key
        self.finished.discard(key)
        if self.groups.get(key) is g:
            del self.groups[key]
        for uid in [*g.members, *(u for u in g.slot_pod if u)]:
            if self.member_of.get(uid) == key:
                del self.member_of[uid]
        if self.scheduler is not None:
            self.scheduler.withdraw(g.qid)
            self.scheduler.running.pop(g.qid, None)
            if getattr(self.scheduler, "profile", None) is not None:
                with contextlib.suppress(Exception):
                    self.scheduler.profile.remove(g.qid)
        base = self.base_key(g)
        if base is not None and key in self.scale_groups.get(base, ()):
            self.scale_groups[base].remove(key)
        if base is not None and not self.scale_groups.get(base, True):
            del self.scale_groups[base]
        if self.journal is not None and g.store_uid:
            self.journal.forget((g.spec.namespace, g.spec.name, g.store_uid))
        self.pruned[str(g.phase)] = self.pruned.get(str(g.phase), 0) + 1
        self._counts_dirty = True

    # ---------------------------------------------------------------- crash windows
    def debug_point(self, point: str, g: Group) -> bool:
        """Is ``FLUXNETES_DEBUG_EXIT_AT`` set to ``point`` (optionally ``point@namespace/name``)?"""
        want, _, target = os.environ.get(DEBUG_EXIT_AT, "").partition("@")
        return want == point and target in ("", g.qid)

    def debug_exit(self, point: str) -> None:
        log.warning("%s=%s: exiting here on purpose", DEBUG_EXIT_AT, point)
        if self.journal is not None:
            self.journal.drain()  # what the store was told is in the store
        logging.shutdown()
        os._exit(137)

    async def _exit_once_placed(self, g: Group) -> None:
        while sum(1 for p in g.members.values() if not _gated(p)) < g.spec.size:
            g.fj_dirty = False
            await asyncio.sleep(0.02)
        self.debug_exit("placed")

    async def _exit_once_written(self, g: Group, point: str) -> None:
        while g.fj_status.get("phase") != str(g.phase) or g.fj_dirty:
            await asyncio.sleep(0.05)
        self.debug_exit(point)

    def resume_if_held(self, g: Group) -> None:
        """A running group whose workload fluxnetes still holds (the resume was lost in a
        crash): let it go now."""
        if g.kind is None or g.spec.owner is None:
            return
        owner = self.owner_obj(g.spec.owner, g.spec.namespace)
        if owner is not None and g.kind.resume_patch(owner) is not None and g.kind.held_by_fluxnetes(owner):
            g.resumed = True
            self.spawn(self.resume(g))

    def nodes_gone(self, held: Any) -> list[str]:
        return sorted(n for n in held if n not in self.nodes or self.node_down.get(n, False))

    def requeue_if_nodes_gone(self, g: Group) -> bool:
        """After a restart: a running group allocated on nodes that are gone. Nothing of it
        placed yet: it is matched again; otherwise the node-loss policy applies."""
        gone = [n for n in g.held if n not in self.nodes]
        if not gone:
            return False
        placed = any(not _gated(p) for p in g.members.values())
        if placed:
            for n in gone:
                self.node_lost(n)
            return g.phase != Phase.RUNNING
        self.release_all(g)
        g.jobid, g.slots, g.slot_pod, g.released, g.start = None, [], [], set(), None
        g.held, g.alloc = {}, []
        reason = g.note = (f"its allocation from before the restart is on nodes that are gone "
                           f"({', '.join(gone)}); matched again")
        self.set_phase(g, Phase.PENDING, reason)
        self.group_event(g, "Warning", "Requeued", reason, pods=False)
        self.dirty = True
        return True

    def adopt_allocation(self, g: Group, alloc: Any, reason: str) -> bool:
        """The store recorded an allocation (made before a crash) the cluster does not show
        yet: the group runs again on exactly those nodes. False (queued again) if one of
        them is gone or down."""
        from fluxnetes.jobspec.pods import cores_for

        held = [shares.Share(node=n.name, cores=n.cores, gpus=n.gpus, memory=n.memory, extra=dict(n.extra))
                for n in alloc.nodes]
        gone = self.nodes_gone(s.node for s in held)
        if gone:
            g.reason = g.note = (f"allocated on {', '.join(sorted(s.node for s in held))} before the restart, "
                                 f"but {', '.join(gone)} is gone or down; matched again")
            g.fj_dirty = True
            self.group_event(g, "Warning", "Requeued", g.reason, pods=False)
            return False
        g.phase, g.reason = Phase.RUNNING, reason
        g.held, g.alloc = {s.node: s for s in held}, held
        g.slots = shares.slots_per_node(held, g.spec.size, cores_for(g.spec.request.cpu_millis), g.spec.exclusive)
        g.slot_pod, g.released = [None] * len(g.slots), set()
        g.start, g.resumed, g.fj_dirty, g.recovered = alloc.at, True, True, True
        g.expected_start = None
        g.jobid = self.matcher.next_jobid
        self.record_group(g)
        self._counts_dirty = True
        self.dirty = True
        self.group_event(g, "Normal", "Recovered",
                         f"{reason}: job {g.jobid} on {','.join(sorted(set(g.slots)))}", pods=False)
        return True

    def cancel_group(self, g: Group, reason: str) -> None:
        if g.phase == Phase.RUNNING:
            self.release_all(g)
        elif g.phase in QUEUED:
            self.scheduler.withdraw(g.qid)
        g.end = self.now()
        self.set_phase(g, Phase.CANCELLED, reason)
        self.group_event(g, "Normal", "Cancelled", reason, pods=False)
        self.dirty = True

    def release_all(self, g: Group) -> None:
        if g.jobid is not None:
            with contextlib.suppress(Exception):
                self.matcher.cancel(g.jobid)
        self.scheduler.running.pop(g.qid, None)
        self.scheduler.invalidate()
        g.held.clear()
        g.released = set(range(len(g.slots)))
        self.dirty = True

    def finish_group(self, g: Group) -> None:
        self.release_all(g)
        g.end = self.now()
        ok = g.failed_pods == 0
        complete = False
        if g.kind is not None:
            owner = self.owner_obj(g.spec.owner, g.spec.namespace)
            for c in ((owner or {}).get("status") or {}).get("conditions") or []:
                if c.get("status") != "True":
                    continue
                if c.get("type") in ("Failed", "FailureTarget"):
                    ok = False
                elif c.get("type") in ("Complete", "SuccessCriteriaMet"):
                    complete = True
        if ok and g.deleted_pods and not complete:
            # its pods were deleted while they ran: the work was stopped, not finished
            reason = f"pods deleted: {g.deleted_pods} pod(s) of the group were deleted before they finished"
            self.set_phase(g, Phase.CANCELLED, reason)
            self.group_event(g, "Normal", "Cancelled", reason, pods=False)
            return
        phase = Phase.COMPLETED if ok else Phase.FAILED
        self.set_phase(g, phase, "all pods finished" if ok else f"{g.failed_pods} pod(s) failed")
        self.group_event(g, "Normal" if ok else "Warning", str(phase), g.reason, pods=False)

    def release_slot(self, g: Group, slot: int) -> None:
        if slot in g.released or slot >= len(g.slots):
            return
        node = g.slots[slot]
        left_on_node = [i for i, n in enumerate(g.slots) if n == node and i not in g.released]
        held = g.held.get(node)
        g.released.add(slot)
        if held is None:
            return
        part = held if len(left_on_node) <= 1 else held.split(len(left_on_node))
        rest = held - part
        if rest.empty:
            g.held.pop(node, None)
            if g.held and self.journal is not None:
                self.journal.release_nodes(self.group_record(g), [node], self.now(), "its pods ended")
        else:
            g.held[node] = rest
        if not g.held:
            self.release_all(g)
        elif not part.empty:
            METRICS.releases.labels(kind="partial").inc()
            try:
                self.matcher.partial_cancel(g.jobid, shares.to_match([part]))
            except Exception as exc:
                log.warning("partial release of %s on %s failed: %s", g.qid, node, exc)
            self.scheduler.invalidate()
        g.fj_dirty = True
        self.dirty = True

    def assign(self, g: Group) -> None:
        """Give every gated member without a slot a free slot, and pin it there."""
        if g.phase != Phase.RUNNING or not self.reconciled or self._hold_placement:
            return  # after a restart, wait until every placed pod has claimed its slot again
        taken = {u for u in g.slot_pod if u}
        for uid, pod in sorted(g.members.items(), key=lambda kv: _meta(kv[1]).get("name", "")):
            if uid in taken or not _gated(pod) or _terminal(pod):
                continue
            want = g.kind.slot_of(pod) if g.kind else None
            free = [i for i in range(len(g.slots)) if g.slot_pod[i] is None and i not in g.released]
            if not free:
                break
            slot = want if want in free else free[0]
            g.slot_pod[slot] = uid
            taken.add(uid)
            self.spawn(self.place(g, pod, slot))

    async def place(self, g: Group, pod: dict[str, Any], slot: int) -> None:
        node = g.slots[slot]
        m = _meta(pod)
        try:
            if hold.gated(pod):  # pin by node affinity and lift the gate in one update
                patch = place_patch(pod, node, jobid=g.jobid, fluxjob=g.spec.name, slot=slot)
                if patch is None:
                    return
                await self.kube.patch(PODS, m["name"], patch, m.get("namespace"), content_type=JSON_PATCH)
            elif hold.is_held(pod):  # fluxnetes is the pod's scheduler: bind it
                body = binding(pod, node, jobid=g.jobid, fluxjob=g.spec.name, slot=slot)
                await self.kube.request("POST", PODS.path(m.get("namespace"), m["name"], "binding"), body)
            else:
                return
        except ApiError as exc:
            METRICS.reconcile_error("placement")
            with log_context(job=g.qid, group=g.spec.name, namespace=g.spec.namespace, pod=m.get("name"), node=node):
                log.info("placing %s/%s on %s: %s", m.get("namespace"), m.get("name"), node, exc)
            return
        METRICS.allocated_pods.inc()
        self.event(self.pod_ref(pod), "Normal", "Scheduled",
                   f"fluxnetes placed the pod on {node} (job {g.jobid}, slot {slot})")

    async def resume(self, g: Group) -> None:
        if g.kind is None or g.spec.owner is None:
            return
        owner = self.owner_obj(g.spec.owner, g.spec.namespace)
        body = g.kind.resume_patch(owner or {})
        if body is None:
            return
        res = OWNER_RESOURCES[g.kind.kind]
        try:
            await self.kube.patch(res, g.spec.owner.name, body, g.spec.namespace)
        except ApiError as exc:
            METRICS.reconcile_error("job")
            with log_context(job=g.qid, group=g.spec.name, namespace=g.spec.namespace):
                log.warning("resuming %s: %s", g.qid, exc)
            return
        if self.debug_point("resumed", g):
            self.debug_exit("resumed")  # the Job runs; no FluxJob status says so

    def start_group(self, g: Group, res: Any) -> None:
        g.jobid = res.jobid
        held = shares.from_match(res.nodes)
        g.held = {s.node: s for s in held}
        g.alloc = list(held)
        from fluxnetes.jobspec.pods import cores_for

        g.slots = shares.slots_per_node(held, g.spec.size, cores_for(g.spec.request.cpu_millis), g.spec.exclusive)
        g.slot_pod = [None] * len(g.slots)
        g.released = set()
        g.start = self.now()
        g.expected_start = None
        g.recovered = False
        METRICS.allocations.inc()
        nodes = ",".join(sorted(set(g.slots)))
        self.set_phase(g, Phase.RUNNING, f"allocated on {nodes}" + (f" ({g.note})" if g.note else ""))
        g.note = ""
        self.group_event(g, "Normal", "Allocated", f"job {g.jobid} allocated on {nodes}", pods=False)
        if self.debug_point("allocated", g):
            self.debug_exit("allocated")  # the store has the allocation; nothing else does
        if self.debug_point("placed", g):
            # pods placed, the FluxJob status not written (nor anything after it)
            g.fj_dirty = False
            self.spawn(self._exit_once_placed(g))
        if self.debug_point("fluxjob-running", g):
            # the FluxJob says Running, no pod placed, the Job not resumed
            self._hold_placement = True
            self.spawn(self._exit_once_written(g, "fluxjob-running"))
            return
        owner = self.owner_obj(g.spec.owner, g.spec.namespace) or {}
        if g.kind is not None and g.kind.resume_patch(owner) and g.kind.held_by_fluxnetes(owner):
            g.resumed = True
            self.spawn(self.resume(g))
        self.assign(g)

    # ---------------------------------------------------------------- pods
    def on_pod(self, etype: str, pod: dict[str, Any]) -> None:
        meta = _meta(pod)
        uid = str(meta.get("uid", ""))
        spec = pod.get("spec") or {}
        node = spec.get("nodeName")
        gone = etype == "DELETED" or _terminal(pod)
        gkey = self.member_of.get(uid)
        managed = (meta.get("labels") or {}).get(names.LABEL_MANAGED) == "true"
        if gkey is None and managed and not _gated(pod) and self.adopt(uid, pod):
            gkey = self.member_of.get(uid)  # placed before a restart: its group again
        if gkey is not None:
            g = self.groups.get(gkey)
            if g is None:
                self.member_of.pop(uid, None)
                return
            if gone:
                self.member_gone(g, uid, pod)
            else:
                g.members[uid] = pod
                if g.phase == Phase.RUNNING and uid not in g.slot_pod:
                    self.assign(g)
            return
        if gone:
            self.parked.pop(uid, None)
            self.remove_foreign(uid)
            return
        if managed and _gated(pod) and not node:
            self.join_group(uid, pod)
            return
        if node:
            self.add_foreign(uid, pod, str(node))

    def adopt(self, uid: str, pod: dict[str, Any]) -> bool:
        """A pod fluxnetes placed (annotation) becomes a member of its group again."""
        meta = _meta(pod)
        fj = (meta.get("annotations") or {}).get(names.ANN_FLUXJOB)
        g = self.groups.get((meta.get("namespace") or "default", fj or ""))
        if g is None and fj and self.store_only:
            g = self.group_from_store(pod, (meta.get("namespace") or "default", fj))
        if g is None or g.phase != Phase.RUNNING:
            return False
        jid = placed_jobid(pod)
        if jid is not None and not g.recovered and jid != str(g.jobid):
            return False  # placed for an earlier group of the same name (that one is over)
        owner = controller_of(meta)
        if owner is not None and g.spec.owner is not None and not self.same_owner(g, owner.uid):
            return False  # a pod of an earlier workload of the same name
        try:
            slot = int((meta.get("annotations") or {}).get(ANN_SLOT, "-1"))
        except ValueError:
            slot = -1
        if slot in g.released:
            return False  # its slot was given back already: the pod ended before
        self.member_of[uid] = g.key
        g.members[uid] = pod
        if 0 <= slot < len(g.slot_pod) and g.slot_pod[slot] is None:
            g.slot_pod[slot] = uid
        return True

    def group_from_store(self, pod: dict[str, Any], key: tuple[str, str]) -> Group | None:
        """A pod placed before a crash that came before its FluxJob was created: the store row
        (with the allocation) is all that is left of its group. The group is made again from
        the pod (or its Job) and takes the row over, so the pod is adopted, not foreign."""
        if key not in self.store_only:
            return None
        owner = controller_of(_meta(pod))
        okind = kind_of(owner.kind) if owner else None
        if owner is not None and okind is not None and okind.resume_patch({}) is not None:
            obj = self.owner_obj(owner, key[0])
            if obj is not None:
                self.on_owner(owner.kind, "ADDED", obj)  # a Job: its group comes from the Job
            return self.groups.get(key)
        try:
            spec = self.pod_group_spec(pod)
        except GroupError:
            return None
        if spec.key != key:
            return None
        g = self.new_group(spec, kind_of(spec.owner.kind) if spec.owner else None)
        self.claim_store_record(g)
        return g

    def pod_group_spec(self, pod: dict[str, Any]) -> GroupSpec:
        ns = _meta(pod).get("namespace") or "default"

        def owner_size(o: OwnerRef) -> int | None:
            k = kind_of(o.kind)
            obj = self.owners.get((o.kind, ns, o.name))
            return k.size(obj) if k is not None and k.owns_pods and obj is not None else None

        def owner_deadline(o: OwnerRef) -> object:
            k = kind_of(o.kind)
            obj = self.owners.get((o.kind, ns, o.name))
            return k.deadline(obj) if k is not None and obj is not None else None

        return group_of_pod(pod, owner_size=owner_size, owner_deadline=owner_deadline, priority=self.priority_of)

    def join_group(self, uid: str, pod: dict[str, Any]) -> None:
        meta = _meta(pod)
        ns = meta.get("namespace") or "default"
        owner = controller_of(meta)
        okind = kind_of(owner.kind) if owner else None
        if owner is not None and okind is not None and okind.owns_pods:
            if self.owner_obj(owner, ns) is None:  # its owner (this uid) not seen yet
                self.parked[uid] = pod
                return
            gkey = (ns, object_name(f"{owner.kind.lower()}-{owner.name}"))
            if okind.resume_patch({}) is not None:
                if gkey in self.groups and self.same_owner(self.groups[gkey], owner.uid):
                    # a workload group (Job): pods join by owner
                    self.add_member(self.groups[gkey], uid, pod)
                    return
            elif (gkey in self.groups or gkey in self.scale_groups) and not explicit_group(_meta(pod).get("labels") or {}):
                target = self.route_pod(gkey, okind, pod)  # replicas: base group or a scale group
                if target is not None:
                    self.add_member(target, uid, pod)
                    return
        try:
            spec = self.pod_group_spec(pod)
        except GroupError as exc:
            self.event(self.pod_ref(pod), "Warning", "InvalidGroup", str(exc))
            return
        g = self.groups.get(spec.key)
        if g is None or (g.phase.final and not g.members):
            kind = kind_of(spec.owner.kind) if spec.owner else None
            g = self.new_group(spec, kind)
        self.add_member(g, uid, pod)

    def add_member(self, g: Group, uid: str, pod: dict[str, Any]) -> None:
        self.member_of[uid] = g.key
        g.members[uid] = pod
        if g.phase != Phase.RUNNING:
            # a running group's new pod changes only status.podsSeen: it rides along with the
            # group's next status write instead of costing one of its own (API server load)
            g.fj_dirty = True
        if g.phase == Phase.PROVISIONAL:
            if len(g.members) >= g.spec.size:
                self.enqueue(g)
            else:
                g.reason = f"waiting for the group: {len(g.members)}/{g.spec.size} pods"
        elif g.phase == Phase.RUNNING:
            self.assign(g)
        elif g.phase == Phase.UNSATISFIABLE:
            self.event(self.pod_ref(pod), "Warning", "Unsatisfiable", g.reason)

    def member_gone(self, g: Group, uid: str, pod: dict[str, Any]) -> None:
        self.member_of.pop(uid, None)
        g.members.pop(uid, None)
        failed = (pod.get("status") or {}).get("phase") == "Failed"
        if g.phase in QUEUED or g.phase == Phase.PROVISIONAL:
            if g.kind is None or g.kind.resume_patch({}) is None:
                # pod-made group lost a member before it started: wait for it again
                if g.phase in QUEUED:
                    self.scheduler.withdraw(g.qid)
                g.phase = Phase.PROVISIONAL
                g.reason = f"waiting for the group: {len(g.members)}/{g.spec.size} pods"
                g.fj_dirty = True
                if not g.members:
                    self.cancel_group(g, "all pods of the group were deleted")
                elif len(g.members) >= g.spec.size:
                    self.enqueue(g)  # a surplus pod went (e.g. after the workload was resized)
            return
        if g.phase != Phase.RUNNING and not g.held:
            return
        slot = next((i for i, u in enumerate(g.slot_pod) if u == uid), None)
        if slot is None:
            return
        g.slot_pod[slot] = None
        if g.phase != Phase.RUNNING:
            # the group failed (a node was lost) while this pod ran on: its share was kept
            # for it until now (node_lost)
            self.release_slot(g, slot)
            return
        if failed:
            g.failed_pods += 1
        owner = self.owner_obj(g.spec.owner, g.spec.namespace)
        unreleased = len(g.slots) - len(g.released)
        base = self.base_key(g)
        if base is not None and g.kind is not None and g.kind.resume_patch({}) is None:
            unreleased = sum(self.capacity(x) for x in self.family(base))  # with its scale groups
        replaced = (g.kind is not None and owner is not None and not g.kind.finished(owner)
                    and (failed or g.kind.replaces_pods(owner)) and unreleased <= g.kind.size(owner))
        if replaced:
            self.assign(g)  # its replacement keeps the share
            return
        if not failed and (pod.get("status") or {}).get("phase") != "Succeeded" \
                and (g.kind is None or g.kind.resume_patch({}) is not None):
            # deleted before it finished, and no scale-down explains it (finish_group)
            g.deleted_pods += 1
        self.release_slot(g, slot)
        if g.phase == Phase.RUNNING and (len(g.released) >= len(g.slots) or not g.held):
            self.finish_group(g)

    # ---------------------------------------------------------------- nodes
    def on_node(self, etype: str, node: dict[str, Any]) -> None:
        name = str(_meta(node).get("name", ""))
        if self.node_view.update(name, None if etype == "DELETED" else node):
            self.dirty = True  # labels/taints changed: waiting groups are fitted again
        if etype == "DELETED":
            self.nodes.pop(name, None)
            self.node_down.pop(name, None)
            self.update_node_gauge()
            if self.matcher is not None:
                with contextlib.suppress(Exception):
                    self.matcher.remove_subgraph(name)
                self.node_lost(name)
            return
        old = self.nodes.get(name)
        self.nodes[name] = node
        if self.matcher is None:
            return
        down = _node_down(node)
        if old is None:
            try:
                from fluxnetes.graph.topology import node_graph

                added = self.matcher.add_subgraph(
                    node_graph(node, self.topologies.get(name), rack_label=self.config.rack_label)[0])
                if not any(p.rstrip("/").endswith("/" + name) for p in added):
                    raise RuntimeError("the node's vertices were not attached")
            except Exception as exc:
                log.warning("node %s could not be attached (%s); rebuilding the graph", name, exc)
                self.rebuild()
            self.foreign_dirty.add(name)
        elif self.node_down.get(name) != down:
            # cordoned / NotReady: nothing new goes there; running pods stay until Kubernetes
            # evicts them (their deletion releases their share like any ending pod)
            with contextlib.suppress(Exception):
                self.matcher.set_status(name, not down)
        elif (old.get("status") or {}).get("allocatable") != (node.get("status") or {}).get("allocatable"):
            self.rebuild()
        self.node_down[name] = down
        self.update_node_gauge()
        self.scheduler.invalidate()
        self.dirty = True

    def on_topology(self, etype: str, obj: dict[str, Any]) -> None:
        from fluxnetes.k8s.topology import replace_node

        name = str(_meta(obj).get("name", ""))
        if not self.topologies.update(etype, obj) or name not in self.nodes or self.matcher is None:
            return
        res = replace_node(self.matcher, self.nodes[name], self.topologies.get(name), rack_label=self.config.rack_label)
        for note in res.notes:
            self.event({"apiVersion": "v1", "kind": "Node", "name": name}, "Warning", "TopologyMismatch", note)
        if res.lost:  # the node shrank under running work: re-record everything from the groups
            log.warning("node %s: topology change lost %s; rebuilding the graph", name, res.lost)
            self.rebuild()
        self.scheduler.invalidate()
        self.dirty = True

    def node_lost(self, name: str) -> None:
        """Node ``name`` is gone (the matcher already dropped its vertices, and with them
        every job's part there: remove_subgraph). A group that held a share on it loses
        exactly that share. Under ``--on-node-lost requeue`` a workload's gang restarts
        whole; otherwise the group fails, and the shares of its surviving pods stay held
        until those pods end (member_gone gives them back as usual): they still run, and
        nothing new may be placed on what they use."""
        what = f"node {name} was removed"
        for g in list(self.groups.values()):
            if name not in g.held:
                continue
            if g.phase != Phase.RUNNING:
                self.lose_share(g, name)  # failed earlier, its survivors still hold shares
                continue
            if self.config.on_node_lost == "requeue" and g.kind is not None and g.spec.owner is not None:
                # restart the whole gang: its surviving pods go (a Job is suspended again, the
                # pods of a ReplicaSet/StatefulSet are deleted and come back gated); until they
                # are gone they count as foreign pods, so nothing is placed on what they use
                self.release_all(g)
                survivors = self.survivors_to_foreign(g)
                self.spawn(self.evict(g, [*survivors, *g.members.values()]))
                g.failed_pods = g.deleted_pods = 0  # counted again for the next run
                g.jobid, g.slots, g.slot_pod, g.released, g.start = None, [], [], set(), None
                self.set_phase(g, Phase.PENDING, f"{what}; requeued")
                self.group_event(g, "Warning", "NodeLost", g.reason, pods=False)
            else:
                self.lose_share(g, name)
                # slots whose pod was never placed hold a share no pod will ever use
                for slot, uid in enumerate(g.slot_pod):
                    if uid is None and slot not in g.released:
                        self.release_slot(g, slot)
                g.end = self.now()
                self.set_phase(g, Phase.FAILED, what)
                self.group_event(g, "Warning", "NodeLost", g.reason)

    def lose_share(self, g: Group, name: str) -> None:
        """The group's share on lost node ``name`` is gone with the node (and its slots)."""
        g.held.pop(name, None)
        g.released.update(i for i, n in enumerate(g.slots) if n == name)
        if not g.held:
            self.release_all(g)
        elif g.jobid is None and all(n in self.nodes for n in g.held):
            # recovered after a restart with nodes gone: the rest was never recorded
            g.jobid = self.matcher.next_jobid
            self.record_group(g)
        self.scheduler.invalidate()
        g.fj_dirty = True
        self.dirty = True

    def survivors_to_foreign(self, g: Group) -> list[dict[str, Any]]:
        """The group's pods that are placed on a node and still run leave the group and are
        followed as foreign pods until they are gone (their share then goes back)."""
        moved = []
        for uid, pod in list(g.members.items()):
            node = (pod.get("spec") or {}).get("nodeName") or (None if _gated(pod) else assigned_node(pod))
            if not node or _terminal(pod):
                continue
            del g.members[uid]
            self.member_of.pop(uid, None)
            self.add_foreign(uid, pod, str(node))
            moved.append(pod)
        return moved

    async def evict(self, g: Group, pods: list[dict[str, Any]] | None = None) -> None:
        assert g.kind is not None and g.spec.owner is not None
        try:
            if g.kind.resume_patch({}) is not None:  # Job: suspending deletes its active pods
                from fluxnetes.k8s.workloads.job import ANN_SUSPENDED_BY, SUSPENDED_BY_US

                # marked as fluxnetes' own hold, so it is resumed when allocated again
                body = {"metadata": {"annotations": {ANN_SUSPENDED_BY: SUSPENDED_BY_US}}, "spec": {"suspend": True}}
                await self.kube.patch(OWNER_RESOURCES[g.kind.kind], g.spec.owner.name, body, g.spec.namespace)
            else:
                for pod in list(g.members.values()) if pods is None else pods:
                    await self.kube.delete(PODS, _meta(pod).get("name", ""), g.spec.namespace)
        except ApiError as exc:
            log.warning("requeue of %s: %s", g.qid, exc)

    def rebuild(self) -> None:
        """Full rebuild (allocatable changed): graph from Nodes, then re-record everything held."""
        self.build_matcher()
        self.foreign_jobs.clear()
        self.foreign_dirty = set(self.foreign)
        for g in self.groups.values():
            # a failed group's surviving pods still hold their shares (node_lost)
            if g.held and g.jobid is not None:
                self.record_group(g)
        self.flush_foreign()

    def record_group(self, g: Group) -> None:
        try:
            self.matcher.update_allocate(g.jobid, shares.to_match(list(g.held.values())),
                                         at=g.start or self.now(), duration=g.spec.duration)
        except Exception as exc:
            log.error("could not re-record %s (job %s): %s", g.qid, g.jobid, exc)

    # ---------------------------------------------------------------- recovery
    def recover(self, fluxjobs: list[dict[str, Any]]) -> None:
        """Rebuild groups from FluxJobs (before any pod is looked at)."""
        for fj in fluxjobs:
            meta, spec, st = _meta(fj), fj.get("spec") or {}, fj.get("status") or {}
            try:
                phase = Phase(st.get("phase", "Provisional"))
            except ValueError:
                phase = Phase.PROVISIONAL
            if phase.final:
                continue
            req = dict(spec.get("request") or {})
            request = PodResources(int(req.pop("cpu", 0)), int(req.pop("memory", 0)), int(req.pop(GPU, 0)),
                                   {k: int(v) for k, v in req.items()})
            wl = spec.get("workload")
            owner = OwnerRef(wl.get("apiVersion", ""), wl.get("kind", ""), wl.get("name", ""), wl.get("uid", "")) if wl else None
            gs = GroupSpec(namespace=meta.get("namespace", "default"), name=meta.get("name", ""),
                           size=int(spec.get("size", 1)), request=request, duration=int(spec.get("duration", 0)),
                           priority=int(spec.get("priority", 0)), owner=owner,
                           jobspec=None, exclusive=bool(spec.get("exclusive", False)))
            g = Group(spec=gs, kind=kind_of(owner.kind) if owner else None, phase=phase, reason=st.get("reason", ""))
            try:
                from fluxnetes.jobspec import parse_jobspec

                g.jobspec = parse_jobspec(spec.get("jobspec") or "") if spec.get("jobspec") else self.make_jobspec(g)
            except Exception:
                g.jobspec = self.make_jobspec(g)
            # a FluxJob without status (the operator died between its create and its status
            # write) is written again once the group is reconciled with its workload
            g.fj_exists, g.fj_dirty, g.fj_status, g.fj_uid = True, not st, st, str(meta.get("uid", ""))
            g.submit = _parse_time(st.get("submitTime")) or _parse_time(meta.get("creationTimestamp"))
            g.start = _parse_time(st.get("startTime"))
            if phase == Phase.RUNNING:
                g.jobid = st.get("jobid")
                g.slots = list(st.get("nodes") or [])
                g.slot_pod = [None] * len(g.slots)
                g.released = set(int(i) for i in st.get("released") or [])
                g.held = {s.node: s for s in (shares.Share.from_dict(d) for d in st.get("shares") or [])}
                g.resumed = g.recovered = True
                g.alloc = list(g.held.values())
                if all(n in self.nodes for n in g.held):
                    self.record_group(g)
                else:
                    g.jobid = None  # not recorded: reconcile re-matches or applies the node-loss policy
            elif phase == Phase.RESERVED:
                g.phase = Phase.PENDING
            self.groups[gs.key] = g
            self.index_scale_group(g)

    def recover_store(self) -> None:
        """The queue's memory after a restart: live store rows, matched with the groups
        recovered from FluxJobs. The store gives the queue order (submit time) and allocations
        whose FluxJob status was not written before the crash; rows no group matches wait in
        ``store_only`` for their objects (replayed pods and owners) and are cancelled by
        ``reconcile_store`` if none shows up."""
        assert self.journal is not None
        allocs = self.store_allocs = self.journal.allocations()
        for rec in self.journal.live_jobs():
            key = (rec.namespace, rec.name)
            g = self.groups.get(key)
            if g is None or g.store_id is not None:
                older = self.store_only.get(key)
                if older is not None:  # two live rows for one name: the newer one counts
                    self.journal.cancel(older.id, self.now(), "superseded by a newer submission")
                self.store_only[key] = rec
                continue
            self.adopt_store_record(g, rec, allocs.get(rec.id))
        log.info("store: %d live jobs read back, %d wait for their objects",
                 sum(1 for g in self.groups.values() if g.store_id is not None), len(self.store_only))

    def adopt_store_record(self, g: Group, rec: Any, alloc: Any) -> None:
        g.store_id, g.store_uid = rec.id, rec.uid
        self.journal.remember((rec.namespace, rec.name, rec.uid), rec.id)
        g.submit = rec.submit_time  # the queue's order survives the restart
        if str(rec.state) == "running" and g.phase != Phase.RUNNING and alloc is not None and alloc.nodes:
            # allocated before the crash, FluxJob status not written yet: the store knows
            self.adopt_allocation(g, alloc, "allocated (recovered from the store)")

    def claim_store_record(self, g: Group) -> None:
        """A group re-created from cluster objects takes over its store row (same object)."""
        rec = self.store_only.get(g.key)
        if rec is None:
            return
        uid = g.spec.owner.uid if g.spec.owner else next(iter(g.members), "")
        if rec.uid != uid and g.spec.owner is not None:
            return  # another object with the same name: the old row is cancelled at reconcile
        del self.store_only[g.key]
        g.store_id, g.store_uid, g.submit = rec.id, rec.uid, rec.submit_time
        self.journal.remember((rec.namespace, rec.name, rec.uid), rec.id)
        alloc = self.store_allocs.get(rec.id)
        if str(rec.state) == "running" and alloc is not None and alloc.nodes and g.phase == Phase.PROVISIONAL:
            # allocated before the crash, before its FluxJob was even created: the store knows
            self.adopt_allocation(g, alloc, "allocated (recovered from the store)")

    def reconcile_store(self) -> None:
        """After the post-restart reconcile: the store follows the cluster."""
        if self.journal is None:
            return
        now = self.now()
        for g in self.groups.values():
            if g.phase != Phase.PROVISIONAL:
                self.journal.record(self.group_record(g), now)
        for rec in self.store_only.values():
            self.journal.cancel(rec.id, now, "its objects are gone (found after a restart)")
        self.store_only.clear()
        self.store_allocs = {}  # only needed to take rows over during the replay

    # ---------------------------------------------------------------- exact recovery
    # At start, with every cache complete and before any replayed event: what the records
    # (FluxJob status, store) do not show is taken from the cluster itself. Pods placed before
    # the crash for a group no record shows allocated give the allocation back exactly
    # (their slot annotations and nodes); a finished workload is never queued again and gets
    # its final FluxJob; afterwards `check_accounting` compares the graph with the bound pods.
    def pod_share(self, g: Group, node: str) -> shares.Share:
        """What one pod of the group holds on ``node``, in the matcher's units (as the
        group's jobspec asks: whole cores, MiB)."""
        from fluxnetes.jobspec.pods import cores_for, extended_type, mib_for

        r = g.spec.request
        return shares.Share(node, cores_for(r.cpu_millis), r.gpus, mib_for(r.memory_bytes),
                            {extended_type(k): v for k, v in r.extended.items() if v})

    def recover_from_cluster(self, pods: list[dict[str, Any]], fluxjobs: list[dict[str, Any]]) -> None:
        final: set[tuple[str, str]] = set()
        fj_owner: dict[tuple[str, str], str] = {}
        for fj in fluxjobs:
            m = _meta(fj)
            key = (m.get("namespace") or "default", m.get("name", ""))
            fj_owner[key] = str(((fj.get("spec") or {}).get("workload") or {}).get("uid", ""))
            with contextlib.suppress(ValueError):
                if Phase((fj.get("status") or {}).get("phase", "Provisional")).final:
                    final.add(key)
        by_owner: dict[str, list[dict[str, Any]]] = {}
        placed: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for pod in pods:
            m = _meta(pod)
            owner = controller_of(m)
            if owner is not None and owner.uid:
                by_owner.setdefault(owner.uid, []).append(pod)
            fjname = str((m.get("annotations") or {}).get(names.ANN_FLUXJOB) or "")
            if fjname and (m.get("labels") or {}).get(names.LABEL_MANAGED) == "true" and not _gated(pod):
                placed.setdefault((str(m.get("namespace") or "default"), fjname), []).append(pod)
        # 1. finished workloads: never queued again; a final FluxJob if they never got one
        for (kname, ns, name), obj in list(self.owners.items()):
            kind = kind_of(kname)
            if kind is None or kind.resume_patch({}) is None or not kind.finished(obj):
                continue
            tmpl_labels = (kind.template(obj).get("metadata") or {}).get("labels") or {}
            if tmpl_labels.get(names.LABEL_MANAGED) != "true":
                continue  # never admitted by fluxnetes (created while the webhook was away)
            uid = str(_meta(obj).get("uid", ""))
            gkey = (ns, object_name(f"{kname.lower()}-{name}"))
            g = self.groups.get(gkey)
            if g is not None and self.same_owner(g, uid):
                if not g.phase.final:
                    self.workload_finished(g, kind, obj)
                continue
            if g is not None:
                self.drop_earlier_owner(gkey, f"{kname} {name} was deleted (a new one has its name)")
            if fj_owner.get(gkey) == uid:
                continue  # its (final) FluxJob exists
            try:
                spec = self.group_for_workload(kind, obj)
            except GroupError:
                continue
            g = self.new_group(spec, kind)
            ran = [p for p in by_owner.get(uid, []) if assigned_node(p)]
            g.slots = sorted(str(assigned_node(p)) for p in ran)
            g.alloc = [s for s in self.shares_of_pods(g, ran) if not s.empty]
            g.released = set(range(len(g.slots)))
            g.fj_dirty = True
            st = obj.get("status") or {}
            g.start = _parse_time(st.get("startTime"))
            g.submit = _parse_time(_meta(obj).get("creationTimestamp"))
            if self.store_only:
                self.claim_store_record(g)
            self.workload_finished(g, kind, obj)
            log.info("%s finished while fluxnetes was away: FluxJob recorded as %s", g.qid, g.phase)
        # 2. groups whose pods were placed but whose allocation no record shows
        for key, members in sorted(placed.items()):
            g = self.groups.get(key)
            if (g is not None and (g.phase == Phase.RUNNING or g.phase.final)) or (g is None and key in final):
                continue
            if all(_terminal(p) for p in members):
                continue  # nothing is held any more
            if g is None:
                g = self.group_of_placed(key, members)
            if g is None or (g.phase != Phase.PROVISIONAL and g.phase not in QUEUED):
                continue
            if not self.adopt_placed(g, members):
                log.warning("%s: pods placed before the restart, its allocation not recorded and not all "
                            "its slots known; they count as foreign pods and the group is matched again",
                            g.qid)

    def shares_of_pods(self, g: Group, pods: list[dict[str, Any]]) -> list[shares.Share]:
        per: dict[str, int] = {}
        for p in pods:
            node = assigned_node(p)
            if node:
                per[node] = per.get(node, 0) + 1
        out = []
        for node, n in sorted(per.items()):
            one = self.pod_share(g, node)
            out.append(shares.Share(node, one.cores * n, one.gpus * n, one.memory * n,
                                    {k: v * n for k, v in one.extra.items()}))
        return out

    def group_of_placed(self, key: tuple[str, str], pods: list[dict[str, Any]]) -> Group | None:
        """The group of pods placed before a crash that came before its FluxJob was created."""
        pod = min(pods, key=lambda p: str(_meta(p).get("name", "")))
        owner = controller_of(_meta(pod))
        okind = kind_of(owner.kind) if owner else None
        kind: WorkloadKind | None
        try:
            if owner is not None and okind is not None and okind.resume_patch({}) is not None:
                obj = self.owner_obj(owner, key[0])
                if obj is None or okind.finished(obj):
                    return None
                spec, kind = self.group_for_workload(okind, obj), okind
            else:
                spec = self.pod_group_spec(pod)
                kind = kind_of(spec.owner.kind) if spec.owner else None
        except GroupError:
            return None
        if spec.key != key or spec.key in self.groups:
            return self.groups.get(key)
        g = self.new_group(spec, kind)
        if self.store_only:
            self.claim_store_record(g)  # the store may know the allocation (then it is running)
        return g

    def adopt_placed(self, g: Group, pods: list[dict[str, Any]]) -> bool:
        """The group's allocation, taken back from its placed pods: each pod's slot annotation
        and node. Only when every slot is known (a live pod or one that ended), for jobspecs
        fluxnetes derived itself (not exclusive): the share of each pod is then exact."""
        if g.spec.exclusive or g.spec.jobspec or g.jobspec is None:
            return False
        size = g.spec.size
        live: dict[int, dict[str, Any]] = {}
        ended: dict[int, dict[str, Any]] = {}
        for p in pods:
            try:
                slot = int((_meta(p).get("annotations") or {}).get(ANN_SLOT, "-1"))
            except ValueError:
                return False
            if not 0 <= slot < size:
                return False
            if _terminal(p):
                ended.setdefault(slot, p)
            elif slot in live:
                return False
            else:
                live[slot] = p
        if not live or set(live) | set(ended) != set(range(size)):
            return False
        if any(assigned_node(p) not in self.nodes or self.node_down.get(str(assigned_node(p)), False)
               for p in live.values()):
            return False  # a node is gone or down: the node-loss rules apply to foreign pods
        held = self.shares_of_pods(g, list(live.values()))
        jobid = self.matcher.next_jobid
        start = min((_parse_time(_meta(p).get("creationTimestamp")) or self.now()) for p in live.values())
        try:
            self.matcher.update_allocate(jobid, shares.to_match(held), at=start, duration=g.spec.duration)
        except Exception as exc:
            log.error("%s: its placed pods could not be recorded (%s)", g.qid, exc)
            return False
        g.phase, g.reason = Phase.RUNNING, "allocated before the restart (recovered from its placed pods)"
        g.jobid, g.start, g.expected_start = jobid, start, None
        g.held, g.alloc = {s.node: s for s in held}, list(held)
        g.slots = [str(assigned_node(live[i] if i in live else ended[i]) or "") for i in range(size)]
        g.slot_pod = [None] * size
        g.released = {i for i in range(size) if i not in live}
        for slot, p in live.items():
            uid = str(_meta(p).get("uid", ""))
            g.slot_pod[slot] = uid
            g.members[uid] = p
            self.member_of[uid] = g.key
        g.resumed = g.recovered = True
        g.fj_dirty = True
        self._counts_dirty = self.dirty = True
        if self.journal is not None:
            self.journal.record(self.group_record(g), self.now())
        self.group_event(g, "Normal", "Recovered",
                         f"{g.reason}: job {g.jobid} on {','.join(sorted(set(g.held)))}", pods=False)
        log.info("%s: %s (job %s on %s)", g.qid, g.reason, g.jobid, ",".join(sorted(g.held)))
        return True

    # ---------------------------------------------------------------- accounting check
    def check_accounting(self, pods: list[dict[str, Any]]) -> dict[str, Any]:
        """Does the graph's use equal the requests of the bound, unfinished pods (in the
        matcher's units), node by node? ``pods``: every pod, as the API server lists them.
        Returns {"ok", "problems", "nodes", "bound", "unbound"}: ``unbound`` counts slots of
        running groups whose pod is not bound yet (allocated, still held: at rest it is 0, and
        then the graph's use is exactly the bound pods')."""
        from collections import Counter

        def add(acc: dict[str, Counter[str]], s: shares.Share) -> None:
            c = acc.setdefault(s.node, Counter())
            c["cores"] += s.cores
            c["gpus"] += s.gpus
            c["memory"] += s.memory
            for k, v in s.extra.items():
                c[k] += v

        graph: dict[str, Counter[str]] = {}
        for rec in self.matcher.jobs.values():
            if rec.reserved:
                continue
            for ns_ in rec.nodes:
                add(graph, shares.Share(ns_.name, ns_.cores, ns_.gpus, ns_.memory, dict(ns_.extra or {})))
        expected: dict[str, Counter[str]] = {}
        foreign: dict[str, list[PodResources]] = {}
        bound_uids: set[str] = set()
        slot_of: dict[str, tuple[Group, int]] = {}
        for g in self.groups.values():
            if g.phase == Phase.RUNNING:
                for i, u in enumerate(g.slot_pod):
                    if u and i not in g.released:
                        slot_of[u] = (g, i)
        bound = 0
        for pod in pods:
            node = (pod.get("spec") or {}).get("nodeName")
            if not node or _terminal(pod) or node not in self.nodes:
                continue
            bound += 1
            uid = str(_meta(pod).get("uid", ""))
            hit = slot_of.get(uid)
            if hit is not None and hit[0].slots[hit[1]] == node:
                g = hit[0]
                bound_uids.add(uid)
                if g.spec.exclusive:
                    add(expected, g.held.get(node, shares.Share(node)))
                else:
                    add(expected, self.pod_share(g, node))
            else:
                try:
                    foreign.setdefault(node, []).append(request_of(pod.get("spec") or {}))
                except GroupError:
                    foreign.setdefault(node, [])
        for node, reqs in foreign.items():
            add(expected, shares.of_pods(node, reqs))
        unbound = 0
        for g in self.groups.values():
            if g.phase != Phase.RUNNING:
                continue
            for i, node in enumerate(g.slots):
                u = g.slot_pod[i] if i < len(g.slot_pod) else None
                if i in g.released or (u and u in bound_uids):
                    continue
                unbound += 1
                add(expected, g.held.get(node, shares.Share(node)) if g.spec.exclusive else self.pod_share(g, node))
        problems = []
        for node in sorted(set(graph) | set(expected)):
            a, b = graph.get(node, Counter()), expected.get(node, Counter())
            if +a != +b:
                problems.append(f"{node}: graph {dict(+a)} != pods {dict(+b)}")
        return {"ok": not problems, "problems": problems, "nodes": len(self.nodes), "bound": bound,
                "unbound": unbound}

    async def accounting_check(self, delay: float = 0.0) -> dict[str, Any] | None:
        """List the pods from the API server and log ``check_accounting``'s answer."""
        if delay:
            await asyncio.sleep(delay)
        res: dict[str, Any] = {}
        for attempt in range(3):
            # the list is a moment older than the state it is compared with: while pods come
            # and go a difference may be that moment; only one seen three times is reported
            try:
                pods, _ = await self.kube.list(PODS)
            except ApiError as exc:
                log.info("accounting check: pods not listed: %s", exc)
                return None
            if self.foreign_dirty:
                self.flush_foreign()  # what the cluster shows now is what the graph must hold
            res = self.check_accounting(pods)
            if res["ok"]:
                break
            if attempt < 2:
                await asyncio.sleep(0.5)
        if res["ok"]:
            log.info("accounting check: ok (%d nodes, %d bound pods, %d slots not bound yet)",
                     res["nodes"], res["bound"], res["unbound"], extra={"accounting": res})
        else:
            log.warning("accounting check: MISMATCH %s", "; ".join(res["problems"][:20]), extra={"accounting": res})
        self.last_check = res
        return res

    async def _check_every(self, seconds: float) -> None:
        while True:
            await asyncio.sleep(seconds)
            if self.reconciled:
                await self.accounting_check()

    # ---------------------------------------------------------------- node rules
    def pod_spec_of(self, g: Group) -> Mapping[str, Any] | None:
        """The pod spec whose node rules a group follows: its workload's pod template, else
        its first pod by name (the pods of one group share one template in practice)."""
        if g.kind is not None:
            owner = self.owner_obj(g.spec.owner, g.spec.namespace)
            if owner is not None:
                return g.kind.template(owner).get("spec") or {}
        if g.members:
            first = min(g.members.values(), key=lambda p: str(_meta(p).get("name", "")))
            return first.get("spec") or {}
        return None

    def fit_groups(self) -> None:
        """Every waiting group's jobspec names the nodes its pods may run on (nodefit: their
        nodeSelector, required node affinity and taint tolerations), as a hostlist constraint,
        only when some node is excluded (otherwise the jobspec is left as it is). Done again
        when the group's jobspec was rebuilt or a node's labels or taints changed. A queued
        group that no node allows is Unsatisfiable, like any request this cluster can never
        run (the issue's rule; a user relabelling nodes recreates the workload)."""
        view = self.node_view
        if not view.synced:
            view.reset(self.nodes.values())
        changed = False
        for g in list(self.groups.values()):
            if g.jobspec is None or not (g.phase == Phase.PROVISIONAL or g.phase in QUEUED):
                continue
            done = self.fitted.get(g.key)
            current = done is not None and done[2] is g.jobspec
            if current and done is not None and done[0] == view.version:
                continue
            spec = self.pod_spec_of(g)
            if spec is None:
                continue
            base = done[1] if current and done is not None else nodefit.unconstrained(g.jobspec)
            f = view.fit(spec)
            if f.none:
                if g.phase in QUEUED:
                    self.fitted.pop(g.key, None)
                    self.scheduler.withdraw(g.qid)
                    g.end = self.now()
                    self.set_phase(g, Phase.UNSATISFIABLE, f"can never run on this cluster: {f.reason}")
                    self.group_event(g, "Warning", "Unsatisfiable", g.reason)
                continue  # provisional: judged once it is queued
            js = nodefit.constrain(base, f)
            if js.constraint == g.jobspec.constraint and js.attributes == g.jobspec.attributes:
                js = g.jobspec  # the same nodes as before
            else:
                g.jobspec, g.jobspec_yaml = js, None
                changed = True
                if g.fj_exists:  # the FluxJob's spec says what the matcher is asked
                    self.spawn(self._patch_fluxjob_spec(g, {"jobspec": self.jobspec_text(g)}))
            self.fitted[g.key] = (view.version, base, js)
        for key in [k for k in self.fitted if k not in self.groups]:
            del self.fitted[key]
        if changed:
            self.scheduler.invalidate()

    # ---------------------------------------------------------------- cycle
    def run_cycle(self) -> None:
        from fluxnetes.queue.job import QueuedJob

        self.flush_foreign()
        self.prune_finished()
        self.fit_groups()
        self.reexamine_unsatisfiable()
        now = self.now()
        pending = []
        for g in list(self.groups.values()):
            if g.phase not in QUEUED or g.jobspec is None:
                continue
            # every queued group, not only the one the matcher is asked to reserve for:
            # the count questions (queue/satisfy.py), answered once per graph version
            short = self.judge.short(g.key, g.jobspec, self.matcher)
            if short is not None:
                self.unsatisfiable(g, short)
                continue
            pending.append(QueuedJob(id=g.qid, jobspec=g.jobspec, submit_time=g.submit or now,
                                     priority=g.spec.priority))
        self.judge.keep_only(self.groups.keys())
        self.dirty = False
        if not pending:
            return
        self.cycles += 1
        with METRICS.time_cycle():
            result = self.scheduler.cycle(pending, now)
        by_id = {g.qid: g for g in self.groups.values() if g.phase in QUEUED}
        for job, res in result.started:
            self.start_group(by_id[job.id], res)
        for job, res in result.reserved:
            g = by_id[job.id]
            at = int(res.at)
            if g.expected_start != at or g.phase != Phase.RESERVED:
                g.expected_start = at
                self.set_phase(g, Phase.RESERVED, f"reserved; expected to start at {fluxjob.rfc3339(at)}")
                self.group_event(g, "Normal", "Reserved", g.reason)
        for job, reason in result.unsatisfiable:
            self.unsatisfiable(by_id[job.id], reason)
        for job in result.blocked:
            g = by_id[job.id]
            never = self.judge.never(g.key, g.jobspec, self.matcher)  # once per request shape
            if never is not None:
                self.unsatisfiable(g, never)
                continue
            if g.phase == Phase.RESERVED:
                g.expected_start = None
                self.set_phase(g, Phase.PENDING, f"waiting for resources{nodefit.note(g.jobspec)}")
            elif g.reason == "queued":
                self.set_phase(g, Phase.PENDING, f"waiting for resources{nodefit.note(g.jobspec)}")

    def unsatisfiable(self, g: Group, reason: str) -> None:
        """A queued group that can never run on this cluster as it is: out of the queue, the
        short resource named (looked at again when nodes change: reexamine_unsatisfiable)."""
        if g.phase in QUEUED:
            self.scheduler.withdraw(g.qid)
        g.end = self.now()
        g.expected_start = None
        self.set_phase(g, Phase.UNSATISFIABLE, f"can never run on this cluster: {reason}{nodefit.note(g.jobspec)}")
        self.group_event(g, "Warning", "Unsatisfiable", g.reason)

    def reexamine_unsatisfiable(self) -> None:
        """Nodes were added, removed or resized, or their labels/taints changed: an
        Unsatisfiable group whose workload still waits (a Job, gated pods) goes back to the
        queue if it could run now (its node rules, the count questions and the matcher's
        satisfiability walk all agree). Its store row stays unsatisfiable (a final state);
        the group continues under a new row."""
        if self.matcher is None or not self.judge.changed(self.matcher, self.node_view.version):
            return
        view = self.node_view
        for g in list(self.groups.values()):
            if g.phase != Phase.UNSATISFIABLE or g.jobspec is None or g.reason.startswith("invalid jobspec"):
                continue
            if not self.still_waits(g):
                continue
            spec = self.pod_spec_of(g)
            js = nodefit.unconstrained(g.jobspec)
            if spec is not None:
                f = view.fit(spec)
                if f.none:
                    continue
                js = nodefit.constrain(js, f)
            if self.judge.short(g.key, js, self.matcher) is not None or \
                    self.judge.never(g.key, js, self.matcher) is not None:
                continue
            if js is not g.jobspec:
                g.jobspec, g.jobspec_yaml = js, None
                if g.fj_exists:
                    self.spawn(self._patch_fluxjob_spec(g, {"jobspec": self.jobspec_text(g)}))
            self.fitted.pop(g.key, None)
            if self.journal is not None:
                if g.store_uid:
                    self.journal.forget((g.spec.namespace, g.spec.name, g.store_uid))
                base = g.store_uid or (g.spec.owner.uid if g.spec.owner else next(iter(g.members), ""))
                stem, _, n = base.rpartition("~requeue-")
                g.store_uid = f"{stem}~requeue-{int(n) + 1}" if stem and n.isdigit() else f"{base}~requeue-1"
                g.store_id = None
            g.end, g.expected_start = None, None
            self.set_phase(g, Phase.PENDING, "queued again: the cluster changed and the group can run on it now")
            self.group_event(g, "Normal", "Requeued", g.reason, pods=False)
            self.dirty = True

    def still_waits(self, g: Group) -> bool:
        """Is the group's work still there, held for fluxnetes (gated pods, or a workload
        that is neither finished nor gone)?"""
        if g.kind is not None and g.spec.owner is not None and g.kind.resume_patch({}) is not None:
            owner = self.owner_obj(g.spec.owner, g.spec.namespace)
            return owner is not None and not g.kind.finished(owner)
        return any(_gated(p) and not _terminal(p) for p in g.members.values())

    # ---------------------------------------------------------------- FluxJob writes
    def fluxjob_status(self, g: Group) -> dict[str, Any]:
        return fluxjob.status(
            g.phase, reason=g.reason, jobid=g.jobid if isinstance(g.jobid, int) else None,
            submit_time=g.submit, expected_start=g.expected_start if g.phase == Phase.RESERVED else None,
            start_time=g.start, end_time=g.end, nodes=g.slots, pods_seen=len(g.members), now=self.now(),
            previous=g.fj_status,
        ) | ({"shares": [s.as_dict() for s in g.held.values()], "released": sorted(g.released)}
             if g.phase == Phase.RUNNING else {"shares": None, "released": None})

    async def write_fluxjob(self, g: Group) -> None:
        st = self.fluxjob_status(g)
        ns, name = g.spec.namespace, g.spec.name
        try:
            if not g.fj_exists:
                body = fluxjob.manifest(g.spec, jobspec=self.jobspec_text(g),
                                        match_policy=self.config.match_policy)
                if g.spec.owner is None and g.spec.size == 1 and len(g.members) == 1:
                    # a lone pod owns its FluxJob: deleting the pod cleans it up
                    ref = self.pod_ref(next(iter(g.members.values())))
                    body["metadata"]["ownerReferences"] = [{"apiVersion": "v1", "kind": "Pod", "name": ref["name"],
                                                            "uid": ref["uid"], "blockOwnerDeletion": False}]
                try:
                    created = await self.kube.create(FLUXJOBS, body, ns, background=True)
                    g.fj_uid = str(_meta(created).get("uid", ""))
                except ApiError as exc:
                    if exc.status != 409:
                        raise
                    if not await self.take_over_fluxjob(g, body):
                        g.fj_dirty = True  # an earlier group's FluxJob is still going away: later
                        return
                g.fj_exists = True
                if self.debug_point("fluxjob-created", g):
                    self.debug_exit("fluxjob-created")  # the FluxJob exists without any status
            # the uid precondition: never write this group's status onto another group's FluxJob
            body_st: dict[str, Any] = {"status": st}
            if g.fj_uid:
                body_st["metadata"] = {"uid": g.fj_uid}
            await self.kube.patch(FLUXJOBS, name, body_st, ns, sub="status", background=True)
            g.fj_status = st
        except ApiError as exc:
            if exc.status in (404, 409):  # gone, or (uid precondition) another group's
                g.fj_exists, g.fj_uid = False, ""
                if g.phase.final and exc.status == 404:
                    return  # its owner is gone and took it along
            METRICS.reconcile_error("fluxjob")
            with log_context(job=g.qid, group=g.spec.name, namespace=ns):
                log.info("FluxJob %s/%s: %s", ns, name, exc)
            g.fj_dirty = True

    async def take_over_fluxjob(self, g: Group, body: Mapping[str, Any]) -> bool:
        """Creating the group's FluxJob found one of that name. Its own (same workload uid, or
        the same group made again after a restart): take it. An earlier workload's (a Job
        deleted and created again under its name; the garbage collector has not removed its
        FluxJob yet): delete that one and create ours. False: try again later."""
        ns, name = g.spec.namespace, g.spec.name
        cur = await self.kube.get_or_none(FLUXJOBS, name, ns)
        if cur is not None:
            theirs = str(((cur.get("spec") or {}).get("workload") or {}).get("uid", ""))
            ours = g.spec.owner.uid if g.spec.owner else ""
            if not theirs or not ours or theirs == ours:
                g.fj_uid = str(_meta(cur).get("uid", ""))
                return True
            with contextlib.suppress(ApiError):
                await self.kube.request("DELETE", FLUXJOBS.path(ns, name),
                                        {"preconditions": {"uid": _meta(cur).get("uid")}})
            log.info("FluxJob %s/%s belonged to an earlier %s of that name: replaced", ns, name,
                     g.spec.owner.kind if g.spec.owner else "object")
        try:
            created = await self.kube.create(FLUXJOBS, body, ns, background=True)
        except ApiError as exc:
            if exc.status != 409:
                raise
            return False
        g.fj_uid = str(_meta(created).get("uid", ""))
        return True

    async def _flush_once(self) -> None:
        try:
            await self.flush_fluxjobs()
        finally:
            self._flushing = False

    def fluxjobs_due(self, now: float) -> float | None:
        """Note when each FluxJob first needed a write; return how long until the earliest is
        due (0: now; None: nothing to write). A group's status is written once it has waited
        ``status_interval``: in a burst a group goes Pending, Running and placed within a
        second, and one status write instead of three or four halves the API server's work
        per job (each CRD status write costs it about 2 ms of CPU)."""
        interval = self.config.status_interval
        wait: float | None = None
        for g in self.groups.values():
            if not g.fj_dirty:
                continue
            if g.fj_since is None:
                g.fj_since = now
            left = max(0.0, g.fj_since + interval - now)
            wait = left if wait is None else min(wait, left)
        return wait

    async def flush_fluxjobs(self, now: float | None = None) -> None:
        cutoff = (time.monotonic() if now is None else now) - self.config.status_interval
        dirty = [g for g in self.groups.values() if g.fj_dirty and (g.fj_since or 0.0) <= cutoff]
        for g in dirty:
            g.fj_dirty, g.fj_since = False, None
        if dirty:
            await asyncio.gather(*(self.write_fluxjob(g) for g in dirty))

    # ---------------------------------------------------------------- main loop
    def handle(self, ev: Event) -> None:
        kind = ev[0]
        try:
            self._handle(ev)
        except Exception:
            # one bad object must not stop the operator: count it, log it, go on
            METRICS.reconcile_error(kind.lower())
            m = _meta(ev[2])
            log.exception("handling %s %s %s/%s failed", ev[1], kind, m.get("namespace", ""), m.get("name", ""))
            return
        if kind in ("Pod", "Node") and self.reconciled:
            at = _event_time(ev[2], ev[1])
            now = self.clock()
            if at is not None and now - at < 300:  # changes seen live, not replayed history
                METRICS.observe_sync_lag(kind.lower(), at, now)

    def _handle(self, ev: Event) -> None:
        kind, etype, obj = ev
        if kind == "Pod":
            self.on_pod(etype, obj)
        elif kind == "Node":
            self.on_node(etype, obj)
        elif kind == "NodeResourceTopology":
            self.on_topology(etype, obj)
        elif kind == "PriorityClass":
            name = str(_meta(obj).get("name", ""))
            if etype == "DELETED":
                self.priority_classes.pop(name, None)
            else:
                self.priority_classes[name] = int(obj.get("value") or 0)
                if obj.get("globalDefault"):
                    self.priority_classes[""] = int(obj.get("value") or 0)
        elif kind in OWNER_RESOURCES:
            self.on_owner(kind, etype, obj)
        elif kind == "FluxJob" and etype == "DELETED":
            m = _meta(obj)
            g = self.groups.get((m.get("namespace") or "default", m.get("name", "")))
            if g is not None and not g.phase.final and m.get("uid") == g.fj_uid:
                # deleted by hand while its group lives: it is the user's window, put it back
                g.fj_exists, g.fj_dirty = False, True

    async def start(self) -> None:
        """Start watching; returns once the cluster view is complete and state recovered."""
        runs = [asyncio.ensure_future(inf.run()) for inf in self.informers]
        for task in runs:
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        synced: asyncio.Future[Any] = asyncio.ensure_future(
            asyncio.gather(*(inf.synced.wait() for inf in self.informers)))
        # an informer that dies (e.g. a permission is missing) ends the start instead of a hang
        waits: list[asyncio.Future[Any]] = [synced, *runs]
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        for task in runs:
            if task.done() and not task.cancelled() and task.exception() is not None:
                synced.cancel()
                raise task.exception()  # type: ignore[misc]
        await synced
        self._informer_runs = runs
        # initial view straight from the caches; the queued ADDED events replay harmlessly
        for inf in self.informers:
            if inf.kind == "Node":
                for obj in inf.cache.values():
                    self.nodes[str(_meta(obj).get("name"))] = obj
            elif inf.kind == "PriorityClass":
                for obj in inf.cache.values():
                    self.handle(("PriorityClass", "ADDED", obj))
            elif inf.kind in OWNER_RESOURCES:
                for obj in inf.cache.values():
                    m = _meta(obj)
                    self.owners[(inf.kind, m.get("namespace") or "default", m.get("name", ""))] = obj
        await self.topology_source.load(self.topologies)  # the first graph is built with them
        self.spawn(self.topology_source.run())
        self.build_matcher()
        fjs = next(list(inf.cache.values()) for inf in self.informers if inf.kind == "FluxJob")
        self.recover(fjs)
        if self.journal is not None:
            self.recover_store()
        # what neither the FluxJobs nor the store recorded, the cluster shows (exact recovery)
        self.recover_from_cluster(next(list(inf.cache.values()) for inf in self.informers if inf.kind == "Pod"), fjs)
        every = os.environ.get(CHECK_EVERY, "")
        if every:  # tests and soaks: the accounting check, logged periodically
            self.spawn(self._check_every(float(every)))
        self.ready.set()
        log.info("operator ready: %d nodes, %d groups recovered", len(self.nodes), len(self.groups))

    def reconcile(self) -> None:
        """After a restart, once every pod has been seen again: groups recovered from FluxJobs
        whose pods vanished while the operator was away give their resources back."""
        for g in list(self.groups.values()):
            if g.phase == Phase.RUNNING and self.requeue_if_nodes_gone(g):
                continue
            if g.phase == Phase.RUNNING:
                self.assign(g)
                self.resume_if_held(g)  # allocated before the crash, resume not sent
            if g.kind is not None:
                owner = self.owner_obj(g.spec.owner, g.spec.namespace)
                if g.spec.owner is not None and owner is None and not g.phase.final:
                    self.cancel_group(g, f"{g.spec.owner.kind} {g.spec.owner.name} no longer exists")
                elif owner is not None and not g.phase.final and g.kind.finished(owner):
                    self.workload_finished(g, g.kind, owner)  # over while the operator was away
                continue
            if g.phase == Phase.PROVISIONAL and not g.members and g.fj_exists:
                self.cancel_group(g, "all pods of the group are gone (found after a restart)")
            elif g.phase == Phase.RUNNING:
                for slot, uid in enumerate(g.slot_pod):
                    if uid is None and slot not in g.released:
                        self.release_slot(g, slot)
                if g.phase == Phase.RUNNING and not g.held:
                    self.finish_group(g)
            elif g.phase in QUEUED and len(g.members) < g.spec.size:
                self.scheduler.withdraw(g.qid)
                if not g.members:
                    self.cancel_group(g, "all pods of the group were deleted")
                else:
                    self.set_phase(g, Phase.PROVISIONAL, f"waiting for the group: {len(g.members)}/{g.spec.size} pods")
        self.spawn(self.accounting_check())  # logged: the graph's use against the bound pods

    async def run(self) -> None:
        await self.start()
        replay = self.queue.qsize()  # the initial lists, queued before ready
        last_cycle = last_chores = 0.0
        coalesce = self.config.coalesce_seconds
        status_wait: float | None = None  # until the next FluxJob write is due
        chores_skipped = False
        while True:
            # a burst of arrivals is matched in one cycle (at most one per `coalesce` seconds)
            # instead of one cycle per event: fewer passes over the queue, starts written together
            timeout = self.config.cycle_interval
            if self.dirty or self.foreign_dirty:
                timeout = max(0.0, last_cycle + coalesce - time.monotonic())
            if status_wait is not None:
                timeout = min(timeout, max(status_wait, coalesce))
            if chores_skipped:  # events came in since the chores last ran: run them soon
                timeout = min(timeout, coalesce)
            try:
                ev = await asyncio.wait_for(self.queue.get(), timeout=timeout)
                self.handle(ev)
                replay -= 1
                while not self.queue.empty() and len(self._tasks) < 4096:
                    self.handle(self.queue.get_nowait())
                    replay -= 1
            except TimeoutError:
                pass
            for task in self._informer_runs:
                if task.done() and not task.cancelled() and task.exception() is not None:
                    raise task.exception()  # type: ignore[misc]  # e.g. a permission was revoked
            if replay <= 0 and not self.reconciled:
                self.reconciled = True
                self.reconcile()
                self.reconcile_store()
            now = time.monotonic()
            since = now - last_cycle
            if since >= self.config.cycle_interval or ((self.dirty or self.foreign_dirty) and since >= coalesce):
                try:
                    self.run_cycle()
                except Exception:
                    METRICS.reconcile_error("cycle")
                    log.exception("scheduling cycle failed")
                last_cycle = now
            if now - last_chores < coalesce and now != last_cycle:
                chores_skipped = True
                continue  # the O(groups) chores below run at most once per window
            last_chores, chores_skipped = now, False
            if self._counts_dirty:
                self.update_queue_gauge()
            if self.journal is not None:
                self.store_ok = self.journal.ok
            status_wait = self.fluxjobs_due(now)
            if not self._flushing and status_wait == 0.0:
                self._flushing = True
                self.spawn(self._flush_once())

    def update_queue_gauge(self) -> None:
        counts: dict[str, int] = dict(self.pruned)  # groups over and forgotten still count
        for g in self.groups.values():
            counts[str(g.phase)] = counts.get(str(g.phase), 0) + 1
        METRICS.set_queue_lengths(counts)
        self._counts_dirty = False

    def update_node_gauge(self) -> None:
        down = sum(1 for d in self.node_down.values() if d)
        METRICS.nodes.labels(status="up").set(len(self.node_down) - down)
        METRICS.nodes.labels(status="down").set(down)

    async def stop(self) -> None:
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.journal is not None:
            await asyncio.get_running_loop().run_in_executor(None, self.journal.close)


def _node_down(node: Mapping[str, Any]) -> bool:
    from fluxnetes.graph.builders import node_is_down

    return bool(node_is_down(node))


def _dump_jobspec(js: Any) -> str:
    if js is None:
        return ""
    for attr in ("to_yaml", "dumps", "to_json"):
        fn = getattr(js, attr, None)
        if callable(fn):
            try:
                return str(fn())
            except Exception:
                continue
    import yaml

    to_dict = getattr(js, "to_dict", None) or getattr(js, "as_dict", None)
    if callable(to_dict):
        return yaml.safe_dump(to_dict(), sort_keys=False)
    return str(js)
