"""kubeflow.org/v2beta1 MPIJob (Kubeflow MPI Operator): a launcher and N workers, one group.

Held at admission with its own suspend field, ``spec.runPolicy.suspend`` (marked
``fluxnetes.io/suspended-by: fluxnetes``; an MPIJob its user created suspended stays theirs),
and its two pod templates (``spec.mpiReplicaSpecs.{Launcher,Worker}.template``) are gated, so
every pod is born held. Suspended, the MPI Operator creates the launcher Job suspended and no
worker; resumed, it creates the workers (pods owned by the MPIJob) and lets the launcher Job
make its pod. Pods carry ``training.kubeflow.org/job-name`` and ``.../job-role``
(launcher|worker) and workers ``.../replica-index``: that is how a pod finds its group.

``runLauncherAsWorker: true``: the launcher also runs ranks, so it is one more worker for
MPI, but it is still the launcher pod set here (its own template, one pod); an MPIJob may
then have no Worker at all. ``launcherCreationPolicy: WaitForWorkersReady``: the launcher pod
is created once the workers run, so its set is ``deferred`` (allocated with the group, placed
when it comes).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fluxnetes.k8s.workloads.base import (
    JsonPatch,
    Lookup,
    PodRoute,
    PodSetSpec,
    SuspendableKind,
    condition_true,
    count_field,
    gate_template_patch,
    suspend_ops,
)

JOB_NAME = "training.kubeflow.org/job-name"
JOB_ROLE = "training.kubeflow.org/job-role"
REPLICA_INDEX = "training.kubeflow.org/replica-index"
OPERATOR_NAME = "training.kubeflow.org/operator-name"
ROLES = (("Launcher", "launcher"), ("Worker", "worker"))



class MPIJobKind(SuspendableKind):
    suspend_path = ("spec", "runPolicy", "suspend")
    api_version = "kubeflow.org/v2beta1"
    kind = "MPIJob"
    plural = "mpijobs"
    addon = True
    template_path = "/spec/mpiReplicaSpecs/Launcher/template"
    children = ("Job",)  # the launcher Job

    def _specs(self, obj: Mapping[str, Any]) -> Mapping[str, Any]:
        return (obj.get("spec") or {}).get("mpiReplicaSpecs") or {}

    def template(self, obj: Mapping[str, Any]) -> Mapping[str, Any]:
        return (self._specs(obj).get("Launcher") or {}).get("template") or {}

    def pod_sets(self, obj: Mapping[str, Any]) -> list[PodSetSpec]:
        spec = obj.get("spec") or {}
        wait = spec.get("launcherCreationPolicy") == "WaitForWorkersReady"
        out = []
        for key, role in ROLES:
            rs = self._specs(obj).get(key)
            if not isinstance(rs, Mapping):
                continue
            count = count_field(rs.get("replicas"), 1)
            if count == 0:
                continue
            out.append(PodSetSpec(role, count, rs.get("template") or {},
                                  f"/spec/mpiReplicaSpecs/{key}/template",
                                  deferred=wait and role == "launcher"))
        return out

    def size(self, obj: Mapping[str, Any]) -> int:
        return sum(ps.count for ps in self.pod_sets(obj))

    def mutate(self, obj: Mapping[str, Any], *, suspend: bool = True, hold: str = "gate") -> JsonPatch:
        ops: JsonPatch = []
        for ps in self.pod_sets(obj):
            ops.extend(gate_template_patch(obj, ps.path, hold))
        if suspend:
            ops.extend(suspend_ops(obj, "/spec/runPolicy/suspend", "/spec/runPolicy"))
        return ops

    def deadline(self, obj: Mapping[str, Any]) -> object:
        return ((obj.get("spec") or {}).get("runPolicy") or {}).get("activeDeadlineSeconds")

    def replaces_pods(self, obj: Mapping[str, Any]) -> bool:
        return True  # a failed worker is re-created by the operator (restartPolicy)

    def replaces_succeeded(self, obj: Mapping[str, Any]) -> bool:
        return False  # a launcher or worker that succeeded is not made again

    def slot_of(self, pod: Mapping[str, Any]) -> int | None:
        route = self.route(pod)
        return None if route is None else route.slot

    def route(self, pod: Mapping[str, Any], lookup: Lookup | None = None) -> PodRoute | None:
        meta = pod.get("metadata") or {}
        labels = meta.get("labels") or {}
        name, role = labels.get(JOB_NAME), labels.get(JOB_ROLE)
        if not name or role not in ("launcher", "worker") or labels.get(OPERATOR_NAME, "mpi-operator") != "mpi-operator":
            return None
        raw = labels.get(REPLICA_INDEX)
        slot = int(raw) if isinstance(raw, str) and raw.isdigit() else (0 if role == "launcher" else None)
        return PodRoute(self.kind, str(meta.get("namespace") or "default"), str(name), role, slot)

    def finished(self, obj: Mapping[str, Any]) -> bool:
        return condition_true(obj, "Succeeded", "Failed")

    def failed(self, obj: Mapping[str, Any]) -> bool:
        return condition_true(obj, "Failed")


KIND = MPIJobKind()
