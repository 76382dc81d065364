"""apps/v1 ReplicaSet: a group of ``replicas`` gated pods (also the pods of a Deployment)."""

from __future__ import annotations

from fluxnetes.k8s.workloads.base import WorkloadKind


class ReplicaSetKind(WorkloadKind):
    api_version = "apps/v1"
    kind = "ReplicaSet"
    plural = "replicasets"


KIND = ReplicaSetKind()
