"""apps/v1 StatefulSet: a group of gated pods; ordinal i keeps slot i.

``podManagementPolicy: Parallel``: the controller creates every pod at once, so the set is
one group of ``replicas`` pods, placed all-or-nothing.

``OrderedReady`` (the default): the controller creates pod N+1 only once pods 0..N are Running
and Ready, so a group of ``replicas`` would never be complete (pod 0 waits gated for pods
that are not created before it runs). Such a set is placed pod by pod instead: its size is
the number of pods the controller will create now, ``min(replicas, max(status.replicas,
status.readyReplicas + 1))`` (the pods it made, or one more once they are all Ready). Pod 0
forms the set's group of one; each time a pod becomes Ready the size grows by one and the
next pod forms a group of its own (``<group>-scale-N``, the controller's scale-up path), queued
like any group. Scaling down and pod replacement work as for Parallel sets.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fluxnetes.k8s.workloads.base import WorkloadKind

ORDERED_READY = "OrderedReady"


def ordered(obj: Mapping[str, Any]) -> bool:
    """Does the set create its pods one at a time (OrderedReady, the default)?"""
    return str((obj.get("spec") or {}).get("podManagementPolicy") or ORDERED_READY) != "Parallel"


def _count(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


class StatefulSetKind(WorkloadKind):
    api_version = "apps/v1"
    kind = "StatefulSet"
    plural = "statefulsets"

    def size(self, obj: Mapping[str, Any]) -> int:
        replicas = super().size(obj)
        if not ordered(obj):
            return replicas
        status = obj.get("status") or {}
        made, ready = _count(status.get("replicas")), _count(status.get("readyReplicas"))
        return max(0, min(replicas, max(made, ready + 1)))

    def slot_of(self, pod: Mapping[str, Any]) -> int | None:
        name = str((pod.get("metadata") or {}).get("name", ""))
        tail = name.rsplit("-", 1)[-1]
        return int(tail) if tail.isdigit() else None


KIND = StatefulSetKind()
