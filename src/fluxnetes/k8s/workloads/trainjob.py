"""trainer.kubeflow.org/v1alpha1 TrainJob (Kubeflow Trainer): one group for the TrainJob.

Trainer runs a TrainJob as a JobSet it creates (same name, controlled by the TrainJob) from
the TrainJob's runtime (a ClusterTrainingRuntime or TrainingRuntime). That JobSet belongs to
the TrainJob's group and is never grouped a second time: admission leaves it alone (its
controlling owner is a TrainJob, see workloads.made_for) and its pods route to the TrainJob
(``route``: the JobSet's pod labels, then the JobSet's owner from the operator's cache).

Held at admission with ``spec.suspend`` (marked ``fluxnetes.io/suspended-by: fluxnetes``; a
TrainJob its user created suspended stays theirs). Suspended, Trainer creates the JobSet
suspended, and the JobSet its Jobs suspended: no pod.

Why the pods are not held through templates: the pod templates are the runtime's, not the
TrainJob's, and Trainer writes the JobSet with server-side apply, re-applying it when the
TrainJob is resumed — a gate a webhook added to the JobSet at its creation is owned by
Trainer's field manager and would be dropped by that very apply, at the moment the pods get
made. ``podSpecOverrides[].schedulingGates`` would need the runtime's replicated Job names,
which admission (a pure function, no API call) cannot read. So the pods of a TrainJob are
held by fluxnetes' pod webhook, like any pod not born from a template fluxnetes gated: each
is created gated (one admission call per pod).

Pod sets: those of the JobSet once it exists (``pod_sets_with``: its replicated Jobs); before,
from the TrainJob alone (``pod_sets``): ``spec.trainer.numNodes`` pods (default 1) asking
``spec.trainer.resourcesPerNode`` — the runtime's own defaults are only known through the
JobSet.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from fluxnetes.k8s.workloads.base import (
    JsonPatch,
    Lookup,
    PodRoute,
    PodSetSpec,
    SuspendableKind,
    condition_true,
    suspend_ops,
)
from fluxnetes.k8s.workloads.jobset import KIND as JOBSET

NODE_SET = "node"


def _controller(obj: Mapping[str, Any]) -> Mapping[str, Any] | None:
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("controller"):
            return ref  # type: ignore[no-any-return]
    return None


class TrainJobKind(SuspendableKind):
    api_version = "trainer.kubeflow.org/v1alpha1"
    kind = "TrainJob"
    plural = "trainjobs"
    addon = True
    owns_pods = False
    template_path = ""
    children = ("JobSet",)

    def template(self, obj: Mapping[str, Any]) -> Mapping[str, Any]:
        trainer = (obj.get("spec") or {}).get("trainer") or {}
        container: dict[str, Any] = {"name": NODE_SET}
        res = trainer.get("resourcesPerNode")
        if isinstance(res, Mapping):
            container["resources"] = dict(res)
        return {"spec": {"containers": [container]}}

    def pod_sets(self, obj: Mapping[str, Any]) -> list[PodSetSpec]:
        trainer = (obj.get("spec") or {}).get("trainer") or {}
        nodes = trainer.get("numNodes")
        count = nodes if isinstance(nodes, int) and not isinstance(nodes, bool) and nodes >= 0 else 1
        return [PodSetSpec(NODE_SET, count, self.template(obj), "")] if count else []

    def pod_sets_with(self, obj: Mapping[str, Any], jobset: Mapping[str, Any] | None) -> list[PodSetSpec]:
        """The pod sets of the TrainJob ``obj`` once its JobSet ``jobset`` exists (its
        replicated Jobs; their templates are not in the TrainJob: ``path`` "")."""
        if jobset is None or not self.owns_jobset(obj, jobset):
            return self.pod_sets(obj)
        return [replace(ps, path="") for ps in JOBSET.pod_sets(jobset)]

    def owns_jobset(self, obj: Mapping[str, Any], jobset: Mapping[str, Any]) -> bool:
        ref = _controller(jobset)
        uid = (obj.get("metadata") or {}).get("uid")
        return ref is not None and ref.get("kind") == self.kind and (not uid or ref.get("uid") == uid)

    def size(self, obj: Mapping[str, Any]) -> int:
        return sum(ps.count for ps in self.pod_sets(obj))

    def mutate(self, obj: Mapping[str, Any], *, suspend: bool = True, hold: str = "gate") -> JsonPatch:
        # pods are held by the pod webhook (see the module docstring)
        return suspend_ops(obj, "/spec/suspend") if suspend else []

    def replaces_succeeded(self, obj: Mapping[str, Any]) -> bool:
        return False  # one pod per training node, run once

    def route(self, pod: Mapping[str, Any], lookup: Lookup | None = None) -> PodRoute | None:
        """A pod of the JobSet a TrainJob made: needs that JobSet in ``lookup``."""
        r = JOBSET.route(pod, lookup)
        if r is None or lookup is None:
            return None
        jobset = lookup(JOBSET.kind, r.namespace, r.name)
        ref = _controller(jobset) if jobset is not None else None
        if ref is None or ref.get("kind") != self.kind:
            return None
        return PodRoute(self.kind, r.namespace, str(ref.get("name", "")), r.pod_set, r.slot)

    def finished(self, obj: Mapping[str, Any]) -> bool:
        return condition_true(obj, "Complete", "Failed")

    def failed(self, obj: Mapping[str, Any]) -> bool:
        return condition_true(obj, "Failed")


KIND = TrainJobKind()
