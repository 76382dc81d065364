"""apps/v1 Deployment: its template is gated; its pods are grouped by their ReplicaSet."""

from __future__ import annotations

from fluxnetes.k8s.workloads.base import WorkloadKind


class DeploymentKind(WorkloadKind):
    api_version = "apps/v1"
    kind = "Deployment"
    plural = "deployments"
    owns_pods = False


KIND = DeploymentKind()
