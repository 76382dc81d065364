"""leaderworkerset.x-k8s.io/v1 LeaderWorkerSet: each replica (a leader and size-1 workers) is
a gang of its own.

An LWS of ``replicas`` R and ``leaderWorkerTemplate.size`` S is R groups (``replica_groups``)
of two pod sets: ``leader`` (1 pod, ``leaderTemplate``, or ``workerTemplate`` when there is
none) and ``worker`` (S-1 pods, ``workerTemplate``). Scaling up adds groups (the new replica
indices), scaling down deletes the last replicas' pods, which release their group.

LWS has no suspend field: it is held through its pods only. Both templates are gated at
admission, so every pod the LWS controller makes (the leader through the leader
StatefulSet, the workers through one StatefulSet per replica, owned by the leader pod) is born
held; these StatefulSets are never grouped on their own (``children``). Pods carry
``leaderworkerset.sigs.k8s.io/name``, ``.../group-index`` (the replica) and
``.../worker-index`` (0 = the leader).

``startupPolicy: LeaderReady``: the workers' StatefulSet is created once the leader runs, so
the worker set is ``deferred`` (allocated with the leader, placed when its pods come).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fluxnetes.k8s.workloads.base import (
    JsonPatch,
    Lookup,
    PodRoute,
    PodSetSpec,
    WorkloadKind,
    count_field,
    gate_template_patch,
)

LWS_NAME = "leaderworkerset.sigs.k8s.io/name"
GROUP_INDEX = "leaderworkerset.sigs.k8s.io/group-index"
WORKER_INDEX = "leaderworkerset.sigs.k8s.io/worker-index"
LEADER, WORKER = "leader", "worker"
_LWT = "/spec/leaderWorkerTemplate"



class LeaderWorkerSetKind(WorkloadKind):
    api_version = "leaderworkerset.x-k8s.io/v1"
    kind = "LeaderWorkerSet"
    plural = "leaderworkersets"
    addon = True
    owns_pods = False
    template_path = f"{_LWT}/workerTemplate"
    children = ("StatefulSet",)

    def _lwt(self, obj: Mapping[str, Any]) -> Mapping[str, Any]:
        return (obj.get("spec") or {}).get("leaderWorkerTemplate") or {}

    def template(self, obj: Mapping[str, Any]) -> Mapping[str, Any]:
        lwt = self._lwt(obj)
        return lwt.get("leaderTemplate") or lwt.get("workerTemplate") or {}

    def group_size(self, obj: Mapping[str, Any]) -> int:
        """Pods per replica: ``leaderWorkerTemplate.size`` (default 1)."""
        return max(1, count_field(self._lwt(obj).get("size"), 1))

    def pod_sets(self, obj: Mapping[str, Any]) -> list[PodSetSpec]:
        lwt = self._lwt(obj)
        worker = lwt.get("workerTemplate") or {}
        leader_path = f"{_LWT}/leaderTemplate" if lwt.get("leaderTemplate") else f"{_LWT}/workerTemplate"
        out = [PodSetSpec(LEADER, 1, lwt.get("leaderTemplate") or worker, leader_path)]
        size = self.group_size(obj)
        if size > 1:
            ready = (obj.get("spec") or {}).get("startupPolicy") == "LeaderReady"
            out.append(PodSetSpec(WORKER, size - 1, worker, f"{_LWT}/workerTemplate", deferred=ready))
        return out

    def size(self, obj: Mapping[str, Any]) -> int:
        """Pods in one group (one replica)."""
        return self.group_size(obj)

    def replica_groups(self, obj: Mapping[str, Any]) -> int | None:
        return count_field((obj.get("spec") or {}).get("replicas"), 1)

    def mutate(self, obj: Mapping[str, Any], *, suspend: bool = True, hold: str = "gate") -> JsonPatch:
        ops: JsonPatch = []
        for path in dict.fromkeys(ps.path for ps in self.pod_sets(obj)):
            ops.extend(gate_template_patch(obj, path, hold))
        return ops

    def slot_of(self, pod: Mapping[str, Any]) -> int | None:
        route = self.route(pod)
        return None if route is None else route.slot

    def route(self, pod: Mapping[str, Any], lookup: Lookup | None = None) -> PodRoute | None:
        meta = pod.get("metadata") or {}
        labels = meta.get("labels") or {}
        name, group, worker = labels.get(LWS_NAME), labels.get(GROUP_INDEX), labels.get(WORKER_INDEX)
        if not name or not (isinstance(group, str) and group.isdigit()):
            return None
        if not (isinstance(worker, str) and worker.isdigit()):
            return None
        w = int(worker)
        pod_set, slot = (LEADER, 0) if w == 0 else (WORKER, w - 1)
        return PodRoute(self.kind, str(meta.get("namespace") or "default"), str(name), pod_set, slot, int(group))


KIND = LeaderWorkerSetKind()
