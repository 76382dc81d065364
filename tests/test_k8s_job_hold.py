"""Unit: the webhook marks only the Jobs it suspends; the Job kind tells whose hold it is."""

from __future__ import annotations

from typing import Any

import pytest

from fluxnetes.k8s import admission
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
    out = admitted(job(), suspend_jobs=False)
    assert not out["spec"].get("suspend")
    assert ANN_SUSPENDED_BY not in (out["metadata"].get("annotations") or {})


def test_replicated_kinds_are_never_held() -> None:
    for name in ("ReplicaSet", "StatefulSet", "Deployment"):
        kind = kind_of(name)
        assert kind is not None
        assert not kind.held_by_user({"spec": {"suspend": True}}) and not kind.held_by_fluxnetes({})
