"""Recovery after a restart (or a new leader): groups from FluxJobs (``recover``), the store's
live rows (``recover_store``, rows claimed by groups re-created from their objects), then what
no record shows, from the cluster itself, before any replayed event
(``recover_from_cluster``: finished workloads, pods placed for an allocation no record shows:
``adopt_placed``); once every pod was seen again, ``reconcile`` (vanished pods give back,
gone nodes, lost resumes). What the store says is read in store_recovery.py. Owned state:
``unrecorded`` (allocations read back that did not fit the graph yet)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Protocol

from fluxnetes.k8s import names
from fluxnetes.k8s.admission.hold import is_ours, template_is_ours
from fluxnetes.k8s.context import Context
from fluxnetes.k8s.groups import GroupError, GroupSpec, OwnerRef, controller_of, object_name
from fluxnetes.k8s.groups.groupbook import QUEUED, Group
from fluxnetes.k8s.groups.grouptable import GroupTable
from fluxnetes.k8s.names import SCALE_SEP
from fluxnetes.k8s.objects import _gated, _meta, _parse_time, _terminal
from fluxnetes.k8s.persistence.fluxjob import Phase
from fluxnetes.k8s.resources import GPU, PodResources
from fluxnetes.k8s.scheduling import allocation_note, shares
from fluxnetes.k8s.scheduling.placement import ANN_SLOT, assigned_node, placed_jobid
from fluxnetes.k8s.workloads import WorkloadKind, kind_of

if TYPE_CHECKING:
    from fluxnetes.k8s.cluster.accounting import AccountingCheck
    from fluxnetes.k8s.cluster.mirror import ClusterView
    from fluxnetes.k8s.persistence.status import StatusWriter
    from fluxnetes.k8s.persistence.store_recovery import StoreRecovery

# one logger for every part of the state machine: its log lines read as before the split
log = logging.getLogger("fluxnetes.k8s.controller")

ACCOUNTING_CHECK_DELAY = 5.0  # seconds after the post-restart reconcile


class RecoveryBook(Protocol):
    """The group book as recovery sees it (groups/groupbook.py)."""

    @property
    def groups(self) -> GroupTable: ...
    @property
    def owners(self) -> Mapping[tuple[str, str, str], dict[str, Any]]: ...
    def add_recovered(self, g: Group) -> None: ...
    def set_member(self, uid: str, key: tuple[str, str]) -> None: ...
    def drop_earlier_owner(self, gkey: tuple[str, str], reason: str) -> None: ...
    def group_for_workload(self, kind: WorkloadKind, obj: Mapping[str, Any]) -> GroupSpec: ...
    def make_jobspec(self, g: Group) -> Any: ...
    def new_group(self, spec: GroupSpec, kind: WorkloadKind | None) -> Group: ...
    def owner_obj(self, ref: OwnerRef | None, namespace: str) -> dict[str, Any] | None: ...
    def pod_group_spec(self, pod: dict[str, Any]) -> GroupSpec: ...
    def same_owner(self, g: Group, uid: str) -> bool: ...
    def workload_finished(self, g: Group, kind: WorkloadKind, obj: Mapping[str, Any]) -> None: ...
    def suspended_while_away(self, g: Group, kind: WorkloadKind, obj: Mapping[str, Any]) -> None: ...


class RecoveryScaling(Protocol):
    """A workload's family of groups as recovery sees it (groups/scaling.py)."""

    @property
    def scale_groups(self) -> Mapping[tuple[str, str], Sequence[tuple[str, str]]]: ...
    def base_key(self, g: Group) -> tuple[str, str] | None: ...
    def ended(self, workload_uid: str) -> bool: ...
    def on_fluxjob(self, obj: Mapping[str, Any]) -> None: ...
    def rescale(self, base: tuple[str, str], kind: WorkloadKind, obj: Mapping[str, Any]) -> None: ...
    def take_strays(self, base: tuple[str, str], g: Group) -> None: ...
    def job_grown(self, base: tuple[str, str], kind: WorkloadKind, obj: Mapping[str, Any]) -> None: ...


class RecoveryAllocation(Protocol):
    """Allocation as recovery sees it (scheduling/allocation.py)."""

    def assign(self, g: Group) -> None: ...
    def cancel_group(self, g: Group, reason: str) -> None: ...
    def finish_group(self, g: Group) -> None: ...
    def release_all(self, g: Group) -> None: ...
    def release_slot(self, g: Group, slot: int) -> None: ...
    async def resume(self, g: Group) -> None: ...


class RecoverySide(Protocol):
    """What recovery uses of the other parts."""

    @property
    def cluster(self) -> ClusterView: ...
    @property
    def status(self) -> StatusWriter: ...
    @property
    def accounting(self) -> AccountingCheck: ...
    @property
    def store_recovery(self) -> StoreRecovery: ...
    @property
    def book(self) -> RecoveryBook: ...
    @property
    def scaling(self) -> RecoveryScaling: ...
    @property
    def allocation(self) -> RecoveryAllocation: ...


class Recovery:
    """What the store, FluxJobs and bound pods say after a restart, reconciled once: a
    component (its state is private); the other parts reach it as ``recovery``."""

    def __init__(self, ctx: Context, side: RecoverySide) -> None:
        self._ctx, self._side = ctx, side
        # running groups read back whose allocation did not fit the graph when recorded (a
        # stale FluxJob of a group that ended during the outage held the room): tried again
        # once reconcile has given back what ended
        self._unrecorded: list[Group] = []

    @property
    def unrecorded(self) -> Sequence[Group]:
        """Running groups read back whose allocation is not recorded in the graph yet."""
        return tuple(self._unrecorded)

    def forget_unrecorded(self, g: Group) -> None:
        """``g`` is not to be recorded any more (the store says it ended before the restart)."""
        if g in self._unrecorded:
            self._unrecorded.remove(g)

    def resume_if_held(self, g: Group) -> None:
        """A running group whose workload fluxnetes still holds (the resume was lost in a
        crash): let it go now."""
        if g.kind is None or g.spec.owner is None:
            return
        owner = self._side.book.owner_obj(g.spec.owner, g.spec.namespace)
        if owner is not None and g.kind.resume_patch(owner) is not None and g.kind.held_by_fluxnetes(owner):
            g.resumed = True
            self._ctx.spawn(self._side.allocation.resume(g))

    def suspended_by_user(self, g: Group) -> bool:
        """A running group read back whose workload its user suspended while no operator ran
        (suspended, and fluxnetes' hold mark is off: the resume takes it off): the group gives
        everything back and waits for its user (a scale group of it is cancelled, as on a
        suspension seen live). True when so."""
        if g.kind is None or g.spec.owner is None:
            return False
        owner = self._side.book.owner_obj(g.spec.owner, g.spec.namespace)
        if owner is None or g.kind.resume_patch(owner) is None or not g.kind.held_by_user(owner):
            return False
        if self._side.scaling.base_key(g) not in (None, g.key):
            self._side.allocation.cancel_group(g, f"{g.kind.kind} {g.spec.owner.name} was suspended by its user "
                                                  "while no operator ran")
        else:
            self._side.book.suspended_while_away(g, g.kind, owner)
        return True

    def requeue_if_nodes_gone(self, g: Group) -> bool:
        """After a restart: a running group allocated on nodes that are gone. A group of bare
        pods with no pod left: it ends (Failed). Nothing of it placed yet: it is matched
        again; otherwise the node-loss policy applies."""
        gone = [n for n in g.held if n not in self._side.cluster.nodes]
        if not gone:
            return False
        if g.kind is None and not g.members:
            # a group of bare pods with none left (nothing re-creates them): it is over, as
            # when its nodes are still there (reconcile). Matched again, it held its cores for
            # good with no pod to use them (the chaos soak: its Failed status write was lost
            # with an API server restart, its FluxJob still said Running on the lost node)
            self._side.allocation.release_all(g)
            g.alloc = []  # (release_all emptied g.held)
            g.end = self._ctx.now()
            reason = (f"none of its pods is left, and its allocation from before the restart is on "
                      f"nodes that are gone ({', '.join(gone)})")
            self._side.status.set_phase(g, Phase.FAILED, reason)
            self._side.status.group_event(g, "Warning", "NodeLost", reason, pods=False)
            self._ctx.dirty = True
            return True
        placed = any(not _gated(p) for p in g.members.values())
        if placed:
            for n in gone:
                self._side.cluster.node_lost(n)
            return g.phase != Phase.RUNNING
        self._side.allocation.release_all(g)
        g.jobid, g.slots, g.slot_pod, g.released, g.start = None, [], [], set(), None
        g.held, g.alloc = {}, []
        reason = g.note = (f"its allocation from before the restart is on nodes that are gone "
                           f"({', '.join(gone)}); matched again")
        self._side.status.set_phase(g, Phase.PENDING, reason)
        self._side.status.group_event(g, "Warning", "Requeued", reason, pods=False)
        self._ctx.dirty = True
        return True

    def adopt(self, uid: str, pod: dict[str, Any]) -> bool:
        """A pod fluxnetes placed (annotation) becomes a member of its group again."""
        meta = _meta(pod)
        fj = (meta.get("annotations") or {}).get(names.ANN_FLUXJOB)
        g = self._side.book.groups.get((meta.get("namespace") or "default", fj or ""))
        if g is None and fj and self._side.store_recovery.unclaimed():
            g = self._side.store_recovery.group_from_store(pod, (meta.get("namespace") or "default", fj))
        if g is None or g.phase != Phase.RUNNING:
            return False
        jid = placed_jobid(pod)
        if jid is not None and not g.recovered and jid != str(g.jobid):
            return False  # placed for an earlier group of the same name (that one is over)
        owner = controller_of(meta)
        if owner is not None and g.spec.owner is not None and not self._side.book.same_owner(g, owner.uid):
            return False  # a pod of an earlier workload of the same name
        slot = _slot_of(pod)
        if slot is None:
            slot = -1
        if slot in g.released:
            return False  # its slot was given back already: the pod ended before
        self._side.book.set_member(uid, g.key)
        g.members[uid] = pod
        if 0 <= slot < len(g.slot_pod) and g.slot_pod[slot] is None:
            g.slot_pod[slot] = uid
        return True

    def take_back(self, g: Group) -> bool:
        """A member of ``g``, a group not started in this leader's view, is seen placed for
        it (its FluxJob annotation names the group): an earlier leader placed the group and
        this one's start saw its pods still gated (a standby whose pod watch lagged behind,
        through API server outages, when it took over), so ``recover_from_cluster`` could not
        take the allocation back. It is taken back now, by the same rules, from the members
        seen placed: then the group runs, its members not placed yet wait for its other
        slots, and a replicated workload scaled since gets a scale group for the rest
        (``rescale``). Left waiting as it was, it kept the placed pods out of every slot and
        took the store's allocation with no pod in it: the workload's added pods waited
        gated for good (the chaos soak's lost Deployments). True when taken back."""
        placed = [p for p in g.members.values()
                  if not _gated(p) and assigned_node(p) is not None
                  and (_meta(p).get("annotations") or {}).get(names.ANN_FLUXJOB) == g.spec.name]
        if not placed or g.phase.final or g.phase in (Phase.RUNNING, Phase.PREEMPTED):
            # (a Preempted group was started here: its placed pods are terminating, and its
            # allocation is still recorded until they are gone; taking it back from them ran
            # the victim again under a second job id)
            return False
        queued = g.phase in QUEUED
        note = placed_note(placed)
        taken = (note is not None and self.adopt_annotated(g, placed, note)) or self.adopt_placed(g, placed)
        if not taken:
            stored = self._side.store_recovery.stored_allocation(g)
            taken = stored is not None and self.adopt_placed(g, placed, stored=stored)
        if not taken:
            log.warning("%s: pods placed by an earlier leader seen after the start, their allocation not known; "
                        "they hold their nodes as foreign pods once they leave the group", g.qid)
            return False
        if queued:
            self._side.cluster.scheduler.withdraw(g.qid)  # (running now: never matched again)
        base = self._side.scaling.base_key(g)
        owner = self._side.book.owner_obj(g.spec.owner, g.spec.namespace)
        if g.kind is not None and g.kind.owns_pods and g.kind.resume_patch({}) is None and base == g.key \
                and owner is not None:
            self._side.scaling.rescale(g.key, g.kind, owner)
        return True

    # ---------------------------------------------------------------- recovery
    def recover(self, fluxjobs: list[dict[str, Any]], live: set[tuple[str, str]] | None = None) -> None:
        """Rebuild groups from FluxJobs (before any pod is looked at). ``live``: FluxJobs whose
        placed pods are bound and running: their allocations are recorded first, so a stale
        Running FluxJob (its group ended while its status could not be written) never takes
        the room of a group whose pods hold it."""
        to_record: list[Group] = []
        derived = _DerivedTexts(self._side.book.make_jobspec)
        for fj in fluxjobs:
            meta, spec, st = _meta(fj), fj.get("spec") or {}, fj.get("status") or {}
            try:
                phase = Phase(st.get("phase", "Provisional"))
            except ValueError:
                phase = Phase.PROVISIONAL
            if phase.final:
                self._side.scaling.on_fluxjob(fj)  # its name is spent (before any replayed pod forms a group)
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

                text = spec.get("jobspec") or ""
                if not text:
                    g.jobspec = self._side.book.make_jobspec(g)
                elif text == derived.text(g):
                    # the jobspec fluxnetes derives for this group, as it wrote it: derived
                    # again (parsing thousands of FluxJobs' texts took seconds at a restart)
                    g.jobspec, g.jobspec_yaml = self._side.book.make_jobspec(g), text
                else:
                    g.jobspec = parse_jobspec(text)
            except Exception:
                g.jobspec = self._side.book.make_jobspec(g)
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
                if all(n in self._side.cluster.nodes for n in g.held):
                    to_record.append(g)
                else:
                    g.jobid = None  # not recorded: reconcile re-matches or applies the node-loss policy
            elif phase == Phase.RESERVED:
                g.phase = Phase.PENDING
            self._side.book.add_recovered(g)
        live = live or set()
        for g in sorted(to_record, key=lambda g: g.key not in live):
            if not self._side.cluster.record_group(g):
                self._unrecorded.append(g)

    # ---------------------------------------------------------------- exact recovery
    # At start, with every cache complete and before any replayed event: what the records
    # (FluxJob status, store) do not show is taken from the cluster itself. Pods placed before
    # the crash for a group no record shows allocated give the allocation back exactly
    # (their slot annotations and nodes); a finished workload is never queued again and gets
    # its final FluxJob; afterwards `check_accounting` compares the graph with the bound pods.
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
            if fjname and is_ours(m, pod.get("spec") or {}) and not _gated(pod):
                placed.setdefault((str(m.get("namespace") or "default"), fjname), []).append(pod)
        # 1. finished workloads: never queued again; a final FluxJob if they never got one
        for (kname, ns, name), obj in list(self._side.book.owners.items()):
            kind = kind_of(kname)
            if kind is None or kind.resume_patch({}) is None or not kind.finished(obj):
                continue
            if not template_is_ours(kind.template(obj)):
                continue  # never fluxnetes' (created while the webhook was away)
            uid = str(_meta(obj).get("uid", ""))
            gkey = (ns, object_name(f"{kname.lower()}-{name}"))
            g = self._side.book.groups.get(gkey)
            if g is not None and self._side.book.same_owner(g, uid):
                if not g.phase.final:
                    self._side.book.workload_finished(g, kind, obj)
                continue
            if g is not None:
                self._side.book.drop_earlier_owner(gkey, f"{kname} {name} was deleted (a new one has its name)")
            if fj_owner.get(gkey) == uid:
                continue  # its (final) FluxJob exists
            try:
                spec = self._side.book.group_for_workload(kind, obj)
            except GroupError:
                continue
            g = self._side.book.new_group(spec, kind)
            ran = [p for p in by_owner.get(uid, []) if assigned_node(p)]
            g.slots = sorted(str(assigned_node(p)) for p in ran)
            g.alloc = [s for s in self._side.accounting.shares_of_pods(g, ran) if not s.empty]
            g.released = set(range(len(g.slots)))
            g.fj_dirty = True
            st = obj.get("status") or {}
            g.start = _parse_time(st.get("startTime"))
            g.submit = _parse_time(_meta(obj).get("creationTimestamp"))
            if self._side.store_recovery.unclaimed():
                self._side.store_recovery.claim_store_record(g)
            self._side.book.workload_finished(g, kind, obj)
            log.info("%s finished while fluxnetes was away: FluxJob recorded as %s", g.qid, g.phase)
        # 2. groups whose pods were placed but whose allocation no record shows
        for key, members in sorted(placed.items()):
            g = self._side.book.groups.get(key)
            if (g is not None and (g.phase == Phase.RUNNING or g.phase.final)) or (g is None and key in final):
                continue
            note = placed_note(members)
            if all(_terminal(p) for p in members) and (note is None or len(note.slots) <= len(members)):
                continue  # nothing is held any more (no slot of its allocation waits for a pod)
            if g is None:
                g = self.group_of_placed(key, members, note)
            if g is None or (g.phase != Phase.PROVISIONAL and g.phase not in QUEUED):
                continue
            if note is not None and self.adopt_annotated(g, members, note, self._open_wanted(g, by_owner)):
                continue
            if self.adopt_placed(g, members):
                continue
            # the store's allocation (what the group held at its last store write): its pods
            # exactly if they agree with it (slots given back before the crash have no pod),
            # else the allocation as recorded (slots laid out again)
            stored = self._side.store_recovery.stored_allocation(g)
            if stored is not None and not self.adopt_placed(g, members, stored=stored):
                self._side.store_recovery.adopt_allocation(g, stored, "allocated (recovered from the store)")
            elif stored is None:
                log.warning("%s: pods placed before the restart, its allocation not recorded and not all "
                            "its slots known; they count as foreign pods and the group is matched again",
                            g.qid)

    def _open_wanted(self, g: Group, by_owner: Mapping[str, list[dict[str, Any]]]) -> int | None:
        """How many slots without a pod a replicated workload's group (ReplicaSet,
        StatefulSet) may still keep open after a restart: its replicas less its live placed
        pods (a pod made again after a deletion waits gated for one). None for other kinds,
        or with the workload unknown: no rule then (``reconcile`` decides)."""
        if g.kind is None or not g.kind.owns_pods or g.kind.resume_patch({}) is not None or g.spec.owner is None:
            return None
        owner = self._side.book.owner_obj(g.spec.owner, g.spec.namespace)
        if owner is None:
            return None
        live = sum(1 for p in by_owner.get(g.spec.owner.uid, [])
                   if not _terminal(p) and not _gated(p) and assigned_node(p) is not None)
        return max(0, g.kind.size(owner) - live)

    def group_of_placed(self, key: tuple[str, str], pods: list[dict[str, Any]],
                        note: allocation_note.PlacedAllocation | None = None) -> Group | None:
        """The group of pods placed before a crash that came before its FluxJob was created.
        ``note``: the allocation its placed pods carry (its size is the group's, whatever
        slots were placed before the crash)."""
        pod = min(pods, key=lambda p: str(_meta(p).get("name", "")))
        owner = controller_of(_meta(pod))
        okind = kind_of(owner.kind) if owner else None
        kind: WorkloadKind | None
        try:
            if owner is not None and okind is not None and okind.resume_patch({}) is not None:
                obj = self._side.book.owner_obj(owner, key[0])
                if obj is None or okind.finished(obj) or self._side.scaling.ended(owner.uid):
                    return None
                spec, kind = self._side.book.group_for_workload(okind, obj), okind
            else:
                spec = self._side.book.pod_group_spec(pod)
                kind = kind_of(spec.owner.kind) if spec.owner else None
        except GroupError:
            return None
        scale_n = key[1][len(spec.name + SCALE_SEP):] if key[1].startswith(spec.name + SCALE_SEP) else ""
        if note is not None and spec.owner is not None and (spec.key == key or (
                key[0] == spec.namespace and scale_n.isdigit())):
            # the whole allocation is known: the group was placed at its size (a scale group's
            # pods carry the base group's spec)
            spec = replace(spec, name=key[1], size=len(note.slots))
        elif spec.key != key and key[0] == spec.namespace and scale_n.isdigit() and spec.owner is not None:
            # a scale group of a replicated workload (its pods carry the base group's spec):
            # its size is what its placed pods' slots say (adopt_placed checks they are all known)
            slots = [_slot_of(p) for p in pods]
            if None in slots:
                return None
            spec = replace(spec, name=key[1], size=1 + max(s for s in slots if s is not None))
        elif spec.key == key and kind is not None and kind.owns_pods:
            # the base group of a kind that owns its pods (Job, ReplicaSet, StatefulSet): its spec says today's
            # replica count (parallelism), which a scale-up (or down) after the placement
            # changed; the group was placed at the size its pods' slots say, and `reconcile`
            # gives the rest a scale group (or back) as for a group read from its FluxJob.
            # (Was: today's count, so not every slot was known and the placed pods counted as
            # foreign: the graph fell below them, or a Job's group was matched a second time.)
            # Today's size is kept when it accounts for every slot (the rule then agrees).
            slots = [_slot_of(p) for p in pods]
            if None not in slots:
                size = 1 + max(s for s in slots if s is not None)
                if set(slots) != set(range(spec.size)) and set(slots) == set(range(size)):
                    spec = replace(spec, size=size)
        if spec.key != key or spec.key in self._side.book.groups:
            return self._side.book.groups.get(key)
        g = self._side.book.new_group(spec, kind)
        if self._side.store_recovery.unclaimed():
            # the store may know the allocation: read after the pods (recover_from_cluster)
            self._side.store_recovery.claim_store_record(g, adopt=False)
        return g

    def adopt_placed(self, g: Group, pods: list[dict[str, Any]], stored: Any = None) -> bool:
        """The group's allocation, taken back from its placed pods: each pod's slot annotation
        and node. Only when every slot is known (a live pod or one that ended), for jobspecs
        fluxnetes derived itself (not exclusive): the share of each pod is then exact.
        ``stored``: the store's allocation of the group (what it held at its last store
        write); when the live pods' shares are exactly that, a slot without a pod was given
        back before the crash (a replica scaled away, a pod deleted), and the group spans
        its highest slot."""
        if g.spec.exclusive or g.spec.jobspec or g.jobspec is None:
            return False
        slots = [_slot_of(p) for p in pods]
        if None in slots:
            return False
        size = g.spec.size if stored is None else max(g.spec.size, 1 + max(s for s in slots if s is not None))
        live: dict[int, dict[str, Any]] = {}
        ended: dict[int, dict[str, Any]] = {}
        for p, slot in zip(pods, slots, strict=True):
            if slot is None or not 0 <= slot < size:
                return False
            if _terminal(p):
                ended.setdefault(slot, p)
            elif slot in live:
                return False
            else:
                live[slot] = p
        if not live or (stored is None and set(live) | set(ended) != set(range(size))):
            return False
        if any(assigned_node(p) not in self._side.cluster.nodes or self._side.cluster.node_down.get(str(assigned_node(p)), False)
               for p in live.values()):
            return False  # a node is gone or down: the node-loss rules apply to foreign pods
        if size != g.spec.size:
            spec, g.spec = g.spec, replace(g.spec, size=size)
            held = self._side.accounting.shares_of_pods(g, list(live.values()))
            if not _same_use(held, stored):
                g.spec = spec
                return False
            g.jobspec = self._side.book.make_jobspec(g)
        else:
            held = self._side.accounting.shares_of_pods(g, list(live.values()))
            if stored is not None and not _same_use(held, stored):
                return False
        # (a slot given back before the crash, whose pod is gone: no node known, none held)
        layout = [str(assigned_node(live[i] if i in live else ended[i]) or "") if i in live or i in ended else ""
                  for i in range(size)]
        return self._adopted(g, live, layout, held, list(held), {i for i in range(size) if i not in live},
                             "allocated before the restart (recovered from its placed pods)" if stored is None
                             else "allocated before the restart (recovered from its placed pods and the store)")

    def adopt_annotated(self, g: Group, pods: list[dict[str, Any]], note: allocation_note.PlacedAllocation,
                        open_wanted: int | None = None) -> bool:
        """The group's whole allocation, from the note its placed pods carry (every slot's
        node, every node's share: allocation_note.py), when a crash came after some but not
        all of its pods were placed and before any record of it. The slots of its live pods
        are theirs, those of ended pods given back, the others wait for the pods not placed
        yet (``reconcile`` assigns them; a group whose pods are gone gives them back there).
        ``open_wanted``: at most that many of those others stay open (a replicated workload
        scaled down, its pod gone, ``_open_wanted``), the rest given back before the record:
        else their room, which the last leader gave to another group, is held again until
        ``reconcile`` and that group's live pods cannot be recorded (they then counted as
        foreign pods for good, their group cancelled). False (the other rules apply) when
        the pods disagree with the note or a node of it is gone or down."""
        if g.sets or (g.spec.jobspec and len(note.slots) != g.spec.size):
            return False
        live: dict[int, dict[str, Any]] = {}
        ended: set[int] = set()
        for p in pods:
            if placed_jobid(p) != note.jobid:
                if not _terminal(p) and not _renumbered(p, note):
                    return False  # a live pod of another allocation: not one allocation
                if _terminal(p):
                    # (an ended pod under another id is not counted here: its own event
                    # gives its slot back, ``adopt`` then ``member_gone``, as for a pod
                    # that ends after the restart)
                    continue
            slot = _slot_of(p)
            if slot is None or not 0 <= slot < len(note.slots) or assigned_node(p) != note.slots[slot]:
                return False
            if _terminal(p):
                ended.add(slot)
            elif slot in live:
                return False
            else:
                live[slot] = p
        ended -= set(live)
        podless = [i for i in range(len(note.slots)) if i not in live and i not in ended]
        if open_wanted is not None and len(podless) > open_wanted:
            # (the first ones kept open: which pod-less slot a waiting pod takes is free)
            ended |= set(podless[open_wanted:])
        if any(n not in self._side.cluster.nodes or self._side.cluster.node_down.get(n, False) for n in note.slots):
            return False  # a node is gone or down: the node-loss rules apply to foreign pods
        held = allocation_note.held_after(note, ended)
        stored = self._side.store_recovery.stored_allocation(g)
        if stored is not None and _store_holds_less(held, stored):
            # the store saw slots given back after the placement (pods deleted, gone before this
            # start, so not seen ended): the note would hold their room again, which the last
            # leader gave to others (chaos soak s40: kwok-node-16 "full", deploy-50 unrecorded);
            # the live pods and the store say the allocation (adopt_placed with ``stored``)
            return False
        if len(note.slots) != g.spec.size:
            g.spec = replace(g.spec, size=len(note.slots))
            g.jobspec = self._side.book.make_jobspec(g)
        return self._adopted(g, live, list(note.slots), held, list(note.shares), ended,
                             "allocated before the restart (recovered from its placed pods' allocation note)")

    def _adopted(self, g: Group, live: Mapping[int, dict[str, Any]], slots: list[str], held: list[shares.Share],
                 alloc: list[shares.Share], released: set[int], reason: str) -> bool:
        """Record an allocation taken back from placed pods: the group runs with ``slots``,
        holds ``held`` (``alloc``: what it was given), its ``live`` pods in their slots."""
        jobid = self._side.cluster.matcher.next_jobid
        start = min(((_parse_time(_meta(p).get("creationTimestamp")) or self._ctx.now()) for p in live.values()),
                    default=self._ctx.now())
        try:
            self._side.cluster.matcher.update_allocate(jobid, shares.to_match(held), at=start, duration=g.spec.duration)
        except Exception as exc:
            log.error("%s: its placed pods could not be recorded (%s)", g.qid, exc)
            return False
        g.phase, g.reason = Phase.RUNNING, reason
        g.jobid, g.start, g.expected_start = jobid, start, None
        g.held, g.alloc = {s.node: s for s in held}, alloc
        g.slots = slots
        g.slot_pod = [None] * len(slots)
        g.released = released
        for slot, p in live.items():
            uid = str(_meta(p).get("uid", ""))
            g.slot_pod[slot] = uid
            g.members[uid] = p
            self._side.book.set_member(uid, g.key)
        g.resumed = g.recovered = True
        g.fj_dirty = True
        self._side.status.counts_changed()
        self._ctx.dirty = True
        if self._ctx.journal is not None:
            self._ctx.journal.record(self._side.status.group_record(g), self._ctx.now())
        self._side.status.group_event(g, "Normal", "Recovered",
                         f"{g.reason}: job {g.jobid} on {','.join(sorted(set(g.held)))}", pods=False)
        log.info("%s: %s (job %s on %s)", g.qid, g.reason, g.jobid, ",".join(sorted(g.held)))
        return True

    def reconcile(self) -> None:
        """After a restart, once every pod has been seen again: groups recovered from FluxJobs
        whose pods vanished while the operator was away give their resources back."""
        for g in list(self._side.book.groups.values()):
            # replicated workloads scaled down while the operator was away: now that every
            # pod has claimed its slot again, the slots without a pod are given back
            if g.phase == Phase.RUNNING and g.kind is not None and g.kind.owns_pods \
                    and g.kind.resume_patch({}) is None and self._side.scaling.base_key(g) == g.key:
                owner = self._side.book.owner_obj(g.spec.owner, g.spec.namespace)
                if owner is not None:
                    self._side.scaling.rescale(g.key, g.kind, owner)
            # a Job taken back at the size its placed pods' slots say (group_of_placed: no note
            # could be used) while its parallelism is larger and its other pods wait in it
            # without a slot: they form a scale group, as a scale-up would (else they wait
            # forever: a Job's pods join its group by owner, never a scale group, live)
            elif g.phase == Phase.RUNNING and g.kind is not None and g.kind.owns_pods \
                    and g.kind.resume_patch({}) is not None and self._side.scaling.base_key(g) == g.key \
                    and len(g.waiting()) > g.free_slots():
                owner = self._side.book.owner_obj(g.spec.owner, g.spec.namespace)
                if owner is not None and g.kind.size(owner) > len(g.slots) - len(g.released):
                    self._side.scaling.rescale(g.key, g.kind, owner)
                if owner is not None:  # a raised Job's scale groups (recovered) take their pods back
                    self._side.scaling.job_grown(g.key, g.kind, owner)
        for base, keys in list(self._side.scaling.scale_groups.items()):
            # pods the replay routed before every slot was claimed again: to the group that
            # still collects its pods (else a scale group waits for pods it already has)
            for k in [base, *keys]:
                short = self._side.book.groups.get(k)
                if short is not None and short.phase == Phase.PROVISIONAL and len(short.members) < short.spec.size:
                    self._side.scaling.take_strays(base, short)
        for g in list(self._side.book.groups.values()):
            if g.phase == Phase.RUNNING and self.requeue_if_nodes_gone(g):
                continue
            if g.phase == Phase.RUNNING and self.suspended_by_user(g):
                continue
            if g.phase == Phase.RUNNING:
                self._side.allocation.assign(g)
                self.resume_if_held(g)  # allocated before the crash, resume not sent
            if g.kind is not None:
                owner = self._side.book.owner_obj(g.spec.owner, g.spec.namespace)
                if g.spec.owner is not None and owner is None and not g.phase.final:
                    self._side.allocation.cancel_group(g, f"{g.spec.owner.kind} {g.spec.owner.name} no longer exists")
                elif owner is not None and not g.phase.final and g.kind.finished(owner):
                    self._side.book.workload_finished(g, g.kind, owner)  # over while the operator was away
                continue
            if g.phase == Phase.PROVISIONAL and not g.members and g.fj_exists:
                self._side.allocation.cancel_group(g, "all pods of the group are gone (found after a restart)")
            elif g.phase == Phase.RUNNING:
                for slot, uid in enumerate(g.slot_pod):
                    if uid is None and slot not in g.released:
                        self._side.allocation.release_slot(g, slot)
                if g.phase == Phase.RUNNING and not g.held:
                    self._side.allocation.finish_group(g)
            elif g.phase in QUEUED and len(g.members) < g.spec.size:
                self._side.cluster.scheduler.withdraw(g.qid)
                if not g.members:
                    self._side.allocation.cancel_group(g, "all pods of the group were deleted")
                else:
                    self._side.status.set_phase(g, Phase.PROVISIONAL, f"waiting for the group: {len(g.members)}/{g.spec.size} pods")
        for g in self._unrecorded:
            # what ended during the outage is given back now: record what could not be before
            if not (g.held and g.jobid is not None and g.jobid not in self._side.cluster.matcher.jobs):
                continue
            if self._side.cluster.record_group(g):
                log.info("%s: allocation recorded once the groups that ended were given back", g.qid)
            else:
                # still no room (live pods of another group hold it): its pods run on, charged
                # as foreign pods, instead of members of an allocation the graph does not hold
                self._side.cluster.unrecordable(g, "its allocation from before the restart could not be "
                                                   f"recorded (no room on {', '.join(sorted(g.held))})")
        self._unrecorded.clear()
        # logged: the graph's use against the bound pods; a few seconds on, so that its list of
        # every pod (and its decoding) does not hold up the first cycles and binds of a restart
        self._ctx.spawn(self._side.accounting.accounting_check(delay=ACCOUNTING_CHECK_DELAY))


class _DerivedTexts:
    """The text of the jobspec fluxnetes derives for a group (``make_jobspec``, dumped as a
    FluxJob holds it), made once per shape (size, request, duration, exclusive, locality)
    with a placeholder for the group's name, which is the only part that differs between
    groups of one shape; a group whose name the dumper would write differently (quoted)
    simply does not match, and its text is parsed."""

    PLACEHOLDER = "fluxnetesrecoveryplaceholder"

    def __init__(self, make: Any) -> None:
        self.make = make
        self.templates: dict[Any, str | None] = {}

    def text(self, g: Group) -> str | None:
        from fluxnetes.k8s.objects import _dump_jobspec

        s = g.spec
        if s.jobspec:
            return None  # a jobspec of the user's: parsed
        r = s.request
        key = (s.size, r.cpu_millis, r.memory_bytes, r.gpus, tuple(sorted(r.extended.items())),
               s.duration, s.exclusive, s.locality)
        if key not in self.templates:
            try:
                probe = Group(spec=replace(s, name=self.PLACEHOLDER), kind=None)
                self.templates[key] = _dump_jobspec(self.make(probe))
            except Exception:
                self.templates[key] = None
        template = self.templates[key]
        return None if template is None else template.replace(self.PLACEHOLDER, s.name[:60])


def _slot_of(pod: Mapping[str, Any]) -> int | None:
    """The slot a placed pod's annotation names (None: none, or not a number)."""
    try:
        return int((_meta(pod).get("annotations") or {}).get(ANN_SLOT, ""))
    except ValueError:
        return None


def placed_note(pods: Sequence[Mapping[str, Any]]) -> allocation_note.PlacedAllocation | None:
    """The allocation the placed pods of a group carry (allocation_note.py): the note of its
    live pods' allocation (of its ended pods' when none is live); None when they carry none
    or live pods carry notes of different allocations."""
    notes: dict[str, allocation_note.PlacedAllocation] = {}
    live: set[str] = set()
    for p in pods:
        note = allocation_note.of_pod(p)
        if note is None or placed_jobid(p) != note.jobid:
            continue
        if notes.setdefault(note.jobid, note) != note:
            return None  # two pods of one allocation that disagree: neither is trusted
        if not _terminal(p):
            live.add(note.jobid)
    # a leader that adopted the allocation from its note gave it its own matcher's job id:
    # the pods it placed carry the same slots and shares under that id (leases lost several
    # times in a row). Live pods of one allocation so renumbered are one allocation.
    if len(live) > 1 and all(_allocation_of(notes[j]) == _allocation_of(notes[min(live)]) for j in live):
        return notes[min(live)]
    if len(live) == 1:
        return notes[live.pop()]
    return notes.popitem()[1] if not live and len(notes) == 1 else None


def _allocation_of(note: allocation_note.PlacedAllocation) -> tuple[Any, ...]:
    """What an allocation is, whatever job id a leader gave it: its slots' nodes and shares."""
    return (note.slots, note.shares)


def _renumbered(pod: Mapping[str, Any], note: allocation_note.PlacedAllocation) -> bool:
    """Was ``pod`` placed for the allocation ``note`` says, under another leader's job id
    (its own note the same slots and shares, under the id it was placed with)?"""
    own = allocation_note.of_pod(pod)
    return own is not None and placed_jobid(pod) == own.jobid and _allocation_of(own) == _allocation_of(note)


def _same_use(held: Sequence[shares.Share], stored: Any) -> bool:
    """Do the shares of a group's live pods equal the store's allocation, node by node?"""
    mine = {(s.node, s.cores, s.gpus, s.memory) for s in held if not s.empty}
    theirs = {(n.name, n.cores, n.gpus, n.memory) for n in stored.nodes if n.cores or n.gpus or n.memory}
    return mine == theirs


def _store_holds_less(held: Sequence[shares.Share], stored: Any) -> bool:
    """Does the store's allocation hold less than ``held`` on some node (a release the store
    saw after the note was written)? (A store that lags behind holds more, never less.)"""
    theirs = {n.name: (n.cores, n.gpus, n.memory) for n in stored.nodes}
    for s in held:
        if s.empty:
            continue
        cores, gpus, memory = theirs.get(s.node, (0, 0, 0))
        if cores < s.cores or gpus < s.gpus or memory < s.memory:
            return True
    return False
