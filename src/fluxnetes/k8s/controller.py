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

Restart windows (each forced by a test at a crash point, crashpoints.py): an allocation the store
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
each cycle (k8s/scheduling/satisfiable.py) and looked at again when nodes change.

Memory: a group that is over (final phase, no pod left, final FluxJob status written) is
forgotten (``prune_finished``); its FluxJob keeps what ``kubectl get fluxjobs`` shows.

Components (each an object with its state private, made here in ``Controller.__init__``, the
composition root): ``cluster`` (cluster/mirror.py: Nodes and foreign pods -> graph, node
loss), ``status`` (persistence/status.py: phases, Events, FluxJob writes, store records),
``accounting`` (cluster/accounting.py), ``book`` (groups/groupbook.py: pod -> group
membership, groups from workload kinds, pruning), ``scaling`` (groups/scaling.py: scale
groups of a workload), ``podsets`` (groups/podset_groups.py: multi-role kinds),
``allocation`` (scheduling/allocation.py: start, place, resume, evict, release),
``preemption``, ``scheduling`` (scheduling/cycle.py: one cycle), ``recovery``
(persistence/recovery.py: after a restart, from FluxJobs and the cluster) and
``store_recovery``. Each says what it uses of the others as a ``Protocol`` in its own module
(its "side"); this object is every component's side and hands out the components. See
README.md.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable, Mapping
from typing import Any

from fluxnetes.graph.model import gc_paused
from fluxnetes.k8s import names
from fluxnetes.k8s.admission.hold import forged_hold_label_patch, is_ours, template_is_ours
from fluxnetes.k8s.cluster.accounting import CHECK_EVERY, AccountingCheck
from fluxnetes.k8s.cluster.mirror import ClusterView, TimedMatcher
from fluxnetes.k8s.config import OperatorConfig
from fluxnetes.k8s.context import Context
from fluxnetes.k8s.groups import GroupError, GroupSpec, OwnerRef, controller_of, object_name
from fluxnetes.k8s.groups.groupbook import QUEUED, Group, GroupBook
from fluxnetes.k8s.groups.grouptable import GroupTable
from fluxnetes.k8s.groups.podset_groups import PodSetGroups
from fluxnetes.k8s.groups.scaling import Scaling
from fluxnetes.k8s.informer import Event, Informer
from fluxnetes.k8s.kube import (
    FLUXJOBS,
    JSON_PATCH,
    NODES,
    PODS,
    PRIORITY_CLASSES,
    ApiError,
    Kube,
    Resource,
)
from fluxnetes.k8s.names import SCALE_SEP
from fluxnetes.k8s.objects import OWNER_RESOURCES, _ended, _event_time, _gated, _meta, _terminal
from fluxnetes.k8s.persistence.fluxjob import Phase
from fluxnetes.k8s.persistence.recovery import Recovery
from fluxnetes.k8s.persistence.status import EVENT_BURST, EVENT_RATE, StatusWriter
from fluxnetes.k8s.persistence.store_recovery import StoreRecovery
from fluxnetes.k8s.scheduling.allocation import Allocation
from fluxnetes.k8s.scheduling.cycle import SchedulingCycle
from fluxnetes.k8s.scheduling.placement import assigned_node
from fluxnetes.k8s.scheduling.preemption import Preemption
from fluxnetes.k8s.workloads import WorkloadKind, kind_of, made_for
from fluxnetes.metrics import METRICS

__all__ = ["CHECK_EVERY", "EVENT_BURST", "EVENT_RATE", "OWNER_RESOURCES", "QUEUED",
           "SCALE_SEP", "Context", "Controller", "Group", "TimedMatcher"]

# one logger for every part of the state machine
log = logging.getLogger(__name__)


class Controller(Context):
    """The operator's state machine and its composition root: makes the components (each
    owns its state; what it needs of the others is a typed Protocol, which this object
    satisfies by handing out the components), routes watch events to them, and runs the main
    loop (the scheduling cycle, the post-restart reconcile and the FluxJob writes)."""

    def __init__(self, kube: Kube, config: OperatorConfig, *, clock: Callable[[], float] = time.time) -> None:
        super().__init__(kube, config, clock=clock)
        self.informers = [
            Informer(kube, NODES, "Node", self.queue),
            Informer(kube, PODS, "Pod", self.queue),
            Informer(kube, PRIORITY_CLASSES, "PriorityClass", self.queue),
            Informer(kube, FLUXJOBS, "FluxJob", self.queue),
            *(Informer(kube, res, kind, self.queue) for kind, res in OWNER_RESOURCES.items()),
        ]
        if config.fairshare != "off":  # fair share: accounts, and the namespaces choosing them
            from fluxnetes.k8s.fairshare.fairshare_book import FLUXACCOUNTS
            from fluxnetes.k8s.kube import NAMESPACES

            self.informers += [Informer(kube, FLUXACCOUNTS, "FluxAccount", self.queue),
                               Informer(kube, NAMESPACES, "Namespace", self.queue)]
        self._informer_runs: list[asyncio.Task[Any]] = []
        self.standby = False  # informers muted: a replica waiting to lead (watch, end_standby)
        # the components: each is given the shared core and this object as its side (what it
        # uses of the others, a Protocol of its own module: mypy checks this object against it)
        self.cluster = ClusterView(self, self)
        self.status = StatusWriter(self, self)
        self.accounting = AccountingCheck(self, self)
        self.book = GroupBook(self, self)
        self.scaling = Scaling(self, self)
        self.podsets = PodSetGroups(self, self)
        self.allocation = Allocation(self, self)
        self.preemption = Preemption(self, self)
        self.scheduling = SchedulingCycle(self, self)
        self.recovery = Recovery(self, self)
        self.store_recovery = StoreRecovery(self, self)

    # ---------------------------------------------------------------- what the sides ask
    # The first components' sides (MirrorSide, StatusBook, AccountingView, CycleSide,
    # PreemptionSide, StoreSide) name the calls they make of the others directly: passed on
    # here to the component that owns each.
    @property
    def groups(self) -> GroupTable:
        return self.book.groups

    @property
    def member_of(self) -> Mapping[str, tuple[str, str]]:
        return self.book.member_of

    @property
    def pruned(self) -> Mapping[str, int]:
        return self.book.pruned

    @property
    def priority_classes(self) -> Mapping[str, int]:
        return self.book.priority_classes

    def owner_obj(self, ref: OwnerRef | None, namespace: str) -> dict[str, Any] | None:
        return self.book.owner_obj(ref, namespace)

    def new_group(self, spec: GroupSpec, kind: WorkloadKind | None) -> Group:
        return self.book.new_group(spec, kind)

    def pod_group_spec(self, pod: dict[str, Any]) -> GroupSpec:
        return self.book.pod_group_spec(pod)

    def drop_member(self, uid: str) -> None:
        self.book.drop_member(uid)

    def mark_finished(self, key: tuple[str, str]) -> None:
        self.book.mark_finished(key)

    def recheck_prune(self, g: Group) -> None:
        self.book.recheck_prune(g)

    def prune_finished(self) -> None:
        self.book.prune_finished()

    def spend_name(self, g: Group) -> None:
        self.scaling.spend_name(g)

    def start_group(self, g: Group, res: Any) -> None:
        self.allocation.start_group(g, res)

    async def evict(self, g: Group, pods: list[dict[str, Any]] | None = None) -> None:
        await self.allocation.evict(g, pods)

    def release_all(self, g: Group) -> None:
        self.allocation.release_all(g)

    def release_slot(self, g: Group, slot: int) -> None:
        self.allocation.release_slot(g, slot)

    def release_idle_slots(self, g: Group) -> None:
        self.allocation.release_idle_slots(g)

    def forget_unrecorded(self, g: Group) -> None:
        self.recovery.forget_unrecorded(g)

    def watch_kind(self, kind_name: str, resource: Resource, *, start: bool) -> None:
        """An informer for a workload kind turned on (podset_groups.enable_addons): muted while
        this replica waits to lead; started now when the others already run."""
        inf = Informer(self.kube, resource, kind_name, self.queue)
        inf.muted = self.standby
        self.informers.append(inf)
        if start:
            task = inf.start()
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    # ---------------------------------------------------------------- workload objects
    def on_owner(self, kind_name: str, etype: str, obj: dict[str, Any]) -> None:
        meta = _meta(obj)
        ns, name, uid = meta.get("namespace") or "default", meta.get("name", ""), str(meta.get("uid", ""))
        kind = kind_of(kind_name)
        assert kind is not None
        if made_for(obj, kind_name) is not None:
            return  # a multi-role workload's Job or StatefulSet: part of its group (podset_groups.py)
        gkey = (ns, object_name(f"{kind_name.lower()}-{name}"))
        if etype == "DELETED":
            self.book.owner_deleted(kind_name, ns, name, uid)  # (a re-list may show the new object first)
            self.scaling.workload_gone(uid)
            for k in [gkey, *self.scaling.scale_groups.get(gkey, ())]:
                g = self.book.groups.get(k)
                if g is not None and not g.phase.final and self.book.same_owner(g, uid):
                    self.allocation.cancel_group(g, f"{kind_name} {name} was deleted")
            return
        before = self.book.owners.get((kind_name, ns, name))  # (who suspends it: book.suspension)
        self.book.set_owner(kind_name, ns, name, obj)
        g = self.book.groups.get(gkey)
        if g is not None and not self.book.same_owner(g, uid):
            self.book.drop_earlier_owner(gkey, f"{kind_name} {name} was deleted (a new one has its name)")
            g = None
        managed = template_is_ours(kind.template(obj))
        if g is None and managed and kind.resume_patch(obj) is not None and not kind.finished(obj) \
                and not self.scaling.ended(uid):
            # a Job: its group is known without any pod (its template was held at admission or
            # names fluxnetes; a Job created while the webhook was away has neither and runs alone)
            try:
                spec = self.book.group_for_workload(kind, obj)
            except GroupError as exc:
                self.status.event({"apiVersion": kind.api_version, "kind": kind_name, "name": name, "namespace": ns,
                            "uid": uid}, "Warning", "InvalidGroup", str(exc))
                return
            if spec.size < 1:
                return  # parallelism 0: nothing to schedule until it is raised
            g = self.book.new_group(spec, kind)
            if g.phase == Phase.PROVISIONAL:
                self.book.enqueue_workload(g, kind, obj)
        elif g is not None and kind.finished(obj):
            if not g.phase.final:
                self.book.workload_finished(g, kind, obj)  # whatever the group's phase: never queued again
            for k in list(self.scaling.scale_groups.get(gkey, ())):  # a Job's, once its parallelism was raised
                sg = self.book.groups.get(k)
                if sg is None or sg.phase.final or not self.book.same_owner(sg, uid):
                    continue
                if sg.phase == Phase.RUNNING:
                    self.book.workload_finished(sg, kind, obj)
                else:
                    self.allocation.cancel_group(sg, f"{kind_name} {name} finished before this group was allocated")
        elif g is not None and kind.resume_patch(obj) is not None:
            self.book.suspension(g, kind, before, obj)
            if g.suspended_by_user and kind.suspended(obj):
                for k in list(self.scaling.scale_groups.get(gkey, ())):  # its parallelism was raised
                    sg = self.book.groups.get(k)
                    if sg is not None and not sg.phase.final and self.book.same_owner(sg, uid):
                        self.allocation.cancel_group(sg, f"{kind_name} {name} was suspended by its user")
            if g.kind is not None and (g.phase == Phase.PROVISIONAL or g.phase in QUEUED):
                self.book.enqueue_workload(g, kind, obj)  # resumed (or suspended) by its user
            elif g.phase == Phase.RUNNING and kind.size(obj) < self.scaling.family_capacity(gkey):
                self.scaling.rescale(gkey, kind, obj)  # parallelism lowered: give back empty slots
            elif g.phase == Phase.RUNNING:
                self.scaling.job_grown(gkey, kind, obj)  # parallelism raised: its waiting pods get a group
        elif kind.owns_pods and (g is not None or gkey in self.scaling.scale_groups):
            self.scaling.rescale(gkey, kind, obj)  # replicas changed
        # pods that arrived before their owner (matched by the owner's uid)
        for puid, pod in list(self.book.parked.items()):
            owner = controller_of(_meta(pod))
            if owner and owner.kind == kind_name and owner.name == name and _meta(pod).get("namespace") == ns \
                    and (not owner.uid or owner.uid == uid):
                self.book.unpark(puid)
                self.on_pod("MODIFIED", pod)

    # ---------------------------------------------------------------- pods
    def on_pod(self, etype: str, pod: dict[str, Any]) -> None:
        meta = _meta(pod)
        uid = str(meta.get("uid", ""))
        spec = pod.get("spec") or {}
        node = spec.get("nodeName")
        # a bound pod being deleted still holds its room until it is gone or has ended (its
        # kubelet stops it first; kube-scheduler counts it meanwhile): giving that room to
        # the next group would overbook the node. An unbound one holds nothing.
        gone = etype == "DELETED" or _ended(pod) or (not node and _terminal(pod))
        gkey = self.book.member_of.get(uid)
        managed = is_ours(meta, spec)
        if gkey is None and managed and not _gated(pod) and self.recovery.adopt(uid, pod):
            gkey = self.book.member_of.get(uid)  # placed before a restart: its group again
        if gkey is not None:
            g = self.book.groups.get(gkey)
            if g is None:
                self.book.drop_member(uid)
                return
            if gone:
                self.book.member_gone(g, uid, pod)
            else:
                g.members[uid] = pod
                if g.phase != Phase.RUNNING and managed and not _gated(pod):
                    # placed by an earlier leader, seen late: the group runs again (when its
                    # allocation can be taken back: recovery.take_back says which)
                    self.recovery.take_back(g)
                if g.phase == Phase.RUNNING and uid not in g.slot_pod:
                    if not _gated(pod) and (meta.get("annotations") or {}).get(names.ANN_FLUXJOB) == g.spec.name:
                        self.recovery.adopt(uid, pod)  # placed for it, seen late: its slot, if still free
                    self.allocation.assign(g)
            return
        if gone:
            self.book.unpark(uid)
            self.cluster.remove_foreign(uid)
            return
        if managed and _gated(pod) and not node:
            self._unforge_hold_label(pod)
            self.book.join_group(uid, pod)
            return
        if node:
            self.cluster.add_foreign(uid, pod, str(node))

    def _unforge_hold_label(self, pod: dict[str, Any]) -> None:
        """A gated pod labelled as held by the scheduler name (admitted by a webhook that did
        not know the label): the gate's guard skips it, so its user could lift the gate.
        The label comes off (hold.forged_hold_label_patch)."""
        patch = forged_hold_label_patch(pod)
        if patch is None:
            return
        m = _meta(pod)

        async def unlabel() -> None:
            try:
                await self.kube.patch(PODS, str(m.get("name", "")), patch, m.get("namespace"), content_type=JSON_PATCH)
                log.warning("%s/%s: gated, it carried %s=%s (the gate's guard skips such pods): taken off",
                            m.get("namespace"), m.get("name"), names.LABEL_HOLD, names.HOLD_SCHEDULER_NAME)
            except ApiError as exc:
                log.warning("%s/%s: %s not taken off a gated pod: %s", m.get("namespace"), m.get("name"),
                            names.LABEL_HOLD, exc)

        self.spawn(unlabel())

    # ---------------------------------------------------------------- main loop
    def handle(self, ev: Event) -> None:
        kind = ev[0]
        replayed = self.replay_left > 0  # (the initial lists: history, not changes seen live)
        self.replay_left -= replayed
        try:
            self._handle(ev)
        except Exception:
            # one bad object must not stop the operator: count it, log it, go on
            METRICS.reconcile_error(kind.lower())
            m = _meta(ev[2])
            log.exception("handling %s %s %s/%s failed", ev[1], kind, m.get("namespace", ""), m.get("name", ""))
            return
        if kind in ("Pod", "Node") and self.reconciled and not replayed:
            at = _event_time(ev[2], ev[1])
            now = self.clock()
            if at is not None and now - at < 300:  # changes seen live, not replayed history
                METRICS.observe_sync_lag(kind.lower(), at, now)

    def _handle(self, ev: Event) -> None:
        kind, etype, obj = ev
        if kind == "Pod":
            self.on_pod(etype, obj)
        elif kind == "Node":
            self.cluster.on_node(etype, obj)
        elif kind == "NodeResourceTopology":
            self.cluster.on_topology(etype, obj)
        elif kind == "PriorityClass":
            self.book.on_priority_class(etype, obj)
        elif kind in OWNER_RESOURCES or kind in self.podsets.addon_on:
            if kind in OWNER_RESOURCES:
                self.on_owner(kind, etype, obj)
            else:
                self.podsets.on_workload(kind, etype, obj)
            m = _meta(obj)
            self.book.owner_changed(kind, m.get("namespace") or "default", m.get("name", ""))
        elif kind in ("FluxAccount", "Namespace"):
            self.scheduling.on_account_object(kind, etype, obj)
        elif kind == "FluxJob" and etype != "DELETED":
            self.scaling.on_fluxjob(obj)
        elif kind == "FluxJob" and etype == "DELETED":
            m = _meta(obj)
            g = self.book.groups.get((m.get("namespace") or "default", m.get("name", "")))
            if g is not None and not g.phase.final and m.get("uid") == g.fj_uid:
                # deleted by hand while its group lives: it is the user's window, put it back
                g.fj_exists, g.fj_dirty = False, True

    async def watch(self, *, standby: bool = False) -> None:
        """Start the informers; returns once each has listed its objects. On ``standby`` (a
        replica that does not lead yet) they only keep their caches, so that when it leads
        ``start`` finds the cluster listed already instead of listing it then."""
        self.standby = standby
        # the first lists build the whole cluster's objects at once: collections meanwhile
        # would each walk all that was listed so far (seconds at thousands of nodes)
        with gc_paused():
            await self._watch()

    async def _watch(self) -> None:
        await self.podsets.start_addons()  # the multi-role kinds served: their informers too
        for inf in self.informers:
            inf.muted = self.standby
        runs = [inf.start() for inf in self.informers]
        for task in runs:
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        synced = asyncio.ensure_future(self._all_synced())
        try:
            # an informer that dies (e.g. a permission is missing) ends the start instead of a hang
            waits: list[asyncio.Future[Any]] = [synced, *runs]
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            for task in runs:
                if task.done() and not task.cancelled() and task.exception() is not None:
                    raise task.exception()  # type: ignore[misc]
            await synced
        finally:
            # stopped (SIGTERM) or failed while listing: the wait goes too. (It was a gather,
            # left pending: cancelled at the loop's close, it logged "_GatheringFuture
            # exception was never retrieved"; a task cancelled is just cancelled.)
            synced.cancel()
        self._informer_runs = runs

    async def _all_synced(self) -> None:
        for inf in self.informers:
            await inf.synced.wait()

    async def catch_up(self) -> None:
        """The replica has just taken the lease: each informer's cache is made at least as
        fresh as the cluster is now before it is handed over (a standby's watch may lag, e.g.
        backing off after an API server outage; scheduling from that view would match again
        what the old leader placed). A current one costs one quorum read of one object
        (Informer.catch_up); a stale one is re-listed."""
        t0 = time.monotonic()

        async def one(inf: Informer) -> str:
            t = time.monotonic()
            path = await inf.catch_up()
            return f"{inf.kind} {path} {time.monotonic() - t:.2f}s"

        done = await asyncio.gather(*(one(inf) for inf in self.informers))
        for inf in self.informers:  # the re-listed ones run anew: their failures are watched too
            if inf.task is not None and inf.task not in self._tasks:
                self._tasks.add(inf.task)
                inf.task.add_done_callback(self._tasks.discard)
        self._informer_runs = [inf.task for inf in self.informers if inf.task is not None]
        log.info("taking over: caches made current in %.2f s (%s)", time.monotonic() - t0, ", ".join(done))

    async def take_over(self) -> None:
        """A standby's caches, made current, handed over (catch_up, then end_standby)."""
        await self.catch_up()
        self.end_standby()

    def end_standby(self) -> None:
        """The replica leads: every cached object is handed over as if just listed (ADDED), in
        one step with unmuting the informers, so that no change is missed or seen twice."""
        while not self.queue.empty():  # (what the informers of a standby made on their own)
            self.queue.get_nowait()
        for inf in self.informers:
            inf.muted = False
            for obj in inf.cache.values():
                self.queue.put_nowait((inf.kind, "ADDED", obj))
        self.standby = False

    async def start(self) -> None:
        """Start watching (unless ``watch`` did); returns once the cluster view is complete and
        state recovered."""
        if not self._informer_runs:
            await self.watch()
        elif self.standby:
            await self.take_over()
        # initial view straight from the caches; the queued ADDED events replay harmlessly
        for inf in self.informers:
            if inf.kind == "Node":
                for obj in inf.cache.values():
                    self.cluster.know_node(obj)
            elif inf.kind == "PriorityClass":
                for obj in inf.cache.values():
                    self.handle(("PriorityClass", "ADDED", obj))
            elif inf.kind in OWNER_RESOURCES or inf.kind in self.podsets.addon_on:
                for obj in inf.cache.values():
                    m = _meta(obj)
                    self.book.set_owner(inf.kind, m.get("namespace") or "default", m.get("name", ""), obj)
        await self.cluster.topology_source.load(self.cluster.topologies)  # the first graph is built with them
        self.spawn(self.cluster.topology_source.run())
        self.cluster.build_matcher()
        fjs = next(list(inf.cache.values()) for inf in self.informers if inf.kind == "FluxJob")
        pods = next(list(inf.cache.values()) for inf in self.informers if inf.kind == "Pod")
        live = {(str(_meta(p).get("namespace") or "default"), str((_meta(p).get("annotations") or {}).get(names.ANN_FLUXJOB)))
                for p in pods if (_meta(p).get("annotations") or {}).get(names.ANN_FLUXJOB)
                and assigned_node(p) and not _ended(p)}
        self.recovery.recover(fjs, live)
        if self.journal is not None:
            self.store_recovery.recover_store()
        # what neither the FluxJobs nor the store recorded, the cluster shows (exact recovery)
        self.recovery.recover_from_cluster(next(list(inf.cache.values()) for inf in self.informers if inf.kind == "Pod"), fjs)
        every = os.environ.get(CHECK_EVERY, "")
        if every:  # tests and soaks: the accounting check, logged periodically
            self.spawn(self.accounting.check_every(float(every)))
        self.ready.set()
        log.info("operator ready: %d nodes, %d groups recovered", len(self.cluster.nodes), len(self.book.groups))

    def order_replay(self) -> int:
        """The initial lists wait in the queue, to be handled as ADDED events; placing waits
        until they are (``reconciled``: every placed pod has claimed its slot again). Nodes and
        FluxJobs go last: ``start`` read them from the caches already (the graph, the node view,
        recovered groups and spent names), so handling them again changes nothing and need not
        hold up the first bind (a third of the events at 1,000 nodes). Returns how many events
        come before them."""
        first: list[Event] = []
        last: list[Event] = []
        while not self.queue.empty():
            ev = self.queue.get_nowait()
            (last if ev[0] in ("Node", "FluxJob") else first).append(ev)
        for ev in first + last:
            self.queue.put_nowait(ev)
        return len(first)

    async def run(self) -> None:
        # the start rebuilds the groups and the graph from the caches at once (see watch)
        with gc_paused():
            await self.start()
        # the initial lists, queued before ready (handle counts them down): placing waits for
        # all but the `later` part (order_replay)
        first = self.order_replay()
        self.replay_left = self.queue.qsize()
        later = self.replay_left - first
        last_cycle = last_chores = 0.0
        coalesce = self.config.coalesce_seconds
        status_wait: float | None = None  # until the next FluxJob write is due
        chores_skipped = False
        while True:
            # a burst of arrivals is matched in one cycle (at most one per `coalesce` seconds)
            # instead of one cycle per event: fewer passes over the queue, starts written together
            timeout = self.config.cycle_interval
            if self.dirty or self.cluster.foreign_dirty:
                timeout = max(0.0, last_cycle + coalesce - time.monotonic())
            if status_wait is not None:
                timeout = min(timeout, max(status_wait, coalesce))
            if chores_skipped:  # events came in since the chores last ran: run them soon
                timeout = min(timeout, coalesce)
            try:
                if timeout <= 0:  # as wait_for did: one turn of the loop, nothing taken
                    await asyncio.sleep(0)
                    raise TimeoutError
                async with asyncio.timeout(timeout):  # (no task per wake-up, unlike wait_for)
                    ev = await self.queue.get()
                self.handle(ev)
                while not self.queue.empty() and len(self._tasks) < 4096 and (
                        self.reconciled or self.replay_left > later):
                    self.handle(self.queue.get_nowait())
            except TimeoutError:
                pass
            for task in self._informer_runs:
                if task.done() and not task.cancelled() and task.exception() is not None:
                    raise task.exception()  # type: ignore[misc]  # e.g. a permission was revoked
            if self.replay_left <= later and not self.reconciled:
                self.reconciled = True
                self.recovery.reconcile()
                self.store_recovery.reconcile_store()
            now = time.monotonic()
            since = now - last_cycle
            if since >= self.config.cycle_interval or ((self.dirty or self.cluster.foreign_dirty) and since >= coalesce):
                try:
                    self.crash_point("cycle", "")  # (the leadership tests' hook holds the loop here)
                    self.scheduling.run_cycle()
                except Exception:
                    METRICS.reconcile_error("cycle")
                    log.exception("scheduling cycle failed")
                last_cycle = now
            if now - last_chores < coalesce and now != last_cycle:
                chores_skipped = True
                continue  # the O(groups) chores below run at most once per window
            last_chores, chores_skipped = now, False
            if self.status.counts_dirty:
                self.status.update_queue_gauge()
            if self.journal is not None:
                self.store_ok = self.journal.ok
            status_wait = self.status.fluxjobs_due(now)
            if status_wait == 0.0:
                self.status.start_flush()

    async def stop(self) -> None:
        if self.ready.is_set():
            self.scheduling.save_fairshare_now()  # fair share's usage survives the restart
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.journal is not None:
            await asyncio.get_running_loop().run_in_executor(None, self.journal.close)
