"""Scale groups: a ReplicaSet (so a Deployment) or StatefulSet that grows after its group was
allocated gets a new group "<group>-scale-N" (its own FluxJob) for the added pods, queued and
matched all-or-nothing like any group while those pods stay gated; the running pods are
untouched. A running Job whose parallelism is raised (or, after a restart without a usable
allocation note, that was taken back at its placed pods' size) gets one the same way, once a
pod of it waits beyond its groups' slots (``job_grown``). Growing or shrinking before a group started resizes it. Shrinking gives back the
removed pods' shares (empty slots at once, the others as the controller deletes the pods),
counting the base group and its scale groups together (its ``family``). ``route_pod`` decides
which group of the family a new gated pod joins. Owned state: ``scale_groups`` (base group
key -> keys of its scale groups) and ``spent_names`` (per workload uid, the names of its groups
that are over: a group name is never used twice for one workload, since the store knows a
group by namespace, name and workload uid and would take a new group of an old name for the
old one, ended, after a restart)."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import replace
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Protocol

from fluxnetes.k8s.context import Context
from fluxnetes.k8s.groups import GroupSpec, controller_of, explicit_group, object_name
from fluxnetes.k8s.groups.groupbook import QUEUED, Group
from fluxnetes.k8s.groups.grouptable import GroupTable
from fluxnetes.k8s.names import SCALE_SEP
from fluxnetes.k8s.objects import _dump_jobspec, _gated, _meta, _terminal
from fluxnetes.k8s.persistence.fluxjob import Phase
from fluxnetes.k8s.scheduling.placement import assigned_node
from fluxnetes.k8s.workloads import WorkloadKind, kind_of

if TYPE_CHECKING:
    from fluxnetes.k8s.cluster.mirror import ClusterView
    from fluxnetes.k8s.persistence.status import StatusWriter

# one logger for every part of the state machine: its log lines read as before the split
log = logging.getLogger("fluxnetes.k8s.controller")



class ScalingBook(Protocol):
    """The group book as scaling sees it (groups/groupbook.py)."""

    @property
    def groups(self) -> GroupTable: ...
    @property
    def owners(self) -> Mapping[tuple[str, str, str], dict[str, Any]]: ...
    def add_member(self, g: Group, uid: str, pod: dict[str, Any]) -> None: ...
    def drop_member(self, uid: str) -> None: ...
    def enqueue(self, g: Group) -> None: ...
    def join_group(self, uid: str, pod: dict[str, Any]) -> None: ...
    def make_jobspec(self, g: Group) -> Any: ...
    def new_group(self, spec: GroupSpec, kind: WorkloadKind | None) -> Group: ...
    def same_owner(self, g: Group, uid: str) -> bool: ...


class ScalingAllocation(Protocol):
    """Allocation as scaling sees it (scheduling/allocation.py)."""

    def cancel_group(self, g: Group, reason: str) -> None: ...
    def finish_group(self, g: Group) -> None: ...
    def release_slot(self, g: Group, slot: int) -> None: ...


class ScalingJudge(Protocol):
    """The scheduling cycle's satisfiability judge as scaling sees it (scheduling/cycle.py)."""

    def still_waits(self, g: Group) -> bool: ...
    def reopen(self, g: Group) -> None: ...


class ScalingSide(Protocol):
    """What scaling uses of the other parts."""

    @property
    def cluster(self) -> ClusterView: ...
    @property
    def status(self) -> StatusWriter: ...
    @property
    def scheduling(self) -> ScalingJudge: ...
    @property
    def book(self) -> ScalingBook: ...
    @property
    def allocation(self) -> ScalingAllocation: ...


class Scaling:
    """A workload's family of groups (base + "-scale-N"): rescale, resize, route new pods: a
    component (its state is private); the other parts reach it as ``scaling``."""

    def __init__(self, ctx: Context, side: ScalingSide) -> None:
        self._ctx, self._side = ctx, side
        # scale-up groups of a workload: base group key -> keys of its "-scale-N" groups
        self._scale_groups: dict[tuple[str, str], list[tuple[str, str]]] = {}
        # workload uid -> names of its groups that are over (from set_phase and, after a
        # restart, from the final FluxJobs the informer lists)
        self._spent_names: dict[str, set[str]] = {}
        # uids of workloads queued whole (Jobs) whose group's FluxJob is final: never queued
        # again. Live, the ended group itself says so until it is pruned; after a restart
        # (or a lost lease) only the final FluxJob does, while the Job controller may not
        # have marked the Job finished yet (it lags after an API server outage)
        self._ended_workloads: set[str] = set()
        # label groups (fluxnetes.io/group) of a ReplicaSet's or StatefulSet's pods: (owner
        # kind, namespace, owner name) -> their keys (they follow its replica count: follow_owner)
        self._label_groups: dict[tuple[str, str, str], set[tuple[str, str]]] = {}

    @property
    def scale_groups(self) -> Mapping[tuple[str, str], Sequence[tuple[str, str]]]:
        """Base group key -> the keys of its scale groups (read-only)."""
        return MappingProxyType(self._scale_groups)

    @property
    def spent_names(self) -> Mapping[str, AbstractSet[str]]:
        """Workload uid -> the names of its groups that are over (read-only)."""
        return MappingProxyType(self._spent_names)

    def ended(self, workload_uid: str) -> bool:
        """Was the workload (a Job) queued whole and its group's FluxJob final?"""
        return workload_uid in self._ended_workloads

    def workload_gone(self, workload_uid: str) -> None:
        """The workload object was deleted: what was kept about it goes."""
        self._spent_names.pop(workload_uid, None)
        self._ended_workloads.discard(workload_uid)

    def index_group(self, g: Group) -> None:
        """A group entered the book: indexed as a scale group or a label group if it is one."""
        self.index_scale_group(g)
        self.index_label_group(g)

    def forget_group(self, g: Group) -> None:
        """A group left the book (groupbook.drop_group): out of the indexes."""
        key = g.key
        base = self.base_key(g)
        if base is not None and key in self._scale_groups.get(base, ()):
            self._scale_groups[base].remove(key)
        if base is not None and not self._scale_groups.get(base, True):
            del self._scale_groups[base]
        self.index_label_group(g, drop=True)

    def spend_name(self, g: Group) -> None:
        """``g`` is over: its name is not given to another group of its workload."""
        o = g.spec.owner
        if o is not None and o.uid and g.kind is not None and g.kind.owns_pods \
                and (g.kind.resume_patch({}) is None or self.base_key(g) != g.key):  # (a Job's scale group)
            self._spent_names.setdefault(o.uid, set()).add(g.spec.name)

    def on_fluxjob(self, obj: Mapping[str, Any]) -> None:
        """A FluxJob listed or changed: a final one of a replicated workload (or of a Job's
        scale group) spends its name; a final one of a Job ends that Job's queueing
        (``ended_workloads``)."""
        st, spec = obj.get("status") or {}, obj.get("spec") or {}
        wl = spec.get("workload") or {}
        kind = kind_of(str(wl.get("kind", "")))
        try:
            final = Phase(st.get("phase", "")).final
        except ValueError:
            return
        if not final or not wl.get("uid") or kind is None:
            return
        name = str(_meta(obj).get("name", ""))
        base = object_name(f"{kind.kind.lower()}-{wl.get('name', '')}")
        if kind.resume_patch({}) is not None and scale_number(name, base) is None:  # queued whole (a Job): never queued again
            self._ended_workloads.add(str(wl["uid"]))
        elif kind.owns_pods:  # replicated, or a Job's scale group (job_grown): that group name is spent
            self._spent_names.setdefault(str(wl["uid"]), set()).add(name)

    def name_for_new_group(self, spec: GroupSpec) -> GroupSpec:
        """A new base group of a replicated workload whose base name an ended group of the same
        workload used (its group failed by node loss and every survivor ended) is named like a
        scale group instead: a name is never reused for one workload."""
        o = spec.owner
        if o is None or not o.uid or spec.name not in self._spent_names.get(o.uid, ()):
            return spec
        return replace(spec, name=self.next_scale_name((spec.namespace, spec.name), o.uid))

    def next_scale_name(self, base: tuple[str, str], owner_uid: str) -> str:
        """"<base>-scale-N" with N above every live and spent scale group of the workload."""
        names = [k[1] for k in self._scale_groups.get(base, ())] + list(self._spent_names.get(owner_uid, ()))
        used = {n for n in (scale_number(name, base[1]) for name in names) if n is not None}
        return f"{base[1]}{SCALE_SEP}{max(used, default=0) + 1}"

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
            keys = self._scale_groups.setdefault(base, [])
            if g.key not in keys:
                keys.append(g.key)

    def index_label_group(self, g: Group, drop: bool = False) -> None:
        """Index (or, ``drop``, forget) a label group made of a replicated workload's pods."""
        o = g.spec.owner
        kind = kind_of(o.kind) if o is not None else None
        if o is None or kind is None or not kind.owns_pods or kind.resume_patch({}) is not None \
                or explicit_group(g.spec.labels) is None:
            return
        ref = (o.kind, g.spec.namespace, o.name)
        if not drop:
            self._label_groups.setdefault(ref, set()).add(g.key)
            return
        keys = self._label_groups.get(ref)
        if keys is not None and self._side.book.groups.get(g.key) in (None, g):
            keys.discard(g.key)
            if not keys:
                del self._label_groups[ref]

    def follow_owner(self, kind_name: str, namespace: str, name: str) -> None:
        """A ReplicaSet or StatefulSet changed: its label groups that have not started (or are
        Unsatisfiable, their pods waiting) take its replica count, at most their size label
        (``fluxnetes.io/group-size``): a group never waits for pods its owner will not make."""
        keys = self._label_groups.get((kind_name, namespace, name))
        kind = kind_of(kind_name)
        obj = self._side.book.owners.get((kind_name, namespace, name))
        if not keys or kind is None or obj is None:
            return
        uid = str(_meta(obj).get("uid", ""))
        # the replicas it asks for (a size label caps them), or, without a size label, the
        # pods its controller makes now (an OrderedReady StatefulSet: one at a time), as
        # groups.group_of_pod sized the group
        replicas = WorkloadKind.size(kind, obj)
        for key in sorted(keys):
            g = self._side.book.groups.get(key)
            if g is None or not self._side.book.same_owner(g, uid) or g.spec.jobspec is not None:
                continue
            if g.phase not in (Phase.PROVISIONAL, *QUEUED) and not self.resizable(g):
                continue
            label = explicit_group(g.spec.labels)
            size = min(replicas, label[1]) if label is not None and label[1] is not None else kind.size(obj)
            if size >= 1:
                self.resize(g, size)
            elif not g.phase.final:
                self._side.allocation.cancel_group(g, f"{kind_name} {name} scaled down to 0 before the group started")

    def family(self, base: tuple[str, str], stuck: bool = False) -> list[Group]:
        """The live groups of one workload: its base group, then its scale groups.
        ``stuck``: with those Unsatisfiable whose pods still wait (see ``resizable``)."""
        out = []
        for k in (base, *self._scale_groups.get(base, ())):
            g = self._side.book.groups.get(k)
            if g is not None and (not g.phase.final or (stuck and self.resizable(g))):
                out.append(g)
        return out

    def resizable(self, g: Group) -> bool:
        """An Unsatisfiable group that follows its workload's size like one not started yet:
        its pods still wait, gated (a smaller group may fit where this one never can)."""
        return (g.phase == Phase.UNSATISFIABLE and g.spec.jobspec is None
                and not g.reason.startswith("invalid jobspec") and self._side.scheduling.still_waits(g))

    @staticmethod
    def capacity(g: Group) -> int:
        """Pods the group stands for: unreleased slots once started, its size before."""
        if g.phase == Phase.RUNNING:
            return len(g.slots) - len(g.released)
        return 0 if g.phase.final else g.spec.size

    def family_capacity(self, base: tuple[str, str]) -> int:
        """Pods a workload's live groups (its ``family``) stand for together."""
        return sum(self.capacity(g) for g in self.family(base))

    def survivors(self, base: tuple[str, str], owner_uid: str) -> int:
        """Pods of the workload still running outside its live groups: survivors of a group
        failed by node loss (members whose shares it keeps until they end) and, after a
        restart, the same pods counted as foreign."""
        n = 0
        for k in (base, *self._scale_groups.get(base, ())):
            g = self._side.book.groups.get(k)
            if g is not None and g.phase.final and self._side.book.same_owner(g, owner_uid):
                n += sum(1 for p in g.members.values() if assigned_node(p) is not None and not _gated(p)
                         and not _terminal(p))
        return n + self._side.cluster.foreign_of_owner(owner_uid)

    def replacement_group(self, base: tuple[str, str], kind: WorkloadKind, obj: Mapping[str, Any]) -> Group | None:
        """A ReplicaSet whose groups are over while some of its pods still run (its group
        failed by node loss): the pods it re-creates form a group of what it misses, queued
        all-or-nothing like a scale-up. None: not that case (a new base group forms)."""
        old = self._side.book.groups.get(base)
        if kind.kind != "ReplicaSet" or self.family(base) or old is None or not old.phase.final:
            return None
        left = self.survivors(base, str(_meta(obj).get("uid", "")))
        missing = kind.size(obj) - left
        if not left or missing < 1:
            return None
        return self.new_scale_group(base, old, kind, missing)

    def rescale(self, base: tuple[str, str], kind: WorkloadKind, obj: Mapping[str, Any]) -> None:
        """Follow the workload's replica count (see the comment above)."""
        uid = str(_meta(obj).get("uid", ""))
        # an Unsatisfiable group whose pods wait absorbs the change too: scaled down, it may fit
        fam = [g for g in self.family(base, stuck=True) if g.phase != Phase.UNSATISFIABLE or self._side.book.same_owner(g, uid)]
        if not fam:
            return  # nothing live: new pods form a new group (join_group)
        # pods still running from a group that failed by node loss count as replicas
        diff = kind.size(obj) - sum(g.spec.size if g.phase == Phase.UNSATISFIABLE else self.capacity(g)
                                    for g in fam) - self.survivors(base, uid)
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
                self._side.book.drop_member(uid)
            g.members.clear()
            self._side.allocation.cancel_group(g, f"{kind.kind} {_meta(obj).get('name', '')} scaled down before the group started")
            for uid, pod in strays:
                self._side.book.join_group(uid, pod)
        if diff > 0 and any(g.phase == Phase.RUNNING for g in fam):
            self.new_scale_group(base, fam[0], kind, diff)
        elif diff < 0 and self._ctx.reconciled:
            # scaled down: give back empty slots now (newest groups first); slots with a pod
            # are given back when the controller deletes that pod (member_gone). Not during
            # the replay after a restart: a slot looks empty until its pod, maybe listed
            # later, claims it again (reconcile gives back the truly empty ones)
            extra = -diff
            for g in reversed(fam):
                for slot in range(len(g.slots)):
                    if extra <= 0 or g.phase != Phase.RUNNING:
                        break
                    if g.slot_pod[slot] is None and slot not in g.released:
                        self._side.allocation.release_slot(g, slot)
                        extra -= 1
                if g.phase == Phase.RUNNING and not g.held:
                    self._side.allocation.finish_group(g)

    def job_grown(self, base: tuple[str, str], kind: WorkloadKind, obj: Mapping[str, Any]) -> None:
        """A running Job whose parallelism was raised: its extra pods join its group by owner
        (groupbook.join_group) and wait there beyond its free slots; they form a scale group of
        what the Job asks beyond its groups' slots, matched all-or-nothing on what is free, as
        a ReplicaSet's scale-up does. Called when the Job changes and when such a pod arrives
        (the watches are not ordered). Only once a pod waits: a slot given back when a pod
        succeeded lowers the groups' capacity while the Job's succeeded count (which says no
        pod comes for it) may lag, and a group formed then would wait forever."""
        g = self._side.book.groups.get(base)
        if g is None or g.phase != Phase.RUNNING or not self._ctx.reconciled:
            return  # (the replay after a restart: recovery.reconcile decides, on every pod seen)
        if len(g.members) <= len(g.slots) - len(g.released):
            return  # no pod can wait beyond its free slots (cheap: called on every pod of the Job)
        for other in self.family(base)[1:]:
            if other.phase == Phase.RUNNING:
                # a scale group's slot kept for a replacement (its pod failed): the Job's new
                # pod joined the base group by owner, so it moves to that slot
                room = other.free_slots() - len(other.waiting())
                for uid in g.waiting()[g.free_slots():][:max(0, room)]:
                    self._side.book.add_member(other, uid, g.members.pop(uid))
            elif other.phase == Phase.PROVISIONAL or other.phase in QUEUED:  # not started: the strays join it
                self.take_strays(base, other)
        wanted = kind.pods_left(obj) - self.family_capacity(base)
        if len(g.waiting()) > g.free_slots() and wanted > 0:
            self.new_scale_group(base, g, kind, wanted)

    def resize(self, g: Group, size: int) -> None:
        """A group that has not started (or is Unsatisfiable, its pods waiting) takes the
        workload's new size."""
        if size == g.spec.size:
            return
        if g.phase in QUEUED:
            self._side.cluster.scheduler.withdraw(g.qid)
            g.phase = Phase.PROVISIONAL  # enqueued again below once complete
        elif g.phase == Phase.UNSATISFIABLE:
            # judged again at its new size: a Deployment of 10 pods that never fit, scaled to 4
            self._side.scheduling.reopen(g)
            self._side.status.set_phase(g, Phase.PROVISIONAL, f"resized from {g.spec.size} to {size} pods: judged again")
            self._side.status.group_event(g, "Normal", "Resized", g.reason, pods=False)
        g.spec = replace(g.spec, size=size)
        try:
            g.jobspec = self._side.book.make_jobspec(g)
        except Exception as exc:
            self._side.status.set_phase(g, Phase.UNSATISFIABLE, f"invalid jobspec: {exc}")
            return
        g.fj_dirty = True
        self._ctx.dirty = True
        if g.fj_exists:  # the FluxJob's spec is written once: say the new size there too
            self._ctx.spawn(self._side.status.patch_fluxjob_spec(g, {"size": size, "jobspec": _dump_jobspec(g.jobspec)}))
        if len(g.members) >= size or (g.kind is not None and g.kind.resume_patch({}) is not None):
            self._side.book.enqueue(g)
        else:
            g.reason = f"waiting for the group: {len(g.members)}/{size} pods"

    def new_scale_group(self, base: tuple[str, str], like: Group, kind: WorkloadKind, size: int) -> Group:
        owner_uid = like.spec.owner.uid if like.spec.owner else ""
        spec = replace(like.spec, name=self.next_scale_name(base, owner_uid), size=size)
        g = self._side.book.new_group(spec, kind)
        g.reason = f"waiting for the group: 0/{size} pods"
        self._side.status.group_event(like, "Normal", "ScaledUp",
                                      f"{size} added pod(s) form group {spec.name}, queued all-or-nothing", pods=False)
        # pods that arrived before the new replica count was seen wait in a running group
        # without a slot: they belong to the new group
        self.take_strays(base, g)
        # logged (not only an Event): a scale-up that never ran is traced from the log alone
        log.info("%s: scaled up by %d pod(s): group %s formed (%d of its pods here already)",
                 like.qid, size, spec.name, len(g.members))
        return g

    def take_strays(self, base: tuple[str, str], g: Group) -> None:
        """Gated pods of the family waiting in a running group beyond its free slots (they
        came before the group ``g`` that wants them was known) move to ``g``."""
        for other in self.family(base):
            if other.phase != Phase.RUNNING or other is g:
                continue
            for uid in other.waiting()[other.free_slots():]:
                # (queued: a Job's scale group, queued without its pods; after a restart its
                # pods joined the Job's base group by owner in the replay)
                if (g.phase != Phase.PROVISIONAL and g.phase not in QUEUED) or len(g.members) >= g.spec.size:
                    return
                self._side.book.add_member(g, uid, other.members.pop(uid))

    def route_pod(self, base: tuple[str, str], kind: WorkloadKind, pod: Mapping[str, Any]) -> Group | None:
        """The group a new gated pod of a replicated workload joins (None: a new base group)."""
        owner = controller_of(_meta(pod))
        obj = self._side.book.owners.get((owner.kind, str(_meta(pod).get("namespace") or "default"), owner.name)) \
            if owner else None
        if obj is not None:
            self.rescale(base, kind, obj)
        fam = self.family(base)
        if not fam:
            return None
        for g in fam:  # a started group with a free slot: a replacement
            # (not during the replay after a restart: a recovered group's slots look free
            # until its placed pods, listed later, have claimed them again)
            if g.phase == Phase.RUNNING and self._ctx.reconciled and g.free_slots() > len(g.waiting()):
                return g
        for g in reversed(fam):  # the group still collecting its pods
            if g.phase == Phase.PROVISIONAL and len(g.members) < g.spec.size:
                return g
        # more pods than the workload asks for as far as this operator knows (racing a
        # release, or a scale-up whose new replica count it has not seen yet): it waits
        log.info("%s: pod %s waits without a slot (%s asks %s replicas, its groups hold them all)",
                 fam[0].qid, _meta(pod).get("name", ""), kind.kind,
                 kind.size(obj) if obj is not None else "?")
        return fam[0]


def scale_number(name: str, base_name: str) -> int | None:
    """N when ``name`` is "<base_name>-scale-N", else None."""
    if not name.startswith(base_name + SCALE_SEP):
        return None
    n = name.rsplit(SCALE_SEP, 1)[-1]
    return int(n) if n.isdigit() else None
