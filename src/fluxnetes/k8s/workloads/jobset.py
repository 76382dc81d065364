"""jobset.x-k8s.io/v1alpha2 JobSet: every replicated Job x replicas x parallelism, one group.

Each replicated Job is a pod set of ``replicas x min(parallelism, completions)`` pods (its Job
template's pod template). Held at admission with ``spec.suspend`` (marked
``fluxnetes.io/suspended-by: fluxnetes``; a JobSet its user created suspended stays theirs)
and every ``spec.replicatedJobs[i].template.spec.template`` gated. Suspended, the JobSet
controller creates its Jobs suspended (no pod); resumed, the Jobs make their pods, born
gated. The Jobs it creates are never grouped on their own (``children``), and their pods
carry ``jobset.sigs.k8s.io/jobset-name``, ``.../replicatedjob-name`` and ``.../job-index``.

A JobSet made by a TrainJob (its controlling owner) belongs to the TrainJob's group: routing
one of its pods needs the JobSet from the operator's cache (``lookup``) to see that owner.
``startupPolicy: InOrder`` and ``dependsOn``: the later replicated Jobs are created once the
earlier ones run, so their pod sets are ``deferred``.
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

JOBSET_NAME = "jobset.sigs.k8s.io/jobset-name"
REPLICATED_JOB = "jobset.sigs.k8s.io/replicatedjob-name"
JOB_INDEX = "jobset.sigs.k8s.io/job-index"
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"



def pods_per_job(job_template: Mapping[str, Any]) -> int:
    """Pods one Job runs at once: min(parallelism, completions), as for a plain Job."""
    spec = job_template.get("spec") or {}
    par = count_field(spec.get("parallelism"), 1)
    comp = spec.get("completions")
    return par if comp is None else min(par, count_field(comp, par))


class JobSetKind(SuspendableKind):
    api_version = "jobset.x-k8s.io/v1alpha2"
    kind = "JobSet"
    plural = "jobsets"
    addon = True
    owns_pods = False
    template_path = "/spec/replicatedJobs/0/template/spec/template"
    children = ("Job",)

    def _rjobs(self, obj: Mapping[str, Any]) -> list[Mapping[str, Any]]:
        return [r for r in (obj.get("spec") or {}).get("replicatedJobs") or [] if isinstance(r, Mapping)]

    def template(self, obj: Mapping[str, Any]) -> Mapping[str, Any]:
        rjobs = self._rjobs(obj)
        return ((rjobs[0].get("template") or {}).get("spec") or {}).get("template") or {} if rjobs else {}

    def pod_sets(self, obj: Mapping[str, Any]) -> list[PodSetSpec]:
        in_order = (obj.get("spec") or {}).get("startupPolicy", {}) or {}
        ordered = isinstance(in_order, Mapping) and in_order.get("startupPolicyOrder") == "InOrder"
        out = []
        for i, rj in enumerate(self._rjobs(obj)):
            jt = rj.get("template") or {}
            count = count_field(rj.get("replicas"), 1) * pods_per_job(jt)
            if count == 0:
                continue
            out.append(PodSetSpec(
                str(rj.get("name", f"rjob-{i}")), count, (jt.get("spec") or {}).get("template") or {},
                f"/spec/replicatedJobs/{i}/template/spec/template",
                deferred=bool(rj.get("dependsOn")) or (ordered and i > 0),
            ))
        return out

    def size(self, obj: Mapping[str, Any]) -> int:
        return sum(ps.count for ps in self.pod_sets(obj))

    def mutate(self, obj: Mapping[str, Any], *, suspend: bool = True, hold: str = "gate") -> JsonPatch:
        ops: JsonPatch = []
        for i, _rj in enumerate(self._rjobs(obj)):
            ops.extend(gate_template_patch(obj, f"/spec/replicatedJobs/{i}/template/spec/template", hold))
        if suspend:
            ops.extend(suspend_ops(obj, "/spec/suspend"))
        return ops

    def replaces_pods(self, obj: Mapping[str, Any]) -> bool:
        # its Jobs replace failed pods (backoffLimit) and failurePolicy restarts whole Jobs
        return True

    def replaces_succeeded(self, obj: Mapping[str, Any]) -> bool:
        """Only a Job of more completions than pods at once makes a pod after one succeeded."""
        for rj in self._rjobs(obj):
            spec = (rj.get("template") or {}).get("spec") or {}
            comp = spec.get("completions")
            if comp is not None and count_field(comp, 0) > pods_per_job(rj.get("template") or {}):
                return True
        return False

    def slot_in_set(self, obj: Mapping[str, Any] | None, pod: Mapping[str, Any]) -> int | None:
        """job-index x pods per Job + completion index (needs the JobSet for the Job width)."""
        labels = (pod.get("metadata") or {}).get("labels") or {}
        job, comp = labels.get(JOB_INDEX), labels.get(COMPLETION_INDEX)
        if not (isinstance(job, str) and job.isdigit() and isinstance(comp, str) and comp.isdigit()):
            return None
        if obj is None:
            return None
        for rj in self._rjobs(obj):
            if rj.get("name") == labels.get(REPLICATED_JOB):
                return int(job) * pods_per_job(rj.get("template") or {}) + int(comp)
        return None

    def route(self, pod: Mapping[str, Any], lookup: Lookup | None = None) -> PodRoute | None:
        meta = pod.get("metadata") or {}
        labels = meta.get("labels") or {}
        name, rjob = labels.get(JOBSET_NAME), labels.get(REPLICATED_JOB)
        if not name or not rjob:
            return None
        ns = str(meta.get("namespace") or "default")
        if lookup is None:
            return PodRoute(self.kind, ns, str(name), str(rjob))
        obj = lookup(self.kind, ns, str(name))
        if obj is None:
            return None  # not in the cache yet: it may be a TrainJob's (workloads.route_pod)
        return PodRoute(self.kind, ns, str(name), str(rjob), self.slot_in_set(obj, pod))

    def finished(self, obj: Mapping[str, Any]) -> bool:
        return bool((obj.get("status") or {}).get("terminalState")) or condition_true(obj, "Completed", "Failed")

    def failed(self, obj: Mapping[str, Any]) -> bool:
        return (obj.get("status") or {}).get("terminalState") == "Failed" or condition_true(obj, "Failed")


KIND = JobSetKind()
