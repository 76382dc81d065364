"""Multi-role workloads (MPIJob, JobSet, TrainJob, LeaderWorkerSet) as groups of pod sets.

The operator's part for the kinds of ``k8s/workloads`` served by CRDs (``WorkloadKind.addon``):

- which kinds are on: the served API resources (discovery, ``served_addons``) at start, asked
  again every ``FLUXNETES_ADDON_DISCOVERY_SECONDS`` (30 s): a kind whose CRD appears turns on
  (its informer starts, and ``on_kinds_changed`` lets the operator add its admission rules).
  Discovery needs no permission beyond what every authenticated client has;
- one group per workload (per replica for a LeaderWorkerSet), made when the workload is seen
  held by fluxnetes (``on_workload``): its jobspec has one slot shape per pod set
  (``jobspec_from_podsets``), so the whole gang is matched all-or-nothing; a TrainJob's group
  is made once the JobSet Trainer creates for it is known (its pod sets are that JobSet's),
  and that JobSet, like a JobSet's or an MPIJob's Jobs and an LWS's StatefulSets, is never
  grouped on its own (``workloads.made_for``);
- every pod routed to its workload's group by its labels (``join_addon``: before the
  owner-based grouping), parked until its workload is known;
- slots per pod set (``slots_of_sets`` when the group starts; ``set_slots`` when a pod is
  given one): a pod takes a slot of its own set, the one of its index when free, so a pod
  re-created by its controller goes back to its predecessor's node; a pod that ends gives
  back its own set's share (``slot_share``).

Resuming (the workload's suspend field, once allocated) and releasing are allocation.py's, as
for a Job. Owned state: ``addon_on`` (the kinds that are on), ``on_kinds_changed``.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import replace
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Protocol

from fluxnetes.k8s.admission.hold import template_is_ours
from fluxnetes.k8s.context import Context
from fluxnetes.k8s.groups import (
    GroupError,
    GroupSpec,
    OwnerRef,
    duration_of,
    locality_of,
    object_name,
    request_of,
)
from fluxnetes.k8s.groups.groupbook import QUEUED, Group
from fluxnetes.k8s.groups.grouptable import GroupTable
from fluxnetes.k8s.kube import ApiError, Kube, Resource
from fluxnetes.k8s.objects import _meta
from fluxnetes.k8s.persistence.fluxjob import Phase
from fluxnetes.k8s.scheduling import shares
from fluxnetes.k8s.workloads import (
    ADDON_KINDS,
    PodRoute,
    PodSetSpec,
    WorkloadKind,
    addon_pod,
    discovery_paths,
    enabled_kinds,
    group_bases,
    made_for,
    pod_sets_of,
    served_resources,
)
from fluxnetes.k8s.workloads import route_pod as route_addon_pod

if TYPE_CHECKING:
    from fluxnetes.k8s.persistence.status import StatusWriter

log = logging.getLogger("fluxnetes.k8s.controller")

DISCOVERY_EVERY = "FLUXNETES_ADDON_DISCOVERY_SECONDS"


async def served_addons(kube: Kube) -> set[tuple[str, str]]:
    """(apiVersion, plural) pairs the API server serves among the multi-role kinds' groups
    (``GET /apis/<group>/<version>``; 404 when the CRD is not installed)."""
    docs = []
    for path in discovery_paths():
        try:
            docs.append(await kube.request("GET", path))
        except ApiError as exc:
            if exc.status in (404, 503) or exc.forbidden:  # not installed (503: not ready yet)
                continue
            raise
    return served_resources(docs)


async def watchable(kube: Kube, served: set[tuple[str, str]], skip: Iterable[str] = (),
                    log_off: Callable[[str], None] | None = None,
                    denied: set[str] | None = None) -> set[tuple[str, str]]:
    """``served`` without the multi-role kinds the operator may not list (a chart whose
    ClusterRole lacks them): such a kind stays off, told once through ``log_off``, rather than
    its informer stopping the operator or its workloads being held with nobody to resume them.
    ``skip``: kinds already on (not asked again)."""
    out = set(served)
    for name, kind in sorted(ADDON_KINDS.items()):
        pair = (kind.api_version, kind.plural)
        if name in skip or pair not in served:
            continue
        try:
            await kube.request("GET", Resource(kind.api_version, kind.plural).path(), params={"limit": 1})
        except ApiError as exc:
            if not exc.forbidden:
                raise
            out.discard(pair)
            if denied is not None:
                denied.add(name)
            if log_off is not None:
                log_off(f"workload kind {name} is off: the operator may not list {kind.plural}.{kind.group} "
                        f"(HTTP {exc.status}); grant get, list, watch and patch on it")
    return out


async def addon_kinds_served(kube: Kube, log_off: Callable[[str], None] | None = None) -> list[WorkloadKind]:
    """The multi-role kinds that are on (their CRD served, and listable), in a stable order."""
    denied: set[str] = set()
    served = await watchable(kube, await served_addons(kube), log_off=log_off, denied=denied)
    on = enabled_kinds(served, _except(log_off, denied))
    return [on[k] for k in sorted(on) if on[k].addon]


def _except(log_off: Callable[[str], None] | None, denied: set[str]) -> Callable[[str], None] | None:
    """``log_off`` without enabled_kinds' line for the kinds already said to be denied."""
    if log_off is None:
        return None
    out = log_off

    def say(line: str) -> None:
        if not any(line.startswith(f"workload kind {n} is off:") for n in denied):
            out(line)

    return say


def _podset(ps: PodSetSpec, locality: str | None) -> Any:
    from fluxnetes.jobspec.pods import PodRequest
    from fluxnetes.jobspec.podsets import PodSet

    r = request_of(ps.template.get("spec") or {})
    return PodSet(ps.name, ps.count, PodRequest(r.cpu_millis, r.memory_bytes, r.gpus, dict(r.extended)), locality)


class PodSetsBook(Protocol):
    """The group book as the multi-role part sees it (groups/groupbook.py)."""

    @property
    def groups(self) -> GroupTable: ...
    @property
    def owners(self) -> Mapping[tuple[str, str, str], dict[str, Any]]: ...
    @property
    def parked(self) -> Mapping[str, dict[str, Any]]: ...
    def set_owner(self, kind_name: str, namespace: str, name: str, obj: dict[str, Any]) -> None: ...
    def owner_deleted(self, kind_name: str, namespace: str, name: str, uid: str) -> None: ...
    def park(self, uid: str, pod: dict[str, Any]) -> None: ...
    def unpark(self, uid: str) -> dict[str, Any] | None: ...
    def add_member(self, g: Group, uid: str, pod: dict[str, Any]) -> None: ...
    def drop_earlier_owner(self, gkey: tuple[str, str], reason: str) -> None: ...
    def enqueue_workload(self, g: Group, kind: WorkloadKind, obj: Mapping[str, Any]) -> None: ...
    def new_group(self, spec: GroupSpec, kind: WorkloadKind | None) -> Group: ...
    def priority_of(self, spec: Mapping[str, Any]) -> int: ...
    def same_owner(self, g: Group, uid: str) -> bool: ...
    def workload_finished(self, g: Group, kind: WorkloadKind, obj: Mapping[str, Any]) -> None: ...


class PodSetsAllocation(Protocol):
    """Allocation as the multi-role part sees it (scheduling/allocation.py)."""

    def cancel_group(self, g: Group, reason: str) -> None: ...


class PodSetsSide(Protocol):
    """What the multi-role part uses of the other parts: the group book, allocation, the
    status writer, and the controller's watch (an informer for a kind turned on; pods
    handed to it again once their workload is known)."""

    @property
    def status(self) -> StatusWriter: ...
    @property
    def book(self) -> PodSetsBook: ...
    @property
    def allocation(self) -> PodSetsAllocation: ...
    def watch_kind(self, kind_name: str, resource: Resource, *, start: bool) -> None: ...
    def on_pod(self, etype: str, pod: dict[str, Any]) -> None: ...


class PodSetGroups:
    """Multi-role kinds: discovery, their informers, their groups, pods into pod-set slots: a
    component (its state is private); the other parts reach it as ``podsets``."""

    def __init__(self, ctx: Context, side: PodSetsSide) -> None:
        self._ctx, self._side = ctx, side
        self._addon_on: dict[str, WorkloadKind] = {}
        # the operator's hook: install the admission rules of these kinds (a CRD appeared)
        self.on_kinds_changed: Callable[[list[WorkloadKind]], Awaitable[None]] | None = None

    @property
    def addon_on(self) -> Mapping[str, WorkloadKind]:
        """The multi-role kinds that are on (read-only)."""
        return MappingProxyType(self._addon_on)

    # ---------------------------------------------------------------- which kinds are on
    async def start_addons(self) -> None:
        """Before the informers start: the kinds served now get theirs (one log line per kind
        that is off); discovery is asked again periodically."""
        denied: set[str] = set()
        try:
            served = await watchable(self._ctx.kube, await served_addons(self._ctx.kube), log_off=log.warning, denied=denied)
        except Exception as exc:  # asked again in a while (_rediscover)
            log.warning("multi-role workload kinds off for now: discovery failed (%r)", exc)
            served = set()
        self.enable_addons(served, started=False, denied=denied)
        every = float(os.environ.get(DISCOVERY_EVERY, "30") or 30)
        if every > 0:
            self._ctx.spawn(self._rediscover(every))

    def enable_addons(self, served: Iterable[tuple[str, str]], *, started: bool,
                      denied: set[str] | None = None) -> list[str]:
        """Turn on the multi-role kinds ``served`` shows (never off: a CRD removed only makes
        its informer retry). Returns the names turned on. At start, one line per kind that is
        off (``denied``: already told)."""
        say = None if started else _except(log.info, denied or set())
        on = {k: v for k, v in enabled_kinds(served, say).items() if v.addon}
        new = sorted(k for k in on if k not in self._addon_on)
        for name in new:
            kind = on[name]
            self._side.watch_kind(name, Resource(kind.api_version, kind.plural), start=started)
            self._addon_on[name] = kind
            if started:
                log.info("workload kind %s is on: %s.%s %s is served now", name, kind.plural, kind.group,
                         kind.version)
        return new

    async def _rediscover(self, every: float) -> None:
        while True:
            await asyncio.sleep(every)
            try:
                served = await watchable(self._ctx.kube, await served_addons(self._ctx.kube), skip=self._addon_on)
            except Exception as exc:  # the API server away: next time
                log.debug("discovery of multi-role kinds: %r", exc)
                continue
            if self.enable_addons(served, started=True) and self.on_kinds_changed is not None:
                try:
                    await self.on_kinds_changed(list(self._addon_on.values()))
                except Exception as exc:
                    log.warning("admission rules of the multi-role kinds not updated: %r", exc)

    # ---------------------------------------------------------------- workloads
    def addon_lookup(self, kind: str, namespace: str, name: str) -> Mapping[str, Any] | None:
        return self._side.book.owners.get((kind, namespace, name))

    def addon_route(self, pod: Mapping[str, Any]) -> PodRoute | None:
        return route_addon_pod(pod, self.addon_lookup, self._addon_on) if self._addon_on else None

    def groups_of(self, kind: str, ns: str, name: str, uid: str) -> list[Group]:
        return [g for g in self._side.book.groups.values()
                if g.spec.owner is not None and g.spec.owner.kind == kind and g.spec.owner.name == name
                and g.spec.namespace == ns and self._side.book.same_owner(g, uid)]

    def on_workload(self, kind_name: str, etype: str, obj: dict[str, Any]) -> None:
        kind = ADDON_KINDS[kind_name]
        meta = _meta(obj)
        ns, name, uid = meta.get("namespace") or "default", str(meta.get("name", "")), str(meta.get("uid", ""))
        if etype == "DELETED":
            self._side.book.owner_deleted(kind_name, ns, name, uid)
            if made_for(obj, kind_name) is None:
                for gone in self.groups_of(kind_name, ns, name, uid):
                    if not gone.phase.final:
                        self._side.allocation.cancel_group(gone, f"{kind_name} {name} was deleted")
            return
        self._side.book.set_owner(kind_name, ns, name, obj)
        if made_for(obj, kind_name) is not None:
            # a TrainJob's JobSet: its TrainJob's group can be made now
            ref: Mapping[str, Any] = next((r for r in meta.get("ownerReferences") or [] if r.get("controller")), {})
            top = self._side.book.owners.get((str(ref.get("kind", "")), ns, str(ref.get("name", ""))))
            if top is not None and str(ref.get("kind", "")) in self._addon_on:
                self.on_workload(str(ref.get("kind")), "MODIFIED", top)
            else:
                self.retry_parked()
            return
        if kind_name == "TrainJob":
            from fluxnetes.k8s.workloads.trainjob import KIND as TRAINJOB

            jobset = self._side.book.owners.get(("JobSet", ns, name))
            if jobset is None or not TRAINJOB.owns_jobset(obj, jobset):
                self.retry_parked()
                return  # its pod sets are its JobSet's: wait for Trainer to make it
        bases = group_bases(obj)
        if kind.replica_groups(obj) is not None:  # LWS scaled down: the last replicas' gangs end
            keep = {object_name(b) for b in bases}
            for old in self.groups_of(kind_name, ns, name, uid):
                # an Unsatisfiable gang ends too: it is no longer wanted, whatever the nodes
                if old.spec.name not in keep and (not old.phase.final or old.phase == Phase.UNSATISFIABLE):
                    self._side.allocation.cancel_group(old, f"{kind_name} {name} was scaled down")
        for base in bases:
            gkey = (ns, object_name(base))
            g = self._side.book.groups.get(gkey)
            if g is not None and not self._side.book.same_owner(g, uid):
                self._side.book.drop_earlier_owner(gkey, f"{kind_name} {name} was deleted (a new one has its name)")
                g = None
            if g is not None and g.kind is None and not g.phase.final:
                self.adopt_sets(g, kind, obj, base)  # recovered from its FluxJob after a restart
            if g is None:
                if kind.finished(obj) or not self.admitted(kind, obj):
                    continue
                g = self.new_workload_group(kind, obj, base)
                if g is not None and g.phase == Phase.PROVISIONAL and kind.resume_patch(obj) is not None:
                    self._side.book.enqueue_workload(g, kind, obj)
            elif not g.phase.final and kind.finished(obj):
                self._side.book.workload_finished(g, kind, obj)
            elif kind.resume_patch(obj) is not None and (g.phase == Phase.PROVISIONAL or g.phase in QUEUED):
                self._side.book.enqueue_workload(g, kind, obj)  # resumed (or suspended) by its user
        self.retry_parked()

    def adopt_sets(self, g: Group, kind: WorkloadKind, obj: Mapping[str, Any], base: str) -> None:
        """A group recovered from its FluxJob (which knows neither its kind nor its pod sets):
        both again from the workload; a running group's slots are set after set, in the order
        its FluxJob status lists their nodes (``slots_of_sets`` wrote them so)."""
        g.kind = kind
        try:
            _, sets = self.podset_group_spec(kind, obj, base)
        except (GroupError, ValueError):
            return
        g.sets = sets
        live = [s for s in sets if s.count > 0]
        if g.slots and not g.slot_set and len(g.slots) == sum(s.count for s in live):
            g.slot_set = [s.name for s in live for _ in range(s.count)]

    @staticmethod
    def admitted(kind: WorkloadKind, obj: Mapping[str, Any]) -> bool:
        """Held by fluxnetes' webhook at admission (a workload created while the webhook was
        away, or in a namespace fluxnetes does not manage, runs without it). A workload that
        already runs (resumed before an operator restart) is not queued again."""
        if kind.resume_patch(obj) is not None:
            return kind.held_by_fluxnetes(obj) or (kind.held_by_user(obj) and any(
                template_is_ours(ps.template) for ps in kind.pod_sets(obj)))
        return any(template_is_ours(ps.template) for ps in kind.pod_sets(obj))

    def new_workload_group(self, kind: WorkloadKind, obj: Mapping[str, Any], base: str) -> Group | None:
        try:
            spec, sets = self.podset_group_spec(kind, obj, base)
        except (GroupError, ValueError) as exc:  # JobspecError / PackingError are ValueErrors
            meta = _meta(obj)
            self._side.status.event({"apiVersion": kind.api_version, "kind": kind.kind, "name": meta.get("name", ""),
                        "namespace": meta.get("namespace") or "default", "uid": meta.get("uid", "")},
                       "Warning", "InvalidGroup", str(exc))
            return None
        g = self._side.book.new_group(spec, kind)
        g.sets = sets
        return g

    def podset_group_spec(self, kind: WorkloadKind, obj: Mapping[str, Any], base: str) -> tuple[GroupSpec, list[Any]]:
        from fluxnetes.jobspec.packing import packing_from_annotations
        from fluxnetes.jobspec.podsets import jobspec_from_podsets

        meta = _meta(obj)
        specs = [ps for ps in pod_sets_of(obj, self.addon_lookup) if ps.count > 0]
        if not specs:
            raise GroupError(f"{kind.kind} {meta.get('name', '')}: no pod set has a pod")
        first = specs[0].template
        ann = {**((first.get("metadata") or {}).get("annotations") or {}), **(meta.get("annotations") or {})}
        merged = {"annotations": ann}
        locality = locality_of(merged)
        sets = [_podset(ps, locality) for ps in specs]
        total = sum(s.count for s in sets)
        packing = packing_from_annotations(meta.get("annotations") or {}, pods=total,
                                           rack_label=getattr(self._ctx.config, "rack_label", "fluxnetes.io/rack"))
        name = object_name(base)
        duration = duration_of(merged, first.get("spec") or {}, kind.deadline(obj))
        js = jobspec_from_podsets(sets, duration=duration, packing=packing, name=name[:60])
        biggest = max(specs, key=lambda ps: request_of(ps.template.get("spec") or {}).cpu_millis)
        spec = GroupSpec(
            namespace=str(meta.get("namespace") or "default"), name=name, size=total,
            request=request_of(biggest.template.get("spec") or {}), duration=duration,
            priority=self._side.book.priority_of(first.get("spec") or {}),
            owner=OwnerRef(kind.api_version, kind.kind, str(meta.get("name", "")), str(meta.get("uid", ""))),
            jobspec=js.to_yaml(), exclusive=packing.exclusive, labels={}, locality=locality,
        )
        return spec, sets

    # ---------------------------------------------------------------- pods
    def join_addon(self, uid: str, pod: dict[str, Any]) -> bool:
        """A gated pod of a multi-role workload joins its workload's group (True), or waits
        for its workload to be known (True, parked); False: not such a pod."""
        if not self._addon_on:
            return False
        route = self.addon_route(pod)
        if route is None:
            if addon_pod(pod, self._addon_on) is None:
                return False
            self._side.book.park(uid, pod)  # its JobSet (maybe a TrainJob's) is not known yet
            return True
        gkey = (route.namespace, object_name(route.group_base))
        g = self._side.book.groups.get(gkey)
        obj = self._side.book.owners.get((route.kind, route.namespace, route.name))
        if obj is None:
            self._side.book.park(uid, pod)
            return True
        if g is not None and not self._side.book.same_owner(g, str(_meta(obj).get("uid", ""))):
            self._side.book.drop_earlier_owner(gkey, f"{route.kind} {route.name} was deleted (a new one has its name)")
            g = None
        if g is None:
            kind = ADDON_KINDS[route.kind]
            if kind.finished(obj):
                return True
            # a workload fluxnetes did not see held (resumed by its user before this operator
            # knew it; an LWS replica made by a scale-up seen first through its pods)
            g = self.new_workload_group(kind, obj, route.group_base)
            if g is None:
                return True
            if kind.resume_patch(obj) is not None:
                self._side.book.enqueue_workload(g, kind, obj)
        if g.phase.final and g.phase != Phase.RUNNING:
            return True  # over: this pod stays held (its workload is going away)
        self._side.book.add_member(g, uid, pod)
        return True

    def retry_parked(self) -> None:
        for puid, pod in list(self._side.book.parked.items()):
            if addon_pod(pod, self._addon_on) is None:
                continue
            if self.addon_route(pod) is None:
                continue
            self._side.book.unpark(puid)
            self._side.on_pod("MODIFIED", pod)

    # ---------------------------------------------------------------- slots per pod set
    def slots_of_sets(self, g: Group, res: Any) -> None:
        """The node of every slot of a started multi-set group, set after set (``slot_set``:
        the set of each slot)."""
        from fluxnetes.jobspec.podsets import nodes_of_sets

        held = [s for s in g.held.values()]
        source = res if getattr(res, "podsets", None) else held
        by_set = nodes_of_sets(g.sets, source, exclusive=g.spec.exclusive)
        slots: list[str] = []
        slot_set: list[str] = []
        for s in g.sets:
            if s.count <= 0:
                continue
            nodes = list(by_set.get(s.name, []))[:s.count]
            slots.extend(nodes)
            slot_set.extend([s.name] * len(nodes))
        g.slots, g.slot_set = slots, slot_set
        g.slot_pod = [None] * len(slots)

    def set_slots(self, g: Group, pod: Mapping[str, Any], free: list[int]) -> tuple[list[int], int | None]:
        """The free slots ``pod`` may take (those of its own pod set) and the one it wants (its
        index in the set)."""
        route = self.addon_route(pod)
        if route is None:
            return free, None
        mine = [i for i, name in enumerate(g.slot_set) if name == route.pod_set]
        if not mine:
            return free, None  # a set the group was not built with: any slot
        want = mine[route.slot] if route.slot is not None and 0 <= route.slot < len(mine) else None
        allowed = set(mine)
        return [i for i in free if i in allowed], want

    def without_pods(self, g: Group, left: Iterable[Mapping[str, Any]]) -> int | None:
        """``g`` (not started) without the pods that ``left`` it (placed by an earlier leader
        on an allocation not taken back: recovery._charge_untaken): each pod set loses its own
        pods, a set left with none goes, and the jobspec is made again from the sets that
        stay. Returns the pods the group stands for now (0: none). None, the group untouched:
        the shape cannot be told (a pod of no set of the group, more pods than its set has,
        the workload not known, or a packing the smaller gang cannot have)."""
        from fluxnetes.jobspec.packing import packing_from_annotations
        from fluxnetes.jobspec.podsets import jobspec_from_podsets

        counts = {s.name: s.count for s in g.sets}
        for pod in left:
            route = self.addon_route(pod)
            if route is None or counts.get(route.pod_set, 0) < 1:
                return None
            counts[route.pod_set] -= 1
        sets = [replace(s, count=counts[s.name]) for s in g.sets if counts[s.name] > 0]
        total = sum(int(s.count) for s in sets)
        if not sets:
            return 0
        ref = g.spec.owner
        owner = self._side.book.owners.get((ref.kind, g.spec.namespace, ref.name)) if ref is not None else None
        if owner is None:
            return None
        try:  # (as podset_group_spec made it, for the sets that stay)
            packing = packing_from_annotations(_meta(owner).get("annotations") or {}, pods=total,
                                               rack_label=getattr(self._ctx.config, "rack_label", "fluxnetes.io/rack"))
            js = jobspec_from_podsets(sets, duration=g.spec.duration, packing=packing, name=g.spec.name[:60])
        except ValueError:  # JobspecError / PackingError
            return None
        g.sets = sets
        g.spec = replace(g.spec, jobspec=js.to_yaml())
        return total

    def slot_share(self, g: Group, slot: int, held: shares.Share) -> shares.Share:
        """What one pod of the set of ``slot`` holds on its node (at most what is held)."""
        name = g.slot_set[slot] if slot < len(g.slot_set) else None
        s = next((x for x in g.sets if x.name == name), None)
        if s is None:
            return held.split(max(1, sum(1 for i, n in enumerate(g.slots) if n == held.node and i not in g.released)))
        d = s.demand()
        extra = {k: v for k, v in d.items() if k not in ("core", "memory", "gpu")}
        return shares.Share(held.node, min(held.cores, d.get("core", 0)), min(held.gpus, d.get("gpu", 0)),
                            min(held.memory, d.get("memory", 0)),
                            {k: min(v, held.extra.get(k, 0)) for k, v in extra.items() if held.extra.get(k, 0)})
