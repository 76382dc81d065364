"""The cluster mirror: Nodes -> the resource graph and matcher (node changes update it in
place: add_subgraph, set_status, remove_subgraph; a rebuild when allocatable changes), pods
bound by anyone but fluxnetes (other schedulers, DaemonSets, static pods) summed per node and
recorded as one allocation per node ("foreign" pods, re-recorded when they change), and node
loss (``node_lost``: exactly the lost node's shares are given back). Owned state: ``nodes``,
``node_down``, ``foreign*``, ``matcher`` and the queue's ``scheduler`` (built with it),
``topologies``, ``node_view`` (the nodes' labels and taints for the pods' node rules)."""

from __future__ import annotations

import contextlib
import logging
import time
from collections import Counter
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Protocol, cast

from fluxnetes.k8s.cluster import nodefit
from fluxnetes.k8s.context import Context
from fluxnetes.k8s.groups import GroupError, controller_of, request_of
from fluxnetes.k8s.groups.group import Group
from fluxnetes.k8s.groups.grouptable import GroupTable
from fluxnetes.k8s.objects import _ended, _gated, _meta, _node_down
from fluxnetes.k8s.persistence.fluxjob import Phase
from fluxnetes.k8s.resources import PodResources
from fluxnetes.k8s.scheduling import shares
from fluxnetes.k8s.scheduling.placement import assigned_node
from fluxnetes.metrics import METRICS

if TYPE_CHECKING:
    from fluxnetes.jobspec.model import Jobspec
    from fluxnetes.k8s.cluster.topology import Topologies, TopologySource
    from fluxnetes.k8s.persistence.status import StatusWriter
    from fluxnetes.match.matcher import Matcher
    from fluxnetes.match.results import JobRecord, MatchResult, NodeShare
    from fluxnetes.queue.cycle import Scheduler

# one logger for every part of the state machine: its log lines read as before the split
log = logging.getLogger("fluxnetes.k8s.controller")

class TimedMatcher:
    """The matcher as the queue's ``Scheduler`` sees it: every match it asks for is timed and
    its outcome counted (fluxnetes_match_duration_seconds, fluxnetes_match_outcomes_total).
    The rest of what the scheduler asks of a matcher (``queue.cycle``: cancel, partial
    cancel, satisfiability, the indexes that tell whether anything ends by itself, the
    policy) is passed on as it is; nothing else is offered (the operator's other parts use
    the plain matcher, ``ClusterView.matcher``)."""

    def __init__(self, matcher: Matcher) -> None:
        self._m = matcher
        # outcome counter children by the result's status, looked up once each (a label
        # lookup and the status' name cost more than the count itself, per match)
        self._outcomes: dict[object, Any] = {}

    def _timed(self, fn: Callable[[], MatchResult]) -> MatchResult:
        t0 = time.perf_counter()
        try:
            res = fn()
        except Exception:
            METRICS.match_outcomes.labels(outcome="error").inc()
            raise
        finally:
            METRICS.match_seconds.observe(time.perf_counter() - t0)
        status = getattr(res, "status", "")
        child = self._outcomes.get(status)
        if child is None:
            name = str(status).rsplit(".", 1)[-1].lower()
            child = self._outcomes[status] = METRICS.match_outcomes.labels(outcome=name or "unknown")
        child.inc()
        return res

    def allocate(self, js: Jobspec, *, now: int = 0, jobid: int | None = None) -> MatchResult:
        return self._timed(lambda: self._m.allocate(js, now=now, jobid=jobid))

    def allocate_orelse_reserve(self, js: Jobspec, *, now: int = 0, jobid: int | None = None) -> MatchResult:
        return self._timed(lambda: self._m.allocate_orelse_reserve(js, now=now, jobid=jobid))

    def satisfiability(self, js: Jobspec, *, now: int = 0) -> MatchResult:
        return self._m.satisfiability(js, now=now)

    def cancel(self, jobid: int) -> None:
        self._m.cancel(jobid)

    def partial_cancel(self, jobid: int, release: Mapping[str, Any] | list[NodeShare]) -> bool:
        return self._m.partial_cancel(jobid, release)

    def earliest_end(self) -> int | None:
        return self._m.earliest_end()

    def reservation_count(self) -> int:
        return self._m.reservation_count()

    @property
    def jobs(self) -> Mapping[int, JobRecord]:
        return self._m.jobs

    @property
    def policy(self) -> str:
        return self._m.policy


class MirrorSide(Protocol):
    """What the cluster view uses of the other parts: the groups and pod membership (node
    loss, survivors turned foreign), the status writer, and allocation's release and eviction."""

    @property
    def groups(self) -> GroupTable: ...
    @property
    def status(self) -> StatusWriter: ...
    def drop_member(self, uid: str) -> None: ...
    async def evict(self, g: Group, pods: list[dict[str, Any]] | None = None) -> None: ...
    def release_all(self, g: Group) -> None: ...
    def release_slot(self, g: Group, slot: int) -> None: ...
    def release_idle_slots(self, g: Group) -> None: ...
    def recheck_prune(self, g: Group) -> None: ...


class ClusterView:
    """Nodes and foreign pods -> graph; node loss: a component of its own (its state is
    private, read through the properties below); the other parts reach it as ``cluster``."""

    def __init__(self, ctx: Context, side: MirrorSide) -> None:
        self._ctx, self._side = ctx, side
        self._nodes: dict[str, dict[str, Any]] = {}
        self._node_down: dict[str, bool] = {}
        self._foreign: dict[str, dict[str, PodResources]] = {}  # node -> uid -> request
        self._foreign_node: dict[str, str] = {}  # uid -> node
        self._foreign_owner: dict[str, str] = {}  # uid -> its controller's uid
        # controller uid -> its foreign pods (scaling.survivors asks it on every routed pod)
        self._foreign_per_owner: Counter[str] = Counter()
        self._foreign_jobs: dict[str, int] = {}  # node -> matcher job id
        self._foreign_dirty: set[str] = set()
        # nodes whose foreign pods could not be recorded (no room: what the graph holds there
        # first must go): tried again at every flush until they are, without waking the loop
        # (``foreign_dirty`` says only that something changed)
        self._foreign_unrecorded: set[str] = set()
        self._matcher: Matcher | None = None  # (built by build_matcher)
        self._scheduler: Scheduler | None = None
        # the pods' own node rules (nodeSelector, required affinity, taints): see fit_groups
        self._node_view = nodefit.NodeView()
        from fluxnetes.k8s.cluster.topology import Topologies, TopologySource

        self._topologies = Topologies()  # NodeResourceTopology by node (k8s/cluster/topology.py)
        self._topology_source = TopologySource(self._ctx.kube, self._ctx.queue)

    # ---------------------------------------------------------------- read by the other parts
    @property
    def nodes(self) -> Mapping[str, dict[str, Any]]:
        return MappingProxyType(self._nodes)

    @property
    def node_down(self) -> Mapping[str, bool]:
        return MappingProxyType(self._node_down)

    @property
    def matcher(self) -> Matcher:
        return cast("Matcher", self._matcher)  # (None until build_matcher: start builds it first)

    @property
    def scheduler(self) -> Scheduler:
        return cast("Scheduler", self._scheduler)  # (None until build_matcher: start builds it first)

    @property
    def node_view(self) -> nodefit.NodeView:
        return self._node_view

    @property
    def topologies(self) -> Topologies:
        return self._topologies

    @property
    def topology_source(self) -> TopologySource:
        return self._topology_source

    @property
    def foreign_dirty(self) -> bool:
        """Foreign pods changed on some node since they were last recorded (flush_foreign)."""
        return bool(self._foreign_dirty)

    def foreign_of_owner(self, owner_uid: str) -> int:
        """How many foreign pods the workload ``owner_uid`` has (scaling.survivors)."""
        return self._foreign_per_owner.get(owner_uid, 0)

    @property
    def foreign(self) -> Mapping[str, Mapping[str, PodResources]]:
        return MappingProxyType(self._foreign)

    @property
    def foreign_jobs(self) -> Mapping[str, int]:
        return MappingProxyType(self._foreign_jobs)

    @property
    def foreign_node(self) -> Mapping[str, str]:
        return MappingProxyType(self._foreign_node)

    def know_node(self, node: dict[str, Any]) -> None:
        """A Node listed at start (before the first graph is built)."""
        self._nodes[str(_meta(node).get("name"))] = node

    def know_only(self, nodes: list[dict[str, Any]]) -> None:
        """The Nodes listed at start are these, and only these (before the first graph is built)."""
        self._nodes.clear()
        for node in nodes:
            self.know_node(node)

    # ---------------------------------------------------------------- matcher
    def build_matcher(self) -> None:
        from fluxnetes.k8s.cluster.topology import build_graph
        from fluxnetes.match.matcher import Matcher
        from fluxnetes.queue.cycle import Scheduler
        from fluxnetes.queue.policy import QueuePolicy
        from fluxnetes.queue.satisfy import node_cores

        graph, _ = build_graph(list(self._nodes.values()), self._topologies, rack_label=self._ctx.config.rack_label)
        self._matcher = Matcher(graph, policy=self._ctx.config.match_policy)
        # node_cores: a job parked as blocked wakes only when something it could use is freed
        self._scheduler = Scheduler(TimedMatcher(self._matcher), QueuePolicy.parse(self._ctx.config.policy),
                                   node_cores=node_cores(graph))
        self._node_down = {n: _node_down(obj) for n, obj in self._nodes.items()}
        self.update_node_gauge()

    # ---------------------------------------------------------------- foreign pods
    def add_foreign(self, uid: str, pod: Mapping[str, Any], node: str) -> None:
        try:
            req = request_of(pod.get("spec") or {})
        except GroupError:
            req = PodResources()
        if self._foreign_node.get(uid) == node and self._foreign.get(node, {}).get(uid) == req:
            return
        self.remove_foreign(uid)
        self._foreign.setdefault(node, {})[uid] = req
        self._foreign_node[uid] = node
        owner = controller_of(_meta(pod))
        if owner is not None and owner.uid:
            self._foreign_owner[uid] = owner.uid  # a replicated workload's pods still running (scaling.survivors)
            self._foreign_per_owner[owner.uid] += 1
        self._foreign_dirty.add(node)
        METRICS.foreign_allocations.inc()
        METRICS.foreign_pods.set(len(self._foreign_node))

    def remove_foreign(self, uid: str) -> None:
        node = self._foreign_node.pop(uid, None)
        gone_owner = self._foreign_owner.pop(uid, None)
        if gone_owner is not None:
            self._foreign_per_owner[gone_owner] -= 1
            if self._foreign_per_owner[gone_owner] <= 0:
                del self._foreign_per_owner[gone_owner]
        if node is not None:
            self._foreign.get(node, {}).pop(uid, None)
            self._foreign_dirty.add(node)
            METRICS.foreign_pods.set(len(self._foreign_node))

    def flush_foreign(self) -> None:
        """Re-record the foreign allocation of every node whose foreign pods changed, or whose
        last record failed (a node stays to be recorded until its record succeeds: cleared
        anyway, its pods ran uncharged for good once nothing else changed there)."""
        if not (self._foreign_dirty or self._foreign_unrecorded) or self._matcher is None:
            return
        now = self._ctx.now()
        failed: set[str] = set()
        for node in sorted(self._foreign_dirty | self._foreign_unrecorded):
            old = self._foreign_jobs.pop(node, None)
            if old is not None:
                with contextlib.suppress(Exception):
                    self.matcher.cancel(old)
            pods = self._foreign.get(node) or {}
            if not pods or node not in self._nodes:
                continue
            share = shares.of_pods(node, pods.values())
            if share.empty:
                continue
            jobid = self.matcher.next_jobid
            try:
                self.matcher.update_allocate(jobid, shares.to_match([share]), at=now, duration=0)
                self._foreign_jobs[node] = jobid
            except Exception as exc:
                failed.add(node)
                if node not in self._foreign_unrecorded:  # (once per node, not every cycle)
                    log.warning("foreign pods on %s (%s) could not be recorded, tried again until they are: %s",
                                node, share, exc)
                # meanwhile what is free there is theirs: left free in the graph, the next
                # group placed there would join them on a node they already overfill
                self._record_what_fits(node, share, now)
        retried = self._foreign_unrecorded - failed
        for node in sorted(retried):
            log.info("foreign pods on %s recorded", node)
        self._foreign_unrecorded = failed
        freed = sorted(self._foreign_dirty)
        self._foreign_dirty.clear()
        if freed:
            self.scheduler.freed(freed)  # foreign pods came or went there: wake what waits for them
            self._ctx.dirty = True

    def _record_what_fits(self, node: str, share: shares.Share, now: int) -> None:
        """Record the part of ``node``'s foreign ``share`` that is free in the graph (the
        whole does not fit: ``flush_foreign`` tries the whole again at every flush)."""
        try:
            part = self.matcher.fitting(shares.to_match([share])[0], at=now)
            if shares.from_match([part])[0].empty:
                return
            jobid = self.matcher.next_jobid
            self.matcher.update_allocate(jobid, [part], at=now, duration=0)
            self._foreign_jobs[node] = jobid
        except Exception as exc:
            log.warning("foreign pods on %s: not even their free part could be recorded: %s", node, exc)

    # ---------------------------------------------------------------- nodes
    def on_node(self, etype: str, node: dict[str, Any]) -> None:
        name = str(_meta(node).get("name", ""))
        eligibility = self._node_view.update(name, None if etype == "DELETED" else node)
        if eligibility:
            self._ctx.dirty = True  # labels/taints changed: waiting groups are fitted again
        if etype == "DELETED":
            self._nodes.pop(name, None)
            self._node_down.pop(name, None)
            self.update_node_gauge()
            if self._matcher is not None:
                with contextlib.suppress(Exception):
                    self.matcher.remove_subgraph(name)
                self.node_lost(name)
                self.sync_node_cores()
            return
        old = self._nodes.get(name)
        self._nodes[name] = node
        if self._matcher is None:
            return
        down = _node_down(node)
        changed = True
        if old is None:
            try:
                from fluxnetes.graph.topology import node_graph

                added = self.matcher.add_subgraph(
                    node_graph(node, self._topologies.get(name), rack_label=self._ctx.config.rack_label)[0])
                if not any(p.rstrip("/").endswith("/" + name) for p in added):
                    raise RuntimeError("the node's vertices were not attached")
            except Exception as exc:
                log.warning("node %s could not be attached (%s); rebuilding the graph", name, exc)
                self.rebuild()
            self._foreign_dirty.add(name)
        elif self._node_down.get(name) != down:
            # cordoned / NotReady: nothing new goes there; running pods stay until Kubernetes
            # evicts them (their deletion releases their share like any ending pod)
            with contextlib.suppress(Exception):
                self.matcher.set_status(name, not down)
        elif (old.get("status") or {}).get("allocatable") != (node.get("status") or {}).get("allocatable"):
            self.rebuild()
        else:
            changed = eligibility
        self._node_down[name] = down
        if not changed:
            # a heartbeat (conditions' times, images, annotations): nothing the graph or the
            # queue sees. Each node reports one every few seconds: at 5,000 nodes the O(nodes)
            # work below, done per event, kept the event loop busy for minutes
            return
        self.update_node_gauge()
        self.sync_node_cores()
        self.scheduler.invalidate()
        self._ctx.dirty = True

    def on_topology(self, etype: str, obj: dict[str, Any]) -> None:
        from fluxnetes.k8s.cluster.topology import replace_node

        name = str(_meta(obj).get("name", ""))
        if not self._topologies.update(etype, obj) or name not in self._nodes or self._matcher is None:
            return
        res = replace_node(self._matcher, self._nodes[name], self._topologies.get(name), rack_label=self._ctx.config.rack_label)
        for note in res.notes:
            self._side.status.event({"apiVersion": "v1", "kind": "Node", "name": name}, "Warning", "TopologyMismatch", note)
        if res.lost:  # the node shrank under running work: re-record everything from the groups
            log.warning("node %s: topology change lost %s; rebuilding the graph", name, res.lost)
            self.rebuild()
        self.sync_node_cores()
        self.scheduler.invalidate()
        self._ctx.dirty = True

    def sync_node_cores(self) -> None:
        """The queue's per-node core counts (its parking wake rule) follow the graph."""
        from fluxnetes.queue.satisfy import node_cores

        self.scheduler.set_node_cores(node_cores(self.matcher.graph))

    def node_lost(self, name: str) -> None:
        """Node ``name`` is gone (the matcher already dropped its vertices, and with them
        every job's part there: remove_subgraph). A group that held a share on it loses
        exactly that share. Under ``--on-node-lost requeue`` a workload's gang restarts
        whole; otherwise the group fails, and the shares of its surviving pods stay held
        until those pods end (member_gone gives them back as usual): they still run, and
        nothing new may be placed on what they use."""
        what = f"node {name} was removed"
        for g in list(self._side.groups.values()):
            if name not in g.held:
                continue
            if g.phase != Phase.RUNNING:
                self.lose_share(g, name)  # failed earlier, its survivors still hold shares
                continue
            if self._requeues(g):
                self._side.release_all(g)
                self._requeue(g, self.survivors_to_foreign(g), f"{what}; requeued", "NodeLost")
            else:
                self.lose_share(g, name)
                self._side.release_idle_slots(g)  # a slot with no pod holds a share no pod will ever use
                g.end = self._ctx.now()
                self._side.status.set_phase(g, Phase.FAILED, what)
                self._side.status.group_event(g, "Warning", "NodeLost", g.reason)

    def _requeues(self, g: Group) -> bool:
        """Does a running group that lost (part of) its allocation restart whole
        (``--on-node-lost requeue``, a workload's group), rather than fail?"""
        return self._ctx.config.on_node_lost == "requeue" and g.kind is not None and g.spec.owner is not None

    def _requeue(self, g: Group, survivors: list[dict[str, Any]], reason: str, event: str) -> None:
        """Restart the whole gang (its allocation given back already): its surviving pods go (a
        Job is suspended again, the pods of a ReplicaSet/StatefulSet are deleted and come back
        gated); until they are gone they count as foreign pods (``survivors``, moved there by
        the caller), so nothing is placed on what they use."""
        self._ctx.spawn(self._side.evict(g, [*survivors, *g.members.values()]))
        g.failed_pods = g.deleted_pods = 0  # counted again for the next run
        g.jobid, g.slots, g.slot_pod, g.released, g.start = None, [], [], set(), None
        self._side.status.set_phase(g, Phase.PENDING, reason)
        self._side.status.group_event(g, "Warning", event, g.reason, pods=False)

    def hold_nothing(self, g: Group) -> list[dict[str, Any]]:
        """``g``'s allocation could not be recorded in the graph (no room there: what was
        recorded first holds its nodes). It holds nothing, then, here either: its placed pods
        leave it and are followed as foreign pods, their nodes charged until they go (a
        foreign record that does not fit yet is tried again: ``flush_foreign``), never left
        members of an allocation the graph does not hold (the next group placed over them
        overbooked their nodes). Returns the pods moved."""
        self._side.release_all(g)  # (its job id stays reserved: record_group)
        g.held, g.alloc = {}, []
        moved = self.survivors_to_foreign(g)
        g.fj_dirty = True
        self._ctx.dirty = True
        return moved

    def unrecordable(self, g: Group, why: str) -> None:
        """``g``'s allocation could not be recorded (``why``): it holds nothing (``hold_nothing``),
        and a running group ends as node loss ends one: it restarts whole under
        ``--on-node-lost requeue`` (a workload's group), else it fails; its pods run on until
        they end, charged as foreign pods."""
        moved = self.hold_nothing(g)
        log.error("%s: %s; its %d placed pod(s) count as foreign pods", g.qid, why, len(moved))
        if g.phase != Phase.RUNNING:
            return
        if self._requeues(g):
            self._requeue(g, moved, f"{why}; requeued", "Unrecorded")
            return
        g.end = self._ctx.now()
        self._side.status.set_phase(g, Phase.FAILED, f"{why}; its pods run on as foreign pods")
        self._side.status.group_event(g, "Warning", "Unrecorded", g.reason, pods=False)

    def lose_share(self, g: Group, name: str) -> None:
        """The group's share on lost node ``name`` is gone with the node (and its slots)."""
        lost = g.held.pop(name, None)
        if lost is not None:
            self.scheduler.released_part(g.qid, name, lost.cores)  # (a node of that name may come back)
        g.released.update(i for i, n in enumerate(g.slots) if n == name)
        g.holdings_changed()
        if not g.held:
            self._side.release_all(g)
        elif g.jobid is None and all(n in self._nodes for n in g.held):
            # recovered after a restart with nodes gone: the rest was never recorded
            g.jobid = self.matcher.next_jobid
            if not self.record_group(g):
                # no room for the rest (something recorded since holds it): its pods run on,
                # charged as foreign pods (the caller ends a running group: node_lost)
                moved = self.hold_nothing(g)
                log.error("%s: its share off lost node %s could not be recorded; its %d placed pod(s) "
                          "count as foreign pods", g.qid, name, len(moved))
        self.scheduler.invalidate()
        g.fj_dirty = True
        self._ctx.dirty = True

    def survivors_to_foreign(self, g: Group) -> list[dict[str, Any]]:
        """The group's pods that are placed on a node and still run leave the group and are
        followed as foreign pods until they are gone (their share then goes back)."""
        moved = []
        for uid, pod in list(g.members.items()):
            node = (pod.get("spec") or {}).get("nodeName") or (None if _gated(pod) else assigned_node(pod))
            if not node or _ended(pod):  # (one being deleted holds its room until it is gone)
                continue
            del g.members[uid]
            self._side.drop_member(uid)
            self.add_foreign(uid, pod, str(node))
            moved.append(pod)
        if moved:
            self._side.recheck_prune(g)
        return moved

    def rebuild(self) -> None:
        """Full rebuild (allocatable changed): graph from Nodes, then re-record everything held."""
        self.build_matcher()
        self._foreign_jobs.clear()
        self._foreign_dirty = set(self._foreign)
        for g in list(self._side.groups.values()):
            # a failed group's surviving pods still hold their shares (node_lost)
            if g.held and g.jobid is not None and not self.record_group(g):
                self.unrecordable(g, "its allocation did not fit the graph rebuilt from the nodes "
                                     f"(on {', '.join(sorted(g.held))})")
        self.flush_foreign()

    def record_group(self, g: Group) -> bool:
        try:
            self.matcher.update_allocate(g.jobid, shares.to_match(list(g.held.values())),
                                         at=g.start or self._ctx.now(), duration=g.spec.duration)
            return True
        except Exception as exc:
            if isinstance(g.jobid, int):
                self.matcher.reserve_jobid(g.jobid)  # never given to another group meanwhile
            log.error("could not re-record %s (job %s): %s", g.qid, g.jobid, exc)
            return False

    def update_node_gauge(self) -> None:
        down = sum(1 for d in self._node_down.values() if d)
        METRICS.nodes.labels(status="up").set(len(self._node_down) - down)
        METRICS.nodes.labels(status="down").set(down)

    def nodes_gone(self, held: Any) -> list[str]:
        return sorted(n for n in held if n not in self._nodes or self._node_down.get(n, False))
