"""batch/v1 Job: created suspended, a group of ``parallelism`` pods, resumed when allocated."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fluxnetes.k8s import names
from fluxnetes.k8s.workloads.base import JsonPatch, WorkloadKind


class JobKind(WorkloadKind):
    api_version = "batch/v1"
    kind = "Job"
    plural = "jobs"

    def mutate(self, obj: Mapping[str, Any], *, suspend: bool = True) -> JsonPatch:
        ops = super().mutate(obj)
        if suspend:
            ops.append({"op": "add", "path": "/spec/suspend", "value": True})
        return ops

    def size(self, obj: Mapping[str, Any]) -> int:
        spec = obj.get("spec") or {}
        par = spec.get("parallelism")
        par = 1 if par is None else int(par)
        comp = spec.get("completions")
        return par if comp is None else min(par, int(comp))

    def deadline(self, obj: Mapping[str, Any]) -> object:
        return (obj.get("spec") or {}).get("activeDeadlineSeconds")

    def resume_patch(self, obj: Mapping[str, Any]) -> dict[str, Any] | None:
        return {"spec": {"suspend": False}}

    def replaces_pods(self, obj: Mapping[str, Any]) -> bool:
        # more pods than the group size will run over the Job's life: keep the shares until
        # the Job is done (a Job of N completions with parallelism N never replaces)
        spec = obj.get("spec") or {}
        comp = spec.get("completions")
        return comp is not None and int(comp) > self.size(obj)

    def slot_of(self, pod: Mapping[str, Any]) -> int | None:
        meta = pod.get("metadata") or {}
        raw = (meta.get("labels") or {}).get(names.JOB_COMPLETION_INDEX) or (
            meta.get("annotations") or {}
        ).get("batch.kubernetes.io/job-completion-index")
        try:
            return None if raw is None else int(raw)
        except ValueError:
            return None

    def finished(self, obj: Mapping[str, Any]) -> bool:
        for cond in (obj.get("status") or {}).get("conditions") or []:
            if cond.get("type") in ("Complete", "Failed") and cond.get("status") == "True":
                return True
        return False


KIND = JobKind()
