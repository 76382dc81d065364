"""Recovery after a restart (or a new leader): groups from FluxJobs (``recover``; each read
by fluxjob_readback.py), the store's live rows (``recover_store``, rows claimed by groups
re-created from their objects: store_recovery.py), then what no record shows, from the
cluster itself, before any replayed event (``recover_from_cluster``: finished workloads, pods
placed for an allocation no record shows: adoption.py, reading the pods with placed_pods.py;
what recovery needs of the other parts: recovery_side.py);
pods seen placed afterwards (``adopt``, ``take_back``); once every pod was seen again,
``reconcile`` (vanished pods give back, gone nodes, lost resumes, a user's suspension while
no operator ran). Owned state: ``unrecorded`` (allocations read back that did not fit the
graph yet)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from fluxnetes.k8s import names
from fluxnetes.k8s.context import Context
from fluxnetes.k8s.groups import controller_of
from fluxnetes.k8s.groups.groupbook import QUEUED, Group
from fluxnetes.k8s.objects import _gated, _meta, _parse_time
from fluxnetes.k8s.persistence.adoption import Adoption
from fluxnetes.k8s.persistence.fluxjob import Phase
from fluxnetes.k8s.persistence.fluxjob_readback import DerivedTexts, group_from_fluxjob
from fluxnetes.k8s.persistence.placed_pods import placed_note, slot_of
from fluxnetes.k8s.persistence.recovery_side import RecoverySide
from fluxnetes.k8s.scheduling import allocation_note, shares
from fluxnetes.k8s.scheduling.placement import assigned_node, placed_jobid

# one logger for every part of the state machine: its log lines read as before the split
log = logging.getLogger("fluxnetes.k8s.controller")

ACCOUNTING_CHECK_DELAY = 5.0  # seconds after the post-restart reconcile


class Recovery:
    """What the store, FluxJobs and bound pods say after a restart, reconciled once: a
    component (its state is private); the other parts reach it as ``recovery``."""

    def __init__(self, ctx: Context, side: RecoverySide) -> None:
        self._ctx, self._side = ctx, side
        # running groups read back whose allocation did not fit the graph when recorded (a
        # stale FluxJob of a group that ended during the outage held the room): tried again
        # once reconcile has given back what ended
        self._unrecorded: list[Group] = []
        self._adoption = Adoption(ctx, side)  # (recovery from placed pods: adoption.py)
        # pods placed for a group whose allocation take_back could not take back: they left it
        # and run on as foreign pods (_charge_untaken); never adopted again while they do
        self._untaken: set[str] = set()

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
        if uid in self._untaken:
            if uid in self._side.cluster.foreign_node:
                return False  # charged as a foreign pod until it goes (_charge_untaken): never twice
            self._untaken.discard(uid)
        jid = placed_jobid(pod)
        if jid is not None and not g.recovered and jid != str(g.jobid):
            return False  # placed for an earlier group of the same name (that one is over)
        owner = controller_of(meta)
        if owner is not None and g.spec.owner is not None and not self._side.book.same_owner(g, owner.uid):
            return False  # a pod of an earlier workload of the same name
        slot = slot_of(pod)
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
        taken = (note is not None and self._adoption.adopt_annotated(g, placed, note)) or self.adopt_placed(g, placed)
        if not taken:
            stored = self._side.store_recovery.stored_allocation(g)
            taken = stored is not None and self.adopt_placed(g, placed, stored=stored)
        if not taken:
            self._charge_untaken(g)
            return False
        if queued:
            self._side.cluster.scheduler.withdraw(g.qid)  # (running now: never matched again)
        base = self._side.scaling.base_key(g)
        owner = self._side.book.owner_obj(g.spec.owner, g.spec.namespace)
        if g.kind is not None and g.kind.owns_pods and g.kind.resume_patch({}) is None and base == g.key \
                and owner is not None:
            self._side.scaling.rescale(g.key, g.kind, owner)
        return True

    def _charge_untaken(self, g: Group) -> None:
        """``g``'s placed pods run on an allocation this leader could not take back (no usable
        note, slots that disagree, or no room to record it). Left members of a group that holds
        nothing, their nodes looked free in the graph and the next group was placed over them
        (double booking: the kubelet refused with OutOfcpu). The rule of the mirror, the
        rebuild and the store's adoption applies: they leave the group and are charged as
        foreign pods until they go (what fits, the rest retried: ``flush_foreign``), and the
        charge goes with them. The group stands for the rest only: a replicated workload's
        group follows its replica count less its pods still running (``rescale`` counts
        foreign pods as survivors), a multi-role group's pod sets each lose their own pods
        (``podsets.without_pods``; its whole shape kept, with a warning, when which sets they
        left cannot be told), any other group shrinks by the pods that left (a jobspec its
        user gave kept whole, with a warning). So when
        it is placed later, all-or-nothing, its running pods are neither counted twice (not
        members) nor uncharged (foreign); ``adopt`` does not take them back while they run."""
        moved = self._side.cluster.survivors_to_foreign(g)
        self._untaken.update(str(_meta(p).get("uid", "")) for p in moved)
        log.warning("%s: %d pod(s) placed by an earlier leader seen after the start, their allocation not known; "
                    "they leave the group and hold their nodes as foreign pods until they go", g.qid, len(moved))
        if not moved:
            return
        self._side.cluster.flush_foreign()  # charged now, before the next cycle matches anything
        owner = self._side.book.owner_obj(g.spec.owner, g.spec.namespace)
        if g.kind is not None and g.kind.owns_pods and g.kind.resume_patch({}) is None \
                and self._side.scaling.base_key(g) == g.key and owner is not None:
            self._side.scaling.rescale(g.key, g.kind, owner)
            return
        if g.sets:
            # a multi-role group: its size less the pods that left cut no role in particular (a
            # launcher counted as a worker, a role kept with none), and its jobspec, made from
            # its pod sets, still asked for every pod: each set loses its own pods instead
            shrunk = self._side.podsets.without_pods(g, moved)
            if shrunk is None:
                # its shape cannot be told: it keeps the one it has, never a wrong one (it may
                # wait until the pods that left are gone); said, not silent
                reason = ("pods placed by an earlier leader left the group as foreign pods, and which of "
                          "its pod sets they left cannot be told: the group keeps its whole shape")
                log.warning("%s: %s", g.qid, reason)
                self._side.status.group_event(g, "Warning", "ShapeKept", reason, pods=False)
                return
            rest = shrunk
        else:
            rest = g.spec.size - len(moved)
            if g.spec.jobspec is not None and rest >= 1:
                # a jobspec its user gave is a shape, not a count of pods: no cut of it is sure
                # to be the user's, so it is matched whole for the pods left (it may wait until
                # the pods that left are gone, and hold their room too); said, not silent
                reason = (f"{len(moved)} pod(s) placed by an earlier leader left the group as foreign pods; its "
                          f"jobspec (annotation {names.ANN_JOBSPEC}) is kept whole for the {rest} left")
                log.warning("%s: %s", g.qid, reason)
                self._side.status.group_event(g, "Warning", "ShapeKept", reason, pods=False)
        if rest >= 1:
            self._side.scaling.resize(g, rest)
        else:
            self._side.allocation.cancel_group(g, "all its pods were placed by an earlier leader on an allocation "
                                                  "not known here: they run on as foreign pods")

    # ---------------------------------------------------------------- recovery
    def recover(self, fluxjobs: list[dict[str, Any]], live: set[tuple[str, str]] | None = None) -> None:
        """Rebuild groups from FluxJobs (before any pod is looked at). ``live``: FluxJobs whose
        placed pods are bound and running: their allocations are recorded first, so a stale
        Running FluxJob (its group ended while its status could not be written) never takes
        the room of a group whose pods hold it."""
        to_record: list[Group] = []
        derived = DerivedTexts(self._side.book.make_jobspec)
        for fj in fluxjobs:
            meta, st = _meta(fj), fj.get("status") or {}
            try:
                phase = Phase(st.get("phase", "Provisional"))
            except ValueError:
                phase = Phase.PROVISIONAL
            if phase.final:
                self._side.scaling.on_fluxjob(fj)  # its name is spent (before any replayed pod forms a group)
                continue
            g = group_from_fluxjob(fj, phase, self._side.book.make_jobspec, derived)
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

    # ---------------------------------------------------------------- exact recovery (adoption.py)
    def recover_from_cluster(self, pods: list[dict[str, Any]], fluxjobs: list[dict[str, Any]]) -> None:
        self._adoption.recover_from_cluster(pods, fluxjobs)

    def group_of_placed(self, key: tuple[str, str], pods: list[dict[str, Any]],
                        note: allocation_note.PlacedAllocation | None = None) -> Group | None:
        return self._adoption.group_of_placed(key, pods, note)

    def adopt_placed(self, g: Group, pods: list[dict[str, Any]], stored: Any = None) -> bool:
        return self._adoption.adopt_placed(g, pods, stored)

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
