"""Unit: the webhook marks only the Jobs it suspends; the Job kind tells whose hold it is."""

from __future__ import annotations

from typing import Any

import pytest

from fluxnetes.k8s.admission import review as admission
from fluxnetes.k8s.workloads import kind_of
from fluxnetes.k8s.workloads.job import ANN_SUSPENDED_BY
from test_k8s_admission import apply_patch


def review(obj: dict[str, Any]) -> dict[str, Any]:
    return {"request": {"uid": "u", "operation": "CREATE", "kind": {"kind": obj["kind"]}, "object": obj}}


def admitted(obj: dict[str, Any], **kw: Any) -> dict[str, Any]:
    return apply_patch(obj, admission.mutate(review(obj), **kw))


def job(suspend: bool | None = None, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"parallelism": 2, "template": {"spec": {"containers": [{"name": "c"}]}}}
    if suspend is not None:
        spec["suspend"] = suspend
    meta: dict[str, Any] = {"name": "j", "namespace": "ns"}
    if annotations is not None:
        meta["annotations"] = annotations
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": meta, "spec": spec}


@pytest.mark.parametrize("suspend", [None, False])
@pytest.mark.parametrize("annotations", [None, {"team": "a/b"}])
def test_webhook_suspends_and_marks_a_running_job(suspend: bool | None, annotations: Any) -> None:
    out = admitted(job(suspend, annotations))
    assert out["spec"]["suspend"] is True
    assert out["metadata"]["annotations"][ANN_SUSPENDED_BY] == "fluxnetes"
    if annotations:
        assert out["metadata"]["annotations"]["team"] == "a/b"
    kind = kind_of("Job")
    assert kind is not None and kind.held_by_fluxnetes(out) and not kind.held_by_user(out)


def test_user_suspended_job_is_not_marked() -> None:
    out = admitted(job(True))
    assert out["spec"]["suspend"] is True
    assert ANN_SUSPENDED_BY not in (out["metadata"].get("annotations") or {})
    kind = kind_of("Job")
    assert kind is not None and kind.held_by_user(out) and not kind.held_by_fluxnetes(out)
    resumed = {**out, "spec": {**out["spec"], "suspend": False}}
    assert not kind.held_by_user(resumed) and not kind.held_by_fluxnetes(resumed)


def test_gate_mode_neither_suspends_nor_marks() -> None:
    out = admitted(job(), job_mode="gate")
    assert not out["spec"].get("suspend")
    assert ANN_SUSPENDED_BY not in (out["metadata"].get("annotations") or {})


def test_replicated_kinds_are_never_held() -> None:
    for name in ("ReplicaSet", "StatefulSet", "Deployment"):
        kind = kind_of(name)
        assert kind is not None
        assert not kind.held_by_user({"spec": {"suspend": True}}) and not kind.held_by_fluxnetes({})


def test_auto_job_mode_suspends_only_jobs_with_a_deadline() -> None:
    """--job-mode auto (the default): a Job is only held through its pods (no suspend and
    resume writes), unless it has activeDeadlineSeconds: Kubernetes counts that from the Job's
    start and restarts it on resume, so a suspended Job's deadline counts from its allocation."""
    plain = admitted(job(), job_mode="auto", hold="auto")
    assert not plain["spec"].get("suspend")
    assert ANN_SUSPENDED_BY not in (plain["metadata"].get("annotations") or {})
    assert plain["spec"]["template"]["spec"]["schedulerName"] == "fluxnetes"
    timed = job()
    timed["spec"]["activeDeadlineSeconds"] = 600
    out = admitted(timed, job_mode="auto")
    assert out["spec"]["suspend"] is True and out["metadata"]["annotations"][ANN_SUSPENDED_BY] == "fluxnetes"
    # a user's own suspend stays the user's, whatever the mode
    assert ANN_SUSPENDED_BY not in (admitted(job(True), job_mode="auto")["metadata"].get("annotations") or {})


@pytest.mark.parametrize(("extra", "held_by"), [
    ({}, "scheduler"),
    ({"volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "d"}}]}, "gate"),
    ({"volumes": [{"name": "scratch", "ephemeral": {"volumeClaimTemplate": {"spec": {}}}}]}, "gate"),
    ({"volumes": [{"name": "tmp", "emptyDir": {}}]}, "scheduler"),
    ({"containers": [{"name": "c", "ports": [{"containerPort": 80, "hostPort": 80}]}]}, "gate"),
    ({"containers": [{"name": "c", "ports": [{"containerPort": 80}]}]}, "scheduler"),
    ({"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": []}}}, "gate"),
    ({"affinity": {"nodeAffinity": {}}}, "scheduler"),  # fluxnetes checks node rules itself
    ({"topologySpreadConstraints": [{"maxSkew": 1}]}, "gate"),
])
def test_auto_placement_holds_a_pod_by_what_it_needs(extra: dict[str, Any], held_by: str) -> None:
    """--placement auto: fluxnetes binds a pod unless it needs a check only kube-scheduler
    makes; then the pod is gated and kube-scheduler binds it on the chosen node."""
    spec: dict[str, Any] = {"containers": [{"name": "c"}], **extra}
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "ns"}, "spec": spec}
    out = admitted(pod, hold="auto")["spec"]
    if held_by == "gate":
        assert out["schedulingGates"] == [{"name": "fluxnetes.io/gate"}] and "schedulerName" not in out
    else:
        assert out["schedulerName"] == "fluxnetes" and not out.get("schedulingGates")


def test_auto_placement_gates_a_statefulset_with_claim_templates() -> None:
    sts = {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "s", "namespace": "ns"},
           "spec": {"replicas": 2, "template": {"spec": {"containers": [{"name": "c"}]}},
                    "volumeClaimTemplates": [{"metadata": {"name": "data"}, "spec": {}}]}}
    tmpl = admitted(sts, hold="auto")["spec"]["template"]["spec"]
    assert tmpl["schedulingGates"] == [{"name": "fluxnetes.io/gate"}] and "schedulerName" not in tmpl
