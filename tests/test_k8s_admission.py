"""Pure pieces of the operator: resources, groups, workload kinds, admission, FluxJob."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fluxnetes.k8s import names
from fluxnetes.k8s.admission import review as admission
from fluxnetes.k8s.groups import (
    GroupError,
    OwnerRef,
    explicit_group,
    group_of_pod,
    object_name,
    parse_duration,
)
from fluxnetes.k8s.persistence import fluxjob
from fluxnetes.k8s.resources import PodResources, ResourceError, parse_quantity, pod_request
from fluxnetes.k8s.workloads import KINDS, kind_of


def pod(
    name: str = "p",
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    spec: dict[str, Any] | None = None,
    owner: tuple[str, str] | None = None,
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "ns"}
    if labels is not None:
        meta["labels"] = labels
    if annotations is not None:
        meta["annotations"] = annotations
    if owner:
        meta["ownerReferences"] = [
            {
                "apiVersion": "batch/v1",
                "kind": owner[0],
                "name": owner[1],
                "uid": "u1",
                "controller": True,
            }
        ]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": spec
        or {
            "containers": [
                {
                    "name": "c",
                    "image": "x",
                    "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}},
                }
            ]
        },
    }


def review(
    obj: dict[str, Any], op: str = "CREATE", old: dict[str, Any] | None = None, user: str = "alice"
) -> dict[str, Any]:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "abc",
            "operation": op,
            "kind": {"kind": obj["kind"]},
            "object": obj,
            "oldObject": old,
            "userInfo": {"username": user},
        },
    }


def apply_patch(obj: dict[str, Any], resp: dict[str, Any]) -> dict[str, Any]:
    """A tiny RFC 6902 'add' and 'remove' applier, enough to check the patches the webhook emits."""
    out = json.loads(json.dumps(obj))
    patch = resp["response"].get("patch")
    if not patch:
        return out
    for op in json.loads(base64.b64decode(patch)):
        assert op["op"] in ("add", "remove")
        parts = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
        target = out
        for p in parts[:-1]:
            target = target[int(p)] if isinstance(target, list) else target[p]
        if op["op"] == "remove":
            del target[int(parts[-1]) if isinstance(target, list) else parts[-1]]
            continue
        if isinstance(target, list):
            target.append(op["value"]) if parts[-1] == "-" else target.insert(
                int(parts[-1]), op["value"]
            )
        else:
            target[parts[-1]] = op["value"]
    return out


# ---- quantities and requests ------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("100m", "0.1"),
        ("1", "1"),
        ("1.5Gi", str(1.5 * 2**30)),
        ("2k", "2000"),
        ("1e3", "1000"),
        ("128974848", "128974848"),
        ("129M", "129000000"),
        (3, "3"),
    ],
)
def test_parse_quantity(text: object, value: str) -> None:
    assert parse_quantity(text) == parse_quantity(value)


@pytest.mark.parametrize("bad", ["", "abc", "-1", "1Xi", None, True, "NaN"])
def test_parse_quantity_rejects(bad: object) -> None:
    for _ in range(2):  # a refused text is refused again (only what was read is remembered)
        with pytest.raises(ResourceError):
            parse_quantity(bad)


def test_parse_quantity_reads_each_text_once() -> None:
    """Every Job and pod grouped reads its template's quantities: a text read before is not
    parsed again (the same immutable Decimal)."""
    assert parse_quantity("64Mi") is parse_quantity("64Mi") == 64 * 2**20
    assert parse_quantity(" 64Mi") == 64 * 2**20


@pytest.mark.parametrize("container", [
    {"name": "a", "resources": {"requests": {"cpu": "1", "memory": "64Mi"}}},
    {"name": "a", "resources": {"limits": {"cpu": "2", "nvidia.com/gpu": 1}, "requests": {"cpu": "250m"}}},
    {"name": "a", "resources": {"requests": {"example.com/fpga": "2", "hugepages-2Mi": "4Mi", "pods": 1}}},
    {"name": "a"},
])
def test_pod_request_one_container_as_the_general_rule(container: dict[str, Any]) -> None:
    one = pod_request({"containers": [container]})
    assert one == pod_request({"containers": [container, {"name": "empty"}]})  # (the general sum)
    assert one == pod_request({"containers": [container], "initContainers": [{"name": "i"}]})


def test_pod_request_effective_rule() -> None:
    spec = {
        "containers": [
            {"name": "a", "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}},
            {"name": "b", "resources": {"limits": {"cpu": "500m", "nvidia.com/gpu": 2}}},
        ],
        "initContainers": [
            {"name": "i1", "resources": {"requests": {"cpu": "4", "memory": "100Mi"}}},
            {"name": "side", "restartPolicy": "Always", "resources": {"requests": {"cpu": "250m"}}},
            {"name": "i2", "resources": {"requests": {"cpu": "2", "example.com/fpga": "1"}}},
        ],
        "overhead": {"cpu": "100m", "memory": "10Mi"},
    }
    r = pod_request(spec)
    # cpu: containers 1.5 + sidecar 0.25 = 1.75; init peaks: 4, 0.25, 0.25+2 = 2.25 -> 4 (+0.1)
    assert r.cpu_millis == 4100
    assert r.memory_bytes == 2**30 + 10 * 2**20
    assert r.gpus == 2
    assert r.extended == {"example.com/fpga": 1}


def test_pod_request_names_bad_field() -> None:
    with pytest.raises(ResourceError, match=r"spec.containers\[0\].resources.requests.cpu"):
        pod_request({"containers": [{"resources": {"requests": {"cpu": "lots"}}}]})


@given(st.lists(st.integers(0, 10_000), min_size=1, max_size=5))
def test_pod_request_sums_containers(cpus: list[int]) -> None:
    spec = {"containers": [{"resources": {"requests": {"cpu": f"{c}m"}}} for c in cpus]}
    assert pod_request(spec).cpu_millis == sum(cpus)


# ---- groups -------------------------------------------------------------------------------


def test_explicit_group_spellings() -> None:
    assert explicit_group({names.LABEL_GROUP: "g", names.LABEL_GROUP_SIZE: "4"}) == ("g", 4)
    assert explicit_group({names.FLUENCE_GROUP: "g", names.FLUENCE_GROUP_SIZE: "2"}) == ("g", 2)
    assert explicit_group({names.COSCHED_GROUP: "g", names.LABEL_GROUP_SIZE: "3"}) == ("g", 3)
    assert explicit_group({"app": "x"}) is None


@pytest.mark.parametrize(
    "labels",
    [
        {names.LABEL_GROUP: "g", names.LABEL_GROUP_SIZE: "0"},
        {names.LABEL_GROUP: "g", names.LABEL_GROUP_SIZE: "four"},
        {names.LABEL_GROUP: "g", names.LABEL_GROUP_SIZE: "-2"},
        {names.LABEL_GROUP: "-bad-", names.LABEL_GROUP_SIZE: "2"},
        {names.LABEL_GROUP_SIZE: "2"},
    ],
)
def test_explicit_group_errors(labels: dict[str, str]) -> None:
    with pytest.raises(GroupError, match="label"):
        explicit_group(labels)


def test_group_of_single_pod() -> None:
    g = group_of_pod(pod("solo"))
    assert (g.name, g.size, g.owner) == ("pod-solo", 1, None)
    assert g.request == PodResources(500, 2**30, 0, {})


def test_group_of_job_pod_uses_owner_size_and_deadline() -> None:
    p = pod("j-abc", owner=("Job", "j"))
    g = group_of_pod(
        p, owner_size=lambda o: 4 if o.kind == "Job" else None, owner_deadline=lambda o: 60
    )
    assert (g.name, g.size, g.duration) == ("job-j", 4, 60)
    assert g.owner == OwnerRef("batch/v1", "Job", "j", "u1")


def test_group_label_needs_size() -> None:
    with pytest.raises(GroupError, match="group-size"):
        group_of_pod(pod(labels={names.LABEL_GROUP: "g"}))


def test_duration_and_priority() -> None:
    p = pod(annotations={names.ANN_DURATION: "1h30m"})
    p["spec"]["priority"] = 100
    g = group_of_pod(p)
    assert (g.duration, g.priority) == (5400, 100)
    p2 = pod()
    p2["spec"]["activeDeadlineSeconds"] = 30
    assert group_of_pod(p2).duration == 30


@pytest.mark.parametrize(
    ("text", "secs"), [("90", 90), ("90s", 90), ("5m", 300), ("1h30m", 5400), ("2d", 172800)]
)
def test_parse_duration(text: str, secs: int) -> None:
    assert parse_duration(text) == secs


@pytest.mark.parametrize("bad", ["", "soon", "5x", "1.5h", "h"])
def test_parse_duration_rejects(bad: str) -> None:
    with pytest.raises(GroupError, match="duration"):
        parse_duration(bad)


@given(st.text(min_size=1, max_size=80))
def test_object_name_is_dns(text: str) -> None:
    name = object_name(text)
    assert name and len(name) <= 253
    assert all(c.isascii() and (c.isalnum() or c in "-.") and not c.isupper() for c in name)


# ---- workload kinds ---------------------------------------------------------------------


def test_kinds_discovered() -> None:
    assert {"Job", "ReplicaSet", "StatefulSet", "Deployment"} <= set(KINDS)


def test_job_kind() -> None:
    job = kind_of("Job")
    assert job is not None
    obj = {"spec": {"parallelism": 4, "completions": 4, "template": {}}}
    assert job.size(obj) == 4 and not job.replaces_pods(obj)
    assert job.size({"spec": {"parallelism": 4, "completions": 2}}) == 2
    assert job.size({"spec": {}}) == 1
    assert job.replaces_pods({"spec": {"parallelism": 2, "completions": 10}})
    assert job.slot_of({"metadata": {"labels": {names.JOB_COMPLETION_INDEX: "3"}}}) == 3
    assert job.resume_patch(obj) == {"spec": {"suspend": False}}


def test_statefulset_slot() -> None:
    sts = kind_of("StatefulSet")
    assert sts is not None and sts.slot_of({"metadata": {"name": "web-2"}}) == 2


# ---- admission ----------------------------------------------------------------------------


def test_mutate_pod_gates_and_labels() -> None:
    p = pod(labels={names.FLUENCE_GROUP: "g", names.FLUENCE_GROUP_SIZE: "2"})
    resp = admission.mutate(review(p))
    assert resp["response"]["allowed"] and resp["response"]["uid"] == "abc"
    out = apply_patch(p, resp)
    assert out["spec"]["schedulingGates"] == [{"name": names.GATE}]
    assert out["metadata"]["labels"][names.LABEL_MANAGED] == "true"
    assert out["metadata"]["labels"][names.LABEL_GROUP] == "g"
    assert out["metadata"]["labels"][names.LABEL_GROUP_SIZE] == "2"


def test_mutate_pod_without_labels_keeps_other_gates() -> None:
    p = pod()
    p["spec"]["schedulingGates"] = [{"name": "other"}]
    out = apply_patch(p, admission.mutate(review(p)))
    assert out["spec"]["schedulingGates"] == [{"name": "other"}, {"name": names.GATE}]
    assert out["metadata"]["labels"] == {names.LABEL_MANAGED: "true"}


@pytest.mark.parametrize(
    "change",
    [
        lambda p: p["spec"].__setitem__("schedulerName", "other"),
        lambda p: p["metadata"].__setitem__(
            "ownerReferences", [{"kind": "DaemonSet", "name": "d", "controller": True}]
        ),
        lambda p: p["metadata"].__setitem__("annotations", {"kubernetes.io/config.mirror": "x"}),
    ],
)
def test_mutate_pod_leaves_foreign_pods(change: Any) -> None:
    p = pod()
    change(p)
    assert "patch" not in admission.mutate(review(p))["response"]


@pytest.mark.parametrize("labels", [None, {names.LABEL_ENABLED: "false"}, {names.LABEL_MANAGED: "true"}])
def test_pod_bound_by_hand_is_refused_naming_the_field(labels: Any) -> None:
    """spec.nodeName in a managed namespace would skip both schedulers: refused, opted out
    or not, with what to do instead; a static pod's mirror and a DaemonSet's pods are not."""
    p = pod(labels=labels)
    p["spec"]["nodeName"] = "n1"
    resp = admission.mutate(review(p))["response"]
    assert resp["allowed"] is False
    msg = resp["status"]["message"]
    assert "spec.nodeName" in msg and "'n1'" in msg and "kubernetes.io/hostname: n1" in msg
    mirror = pod(annotations={"kubernetes.io/config.mirror": "x"})
    mirror["spec"]["nodeName"] = "n1"
    assert admission.mutate(review(mirror))["response"]["allowed"] is True
    ds = pod()
    ds["metadata"]["ownerReferences"] = [{"kind": "DaemonSet", "name": "d", "controller": True}]
    ds["spec"]["nodeName"] = "n1"
    assert admission.mutate(review(ds))["response"]["allowed"] is True


def test_workload_whose_pods_would_be_bound_by_hand_is_refused() -> None:
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j", "namespace": "ns"},
           "spec": {"template": {"spec": {"nodeName": "n2", "restartPolicy": "Never",
                                          "containers": [{"name": "c", "image": "x"}]}}}}
    req = {"uid": "u", "operation": "CREATE", "kind": {"kind": "Job"}, "object": job}
    resp = admission.mutate({"request": req})["response"]
    assert resp["allowed"] is False and "spec.template.spec.nodeName" in resp["status"]["message"]


@pytest.mark.parametrize(
    ("labels", "annotations", "field"),
    [
        ({names.LABEL_GROUP: "g", names.LABEL_GROUP_SIZE: "0"}, None, names.LABEL_GROUP_SIZE),
        ({names.LABEL_GROUP: "g!", names.LABEL_GROUP_SIZE: "2"}, None, names.LABEL_GROUP),
        (None, {names.ANN_DURATION: "forever"}, names.ANN_DURATION),
        (None, {names.ANN_JOBSPEC: "resources: [unclosed"}, names.ANN_JOBSPEC),
    ],
)
def test_mutate_pod_refuses_bad_input(labels: Any, annotations: Any, field: str) -> None:
    resp = admission.mutate(review(pod(labels=labels, annotations=annotations)))["response"]
    assert resp["allowed"] is False
    assert field in resp["status"]["message"]


def test_mutate_job_suspends_and_gates_template() -> None:
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "j", "namespace": "ns"},
        "spec": {"parallelism": 4, "template": {"spec": {"containers": [{"name": "c"}]}}},
    }
    out = apply_patch(job, admission.mutate(review(job)))
    assert out["spec"]["suspend"] is True
    assert out["spec"]["template"]["spec"]["schedulingGates"] == [{"name": names.GATE}]
    assert out["spec"]["template"]["metadata"]["labels"] == {names.LABEL_MANAGED: "true"}


@pytest.mark.parametrize("kind", ["Deployment", "ReplicaSet", "StatefulSet"])
def test_mutate_replicated_templates(kind: str) -> None:
    obj = {
        "apiVersion": "apps/v1",
        "kind": kind,
        "metadata": {"name": "d", "namespace": "ns"},
        "spec": {
            "replicas": 2,
            "template": {
                "metadata": {"labels": {"app": "x"}},
                "spec": {"containers": [{"name": "c"}]},
            },
        },
    }
    out = apply_patch(obj, admission.mutate(review(obj)))
    assert out["spec"]["template"]["spec"]["schedulingGates"] == [{"name": names.GATE}]
    assert out["spec"]["template"]["metadata"]["labels"] == {
        "app": "x",
        names.LABEL_MANAGED: "true",
    }
    assert "suspend" not in out["spec"]


@pytest.mark.parametrize("hold", ["gate", "scheduler", "auto"])
def test_pod_naming_fluxnetes_is_checked_and_labelled_but_not_held_again(hold: str) -> None:
    """A user who wrote schedulerName: fluxnetes (as for Volcano or Fluence) opted in: the
    webhook used to leave such a pod alone as another scheduler's, so nobody ever placed it."""
    p = pod()
    p["spec"]["schedulerName"] = names.SCHEDULER_NAME
    out = apply_patch(p, admission.mutate(review(p), hold=hold))
    # (held by the name only: the gate's policy skips it, webhook_config.gated_pods_selector)
    assert out["metadata"]["labels"] == {names.LABEL_MANAGED: "true", names.LABEL_HOLD: names.HOLD_SCHEDULER_NAME}
    assert "schedulingGates" not in out["spec"]  # the Binding refuses gated pods
    assert out["spec"]["schedulerName"] == names.SCHEDULER_NAME
    bad = pod(annotations={names.ANN_DURATION: "forever"})
    bad["spec"]["schedulerName"] = names.SCHEDULER_NAME
    resp = admission.mutate(review(bad))["response"]
    assert resp["allowed"] is False and names.ANN_DURATION in resp["status"]["message"]


def test_job_template_naming_fluxnetes_is_labelled_and_suspended_by_job_mode() -> None:
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "j", "namespace": "ns"},
        "spec": {"parallelism": 2, "template": {"spec": {
            "schedulerName": names.SCHEDULER_NAME, "containers": [{"name": "c"}]}}},
    }
    out = apply_patch(job, admission.mutate(review(job), job_mode="suspend", hold="gate"))
    assert out["spec"]["suspend"] is True
    tmpl = out["spec"]["template"]
    assert tmpl["metadata"]["labels"] == {names.LABEL_MANAGED: "true", names.LABEL_HOLD: names.HOLD_SCHEDULER_NAME}
    assert "schedulingGates" not in tmpl["spec"]
    out = apply_patch(job, admission.mutate(review(job), job_mode="gate", hold="gate"))
    assert "suspend" not in out["spec"]


def test_hold_knows_fluxnetes_pods_with_or_without_the_webhook() -> None:
    from fluxnetes.k8s.admission.hold import is_held, is_ours

    named = {"schedulerName": names.SCHEDULER_NAME}
    assert is_ours({}, named) and is_held({"spec": named})
    assert is_ours({"labels": {names.LABEL_MANAGED: "true"}}, {})
    assert not is_ours({}, {}) and not is_ours({}, {"schedulerName": "volcano"})


@pytest.mark.parametrize("hold", ["gate", "scheduler", "auto"])
def test_only_pods_held_by_the_scheduler_name_are_labelled_so(hold: str) -> None:
    """fluxnetes.io/hold=scheduler-name takes a pod out of the gate policy's selector: never on
    a pod (or pod template) that carries fluxnetes' gate, even when its user wrote it."""
    def labels(obj: dict[str, Any], **kw: Any) -> dict[str, str]:
        out = apply_patch(obj, admission.mutate(review(obj), **kw))
        meta = out["spec"]["template"]["metadata"] if out["kind"] != "Pod" else out["metadata"]
        spec = out["spec"]["template"]["spec"] if out["kind"] != "Pod" else out["spec"]
        gated = any(g["name"] == names.GATE for g in spec.get("schedulingGates") or [])
        assert gated or spec.get("schedulerName") == names.SCHEDULER_NAME
        # held one way or the other, labelled as held by the name exactly when not gated
        assert (meta["labels"].get(names.LABEL_HOLD) == names.HOLD_SCHEDULER_NAME) is (not gated)
        return dict(meta["labels"])

    plain = labels(pod(), hold=hold)
    assert (names.LABEL_HOLD in plain) is (hold != "gate")
    claim = pod()  # a claim needs kube-scheduler: gated under auto
    claim["spec"]["volumes"] = [{"name": "v", "persistentVolumeClaim": {"claimName": "c"}}]
    assert (names.LABEL_HOLD in labels(claim, hold=hold)) is (hold == "scheduler")
    forged = pod(labels={names.LABEL_HOLD: names.HOLD_SCHEDULER_NAME})  # its user's label goes
    forged["spec"]["schedulingGates"] = [{"name": names.GATE}]
    assert names.LABEL_HOLD not in labels(forged, hold=hold)
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j", "namespace": "ns"},
           "spec": {"parallelism": 2, "template": {"metadata": {"labels": {names.LABEL_HOLD: "x"}},
                                                   "spec": {"containers": [{"name": "c"}]}}}}
    assert (labels(job, hold=hold).get(names.LABEL_HOLD) == names.HOLD_SCHEDULER_NAME) is (hold != "gate")


def test_mutate_ignores_updates() -> None:
    assert "patch" not in admission.mutate(review(pod(), op="UPDATE"))["response"]


def test_validate_gate_removal() -> None:
    old = pod()
    old["spec"]["schedulingGates"] = [{"name": names.GATE}]
    new = pod()
    ops = {"system:serviceaccount:fluxnetes-system:fluxnetes"}
    denied = admission.validate(review(new, "UPDATE", old, user="mallory"), ops)["response"]
    assert denied["allowed"] is False and names.GATE in denied["status"]["message"]
    allowed = admission.validate(
        review(new, "UPDATE", old, user="system:serviceaccount:fluxnetes-system:fluxnetes"), ops
    )
    assert allowed["response"]["allowed"]
    # other edits are fine for anyone
    assert admission.validate(review(old, "UPDATE", old, user="mallory"), ops)["response"][
        "allowed"
    ]
    # nor may anyone else label a gated pod as held by the scheduler name (it would leave the
    # guard's selector, gate and all); on a pod without the gate the label guards nothing
    marked = pod(labels={names.LABEL_HOLD: names.HOLD_SCHEDULER_NAME})
    marked["spec"]["schedulingGates"] = [{"name": names.GATE}]
    denied = admission.validate(review(marked, "UPDATE", old, user="mallory"), ops)["response"]
    assert denied["allowed"] is False and names.LABEL_HOLD in denied["status"]["message"]
    assert admission.validate(review(marked, "UPDATE", old, user=next(iter(ops))), ops)["response"]["allowed"]
    assert admission.validate(review(marked, "UPDATE", marked, user="mallory"), ops)["response"]["allowed"]
    ungated = pod(labels={names.LABEL_HOLD: names.HOLD_SCHEDULER_NAME})
    assert admission.validate(review(ungated, "UPDATE", pod(), user="mallory"), ops)["response"]["allowed"]


# ---- FluxJob ------------------------------------------------------------------------------


def test_crd_and_manifest() -> None:
    crd = fluxjob.crd_manifest()
    assert crd["spec"]["group"] == names.API_GROUP
    version = crd["spec"]["versions"][0]
    phases = version["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]["phase"][
        "enum"
    ]
    assert set(phases) == {str(p) for p in fluxjob.Phase}
    cols = {c["name"] for c in version["additionalPrinterColumns"]}
    assert {"Phase", "Reason", "Expected Start", "Nodes"} <= cols
    g = group_of_pod(pod("j-1", owner=("Job", "j")), owner_size=lambda o: 4)
    m = fluxjob.manifest(g, jobspec="version: 1", match_policy="lonode")
    assert m["metadata"]["ownerReferences"][0]["uid"] == "u1"
    assert m["spec"]["size"] == 4 and m["spec"]["workload"]["kind"] == "Job"
    s = fluxjob.status(
        fluxjob.Phase.RESERVED, reason="waiting", expected_start=0, now=0, nodes=["b", "a", "a"]
    )
    assert s["expectedStart"] == "1970-01-01T00:00:00Z" and s["nodeList"] == "a,b"


def test_fluxjob_conditions_one_per_phase() -> None:
    s1 = fluxjob.status(fluxjob.Phase.PENDING, reason="queued", now=0)
    s2 = fluxjob.status(fluxjob.Phase.RUNNING, reason="allocated", now=5, previous=s1)
    s3 = fluxjob.status(fluxjob.Phase.RUNNING, reason="allocated", now=9, previous=s2)
    conds = {c["type"]: c for c in s3["conditions"]}
    assert conds["Pending"]["status"] == "False" and conds["Running"]["status"] == "True"
    assert conds["Running"]["lastTransitionTime"] == "1970-01-01T00:00:05Z"
    assert len(s3["conditions"]) == 2
