"""Reading the objects the controller watches: metadata, held or finished pods, times, down
nodes; the resource of each workload kind that owns pods; a jobspec as text. Shared by every
part of the controller (controller.py and the modules it joins)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from functools import lru_cache
from typing import Any

from fluxnetes.k8s.admission.hold import is_held
from fluxnetes.k8s.kube import Resource
from fluxnetes.k8s.workloads import KINDS, WorkloadKind

OWNER_RESOURCES = {k.kind: Resource(k.api_version, k.plural) for k in KINDS.values() if k.owns_pods}


def workload_resource(kind: WorkloadKind) -> Resource:
    """The API resource of a workload kind (built-in or multi-role: k8s/groups/podset_groups.py)."""
    return OWNER_RESOURCES.get(kind.kind) or Resource(kind.api_version, kind.plural)


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


def _gated(pod: Mapping[str, Any]) -> bool:
    """Is the pod held for fluxnetes (its gate, or its scheduler name: k8s/admission/hold.py)?"""
    return is_held(pod)


def _ended(pod: Mapping[str, Any]) -> bool:
    """Has the pod ended (Succeeded or Failed)? Only then is its room on its node free: a pod
    being deleted still runs until its kubelet stops it, and kube-scheduler counts it."""
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


def _terminal(pod: Mapping[str, Any]) -> bool:
    """Will the pod not run on (ended, or being deleted)? What a workload has left; not what
    its node holds (``_ended``)."""
    return bool(_meta(pod).get("deletionTimestamp")) or _ended(pod)


def _parse_time(s: object) -> int | None:
    if not isinstance(s, str) or not s:
        return None
    return _parse_text_time(s)


@lru_cache(maxsize=4096)  # every watch event of a pod carries the same few times again
def _parse_text_time(s: str) -> int | None:
    try:
        return int(datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp())
    except ValueError:
        return None


def _event_time(obj: Mapping[str, Any], etype: str) -> int | None:
    """When the change a watch event reports happened (seconds; None if unknown)."""
    meta = obj.get("metadata") or {}
    if etype == "ADDED":
        return _parse_time(meta.get("creationTimestamp"))
    times = [_parse_time(meta.get("deletionTimestamp"))]
    times += [_parse_time(c.get("lastTransitionTime")) for c in (obj.get("status") or {}).get("conditions") or []]
    known = [t for t in times if t is not None]
    return max(known) if known else None


def _node_down(node: Mapping[str, Any]) -> bool:
    from fluxnetes.graph.builders import node_is_down

    return bool(node_is_down(node))


def _dump_jobspec(js: Any) -> str:
    if js is None:
        return ""
    for attr in ("to_yaml", "dumps", "to_json"):
        fn = getattr(js, attr, None)
        if callable(fn):
            try:
                return str(fn())
            except Exception:
                continue
    import yaml

    to_dict = getattr(js, "to_dict", None) or getattr(js, "as_dict", None)
    if callable(to_dict):
        return yaml.safe_dump(to_dict(), sort_keys=False)
    return str(js)
