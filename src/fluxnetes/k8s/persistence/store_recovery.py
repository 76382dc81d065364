"""Recovery from the store (``--store``) after a restart: its live rows matched with the
groups read back from FluxJobs (``recover_store``; the queue's order and allocations whose
FluxJob status was not written), rows claimed by groups re-created from their objects
(``claim_store_record``, ``group_from_store``), groups the store saw end while their FluxJob
still says they live (``end_as_stored``), and after the reconcile the store following the
cluster (``reconcile_store``). Owned state (private): ``_store_only`` (live
rows no group has claimed yet), ``_store_allocs``, ``_stored_state``; what it needs of the
others is ``StoreSide``."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Protocol

from fluxnetes.k8s.context import Context
from fluxnetes.k8s.groups import GroupError, GroupSpec, OwnerRef, controller_of
from fluxnetes.k8s.groups.group import Group
from fluxnetes.k8s.groups.grouptable import GroupTable
from fluxnetes.k8s.objects import _meta
from fluxnetes.k8s.persistence.fluxjob import Phase
from fluxnetes.k8s.scheduling import shares
from fluxnetes.k8s.workloads import WorkloadKind, kind_of

if TYPE_CHECKING:
    from fluxnetes.k8s.cluster.mirror import ClusterView
    from fluxnetes.k8s.persistence.status import StatusWriter

# one logger for every part of the state machine: its log lines read as before the split
log = logging.getLogger("fluxnetes.k8s.controller")


class StoreSide(Protocol):
    """What recovery from the store uses of the other parts: the group book (groups, making
    one, its names and finished groups), the cluster view (matcher, nodes gone, recording an
    allocation), recovery's list of groups whose allocation is not recorded yet (a group leaves it), the status
    writer, and the controller's handling of a workload."""

    @property
    def groups(self) -> GroupTable: ...
    @property
    def cluster(self) -> ClusterView: ...
    def forget_unrecorded(self, g: Group) -> None: ...
    @property
    def status(self) -> StatusWriter: ...
    def spend_name(self, g: Group) -> None: ...
    def mark_finished(self, key: tuple[str, str]) -> None: ...
    def new_group(self, spec: GroupSpec, kind: WorkloadKind | None) -> Group: ...
    def on_owner(self, kind_name: str, etype: str, obj: dict[str, Any]) -> None: ...
    def owner_obj(self, ref: OwnerRef | None, namespace: str) -> dict[str, Any] | None: ...
    def pod_group_spec(self, pod: dict[str, Any]) -> GroupSpec: ...


class StoreRecovery:
    """What the store says after a restart, matched with the groups read back: a component of
    its own (its state is private); the other parts reach it as ``store_recovery``."""

    def __init__(self, ctx: Context, side: StoreSide) -> None:
        self._ctx, self._side = ctx, side
        # live store rows no group has claimed yet (after a restart): (namespace, name) -> record
        self._store_only: dict[tuple[str, str], Any] = {}
        self._store_allocs: dict[int, Any] = {}  # store allocations read at start, by store id
        # the state of each row taken over at start, by store id: reconcile_store skips the
        # groups whose phase is still that state (the journal would read the row and do nothing)
        self._stored_state: dict[int, str] = {}

    def unclaimed(self) -> bool:
        """Are there live store rows no group has claimed yet (after a restart)?"""
        return bool(self._store_only)

    def adopt_allocation(self, g: Group, alloc: Any, reason: str) -> bool:
        """The store recorded an allocation (made before a crash) the cluster does not show
        yet: the group runs again on exactly those nodes. False (queued again) if one of
        them is gone or down."""
        from fluxnetes.jobspec.pods import cores_for

        held = [shares.Share(node=n.name, cores=n.cores, gpus=n.gpus, memory=n.memory, extra=dict(n.extra))
                for n in alloc.nodes]
        gone = self._side.cluster.nodes_gone(s.node for s in held)
        if gone:
            g.reason = g.note = (f"allocated on {', '.join(sorted(s.node for s in held))} before the restart, "
                                 f"but {', '.join(gone)} is gone or down; matched again")
            g.fj_dirty = True
            self._side.status.group_event(g, "Warning", "Requeued", g.reason, pods=False)
            return False
        before = (g.phase, g.reason, g.start, g.expected_start)
        g.phase, g.reason = Phase.RUNNING, reason
        g.held, g.alloc = {s.node: s for s in held}, held
        per_pod = cores_for(g.spec.request.cpu_millis)
        g.slots = shares.slots_per_node(held, g.spec.size, per_pod, g.spec.exclusive)
        g.slot_pod, g.released = [None] * len(g.slots), set()
        covered = _covered_slots(g, held, per_pod)
        if covered is not None and len(covered) < g.spec.size:
            # pods of it ended before the crash (the store records what it held at its last
            # write): only the slots its amounts hold stay open, the others are given back. Laid
            # out over all of ``size`` instead, an open slot without a share would take a new
            # pod of the group onto room the graph gives to others (overbooking). Which slots
            # ended is not known here: the highest are given back (a live pod at one of them
            # counts as foreign: its node charged, never double-booked).
            g.slots = covered + [covered[-1] if covered else held[0].node] * (g.spec.size - len(covered))
            g.slot_pod = [None] * len(g.slots)
            g.released = set(range(len(covered), g.spec.size))
        g.start, g.resumed, g.fj_dirty, g.recovered = alloc.at, True, True, True
        g.expected_start = None
        g.jobid = self._side.cluster.matcher.next_jobid
        if not self._side.cluster.record_group(g):
            # the graph has no room for it (something recorded first holds its nodes): not
            # running here, so its placed pods are followed as foreign pods (their nodes
            # charged until they go) instead of members of an allocation the graph never saw
            (g.phase, g.reason, g.start, g.expected_start), g.jobid = before, None
            g.held, g.alloc, g.slots, g.slot_pod, g.released = {}, [], [], [], set()
            g.resumed = g.recovered = False
            return False
        self._side.status.counts_changed()
        self._ctx.dirty = True
        self._side.status.group_event(g, "Normal", "Recovered",
                         f"{reason}: job {g.jobid} on {','.join(sorted(set(g.slots)))}", pods=False)
        return True

    def group_from_store(self, pod: dict[str, Any], key: tuple[str, str]) -> Group | None:
        """A pod placed before a crash that came before its FluxJob was created: the store row
        (with the allocation) is all that is left of its group. The group is made again from
        the pod (or its Job) and takes the row over, so the pod is adopted, not foreign."""
        if key not in self._store_only:
            return None
        owner = controller_of(_meta(pod))
        okind = kind_of(owner.kind) if owner else None
        if owner is not None and okind is not None and okind.resume_patch({}) is not None:
            obj = self._side.owner_obj(owner, key[0])
            if obj is not None:
                self._side.on_owner(owner.kind, "ADDED", obj)  # a Job: its group comes from the Job
            return self._side.groups.get(key)
        try:
            spec = self._side.pod_group_spec(pod)
        except GroupError:
            return None
        if spec.key != key:
            return None
        g = self._side.new_group(spec, kind_of(spec.owner.kind) if spec.owner else None)
        self.claim_store_record(g)
        return g

    def recover_store(self) -> None:
        """The queue's memory after a restart: live store rows, matched with the groups
        recovered from FluxJobs. The store gives the queue order (submit time) and allocations
        whose FluxJob status was not written before the crash; rows no group matches wait in
        ``store_only`` for their objects (replayed pods and owners) and are cancelled by
        ``reconcile_store`` if none shows up."""
        assert self._ctx.journal is not None
        allocs = self._store_allocs = self._ctx.journal.allocations()
        for rec in self._ctx.journal.live_jobs():
            key = (rec.namespace, rec.name)
            g = self._side.groups.get(key)
            if g is None or g.store_id is not None:
                older = self._store_only.get(key)
                if older is not None:  # two live rows for one name: the newer one counts
                    self._ctx.journal.cancel(older.id, self._ctx.now(), "superseded by a newer submission")
                self._store_only[key] = rec
                continue
            self.adopt_store_record(g, rec, allocs.get(rec.id))
        self.end_as_stored()
        log.info("store: %d live jobs read back, %d wait for their objects",
                 sum(1 for g in self._side.groups.values() if g.store_id is not None), len(self._store_only))

    def end_as_stored(self) -> None:
        """Workload groups read back from FluxJobs that still say they live, while the store
        saw them end (their last status write was lost with the leader, e.g. during an API
        server outage): they are over. Their surviving pods, if any (a group failed by node
        loss), count as foreign pods; nothing is queued or held for them again."""
        from fluxnetes.k8s.persistence.journal import TERMINAL

        assert self._ctx.journal is not None  # (only with --store)
        for g in list(self._side.groups.values()):
            if g.store_id is not None or g.phase.final or not g.fj_exists or g.spec.owner is None:
                continue
            rec = self._ctx.journal.store.find(g.spec.namespace, g.spec.name, g.spec.owner.uid)
            if rec is None or str(rec.state) not in TERMINAL:
                continue
            if g.jobid is not None and g.jobid in self._side.cluster.matcher.jobs:
                self._side.cluster.matcher.cancel(g.jobid)
            self._side.forget_unrecorded(g)
            g.held, g.alloc, g.jobid = {}, [], None
            g.slot_pod = [None] * len(g.slots)
            g.store_id, g.store_uid = rec.id, rec.uid
            phase = {"completed": Phase.COMPLETED, "failed": Phase.FAILED, "cancelled": Phase.CANCELLED,
                     "unsatisfiable": Phase.UNSATISFIABLE}[str(rec.state)]
            g.phase, g.reason = phase, f"{rec.reason} (as the store recorded it before a restart)"
            g.end = g.end or self._ctx.now()
            g.fj_dirty = True
            self._side.mark_finished(g.key)
            self._side.spend_name(g)
            log.info("%s: ended before the restart (store: %s); its FluxJob said %s", g.qid, rec.state,
                     (g.fj_status or {}).get("phase", "nothing"))

    def adopt_store_record(self, g: Group, rec: Any, alloc: Any) -> None:
        assert self._ctx.journal is not None  # (only with --store)
        g.store_id, g.store_uid = rec.id, rec.uid
        self._stored_state[rec.id] = str(rec.state)
        self._ctx.journal.remember((rec.namespace, rec.name, rec.uid), rec.id)
        g.submit = rec.submit_time  # the queue's order survives the restart
        if str(rec.state) == "running" and g.phase != Phase.RUNNING and alloc is not None and alloc.nodes:
            # allocated before the crash, FluxJob status not written yet: the store knows
            self.adopt_allocation(g, alloc, "allocated (recovered from the store)")

    def claim_store_record(self, g: Group, adopt: bool = True) -> None:
        """A group re-created from cluster objects takes over its store row (same object).
        ``adopt``: a row that says running takes its allocation too (False: the caller
        reads the group's placed pods first, ``stored_allocation``)."""
        rec = self._store_only.get(g.key)
        if rec is None:
            return
        uid = g.spec.owner.uid if g.spec.owner else next(iter(g.members), "")
        if rec.uid != uid and g.spec.owner is not None:
            return  # another object with the same name: the old row is cancelled at reconcile
        del self._store_only[g.key]
        assert self._ctx.journal is not None  # (a row was read: there is a store)
        g.store_id, g.store_uid, g.submit = rec.id, rec.uid, rec.submit_time
        self._stored_state[rec.id] = str(rec.state)
        self._ctx.journal.remember((rec.namespace, rec.name, rec.uid), rec.id)
        alloc = self._store_allocs.get(rec.id)
        if adopt and str(rec.state) == "running" and alloc is not None and alloc.nodes and g.phase == Phase.PROVISIONAL:
            # allocated before the crash, before its FluxJob was even created: the store knows
            self.adopt_allocation(g, alloc, "allocated (recovered from the store)")

    def stored_allocation(self, g: Group) -> Any | None:
        """The allocation the store recorded for ``g``'s claimed row when it says running (what
        the group held at its last store write), else None."""
        if g.store_id is None or self._stored_state.get(g.store_id) != "running":
            return None
        alloc = self._store_allocs.get(g.store_id)
        return alloc if alloc is not None and alloc.nodes else None

    def reconcile_store(self) -> None:
        """After the post-restart reconcile: the store follows the cluster. A group whose row
        was read at start in the state its phase maps to is skipped: the journal would read
        the row and find nothing to do, and making its record dumps the jobspec as YAML (about
        0.3 ms each): at 5,800 groups that was ~2 s of CPU on the event loop right before the
        first cycle after a restart, and 5,800 reads on the store thread (issue 17). A row
        written since (a decision of this process) was written by that decision already."""
        if self._ctx.journal is None:
            return
        from fluxnetes.k8s.persistence.journal import _STATE

        now = self._ctx.now()
        for g in self._side.groups.values():
            if g.phase == Phase.PROVISIONAL:
                continue
            if g.store_id is not None and self._stored_state.get(g.store_id) == _STATE[g.phase]:
                continue
            self._ctx.journal.record(self._side.status.group_record(g), now)
        for rec in self._store_only.values():
            self._ctx.journal.cancel(rec.id, now, "its objects are gone (found after a restart)")
        self._store_only.clear()
        self._store_allocs = {}  # only needed to take rows over during the replay
        self._stored_state = {}


def _covered_slots(g: Group, held: list[shares.Share], per_pod: int) -> list[str] | None:
    """The node of each slot ``held`` gives room to (a pod's cores each), when fluxnetes derived
    the group's jobspec from its pods' requests (one set, not exclusive); None otherwise (a
    user's jobspec says nothing of a pod's share)."""
    if g.spec.exclusive or g.spec.jobspec or g.sets or per_pod <= 0 or not held:
        return None
    return sorted(s.node for s in held for _ in range(s.cores // per_pod))
