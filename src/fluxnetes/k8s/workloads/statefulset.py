"""apps/v1 StatefulSet: a group of ``replicas`` gated pods; ordinal i keeps slot i."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fluxnetes.k8s.workloads.base import WorkloadKind


class StatefulSetKind(WorkloadKind):
    api_version = "apps/v1"
    kind = "StatefulSet"
    plural = "statefulsets"

    def slot_of(self, pod: Mapping[str, Any]) -> int | None:
        name = str((pod.get("metadata") or {}).get("name", ""))
        tail = name.rsplit("-", 1)[-1]
        return int(tail) if tail.isdigit() else None


KIND = StatefulSetKind()
