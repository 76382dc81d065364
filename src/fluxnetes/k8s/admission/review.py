"""Admission as pure functions: AdmissionReview request in, AdmissionReview response out.

Mutating (CREATE):
- Pod: add the scheduling gate ``fluxnetes.io/gate`` and the label ``fluxnetes.io/managed``;
  Fluence/coscheduling group labels are copied to fluxnetes' spelling. Mirror/static pods,
  DaemonSet pods, pods of another scheduler and pods labelled ``fluxnetes.io/enabled=false``
  are left alone: the operator counts them as foreign allocations instead. A pod (or
  template) naming ``schedulerName: fluxnetes`` is held already: checked and labelled only
  (the operator takes it even where no webhook saw it, k8s/admission/hold.py).
- A pod bound by hand (``spec.nodeName`` set at creation; also a workload whose pod template
  sets it) is refused, opted out or not: it would skip both kube-scheduler and the queue and
  take resources fluxnetes may have promised to other work (which fluxnetes could then not
  even record). The message names the field and what to do instead.
- Job: created suspended (and annotated ``fluxnetes.io/suspended-by: fluxnetes``, so the
  operator knows the hold is its own to lift), template gated. A Job its user created with
  ``spec.suspend: true`` keeps it and gets no such annotation: the operator waits for the user
  to resume it (see workloads/job.py). Deployment/ReplicaSet/StatefulSet: template gated.
- Multi-role kinds (workloads/: MPIJob, JobSet, TrainJob, LeaderWorkerSet; only when the
  operator asked the API server to send them, i.e. their CRD is served): held with their own
  suspend field where they have one (marked ``fluxnetes.io/suspended-by: fluxnetes``) and
  every pod template gated (a TrainJob's pods are held by the pod webhook instead, see
  workloads/trainjob.py). What their controllers create for them (a JobSet's or MPIJob's
  Jobs, an LWS's StatefulSets, a TrainJob's JobSet) is left alone: it belongs to the
  workload's group, and its pods are born held from the gated templates.
- Bad grouping input (malformed group label, group size 0, unparsable duration or jobspec
  annotation) is refused with a message naming the field: the user sees it at ``kubectl
  apply`` instead of finding a pod waiting forever.

Validating (UPDATE of pods): only the operator's identity may remove fluxnetes' gate, or label
a gated pod ``fluxnetes.io/hold=scheduler-name`` (the label the mutation puts only on pods held
by the scheduler name, which the gate's guard skips).

No API calls and no shared state: the webhook is a pure function, fast and replica-safe.
"""

from __future__ import annotations

import base64
from collections.abc import Collection, Mapping
from typing import Any

import orjson

from fluxnetes.jobspec.packing import PackingError, packing_from_annotations
from fluxnetes.k8s import names
from fluxnetes.k8s.admission.hold import GATE, hold_label_ops, hold_ops, names_fluxnetes
from fluxnetes.k8s.groups import GroupError, check_pod_template, controller_of, duration_of
from fluxnetes.k8s.workloads import any_kind_of, kind_of, made_for
from fluxnetes.k8s.workloads.base import JsonPatch, WorkloadKind, managed_label_ops

_DEFAULT_SCHEDULER = "default-scheduler"


def _response(uid: str, allowed: bool = True, patch: JsonPatch | None = None,
              message: str | None = None, code: int = 400) -> dict[str, Any]:
    resp: dict[str, Any] = {"uid": uid, "allowed": allowed}
    if patch:
        resp["patchType"] = "JSONPatch"
        resp["patch"] = base64.b64encode(orjson.dumps(patch)).decode()
    if message is not None and not allowed:
        resp["status"] = {"code": code, "message": message, "reason": "BadRequest" if code == 400 else "Forbidden"}
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": resp}


class Refused(ValueError):
    """Admission refuses the object; the message says which field and what to do."""


def _check_not_bound(meta: Mapping[str, Any], spec: Mapping[str, Any], field: str) -> None:
    node = spec.get("nodeName")
    if not node:
        return
    if (meta.get("annotations") or {}).get("kubernetes.io/config.mirror"):
        return  # a static pod's mirror, made by the kubelet
    owner = controller_of(meta)
    if owner is not None and owner.kind == "DaemonSet":
        return
    raise Refused(
        f"{field} is set ({node!r}): in a namespace managed by fluxnetes pods are placed by its queue, "
        "and a pod bound by hand would skip both schedulers and take resources promised to other work. "
        f"Remove {field}; to run on that node, ask for it with a nodeSelector "
        f"(kubernetes.io/hostname: {node}) and fluxnetes places it there when it fits; or use a namespace "
        "that is not opted in to fluxnetes")


def _ours_to_hold(spec: Mapping[str, Any]) -> bool:
    """A pod spec for kube-scheduler (held here) or naming fluxnetes (held already: checked
    and labelled here); any other scheduler's pods are left alone."""
    return spec.get("schedulerName", _DEFAULT_SCHEDULER) == _DEFAULT_SCHEDULER or names_fluxnetes(spec)


def _skip_pod(pod: Mapping[str, Any]) -> bool:
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    if (meta.get("annotations") or {}).get("kubernetes.io/config.mirror"):
        return True
    if (meta.get("labels") or {}).get(names.LABEL_ENABLED) == "false":
        return True
    if not _ours_to_hold(spec):
        return True
    owner = controller_of(meta)
    return owner is not None and owner.kind == "DaemonSet"


def mutate_pod(pod: Mapping[str, Any], hold: str = GATE) -> JsonPatch:
    """JSON patch holding a pod (see k8s/admission/hold.py); raises GroupError for bad grouping input
    and Refused for a pod bound by hand."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    _check_not_bound(meta, spec, "spec.nodeName")
    if _skip_pod(pod):
        return []
    check_pod_template(meta, spec)
    labels = meta.get("labels") or {}
    held = hold_ops(spec, "", hold)
    return [*managed_label_ops(labels, ""), *hold_label_ops(labels, spec, "", hold), *held]


JOB_MODES = ("auto", "suspend", "gate")  # --job-mode


def suspends(job_mode: str, deadline: object) -> bool:
    """Is a Job (of ``activeDeadlineSeconds`` ``deadline``) held by suspending it? ``suspend``:
    always (no pod exists before the group is allocated; the suspend and the resume are two
    API writes more per Job). ``gate``: never, its pods are held. ``auto``: only a Job with a
    deadline, which counts from the Job's start and restarts when it is resumed: suspended, it
    counts from the allocation, as its user means; only gated, it would count while queued."""
    if job_mode == "auto":
        return deadline is not None
    return job_mode == "suspend"


def mutate_workload(obj: Mapping[str, Any], *, job_mode: str = "suspend", hold: str = GATE) -> JsonPatch:
    if made_for(obj) is not None:
        return []  # part of a multi-role workload's group, held through it
    kind = kind_of(str(obj.get("kind", "")))
    if kind is None:
        addon = any_kind_of(str(obj.get("kind", "")))
        # a multi-role workload is suspended unless --job-mode gate (its controller would
        # otherwise make every child object at once)
        return [] if addon is None else mutate_multi_role(obj, addon, suspend=job_mode != "gate", hold=hold)
    meta = obj.get("metadata") or {}
    if (meta.get("labels") or {}).get(names.LABEL_ENABLED) == "false":
        return []
    tmpl = kind.template(obj)
    tmeta, tspec = tmpl.get("metadata") or {}, tmpl.get("spec") or {}
    _check_not_bound({}, tspec, "spec.template.spec.nodeName")
    if not _ours_to_hold(tspec):
        return []
    check_pod_template(tmeta, tspec)
    # the workload's own annotations may carry the duration too
    duration_of(meta, tspec, kind.deadline(obj))
    return kind.mutate(obj, suspend=suspends(job_mode, kind.deadline(obj)), hold=hold)


def _field(path: str) -> str:
    return path.strip("/").replace("/", ".")


def mutate_multi_role(obj: Mapping[str, Any], kind: WorkloadKind, *, suspend: bool = True,
                      hold: str = GATE) -> JsonPatch:
    """A multi-role workload (MPIJob, JobSet, TrainJob, LeaderWorkerSet): every pod set's
    template is checked as a Job's would be, then the kind holds it (workloads/<kind>.py)."""
    meta = obj.get("metadata") or {}
    if (meta.get("labels") or {}).get(names.LABEL_ENABLED) == "false":
        return []
    sets = kind.pod_sets(obj)
    for ps in sets:
        tmeta, tspec = ps.template.get("metadata") or {}, ps.template.get("spec") or {}
        if ps.path:
            _check_not_bound({}, tspec, f"{_field(ps.path)}.spec.nodeName")
        if not _ours_to_hold(tspec):
            return []  # another scheduler's work, as for a Job's template
        check_pod_template(tmeta, tspec)
    first = (sets[0].template.get("spec") or {}) if sets else {}
    duration_of(meta, first, kind.deadline(obj))
    try:  # fluxnetes.io/pack and exclusive (and Kueue's alias): bad values, conflicts
        packing_from_annotations(meta.get("annotations") or {}, pods=sum(ps.count for ps in sets))
    except PackingError as exc:
        raise GroupError(str(exc)) from None
    return kind.mutate(obj, suspend=suspend, hold=hold)


def mutate(review: Mapping[str, Any], *, job_mode: str = "suspend", hold: str = GATE) -> dict[str, Any]:
    """The mutating webhook: AdmissionReview in, AdmissionReview out. ``job_mode``: which Jobs
    are suspended (:func:`suspends`). ``hold``: how pods are held (k8s/admission/hold.py: the gate,
    fluxnetes' scheduler name, or auto: per pod)."""
    req = review.get("request") or {}
    uid = str(req.get("uid", ""))
    obj = req.get("object") or {}
    if req.get("operation") != "CREATE" or not isinstance(obj, Mapping):
        return _response(uid)
    try:
        if (req.get("kind") or {}).get("kind", obj.get("kind")) == "Pod":
            ops = mutate_pod(obj, hold)
        else:
            ops = mutate_workload(obj, job_mode=job_mode, hold=hold)
    except (GroupError, Refused) as exc:
        return _response(uid, allowed=False, message=f"fluxnetes: {exc}")
    return _response(uid, patch=ops)


def _has_gate(pod: Mapping[str, Any] | None) -> bool:
    gates = ((pod or {}).get("spec") or {}).get("schedulingGates") or []
    return any(g.get("name") == names.GATE for g in gates)


def validate(review: Mapping[str, Any], operators: Collection[str]) -> dict[str, Any]:
    """The validating webhook: only identities in ``operators`` may remove fluxnetes' gate."""
    req = review.get("request") or {}
    uid = str(req.get("uid", ""))
    if req.get("operation") != "UPDATE":
        return _response(uid)
    user = str((req.get("userInfo") or {}).get("username", ""))
    if user in operators:
        return _response(uid)
    old, new = req.get("oldObject"), req.get("object")
    if _has_gate(old) and not _has_gate(new):
        return _response(
            uid, allowed=False, code=403,
            message=f"fluxnetes: only the fluxnetes operator may remove the scheduling gate "
            f"{names.GATE} (user {user!r} may not); delete the pod to cancel it",
        )
    if _has_gate(new) and _held_by_name(new) and not _held_by_name(old):
        # (the label would take the pod out of this webhook's selector, and its gate with it)
        return _response(
            uid, allowed=False, code=403,
            message=f"fluxnetes: only the fluxnetes operator may label a gated pod "
            f"{names.LABEL_HOLD}={names.HOLD_SCHEDULER_NAME} (user {user!r} may not)",
        )
    return _response(uid)


def _held_by_name(pod: Mapping[str, Any] | None) -> bool:
    labels = (((pod or {}).get("metadata") or {}).get("labels")) or {}
    return bool(labels.get(names.LABEL_HOLD) == names.HOLD_SCHEDULER_NAME)
