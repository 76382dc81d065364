"""The group book: which group every managed pod belongs to, and each group's life before
and after its allocation. A group (``Group``) is one FluxJob: a workload's pods (Job,
ReplicaSet, StatefulSet, Deployment: its owner, matched by uid), a label group or a single
pod. Jobs are complete at creation and queue at once; pod-made groups wait Provisional until
``size`` gated pods exist (``join_group`` / ``add_member``); a pod that goes gives back its
slot or is replaced (``member_gone``); groups that are over are forgotten (``prune_finished``).
Owned state: ``groups``, ``member_of`` (pod uid -> group key), ``parked`` (pods waiting for
their owner to be seen), ``owners`` and ``priority_classes`` (the watched objects groups are
made from), ``finished`` and ``pruned``."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Protocol

from fluxnetes.k8s.context import Context
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
from fluxnetes.k8s.groups.group import Group as Group  # re-exported: the parts import it from here
from fluxnetes.k8s.groups.grouptable import GroupTable
from fluxnetes.k8s.objects import _ended, _gated, _meta
from fluxnetes.k8s.persistence.fluxjob import Phase
from fluxnetes.k8s.workloads import WorkloadKind, kind_of
from fluxnetes.k8s.workloads.base import marked_suspended_by_us

if TYPE_CHECKING:
    from fluxnetes.k8s.cluster.mirror import ClusterView
    from fluxnetes.k8s.persistence.status import StatusWriter
    from fluxnetes.k8s.persistence.store_recovery import StoreRecovery

# one logger for every part of the state machine: its log lines read as before the split
log = logging.getLogger("fluxnetes.k8s.controller")

QUEUED = (Phase.PENDING, Phase.RESERVED)
# every group over but kept is looked at again at least this often (see prune_finished)
PRUNE_SWEEP_SECONDS = 10
class BookAllocation(Protocol):
    """Allocation as the group book sees it (scheduling/allocation.py)."""

    def assign(self, g: Group) -> None: ...
    def cancel_group(self, g: Group, reason: str) -> None: ...
    def finish_group(self, g: Group) -> None: ...
    def release_all(self, g: Group) -> None: ...
    def release_slot(self, g: Group, slot: int) -> None: ...
    def drop_hold_mark(self, g: Group) -> None: ...


class BookScaling(Protocol):
    """A workload's family of groups as the group book sees it (groups/scaling.py)."""

    @property
    def scale_groups(self) -> Mapping[tuple[str, str], Sequence[tuple[str, str]]]: ...
    def base_key(self, g: Group) -> tuple[str, str] | None: ...
    def capacity(self, g: Group) -> int: ...
    def family(self, base: tuple[str, str], stuck: bool = False) -> list[Group]: ...
    def family_capacity(self, base: tuple[str, str]) -> int: ...
    def follow_owner(self, kind_name: str, namespace: str, name: str) -> None: ...
    def index_group(self, g: Group) -> None: ...
    def index_scale_group(self, g: Group) -> None: ...
    def forget_group(self, g: Group) -> None: ...
    def name_for_new_group(self, spec: GroupSpec) -> GroupSpec: ...
    def replacement_group(self, base: tuple[str, str], kind: WorkloadKind,
                          obj: Mapping[str, Any]) -> Group | None: ...
    def route_pod(self, base: tuple[str, str], kind: WorkloadKind, pod: Mapping[str, Any]) -> Group | None: ...
    def job_grown(self, base: tuple[str, str], kind: WorkloadKind, obj: Mapping[str, Any]) -> None: ...


class BookPodSets(Protocol):
    """Multi-role workloads as the group book sees them (groups/podset_groups.py)."""

    def join_addon(self, uid: str, pod: dict[str, Any]) -> bool: ...


class BookSide(Protocol):
    """What the group book uses of the other parts."""

    @property
    def cluster(self) -> ClusterView: ...
    @property
    def status(self) -> StatusWriter: ...
    @property
    def store_recovery(self) -> StoreRecovery: ...
    @property
    def allocation(self) -> BookAllocation: ...
    @property
    def scaling(self) -> BookScaling: ...
    @property
    def podsets(self) -> BookPodSets: ...


class GroupBook:
    """Pod -> group membership, group specs from workload kinds, pruning: a component (its
    state is private: the others read it through the read-only views below and change it
    through its methods); the other parts reach it as ``book``."""

    def __init__(self, ctx: Context, side: BookSide) -> None:
        self._ctx, self._side = ctx, side
        self._owners: dict[tuple[str, str, str], dict[str, Any]] = {}
        self._priority_classes: dict[str, int] = {}
        self._groups = GroupTable()
        self._member_of: dict[str, tuple[str, str]] = {}
        self._parked: dict[str, dict[str, Any]] = {}  # pods waiting for their owner to be seen
        # groups that reached a final phase (candidates for pruning) and counts of pruned ones
        self._finished: set[tuple[str, str]] = set()
        self._pruned: dict[str, int] = {}
        # which of them to look at on the next prune (see prune_finished): those that became
        # final or had something change that kept them, and, per owner, those kept because
        # that owner had not finished (looked at again when it changes)
        self._prune_check: set[tuple[str, str]] = set()
        self._prune_waits: dict[tuple[str, str, str], set[tuple[str, str]]] = {}
        self._prune_swept = float("-inf")

    # ---------------------------------------------------------------- read by the other parts
    @property
    def groups(self) -> GroupTable:
        """The groups by key (the table is the book's: groups enter it through ``new_group``
        and ``add_recovered`` and leave it through ``drop_group``)."""
        return self._groups

    @property
    def member_of(self) -> Mapping[str, tuple[str, str]]:
        return MappingProxyType(self._member_of)

    @property
    def owners(self) -> Mapping[tuple[str, str, str], dict[str, Any]]:
        return MappingProxyType(self._owners)

    @property
    def parked(self) -> Mapping[str, dict[str, Any]]:
        return MappingProxyType(self._parked)

    @property
    def priority_classes(self) -> Mapping[str, int]:
        return MappingProxyType(self._priority_classes)

    @property
    def finished(self) -> AbstractSet[tuple[str, str]]:
        return frozenset(self._finished)

    @property
    def pruned(self) -> Mapping[str, int]:
        return MappingProxyType(self._pruned)

    # ---------------------------------------------------------------- told by the other parts
    def set_member(self, uid: str, key: tuple[str, str]) -> None:
        """The pod ``uid`` belongs to group ``key`` (recovery: a placed pod claimed again)."""
        self._member_of[uid] = key

    def drop_member(self, uid: str) -> None:
        self._member_of.pop(uid, None)

    def set_owner(self, kind_name: str, namespace: str, name: str, obj: dict[str, Any]) -> None:
        """A workload object listed or changed."""
        self._owners[(kind_name, namespace, name)] = obj

    def owner_deleted(self, kind_name: str, namespace: str, name: str, uid: str) -> None:
        """A workload object was deleted (a re-list may show its successor of the same name
        first: that one is kept)."""
        key = (kind_name, namespace, name)
        cached = self._owners.get(key)
        if cached is None or _meta(cached).get("uid") in (None, "", uid):
            self._owners.pop(key, None)

    def park(self, uid: str, pod: dict[str, Any]) -> None:
        """A pod waits for its owner (or its multi-role workload) to be seen."""
        self._parked[uid] = pod

    def unpark(self, uid: str) -> dict[str, Any] | None:
        return self._parked.pop(uid, None)

    def on_priority_class(self, etype: str, obj: Mapping[str, Any]) -> None:
        name = str(_meta(obj).get("name", ""))
        if etype == "DELETED":
            self._priority_classes.pop(name, None)
        else:
            self._priority_classes[name] = int(obj.get("value") or 0)
            if obj.get("globalDefault"):
                self._priority_classes[""] = int(obj.get("value") or 0)

    def add_recovered(self, g: Group) -> None:
        """A group read back after a restart (recovery.py, from its FluxJob)."""
        self._groups[g.key] = g
        self._side.scaling.index_scale_group(g)

    def owner_obj(self, ref: OwnerRef | None, namespace: str) -> dict[str, Any] | None:
        if ref is None:
            return None
        obj = self._owners.get((ref.kind, namespace, ref.name))
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
            return self._priority_classes.get(str(pc), 0)
        return self._priority_classes.get("", 0)  # the globalDefault class, if any

    def make_jobspec(self, g: Group) -> Any:
        from fluxnetes.jobspec import PodRequest, jobspec_from_pods, parse_jobspec

        if g.spec.jobspec:
            return parse_jobspec(g.spec.jobspec)
        r = g.spec.request
        req = PodRequest(r.cpu_millis, r.memory_bytes, r.gpus, dict(r.extended))
        return jobspec_from_pods(g.spec.size, req, duration=g.spec.duration, exclusive_nodes=g.spec.exclusive,
                                 name=g.spec.name[:60], locality=g.spec.locality)

    # ---------------------------------------------------------------- groups
    def new_group(self, spec: GroupSpec, kind: WorkloadKind | None) -> Group:
        g = Group(spec=spec, kind=kind)
        try:
            g.jobspec = self.make_jobspec(g)
        except Exception as exc:
            g.phase, g.reason = Phase.UNSATISFIABLE, f"invalid jobspec: {exc}"
            self.mark_finished(spec.key)
            self._side.status.group_event(g, "Warning", "InvalidJobspec", g.reason, pods=False)
        self._groups[spec.key] = g
        self._side.scaling.index_group(g)
        return g

    def enqueue(self, g: Group) -> None:
        if g.phase != Phase.PROVISIONAL:
            return
        if self._side.store_recovery.unclaimed():
            self._side.store_recovery.claim_store_record(g)
            if g.phase != Phase.PROVISIONAL:
                return  # allocated before the restart (the store knew): running again
        g.submit = g.submit or self._ctx.now()
        self._side.status.set_phase(g, Phase.PENDING, "queued")
        # one Event for the group (on its FluxJob), not one per pod as well: the API server's
        # writes per pod (issue 17); the pods' own Events come with placement. None for a
        # group of one pod: its FluxJob's conditions say it, and its pod's Scheduled Event
        # is then all the Events it costs, as on kube-scheduler's path
        if g.spec.size > 1:
            self._side.status.group_event(g, "Normal", "Queued", f"group of {g.spec.size} pods queued", pods=False)
        self._ctx.dirty = True

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

    def drop_earlier_owner(self, gkey: tuple[str, str], reason: str) -> None:
        """Owners are matched by uid: a workload object with an earlier one's name (deleted and
        created again) is a new workload. The earlier one's groups are over (what they hold is
        given back) and forgotten, so they never answer for the new one."""
        for k in [*self._side.scaling.scale_groups.get(gkey, ()), gkey]:
            old = self._groups.get(k)
            if old is None:
                continue
            if not old.phase.final:
                self._side.allocation.cancel_group(old, reason)
            self.drop_group(old)

    def workload_finished(self, g: Group, kind: WorkloadKind, obj: Mapping[str, Any]) -> None:
        """The group's workload is over (a Job's Complete/Failed condition). A running group
        gives everything back; a group not allocated (in this operator's life: its Job ran
        before a restart, or was resumed by someone else) is never queued again and ends with
        its workload's outcome."""
        if g.phase == Phase.RUNNING:
            # a node is given back once the pod on it has ended or gone, not when the workload
            # says it is over: an MPIJob is Succeeded when its launcher ends, while its workers
            # run on until the MPI Operator deletes them (minutes, under load); the next gang
            # placed on their nodes would start its launcher and leave its workers pending
            running = {i for i, uid in enumerate(g.slot_pod)
                       if uid is not None and uid in g.members and not _ended(g.members[uid])
                       and not _gated(g.members[uid])}
            if not running:
                self._side.allocation.finish_group(g)
                return
            for slot in range(len(g.slots)):
                if slot not in running:
                    self._side.allocation.release_slot(g, slot)
            return  # the last of those pods to end finishes the group (member_gone)
        if g.phase in QUEUED:
            self._side.cluster.scheduler.withdraw(g.qid)
        failed = kind.failed(obj)
        g.end = self._ctx.now()
        phase = Phase.FAILED if failed else Phase.COMPLETED
        self._side.status.set_phase(g, phase, f"{kind.kind} {_meta(obj).get('name', '')} "
                                 f"{'failed' if failed else 'completed'} before this operator allocated it "
                                 f"(it ran before a restart); nothing is held")
        self._side.status.group_event(g, "Warning" if failed else "Normal", str(phase), g.reason, pods=False)
        self._ctx.dirty = True

    def suspension(self, g: Group, kind: WorkloadKind, before: Mapping[str, Any] | None,
                   obj: Mapping[str, Any]) -> None:
        """Follow who suspends the group's workload (a Job), from its last object seen
        (``before``) to this one. Suspended after it was let go (resumed, by fluxnetes or its
        user), and not by fluxnetes itself (``g.suspending``: preempted, a node lost): its user
        suspended it (``kubectl patch job J -p '{"spec":{"suspend":true}}'``, Kueue's way). A
        Job resumed by an earlier version of fluxnetes still carries fluxnetes' mark (the
        resume takes it off now), so the mark cannot always tell; the change can. Its controller deletes its pods; a running group gives back everything now
        (its pods still running are followed as foreign pods until they are gone, so their
        room stays taken meanwhile) and waits with the others that are not running, never
        resumed by fluxnetes, until its user resumes it (``enqueue_workload``)."""
        if not kind.suspended(obj):
            g.suspended_by_user = False
            return
        if before is None or kind.suspended(before) or g.suspending or g.phase.final \
                or str(_meta(before).get("uid", "")) != str(_meta(obj).get("uid", "")):
            return
        g.suspended_by_user = True
        if marked_suspended_by_us(obj):
            self._side.allocation.drop_hold_mark(g)  # (so that the next leader knows it too)
        if g.phase != Phase.RUNNING:
            return  # enqueue_workload takes it out of the queue
        self.give_back_to_user(g, kind, obj, f"{kind.kind} {_meta(obj).get('name', '')} was suspended by its user")

    def suspended_while_away(self, g: Group, kind: WorkloadKind, obj: Mapping[str, Any]) -> None:
        """After a restart: the running group's workload is suspended, without fluxnetes' hold
        mark (the resume takes it off: ``Allocation.resume``), so its user suspended it while
        no operator ran (no change was seen: ``suspension`` cannot tell). It is the user's
        suspension: everything goes back and the group waits for its user, never resumed."""
        g.suspended_by_user = True
        self.give_back_to_user(g, kind, obj, f"{kind.kind} {_meta(obj).get('name', '')} was suspended by its "
                                             "user while no operator ran")

    def give_back_to_user(self, g: Group, kind: WorkloadKind, obj: Mapping[str, Any], why: str) -> None:
        """A running group whose user suspended its workload (``why``) gives everything back
        and waits, Provisional, until its user resumes it."""
        self._side.allocation.release_all(g)
        self._side.cluster.survivors_to_foreign(g)
        self._side.status.end_run(g, f"{why}; it waits until it is resumed", self._ctx.now())
        g.forget_allocation()
        self.enqueue_workload(g, kind, obj)  # Provisional, saying why; a new store row

    def held_by_user(self, g: Group, kind: WorkloadKind, obj: Mapping[str, Any]) -> bool:
        """The workload is its user's to resume: created suspended, or suspended by its user
        after it was let go (``suspension``)."""
        return kind.held_by_user(obj) or (g.suspended_by_user and kind.suspended(obj))

    def enqueue_workload(self, g: Group, kind: WorkloadKind, obj: Mapping[str, Any]) -> None:
        """A workload group enters the queue, unless its user holds the workload (a Job created
        with ``spec.suspend: true``, or suspended by its user since): then it waits, and
        fluxnetes will not resume it."""
        if self.held_by_user(g, kind, obj):
            if g.phase in QUEUED:
                self._side.cluster.scheduler.withdraw(g.qid)
            reason = (f"{kind.kind} {_meta(obj).get('name', '')} is suspended by its user "
                      f"(spec.suspend=true): waiting until it is resumed")
            if g.phase != Phase.PROVISIONAL or g.reason != reason:
                self._side.status.set_phase(g, Phase.PROVISIONAL, reason)
                g.fj_dirty = True
                self._side.status.group_event(g, "Normal", "SuspendedByUser", reason, pods=False)
            return
        if g.phase == Phase.PROVISIONAL:
            self.enqueue(g)

    # ---------------------------------------------------------------- pruning
    def prune_finished(self) -> None:
        """Forget groups that are over: final phase, no pod left, FluxJob status written (it
        keeps what ``kubectl get fluxjobs`` shows), and no live owner that would bring the
        group back (an unfinished Job stays, e.g. Unsatisfiable, so it is not queued again).

        Runs every cycle, so it looks only at the groups something happened to
        (``recheck_prune``, ``owner_changed``): a mass deletion or a lagging Job controller
        leaves thousands over but kept, and a sweep of them each cycle was a sixth of the
        operator's CPU. Every one is looked at again each ``PRUNE_SWEEP_SECONDS`` all the
        same, so a change no trigger reports only delays its pruning."""
        if not self._finished or not self._ctx.reconciled:
            return
        now = self._ctx.now()
        if now - self._prune_swept >= PRUNE_SWEEP_SECONDS:
            keys = list(self._finished)
            self._prune_swept = float(now)  # float: mypyc keeps int and float apart
            self._prune_waits.clear()
        else:
            keys = [k for k in self._prune_check if k in self._finished]
        self._prune_check.clear()
        for key in keys:
            g = self._groups.get(key)
            if g is None or not g.phase.final:
                self._finished.discard(key)
                continue
            if g.members or g.fj_dirty or (g.fj_exists and g.fj_status.get("phase") != str(g.phase)):
                continue  # looked at again when a pod leaves or its FluxJob is written
            if g.kind is not None and g.spec.owner is not None and g.kind.resume_patch({}) is not None:
                owner = self.owner_obj(g.spec.owner, g.spec.namespace)
                if owner is not None and not g.kind.finished(owner):
                    ref = g.spec.owner
                    self._prune_waits.setdefault((ref.kind, g.spec.namespace, ref.name), set()).add(key)
                    continue
            self.drop_group(g)

    def mark_finished(self, key: tuple[str, str]) -> None:
        """The group reached a final phase: a candidate for pruning, looked at on the next one."""
        self._finished.add(key)
        self._prune_check.add(key)

    def recheck_prune(self, g: Group) -> None:
        """Something that kept a group over from being forgotten may have changed (a pod
        left, its FluxJob was written): the next prune looks at it."""
        if g.key in self._finished:
            self._prune_check.add(g.key)

    def owner_changed(self, kind_name: str, namespace: str, name: str) -> None:
        """A workload object changed or went: the groups over it kept look again, and its
        label groups follow its replica count (scaling.follow_owner)."""
        waiting = self._prune_waits.pop((kind_name, namespace, name), None)
        if waiting:
            self._prune_check |= waiting
        self._side.scaling.follow_owner(kind_name, namespace, name)

    def drop_group(self, g: Group) -> None:
        key = g.key
        self._finished.discard(key)
        if g.held:
            # it ended with pods still running on (cancelled, node lost) and goes now (a new
            # workload took its name): those pods are followed as foreign pods until they are
            # gone, so what they use stays taken, and the group's allocation goes with it
            self._side.allocation.release_all(g)
            self._side.cluster.survivors_to_foreign(g)
        if self._groups.get(key) is g:
            del self._groups[key]
        for uid in [*g.members, *(u for u in g.slot_pod if u)]:
            if self._member_of.get(uid) == key:
                del self._member_of[uid]
        if self._side.cluster.scheduler is not None:
            self._side.cluster.scheduler.withdraw(g.qid)
            self._side.cluster.scheduler.running.pop(g.qid, None)
            profile = getattr(self._side.cluster.scheduler, "profile", None)
            if profile is not None:
                with contextlib.suppress(Exception):
                    profile.remove(g.qid)
        self._side.scaling.forget_group(g)
        if self._ctx.journal is not None and g.store_uid:
            self._ctx.journal.forget((g.spec.namespace, g.spec.name, g.store_uid))
        self._pruned[str(g.phase)] = self._pruned.get(str(g.phase), 0) + 1
        self._side.status.counts_changed()

    def pod_group_spec(self, pod: dict[str, Any]) -> GroupSpec:
        ns = _meta(pod).get("namespace") or "default"

        def owner_size(o: OwnerRef) -> int | None:
            k = kind_of(o.kind)
            obj = self._owners.get((o.kind, ns, o.name))
            return k.size(obj) if k is not None and k.owns_pods and obj is not None else None

        def owner_deadline(o: OwnerRef) -> object:
            k = kind_of(o.kind)
            obj = self._owners.get((o.kind, ns, o.name))
            return k.deadline(obj) if k is not None and obj is not None else None

        return group_of_pod(pod, owner_size=owner_size, owner_deadline=owner_deadline, priority=self.priority_of)

    def join_group(self, uid: str, pod: dict[str, Any]) -> None:
        if self._side.podsets.join_addon(uid, pod):
            return  # a multi-role workload's pod (k8s/groups/podset_groups.py)
        meta = _meta(pod)
        ns = meta.get("namespace") or "default"
        owner = controller_of(meta)
        okind = kind_of(owner.kind) if owner else None
        if owner is not None and okind is not None and okind.owns_pods:
            owner_obj = self.owner_obj(owner, ns)
            if owner_obj is None:  # its owner (this uid) not seen yet
                self._parked[uid] = pod
                return
            gkey = (ns, object_name(f"{owner.kind.lower()}-{owner.name}"))
            if okind.resume_patch({}) is not None:
                if gkey in self._groups and self.same_owner(self._groups[gkey], owner.uid):
                    # a workload group (Job): pods join by owner
                    self.add_member(self._groups[gkey], uid, pod)
                    # beyond a running Job's slots: its parallelism was raised
                    self._side.scaling.job_grown(gkey, okind, owner_obj)
                    return
            elif (gkey in self._groups or gkey in self._side.scaling.scale_groups) and not explicit_group(_meta(pod).get("labels") or {}):
                target = self._side.scaling.route_pod(gkey, okind, pod)  # replicas: base group or a scale group
                if target is None:
                    target = self._side.scaling.replacement_group(gkey, okind, owner_obj)
                if target is not None:
                    self.add_member(target, uid, pod)
                    return
        try:
            spec = self.pod_group_spec(pod)
        except GroupError as exc:
            self._side.status.event(self._side.status.pod_ref(pod), "Warning", "InvalidGroup", str(exc))
            return
        if spec.size < 1:
            # its owner asks for no pod (scaled to 0: it is deleting this one): no group of 0;
            # it waits for the owner's next change (controller.on_owner retries parked pods)
            self._parked[uid] = pod
            return
        g = self._groups.get(spec.key)
        if g is None or (g.phase.final and not g.members):
            kind = kind_of(spec.owner.kind) if spec.owner else None
            spec = self._side.scaling.name_for_new_group(spec)
            g = self._groups.get(spec.key)
            if g is None or g.phase.final:
                g = self.new_group(spec, kind)
        self.add_member(g, uid, pod)

    def add_member(self, g: Group, uid: str, pod: dict[str, Any]) -> None:
        self._member_of[uid] = g.key
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
            self._side.allocation.assign(g)
        elif g.phase == Phase.UNSATISFIABLE:
            self._side.status.event(self._side.status.pod_ref(pod), "Warning", "Unsatisfiable", g.reason)

    def member_gone(self, g: Group, uid: str, pod: dict[str, Any]) -> None:
        self._member_of.pop(uid, None)
        g.members.pop(uid, None)
        self.recheck_prune(g)
        failed = (pod.get("status") or {}).get("phase") == "Failed"
        if g.phase in QUEUED or g.phase == Phase.PROVISIONAL:
            if g.kind is None or g.kind.resume_patch({}) is None:
                # pod-made group lost a member before it started: wait for it again
                if g.phase in QUEUED:
                    self._side.cluster.scheduler.withdraw(g.qid)
                g.phase = Phase.PROVISIONAL
                g.reason = f"waiting for the group: {len(g.members)}/{g.spec.size} pods"
                g.fj_dirty = True
                if not g.members:
                    self._side.allocation.cancel_group(g, "all pods of the group were deleted")
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
            self._side.allocation.release_slot(g, slot)
            return
        if failed:
            g.failed_pods += 1
        owner = self.owner_obj(g.spec.owner, g.spec.namespace)
        unreleased = len(g.slots) - len(g.released)
        base = self._side.scaling.base_key(g)
        if base is not None and g.kind is not None and (
                g.kind.resume_patch({}) is None or g.key == base or g.key in self._side.scaling.scale_groups.get(base, ())):
            # with its scale groups (a Job has some once its parallelism was raised: job_grown)
            unreleased = self._side.scaling.family_capacity(base)
        succeeded = (pod.get("status") or {}).get("phase") == "Succeeded"
        # Who makes a pod for this one? Nothing for a pod without a workload (a label group of
        # bare pods, a lone pod) nor for a finished or suspended workload, nor past the pods
        # its workload asks for now (scaled down, a Job's parallelism lowered): the share
        # goes back at once. A pod that failed or was deleted before it ended is made again
        # by every workload controller (a Job counts a deleted pod as failed and retries it,
        # even with as many completions as parallelism); one that succeeded only where
        # more pods follow (replaces_pods, replaces_succeeded). A share kept here is never
        # lost: the workload ending or going gives it back (workload_finished, cancel_group).
        # Suspended: by its user, or still by fluxnetes when this allocation did not resume it
        # (once it did, a suspended view is the resume not seen yet: the watches of pods and
        # workloads are not ordered; a user suspending it again looks the same, and keeps its
        # shares until it is resumed, finished or deleted)
        suspended = owner is not None and g.kind is not None and (
            self.held_by_user(g, g.kind, owner) or (g.kind.held_by_fluxnetes(owner) and not g.resumed))
        replaced = (g.kind is not None and owner is not None and not g.kind.finished(owner) and not suspended
                    and unreleased <= g.kind.size(owner)
                    and (not succeeded or (g.kind.replaces_pods(owner) and g.kind.replaces_succeeded(owner))))
        if replaced:
            self._side.allocation.assign(g)  # its replacement keeps the share
            return
        if not failed and not succeeded \
                and (g.kind is None or g.kind.resume_patch({}) is not None):
            # deleted before it finished, and no scale-down explains it (finish_group)
            g.deleted_pods += 1
        self._side.allocation.release_slot(g, slot)
        if g.phase == Phase.RUNNING and (len(g.released) >= len(g.slots) or not g.held):
            self._side.allocation.finish_group(g)
