"""Recovery from the cluster itself after a restart (``recover_from_cluster``, at start,
with every cache complete and before any replayed event): finished workloads get their final
FluxJob and are never queued again; a group whose pods were placed for an allocation no
record shows takes it back exactly, from its placed pods' slots and nodes (``adopt_placed``),
the allocation note they carry (``adopt_annotated``) or the store (``store_recovery``). A
group of placed pods whose FluxJob was never created is made again (``group_of_placed``).
Owned state: none (a part of ``Recovery``, which reaches it as ``_adoption``)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from fluxnetes.k8s import names
from fluxnetes.k8s.admission.hold import is_ours, template_is_ours
from fluxnetes.k8s.context import Context
from fluxnetes.k8s.groups import GroupError, controller_of, object_name
from fluxnetes.k8s.groups.groupbook import QUEUED, Group
from fluxnetes.k8s.names import SCALE_SEP
from fluxnetes.k8s.objects import _gated, _meta, _parse_time, _terminal
from fluxnetes.k8s.persistence.fluxjob import Phase
from fluxnetes.k8s.persistence.placed_pods import (
    placed_note,
    renumbered,
    same_use,
    slot_of,
    store_holds_less,
)
from fluxnetes.k8s.scheduling import allocation_note, shares
from fluxnetes.k8s.scheduling.placement import assigned_node, placed_jobid
from fluxnetes.k8s.workloads import WorkloadKind, kind_of

if TYPE_CHECKING:
    from fluxnetes.k8s.persistence.recovery_side import RecoverySide

# one logger for every part of the state machine: its log lines read as before the split
log = logging.getLogger("fluxnetes.k8s.controller")


class Adoption:
    """Allocations taken back from the cluster after a restart (placed pods, finished
    workloads): the part of recovery that reads them."""

    def __init__(self, ctx: Context, side: RecoverySide) -> None:
        self._ctx, self._side = ctx, side

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
            slots = [slot_of(p) for p in pods]
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
            slots = [slot_of(p) for p in pods]
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
        slots = [slot_of(p) for p in pods]
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
            if not same_use(held, stored):
                g.spec = spec
                return False
            g.jobspec = self._side.book.make_jobspec(g)
        else:
            held = self._side.accounting.shares_of_pods(g, list(live.values()))
            if stored is not None and not same_use(held, stored):
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
                if not _terminal(p) and not renumbered(p, note):
                    return False  # a live pod of another allocation: not one allocation
                if _terminal(p):
                    # (an ended pod under another id is not counted here: its own event
                    # gives its slot back, ``adopt`` then ``member_gone``, as for a pod
                    # that ends after the restart)
                    continue
            slot = slot_of(p)
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
        if stored is not None and store_holds_less(held, stored):
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
