"""`explain`, `cancel` and `queue` of a group without a FluxJob (the operator's default,
``--fluxjobs waiting``: a group placed at once that completes gets none), read from its pods,
running or finished: the pure parts, then the commands end to end against a fake API (the
real one: tests/test_ctl.py, tests/test_k8s_fluxjobs_default.py)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import pytest
from typer.testing import CliRunner

from fluxnetes.cli.ctl import build
from fluxnetes.cli.ctl import cancel as cancel_mod
from fluxnetes.cli.ctl import common as common_mod
from fluxnetes.cli.ctl import explain as explain_mod
from fluxnetes.cli.ctl import queue as queue_mod
from fluxnetes.cli.ctl.common import ClusterView, CtlError
from fluxnetes.cli.ctl.unrecorded import cancel_targets, explain_unrecorded, group_pods

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


def pod(name: str, node: str | None, cpu: str = "2", memory: str = "1Gi", *, group: str | None = "job-quick",
        ns: str = "default", owner: tuple[str, str] | None = None, phase: str = "Running") -> dict[str, Any]:
    md: dict[str, Any] = {"name": name, "namespace": ns}
    if group:
        md["annotations"] = {"fluxnetes.io/fluxjob": group}
    if owner:
        md["ownerReferences"] = [{"apiVersion": "v1", "kind": owner[0], "name": owner[1], "uid": "u",
                                  "controller": True}]
    spec: dict[str, Any] = {"containers": [{"name": "c", "resources": {"requests": {"cpu": cpu, "memory": memory}}}]}
    if node:
        spec["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod", "metadata": md, "spec": spec,
            "status": {"phase": phase, "startTime": "2026-01-01T11:58:00Z"}}


def owned(kind: str, name: str, owner: tuple[str, str] | None = None) -> dict[str, Any]:
    md: dict[str, Any] = {"name": name, "namespace": "default"}
    if owner:
        md["ownerReferences"] = [{"kind": owner[0], "name": owner[1], "controller": True}]
    return {"kind": kind, "metadata": md}


def test_group_pods_are_the_bound_unfinished_pods_placed_for_it() -> None:
    pods = [pod("q-1", "n1"), pod("q-0", "n0"), pod("q-2", None), pod("q-3", "n0", phase="Succeeded"),
            pod("other", "n0", group="job-other"), pod("q-x", "n0", ns="elsewhere"),
            pod("q-ns", "n0", group="default/job-quick")]
    assert [p["metadata"]["name"] for p in group_pods(pods, "default", "job-quick")] == ["q-0", "q-1", "q-ns"]


def test_explain_a_group_without_a_fluxjob_names_its_pods_nodes_and_shares() -> None:
    members = [pod("q-0", "n0", owner=("Job", "quick")), pod("q-1", "n0", owner=("Job", "quick")),
               pod("q-2", "n1", "500m", "512Mi", owner=("Job", "quick"))]
    info = explain_unrecorded("default", "job-quick", members, NOW)
    assert info["job"] == "default/job-quick" and info["state"] == "Running" and info["fluxJob"] is False
    assert "no FluxJob (--fluxjobs waiting)" in info["reason"] and info["size"] == 3
    assert info["nodes"] == ["n0", "n1"] and info["workloads"] == [{"kind": "Job", "name": "quick"}]
    assert info["shares"] == [{"node": "n0", "pods": 2, "cores": 4, "memory": 2048, "gpus": 0},
                              {"node": "n1", "pods": 1, "cores": 1, "memory": 512, "gpus": 0}]
    assert [(p["name"], p["node"], p["request"]) for p in info["pods"]] == [
        ("q-0", "n0", "2c,1Gi"), ("q-1", "n0", "2c,1Gi"), ("q-2", "n1", "1c,512Mi")]
    assert info["perPod"] == "1c,512Mi; 2c,1Gi" and info["started"] == "2m ago"


def test_cancel_targets_follow_the_owners_to_the_workload() -> None:
    objects = {
        "/apis/apps/v1/namespaces/default/replicasets/web-5f": owned("ReplicaSet", "web-5f", ("Deployment", "web")),
        "/apis/apps/v1/namespaces/default/deployments/web": owned("Deployment", "web"),
        "/apis/batch/v1/namespaces/default/jobs/set-a-0": owned("Job", "set-a-0", ("JobSet", "set-a")),
    }
    seen: list[str] = []

    def get(path: str) -> Mapping[str, Any] | None:
        seen.append(path)
        return objects.get(path)

    web = [pod(f"web-{i}", "n0", owner=("ReplicaSet", "web-5f")) for i in range(2)]
    # a Deployment's pods: the Deployment, once (deleting the ReplicaSet would only have it recreated)
    assert cancel_targets("default", "job-web", web, get) == [{"kind": "Deployment", "name": "web"}]
    # a Job whose owner is gone already: the Job; bare pods (a labelled group): the pods
    assert cancel_targets("default", "g", [pod("j-0", "n0", owner=("Job", "gone"))], get) == [
        {"kind": "Job", "name": "gone"}]
    assert cancel_targets("default", "g", [pod("b-1", "n0"), pod("b-0", "n1")], get) == [
        {"kind": "Pod", "name": "b-1"}, {"kind": "Pod", "name": "b-0"}]
    # a JobSet's Job (or an MPIJob's pods): refused, naming the owner and what to do
    # a CronJob's Job: the Job (the CronJob would not recreate it; deleting it would end the schedule)
    objects["/apis/batch/v1/namespaces/default/jobs/nightly-1"] = owned("Job", "nightly-1", ("CronJob", "nightly"))
    assert cancel_targets("default", "g", [pod("n-0", "n0", owner=("Job", "nightly-1"))], get) == [
        {"kind": "Job", "name": "nightly-1"}]
    with pytest.raises(CtlError, match=r"belong to JobSet set-a \(controlling Job set-a-0\); "
                                       r".*kubectl delete jobset set-a -n default"):
        cancel_targets("default", "g", [pod("s-0", "n0", owner=("Job", "set-a-0"))], get)
    with pytest.raises(CtlError, match="belong to MPIJob pi; cancel deletes only Job, Deployment"):
        cancel_targets("default", "g", [pod("w-0", "n0", owner=("MPIJob", "pi"))], get)


class FakeApi:
    """The API paths the two commands use, over a list of pods and objects; records DELETEs."""

    def __init__(self, pods: list[dict[str, Any]], objects: Mapping[str, Any] | None = None,
                 fluxjobs: list[dict[str, Any]] | None = None) -> None:
        self.pods, self.objects, self.fluxjobs = pods, dict(objects or {}), fluxjobs or []
        self.deleted: list[str] = []

    def fetch(self, conn: Any, *, nodes: bool = False, pods: bool = False, fluxjobs: str | None = None) -> ClusterView:
        node = {"metadata": {"name": "n0"}, "status": {"allocatable": {"cpu": "16", "memory": "64Gi"}}}
        return ClusterView(nodes=[node] if nodes else [], pods=list(self.pods) if pods else [],
                           fluxjobs=list(self.fluxjobs) if fluxjobs is not None else [])

    def api(self, conn: Any, method: str, path: str, body: Any = None, content_type: str = "") -> Any:
        if method == "DELETE":
            self.deleted.append(path)
            return {}
        if path.endswith("/pods"):
            ns = path.split("/")[4]
            return {"items": [p for p in self.pods if p["metadata"]["namespace"] == ns]}
        if path in self.objects:
            return self.objects[path]
        from fluxnetes.k8s.kube import ApiError

        raise CtlError(f"GET {path}: HTTP 404") from ApiError(404, {"message": "not found"}, method, path)


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeApi:
    api = FakeApi([pod("q-0", "n0", owner=("Job", "quick")), pod("q-1", "n0", owner=("Job", "quick")),
                   pod("lone", "n0", group="job-lone"), pod("o-0", "n0", group="job-orphan", owner=("Job", "gone"))],
                  {"/apis/batch/v1/namespaces/default/jobs/quick": owned("Job", "quick")})
    for mod in (explain_mod, cancel_mod, queue_mod):
        monkeypatch.setattr(mod, "fetch", api.fetch)
    for mod in (cancel_mod, queue_mod, common_mod):  # (explain reads through common.api)
        monkeypatch.setattr(mod, "api", api.api)
    return api


def test_explain_and_cancel_commands_answer_for_a_group_without_a_fluxjob(fake: FakeApi) -> None:
    ctl = build()
    res = CliRunner().invoke(ctl, ["explain", "job-quick", "-n", "default"])
    assert res.exit_code == 0, res.output
    assert "default/job-quick: Running (no FluxJob)  size 2 x (2c,1Gi)" in res.output
    assert "placed at once, no FluxJob (--fluxjobs waiting)" in res.output and "workload: Job/quick" in res.output
    info = json.loads(CliRunner().invoke(ctl, ["explain", "default/job-quick", "-o", "json"]).stdout)
    assert info["shares"] == [{"node": "n0", "pods": 2, "cores": 4, "memory": 2048, "gpus": 0}]
    missing = CliRunner().invoke(ctl, ["explain", "nope", "-n", "default"])
    assert missing.exit_code == 1
    assert "FluxJob default/nope not found" in missing.output
    assert "nor a group of that name without a FluxJob" in missing.output

    res = CliRunner().invoke(ctl, ["cancel", "job-quick", "-n", "default"])
    assert res.exit_code == 0, res.output
    assert "group default/job-quick has no FluxJob" in res.output and "deleted Job default/quick" in res.output
    assert fake.deleted == ["/apis/batch/v1/namespaces/default/jobs/quick"]
    done = json.loads(CliRunner().invoke(ctl, ["cancel", "default/job-lone", "-o", "json"]).stdout)
    assert done == {"job": "default/job-lone", "phase": "Running", "deleted": [{"kind": "Pod", "name": "lone"}],
                    "cancelled": True, "fluxJob": False}
    assert fake.deleted[-1] == "/api/v1/namespaces/default/pods/lone"
    # a Job deleted meanwhile (404 on its GET): still the Job that is deleted
    assert "deleted Job default/gone" in CliRunner().invoke(ctl, ["cancel", "job-orphan", "-n", "default"]).output
    missing = CliRunner().invoke(ctl, ["cancel", "nope", "-n", "default"])
    assert missing.exit_code == 1 and "no running group of that name" in missing.output


def test_a_finished_group_without_a_fluxjob_is_explained_and_listed(fake: FakeApi,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A Job placed at once that completed has no FluxJob and no running pod: `explain`
    answers from its finished pods (by the group's name or the Job's own), and `queue --all`
    lists it; `queue` alone does not (it lists what runs and waits). (Both used to answer
    "not found" / nothing.)"""
    done = [pod(f"d-{i}", "n0", owner=("Job", "done"), group="job-done", phase="Succeeded") for i in range(2)]
    failed = [pod("f-0", "n0", owner=("Job", "flop"), group="job-flop", phase="Failed")]
    fake.pods += [*done, *failed, pod("r-0", "n0", owner=("Job", "mixed"), group="job-mixed", phase="Succeeded"),
                  pod("r-1", "n0", owner=("Job", "mixed"), group="job-mixed")]
    unfinished = [p for p in fake.pods if p["status"]["phase"] not in ("Succeeded", "Failed")]

    def fetch(conn: Any, *, nodes: bool = False, pods: bool = False, fluxjobs: str | None = None) -> ClusterView:
        view = fake.fetch(conn, nodes=nodes, pods=pods, fluxjobs=fluxjobs)
        view.pods = list(unfinished) if pods else []  # as the API server's field selector gives
        return view

    for mod in (explain_mod, queue_mod):
        monkeypatch.setattr(mod, "fetch", fetch)
    ctl = build()
    for name in ("job-done", "done"):
        res = CliRunner().invoke(ctl, ["explain", name, "-n", "default"])
        assert res.exit_code == 0, res.output
        assert "default/job-done: Completed (no FluxJob)  size 2 x (2c,1Gi)" in res.output, res.output
        assert "placed at once and finished, no FluxJob" in res.output and "held while it ran" in res.output
    info = json.loads(CliRunner().invoke(ctl, ["explain", "default/job-flop", "-o", "json"]).stdout)
    assert info["state"] == "Failed" and info["nodes"] == ["n0"] and info["fluxJob"] is False
    # a group with one pod still running is Running, explained from that pod
    info = json.loads(CliRunner().invoke(ctl, ["explain", "default/mixed", "-o", "json"]).stdout)
    assert info["job"] == "default/job-mixed" and info["state"] == "Running" and info["size"] == 1

    rows = json.loads(CliRunner().invoke(ctl, ["queue", "-n", "default", "-o", "json"]).stdout)
    assert {r["name"]: r["state"] for r in rows} == {"job-quick": "Running", "job-lone": "Running",
                                                     "job-orphan": "Running", "job-mixed": "Running"}
    rows = json.loads(CliRunner().invoke(ctl, ["queue", "-n", "default", "--all", "-o", "json"]).stdout)
    finished = {r["name"]: (r["state"], r["size"], r["fluxJob"]) for r in rows if r["state"] != "Running"}
    assert finished == {"job-done": ("Completed", 2, False), "job-flop": ("Failed", 1, False)}
    assert [r["position"] for r in rows] == list(range(1, len(rows) + 1))


def fluxjob(name: str, workload: tuple[str, str]) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "default"}, "status": {"phase": "Pending"},
            "spec": {"size": 2, "workload": {"apiVersion": "v1", "kind": workload[0], "name": workload[1]}}}


def test_cancel_of_a_fluxjob_deletes_the_workload_its_owner_would_not_recreate(monkeypatch: pytest.MonkeyPatch) -> None:
    # a Deployment's group is its ReplicaSet's: deleting that ReplicaSet only had the
    # Deployment make a new one (and the group queue again); the Deployment is deleted
    api = FakeApi([], {"/apis/apps/v1/namespaces/default/replicasets/web-5f":
                       owned("ReplicaSet", "web-5f", ("Deployment", "web"))},
                  [fluxjob("web", ("ReplicaSet", "web-5f")), fluxjob("set", ("JobSet", "set-a"))])
    monkeypatch.setattr(cancel_mod, "fetch", api.fetch)
    monkeypatch.setattr(cancel_mod, "api", api.api)
    res = CliRunner().invoke(build(), ["cancel", "default/web"])
    assert res.exit_code == 0, res.output
    assert "deleted Deployment default/web" in res.output and "fluxjob default/web cancelled" in res.output
    assert api.deleted == ["/apis/apps/v1/namespaces/default/deployments/web"]
    res = CliRunner().invoke(build(), ["cancel", "default/set"])
    assert res.exit_code == 1 and api.deleted == ["/apis/apps/v1/namespaces/default/deployments/web"]
    assert "the workload of FluxJob default/set is JobSet set-a; cancel deletes only" in res.output
    assert "kubectl delete jobset set-a -n default" in res.output
