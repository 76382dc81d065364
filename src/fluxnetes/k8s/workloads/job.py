"""batch/v1 Job: created suspended, a group of ``parallelism`` pods, resumed when allocated.

Who holds a suspended Job matters. The webhook suspends a Job at admission only when its
creator did not (``spec.suspend`` absent or false), and marks it with the annotation
``fluxnetes.io/suspended-by: fluxnetes``. Only such a Job is resumed by the operator when its
group is allocated. A Job its user created with ``spec.suspend: true`` (a Job queued by
Kueue, a paused pipeline, ...) is the user's to resume: its group waits as Provisional (the
FluxJob reason says so) until ``spec.suspend`` turns false, then goes through the queue like
any other (its pods are born gated, so nothing starts before the group is allocated).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fluxnetes.k8s import names
from fluxnetes.k8s.workloads.base import JsonPatch, WorkloadKind, _escape

# set by the webhook on a Job it suspended: the operator resumes only Jobs carrying it
ANN_SUSPENDED_BY = f"{names.DOMAIN}/suspended-by"
SUSPENDED_BY_US = "fluxnetes"


class JobKind(WorkloadKind):
    api_version = "batch/v1"
    kind = "Job"
    plural = "jobs"

    def mutate(self, obj: Mapping[str, Any], *, suspend: bool = True, hold: str = "gate") -> JsonPatch:
        ops = super().mutate(obj, hold=hold)
        if suspend and (obj.get("spec") or {}).get("suspend") is not True:
            ops.append({"op": "add", "path": "/spec/suspend", "value": True})
            meta = obj.get("metadata") or {}
            if not meta.get("annotations"):
                ops.append({"op": "add", "path": "/metadata/annotations",
                            "value": {ANN_SUSPENDED_BY: SUSPENDED_BY_US}})
            else:
                ops.append({"op": "add", "path": f"/metadata/annotations/{_escape(ANN_SUSPENDED_BY)}",
                            "value": SUSPENDED_BY_US})
        return ops

    def size(self, obj: Mapping[str, Any]) -> int:
        spec = obj.get("spec") or {}
        par = spec.get("parallelism")
        par = 1 if par is None else int(par)
        comp = spec.get("completions")
        return par if comp is None else min(par, int(comp))

    def pods_left(self, obj: Mapping[str, Any]) -> int:
        # the Job controller runs no more pods than the completions not yet succeeded
        comp = (obj.get("spec") or {}).get("completions")
        if comp is None:
            return self.size(obj)
        succeeded = int((obj.get("status") or {}).get("succeeded") or 0)
        return max(0, min(self.size(obj), int(comp) - succeeded))

    def deadline(self, obj: Mapping[str, Any]) -> object:
        return (obj.get("spec") or {}).get("activeDeadlineSeconds")

    def resume_patch(self, obj: Mapping[str, Any]) -> dict[str, Any] | None:
        return {"spec": {"suspend": False}}

    def held_by_fluxnetes(self, obj: Mapping[str, Any]) -> bool:
        meta = obj.get("metadata") or {}
        marked = (meta.get("annotations") or {}).get(ANN_SUSPENDED_BY) == SUSPENDED_BY_US
        return marked and (obj.get("spec") or {}).get("suspend") is True

    def held_by_user(self, obj: Mapping[str, Any]) -> bool:
        return (obj.get("spec") or {}).get("suspend") is True and not self.held_by_fluxnetes(obj)

    def suspended(self, obj: Mapping[str, Any]) -> bool:
        return (obj.get("spec") or {}).get("suspend") is True

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
        # SuccessCriteriaMet / FailureTarget come first (1.31+), Complete / Failed once the
        # pods are gone; a Job whose every completion succeeded is done even before either
        # (its condition lags its last pod: after a restart that moment must not queue it)
        status = obj.get("status") or {}
        for cond in status.get("conditions") or []:
            if cond.get("type") in _DONE and cond.get("status") == "True":
                return True
        comp = (obj.get("spec") or {}).get("completions")
        return comp is not None and int(status.get("succeeded") or 0) >= int(comp) > 0

    def failed(self, obj: Mapping[str, Any]) -> bool:
        return any(c.get("type") in ("Failed", "FailureTarget") and c.get("status") == "True"
                   for c in (obj.get("status") or {}).get("conditions") or [])


_DONE = ("Complete", "Failed", "SuccessCriteriaMet", "FailureTarget")


KIND = JobKind()
