"""A group's allocation from start to release: ``start_group`` records the matcher's answer
(slots per node, shares held), ``assign`` gives each gated member a slot and ``place`` pins it
(node affinity + ungate, or a Binding when fluxnetes is the pod's scheduler: k8s/scheduling/placement.py),
``resume`` lets a held Job go, ``evict`` restarts a gang (--on-node-lost requeue);
``release_slot`` / ``release_all`` give shares back (partial_cancel / cancel), ``finish_group``
and ``cancel_group`` end a group. Most crash points of the restart tests are here
(crashpoints.py). Owned state: ``_hold_placement``. A component: what it needs of the
others is ``AllocationSide``."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

from fluxnetes.k8s.admission import hold
from fluxnetes.k8s.context import Context
from fluxnetes.k8s.groups import OwnerRef
from fluxnetes.k8s.groups.groupbook import QUEUED, Group
from fluxnetes.k8s.kube import JSON_PATCH, PODS, ApiError
from fluxnetes.k8s.objects import _ended, _gated, _meta, _terminal, workload_resource
from fluxnetes.k8s.persistence.fluxjob import Phase
from fluxnetes.k8s.scheduling import allocation_note, shares
from fluxnetes.k8s.scheduling.placement import binding, place_patch
from fluxnetes.logging import log_context
from fluxnetes.metrics import METRICS

if TYPE_CHECKING:
    from fluxnetes.k8s.cluster.mirror import ClusterView
    from fluxnetes.k8s.persistence.status import StatusWriter
    from fluxnetes.match.results import MatchResult

# one logger for every part of the state machine: its log lines read as before the split
log = logging.getLogger("fluxnetes.k8s.controller")


class Owners(Protocol):
    """The group book as allocation sees it: the workload objects (groups/groupbook.py)."""

    def owner_obj(self, ref: OwnerRef | None, namespace: str) -> dict[str, Any] | None: ...


class SetSlots(Protocol):
    """The slots of multi-role workloads' pod sets (groups/podset_groups.py)."""

    def slots_of_sets(self, g: Group, res: MatchResult) -> None: ...
    def set_slots(self, g: Group, pod: Mapping[str, Any], free: list[int]) -> tuple[list[int], int | None]: ...
    def slot_share(self, g: Group, slot: int, held: shares.Share) -> shares.Share: ...


class AllocationSide(Protocol):
    """What allocation uses of the other parts: the cluster view (matcher, the queue's
    scheduler), the status writer, the workload objects and the pod sets' slots."""

    @property
    def cluster(self) -> ClusterView: ...
    @property
    def status(self) -> StatusWriter: ...
    @property
    def book(self) -> Owners: ...
    @property
    def podsets(self) -> SetSlots: ...


class Allocation:
    """Start, place, resume, evict, release: a component (its state is private); the other
    parts reach it as ``allocation``."""

    def __init__(self, ctx: Context, side: AllocationSide) -> None:
        self._ctx, self._side = ctx, side
        self._hold_placement = False  # a restart test's hook held placement back: never place

    def start_group(self, g: Group, res: MatchResult) -> None:
        g.jobid = res.jobid
        held = shares.from_match(res.nodes)
        g.held = {s.node: s for s in held}
        g.alloc = list(held)
        from fluxnetes.jobspec.pods import cores_for

        g.slots = shares.slots_per_node(held, g.spec.size, cores_for(g.spec.request.cpu_millis), g.spec.exclusive)
        g.slot_pod = [None] * len(g.slots)
        if g.sets:  # a multi-role workload: each pod set's slots (k8s/groups/podset_groups.py)
            self._side.podsets.slots_of_sets(g, res)
        g.released = set()
        g.start = self._ctx.now()
        g.expected_start = None
        g.recovered = g.suspending = False
        METRICS.allocations.inc()
        nodes = ",".join(sorted(set(g.slots)))
        self._side.status.set_phase(g, Phase.RUNNING, f"allocated on {nodes}" + (f" ({g.note})" if g.note else ""))
        g.note = ""
        if g.spec.size > 1:  # (a group of one pod: its pod's Scheduled Event says it; see enqueue)
            self._side.status.group_event(g, "Normal", "Allocated", f"job {g.jobid} allocated on {nodes}", pods=False)
        self._ctx.crash_point("allocated", g.qid)  # the store has the allocation; nothing else does
        if self._ctx.crash_point("placement", g.qid):
            self._hold_placement = True  # a restart test's hook: no pod placed, the Job not resumed
            return
        owner = self._side.book.owner_obj(g.spec.owner, g.spec.namespace) or {}
        if g.kind is not None and g.kind.resume_patch(owner) and g.kind.held_by_fluxnetes(owner):
            g.resumed = True
            self._ctx.spawn(self.resume(g))
        self.assign(g)

    def assign(self, g: Group) -> None:
        """Give every gated member without a slot a free slot, and pin it there."""
        if g.phase != Phase.RUNNING or not self._ctx.reconciled or self._hold_placement:
            return  # after a restart, wait until every placed pod has claimed its slot again
        taken = {u for u in g.slot_pod if u}
        for uid, pod in sorted(g.members.items(), key=lambda kv: _meta(kv[1]).get("name", "")):
            if uid in taken or not _gated(pod) or _terminal(pod):
                continue
            want = g.kind.slot_of(pod) if g.kind else None
            free = [i for i in range(len(g.slots)) if g.slot_pod[i] is None and i not in g.released]
            if g.slot_set:  # a slot of the pod's own set, its index's if free
                free, want = self._side.podsets.set_slots(g, pod, free)
                if not free:
                    continue
            if not free:
                break
            slot = want if want in free else free[0]
            g.slot_pod[slot] = uid
            taken.add(uid)
            self._ctx.spawn(self.place(g, pod, slot))

    async def place(self, g: Group, pod: dict[str, Any], slot: int) -> None:
        node = g.slots[slot]
        m = _meta(pod)
        uid = m.get("uid")
        jobid = g.jobid

        def still() -> bool:  # the slot is still this pod's, in the same allocation
            return (g.phase == Phase.RUNNING and g.jobid == jobid and slot < len(g.slot_pod)
                    and g.slot_pod[slot] == uid and slot not in g.released)

        # the whole allocation rides on each placement of a multi-pod group: a crash after
        # some of its pods were placed, before any record of it, is recovered exactly from
        # any of them (persistence/adoption.py ``adopt_annotated``)
        if g.alloc_note is None or g.alloc_note[0] != g.jobid:  # once per allocation, not per pod
            g.alloc_note = (g.jobid, None if g.sets else allocation_note.encode(g.jobid, g.slots, g.alloc))
        note = g.alloc_note[1]
        if self._ctx.crash_point("pod-place", g.qid, pod=uid):
            return  # a restart test's hook holds this pod's placement back (a group placed in part)
        try:
            if hold.gated(pod):  # pin by node affinity and lift the gate in one update
                patch = place_patch(pod, node, jobid=g.jobid, fluxjob=g.spec.name, slot=slot, allocation=note)
                if patch is None:
                    return
                done = await self._ctx.until_answered(
                    lambda: self._ctx.kube.patch(PODS, m["name"], patch, m.get("namespace"), content_type=JSON_PATCH),
                    still, f"placing {m.get('namespace')}/{m.get('name')} on {node}")
            elif hold.is_held(pod):  # fluxnetes is the pod's scheduler: bind it
                body = binding(pod, node, jobid=g.jobid, fluxjob=g.spec.name, slot=slot, allocation=note)
                done = await self._ctx.until_answered(
                    lambda: self._ctx.kube.request("POST", PODS.path(m.get("namespace"), m["name"], "binding"), body),
                    still, f"binding {m.get('namespace')}/{m.get('name')} to {node}")
            else:
                return
            if done is None:
                return  # the slot or the group went away while the API server was away
        except ApiError as exc:
            METRICS.reconcile_error("placement")
            with log_context(job=g.qid, group=g.spec.name, namespace=g.spec.namespace, pod=m.get("name"), node=node):
                log.info("placing %s/%s on %s: %s", m.get("namespace"), m.get("name"), node, exc)
            return
        METRICS.allocated_pods.inc()
        self._ctx.crash_point("pod-placed", g.qid, pod=uid, size=g.spec.size)
        if not hold.gated(pod):  # a pinned pod gets its Scheduled Event from kube-scheduler
            self._side.status.event(self._side.status.pod_ref(pod), "Normal", "Scheduled",
                       f"fluxnetes placed the pod on {node} (job {g.jobid}, slot {slot})")

    async def resume(self, g: Group) -> None:
        if g.kind is None or g.spec.owner is None:
            return
        owner = self._side.book.owner_obj(g.spec.owner, g.spec.namespace)
        body = g.kind.resume_patch(owner or {})
        if body is None:
            return
        from fluxnetes.k8s.workloads.base import ANN_SUSPENDED_BY

        # fluxnetes' hold mark comes off with the hold, in the same write: a suspension seen
        # later without it is its user's, also by a leader that saw no change (one suspended
        # while no operator ran: Recovery.reconcile, GroupBook.suspended_while_away)
        body = {**body, "metadata": {"annotations": {ANN_SUSPENDED_BY: None}}}
        res = workload_resource(g.kind)
        owner_name, jobid = g.spec.owner.name, g.jobid
        try:
            done = await self._ctx.until_answered(
                lambda: self._ctx.kube.patch(res, owner_name, body, g.spec.namespace),
                lambda: g.phase == Phase.RUNNING and g.jobid == jobid, f"resuming {g.qid}")
            if done is None:
                return
        except ApiError as exc:
            METRICS.reconcile_error("job")
            with log_context(job=g.qid, group=g.spec.name, namespace=g.spec.namespace):
                log.warning("resuming %s: %s", g.qid, exc)
            return
        self._ctx.crash_point("resumed", g.qid)  # the Job runs; no FluxJob status says so

    def drop_hold_mark(self, g: Group) -> None:
        """Its user suspended the group's workload after it was let go: fluxnetes' hold mark
        comes off it (one resumed by an earlier version of fluxnetes kept it), so that the
        suspension reads as the user's in the object itself. ``Group.suspended_by_user`` is this leader's memory
        only; the next one (a restart, a leader change) reads the object, and with the mark
        still on took the suspension for its own hold and resumed the workload."""
        from fluxnetes.k8s.workloads.base import ANN_SUSPENDED_BY

        if g.kind is None or g.spec.owner is None:
            return
        res, name, ns = workload_resource(g.kind), g.spec.owner.name, g.spec.namespace

        async def drop() -> None:
            try:  # (a merge patch: null removes the annotation)
                await self._ctx.kube.patch(res, name, {"metadata": {"annotations": {ANN_SUSPENDED_BY: None}}}, ns)
            except ApiError as exc:
                log.warning("%s: fluxnetes' hold mark not taken off its suspended workload: %s", g.qid, exc)

        self._ctx.spawn(drop())

    async def evict(self, g: Group, pods: list[dict[str, Any]] | None = None) -> None:
        assert g.kind is not None and g.spec.owner is not None
        try:
            if g.kind.resume_patch({}) is not None:  # Job: suspending deletes its active pods
                from fluxnetes.k8s.workloads.job import ANN_SUSPENDED_BY, SUSPENDED_BY_US

                g.suspending = True  # (its suspension is not its user's: groupbook.suspension)
                # marked as fluxnetes' own hold, so it is resumed when allocated again
                body = {"metadata": {"annotations": {ANN_SUSPENDED_BY: SUSPENDED_BY_US}}, "spec": {"suspend": True}}
                suspend_at = getattr(g.kind, "suspend_path", None)  # a multi-role kind's own field
                if suspend_at is not None:
                    held: dict[str, Any] = {suspend_at[-1]: True}
                    for part in reversed(suspend_at[1:-1]):
                        held = {part: held}
                    body["spec"] = held
                await self._ctx.kube.patch(workload_resource(g.kind), g.spec.owner.name, body, g.spec.namespace)
            else:
                for pod in list(g.members.values()) if pods is None else pods:
                    await self._ctx.kube.delete(PODS, _meta(pod).get("name", ""), g.spec.namespace)
        except ApiError as exc:
            log.warning("requeue of %s: %s", g.qid, exc)

    def release_slot(self, g: Group, slot: int) -> None:
        if slot in g.released or slot >= len(g.slots):
            return
        node = g.slots[slot]
        left_on_node = [i for i, n in enumerate(g.slots) if n == node and i not in g.released]
        held = g.held.get(node)
        g.released.add(slot)
        g.holdings_changed()
        if held is None:
            return
        part = (self._side.podsets.slot_share(g, slot, held) if g.slot_set and len(left_on_node) > 1
                else held.slot_part(len(left_on_node)))
        rest = held - part
        if rest.empty:
            g.held.pop(node, None)
            if g.held and self._ctx.journal is not None:
                self._ctx.journal.release_nodes(self._side.status.group_record(g), [node], self._ctx.now(), "its pods ended")
        else:
            g.held[node] = rest
            if self._ctx.journal is not None and not part.empty:
                # what it holds on the node now, or a restart from the store would lay the
                # group out with the node's old amount (the ended pod's cores held until the
                # group ends)
                self._ctx.journal.release_part(self._side.status.group_record(g), rest, self._ctx.now())
        if not g.held:
            self.release_all(g)
        elif not part.empty:
            METRICS.release("partial")
            try:
                self._side.cluster.matcher.partial_cancel(g.jobid, shares.to_match([part]))
            except Exception as exc:
                log.warning("partial release of %s on %s failed: %s", g.qid, node, exc)
            # wakes only the jobs that could use that node, counting it as freed by this much
            self._side.cluster.scheduler.released_part(g.qid, node, part.cores)
        g.fj_dirty = True
        self._ctx.dirty = True

    def release_all(self, g: Group) -> None:
        if g.jobid is not None:
            with contextlib.suppress(Exception):
                self._side.cluster.matcher.cancel(g.jobid)
        self._side.cluster.scheduler.running.pop(g.qid, None)
        self._side.cluster.scheduler.freed(set(g.slots) or None)  # wakes the jobs that could use these nodes
        g.held.clear()
        g.released = set(range(len(g.slots)))  # (told to the table: fair share sees the end)
        self._ctx.dirty = True

    def release_idle_slots(self, g: Group) -> None:
        """A running group is cancelled (its workload deleted, scaled down, ...): the slots
        with no pod are given back now; a slot whose pod is still there (running, being
        deleted, or its bind in flight) only once that pod is gone or has ended
        (``member_gone``), as its kubelet and kube-scheduler still count it on its node."""
        for slot, uid in enumerate(g.slot_pod):
            pod = g.members.get(uid) if uid is not None else None
            if pod is None or _ended(pod):
                self.release_slot(g, slot)
        for slot in range(len(g.slot_pod), len(g.slots)):
            self.release_slot(g, slot)
        if not g.held:  # (also when release_slot did: a group with no slot has none to empty)
            self.release_all(g)

    def finish_group(self, g: Group) -> None:
        self.release_all(g)
        g.end = self._ctx.now()
        ok = g.failed_pods == 0
        complete = False
        why = f"{g.failed_pods} pod(s) failed"
        if g.kind is not None:
            owner = self._side.book.owner_obj(g.spec.owner, g.spec.namespace)
            for c in ((owner or {}).get("status") or {}).get("conditions") or []:
                if c.get("status") != "True":
                    continue
                if c.get("type") in ("Failed", "FailureTarget"):
                    ok = False
                    # the workload's own word (a Job's DeadlineExceeded, BackoffLimitExceeded):
                    # its pods may all have been stopped rather than failed
                    why = _condition_text(g.kind.kind, g.spec.owner.name if g.spec.owner else "", c) or why
                elif c.get("type") in ("Complete", "SuccessCriteriaMet"):
                    complete = True
            if g.kind.addon and owner is not None and g.kind.finished(owner):
                # a multi-role workload's own outcome (MPIJob Succeeded, JobSet Completed, ...):
                # its controller deleting the pods left running after it is not a cancel
                ok = complete = not g.kind.failed(owner)
        if ok and g.deleted_pods and not complete:
            # its pods were deleted while they ran: the work was stopped, not finished
            reason = f"pods deleted: {g.deleted_pods} pod(s) of the group were deleted before they finished"
            self._side.status.set_phase(g, Phase.CANCELLED, reason)
            self._side.status.group_event(g, "Normal", "Cancelled", reason, pods=False)
            return
        phase = Phase.COMPLETED if ok else Phase.FAILED
        self._side.status.set_phase(g, phase, "all pods finished" if ok else why)
        if ok and g.spec.size == 1:
            # a group of one pod that succeeded: its pod's phase, its FluxJob's conditions and
            # its workload's own Event (a Job's Completed) say it; one Event more per pod is a
            # write kube-scheduler's path does not make (issue 31). A failure keeps its Warning.
            return
        self._side.status.group_event(g, "Normal" if ok else "Warning", str(phase), g.reason, pods=False)

    def cancel_group(self, g: Group, reason: str) -> None:
        if g.phase == Phase.RUNNING:
            self.release_idle_slots(g)
        elif g.phase in QUEUED:
            self._side.cluster.scheduler.withdraw(g.qid)
        g.end = self._ctx.now()
        self._side.status.set_phase(g, Phase.CANCELLED, reason)
        self._side.status.group_event(g, "Normal", "Cancelled", reason, pods=False)
        self._ctx.dirty = True


def _condition_text(kind: str, name: str, cond: Mapping[str, Any]) -> str:
    """'Job x failed: DeadlineExceeded: Job was active longer than specified deadline'."""
    reason, message = str(cond.get("reason") or ""), str(cond.get("message") or "")
    if not reason and not message:
        return ""
    return f"{kind} {name} failed: " + ": ".join(t for t in (reason, message) if t)
