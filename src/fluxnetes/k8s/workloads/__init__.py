"""Workload kinds fluxnetes understands, discovered from the modules of this package.

Each module defines ``KIND``, an instance of :class:`~fluxnetes.k8s.workloads.base.WorkloadKind`.

Two registries:

- ``KINDS``: the built-in kinds (Job, ReplicaSet, Deployment, StatefulSet), always on; what
  ``kind_of`` answers from, unchanged.
- ``ADDON_KINDS``: the multi-role kinds served by CRDs (MPIJob, JobSet, TrainJob,
  LeaderWorkerSet; ``WorkloadKind.addon``). A cluster may not have their CRDs: the operator
  asks ``enabled_kinds`` with what discovery shows (one log line per kind that is off) and
  asks again when a CRD appears. ``any_kind_of`` looks in both.

Routing a pod to its workload (``route_pod``): multi-role kinds first, by the labels their
controllers put on pods (a JobSet's pods belong to Jobs, an LWS's to StatefulSets: their
controlling owner is not the workload); then, as before, the pod's controlling owner.
Objects those controllers create for their workload (``made_for``) are never grouped alone.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from fluxnetes.k8s.workloads.base import Lookup, PodRoute, PodSetSpec, WorkloadKind


def _discover() -> dict[str, WorkloadKind]:
    kinds: dict[str, WorkloadKind] = {}
    for info in pkgutil.iter_modules(__path__):
        if info.name == "base":
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        kind = getattr(module, "KIND", None)
        if isinstance(kind, WorkloadKind):
            kinds[kind.kind] = kind
    return kinds


ALL_KINDS: dict[str, WorkloadKind] = _discover()
KINDS: dict[str, WorkloadKind] = {k: v for k, v in ALL_KINDS.items() if not v.addon}
ADDON_KINDS: dict[str, WorkloadKind] = {k: v for k, v in ALL_KINDS.items() if v.addon}
# routing order: a TrainJob's pods are also a JobSet's, so TrainJob is asked first
ROUTE_ORDER: tuple[str, ...] = ("TrainJob", "JobSet", "MPIJob", "LeaderWorkerSet")
# kinds that only work with another one on (TrainJob runs as a JobSet)
REQUIRES: dict[str, tuple[str, ...]] = {"TrainJob": ("JobSet",)}


def kind_of(kind: str) -> WorkloadKind | None:
    return KINDS.get(kind)


def any_kind_of(kind: str) -> WorkloadKind | None:
    """The built-in or multi-role kind named ``kind``."""
    return ALL_KINDS.get(kind)


def _controller(meta: Mapping[str, Any]) -> Mapping[str, Any] | None:
    for ref in meta.get("ownerReferences") or []:
        if ref.get("controller"):
            return ref  # type: ignore[no-any-return]
    return None


def made_for(obj: Mapping[str, Any], kind: str | None = None) -> str | None:
    """The multi-role kind whose controller made ``obj`` for one of its workloads (a JobSet's or
    MPIJob's Job, an LWS's StatefulSets, a TrainJob's JobSet), or None. Such objects are part
    of that workload's group: admission leaves them alone and the operator never groups them.
    ``kind``: the object's kind when it does not say (items of a list do not)."""
    meta = obj.get("metadata") or {}
    kind = kind or str(obj.get("kind", ""))
    ref = _controller(meta)
    if ref is not None:
        owner = ADDON_KINDS.get(str(ref.get("kind", "")))
        if owner is not None and kind in owner.children:
            return owner.kind
    # an LWS's worker StatefulSets are controlled by the leader pod; they carry the LWS's name
    if kind == "StatefulSet" and "leaderworkerset.sigs.k8s.io/name" in (meta.get("labels") or {}):
        return "LeaderWorkerSet"
    return None


# the label each multi-role controller puts on every pod it makes (whatever the pod's owner)
POD_LABELS: dict[str, str] = {
    "JobSet": "jobset.sigs.k8s.io/jobset-name",
    "MPIJob": "training.kubeflow.org/job-name",
    "LeaderWorkerSet": "leaderworkerset.sigs.k8s.io/name",
}


def addon_pod(pod: Mapping[str, Any], enabled: Iterable[str] | None = None) -> str | None:
    """The multi-role kind whose controller made ``pod`` (from its labels alone: "JobSet" also
    for a TrainJob's pods), or None. Such a pod is never grouped through its controlling owner
    (a Job, a StatefulSet): if ``route_pod`` cannot place it yet, wait for its owner."""
    labels = (pod.get("metadata") or {}).get("labels") or {}
    on = set(POD_LABELS if enabled is None else enabled)
    for kind, label in POD_LABELS.items():
        if kind in on and label in labels:
            return kind
    return None


def route_pod(pod: Mapping[str, Any], lookup: Lookup | None = None,
              enabled: Iterable[str] | None = None) -> PodRoute | None:
    """The multi-role workload, group and pod set ``pod`` belongs to, or None: then either the
    pod is not a multi-role kind's (``addon_pod`` None: group it as today, by its labels, its
    controlling owner, or alone) or its owner is not known yet. ``lookup`` reads the
    operator's cache: a JobSet's pod needs its JobSet, to tell a TrainJob's from a user's
    (None until the JobSet is cached); without ``lookup`` such a pod routes to the JobSet.
    ``enabled``: the kinds that are on (default all)."""
    on = set(ROUTE_ORDER if enabled is None else enabled)
    for name in ROUTE_ORDER:
        if name not in on:
            continue
        if name == "TrainJob" and lookup is None:
            continue
        route = ADDON_KINDS[name].route(pod, lookup)
        if route is not None:
            return route
    return None


def pod_sets_of(obj: Mapping[str, Any], lookup: Lookup | None = None) -> list[PodSetSpec]:
    """The pod sets of one group of workload ``obj`` (any kind): a TrainJob's come from its
    JobSet once ``lookup`` finds it (its runtime's replicated Jobs), else from the TrainJob."""
    kind = any_kind_of(str(obj.get("kind", "")))
    if kind is None:
        return []
    if kind.kind == "TrainJob" and lookup is not None:
        from fluxnetes.k8s.workloads.trainjob import KIND as TRAINJOB

        meta = obj.get("metadata") or {}
        jobset = lookup("JobSet", str(meta.get("namespace") or "default"), str(meta.get("name", "")))
        return TRAINJOB.pod_sets_with(obj, jobset)
    return kind.pod_sets(obj)


def group_bases(obj: Mapping[str, Any]) -> list[str]:
    """The names (before object_name()) of the groups workload ``obj`` is now: one,
    "<kind>-<name>", or for a LeaderWorkerSet one per replica, "<kind>-<name>-<i>" (scaling up
    adds the new indices, scaling down removes the last ones) — the same names as
    ``PodRoute.group_base`` of their pods."""
    kind = any_kind_of(str(obj.get("kind", "")))
    meta = obj.get("metadata") or {}
    base = f"{str(obj.get('kind', '')).lower()}-{meta.get('name', '')}"
    n = kind.replica_groups(obj) if kind is not None else None
    return [base] if n is None else [f"{base}-{i}" for i in range(n)]


# -- which kinds are on: the served API resources ---------------------------------------------
def discovery_paths(kinds: Iterable[WorkloadKind] | None = None) -> list[str]:
    """The API discovery documents that say whether the multi-role kinds are served
    (``GET /apis/<group>/<version>``: an APIResourceList; 404 when the CRD is absent)."""
    return sorted({f"/apis/{k.api_version}" for k in (kinds or ADDON_KINDS.values())})


def served_resources(docs: Iterable[Mapping[str, Any]]) -> set[tuple[str, str]]:
    """(apiVersion, plural) pairs served, read from APIResourceList documents (discovery) and/or
    CustomResourceDefinition objects (served versions of an Established CRD)."""
    out: set[tuple[str, str]] = set()
    for doc in docs:
        if doc.get("kind") == "CustomResourceDefinition":
            spec = doc.get("spec") or {}
            conds = (doc.get("status") or {}).get("conditions") or []
            if not any(c.get("type") == "Established" and c.get("status") == "True" for c in conds):
                continue
            plural = (spec.get("names") or {}).get("plural", "")
            for v in spec.get("versions") or []:
                if v.get("served"):
                    out.add((f"{spec.get('group', '')}/{v.get('name', '')}", str(plural)))
        elif "groupVersion" in doc:
            for r in doc.get("resources") or []:
                name = str(r.get("name", ""))
                if "/" not in name:  # not a subresource
                    out.add((str(doc["groupVersion"]), name))
    return out


def enabled_kinds(served: Iterable[tuple[str, str]],
                  log: Callable[[str], None] | None = None) -> dict[str, WorkloadKind]:
    """Every built-in kind, plus each multi-role kind whose resource is in ``served`` (and whose
    required kinds are on). ``log`` gets one line per multi-role kind that is off, naming the
    missing CRD."""
    have = set(served)
    on: dict[str, WorkloadKind] = dict(KINDS)
    for name, kind in ADDON_KINDS.items():
        if (kind.api_version, kind.plural) in have:
            on[name] = kind
    for name, needs in REQUIRES.items():
        if name in on and any(n not in on for n in needs):
            del on[name]
    if log is not None:
        for name, kind in sorted(ADDON_KINDS.items()):
            if name not in on:
                why = (f"{kind.plural}.{kind.group} {kind.version} is not served (CRD not installed)"
                       if (kind.api_version, kind.plural) not in have
                       else f"it needs {', '.join(REQUIRES.get(name, ()))}")
                log(f"workload kind {name} is off: {why}; it turns on when the CRD appears")
    return on


__all__ = [
    "ADDON_KINDS",
    "ALL_KINDS",
    "KINDS",
    "Lookup",
    "PodRoute",
    "PodSetSpec",
    "WorkloadKind",
    "addon_pod",
    "any_kind_of",
    "discovery_paths",
    "enabled_kinds",
    "group_bases",
    "kind_of",
    "made_for",
    "pod_sets_of",
    "route_pod",
    "served_resources",
]
