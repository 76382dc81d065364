"""Scaling a Deployment after its group was allocated, on the real control plane.

The pods added by a scale-up form a new group ``<group>-scale-N`` (its own FluxJob), matched
all-or-nothing; scaling down gives the removed pods' shares back. Nothing is ever bound
beyond a node's allocatable (checked continuously).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from k8s_helpers import Operator, OverbookingWatch, namespace, operator_session
from test_k8s_operator import apply, fluxjob, job, job_complete, pod, pods, wait
from test_k8s_operator import fluxjob_phase as phase  # (--fluxjobs all: what the FluxJob says)

pytestmark = pytest.mark.k8s


@pytest.fixture(scope="module")
def op(k8s_cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Operator]:
    # these tests read the base group's FluxJob (its spec resized, its nodes) beside its scale
    # groups': every group gets one (--fluxjobs all; the default, waiting, gives a base group
    # placed at once none; scale groups always get one)
    with operator_session(k8s_cluster, tmp_path_factory, "operator-scaling", "--fluxjobs", "all") as o:
        yield o


@pytest.fixture
def ns(k8s_cluster: Any, op: Operator) -> Iterator[str]:
    with namespace(k8s_cluster) as name:
        yield name


def deployment(name: str, replicas: int, cpu: str) -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": {"app": name}},
                                  "spec": {"containers": [{"name": "c", "image": "nginx",
                                                           "resources": {"requests": {"cpu": cpu}}}]}}}}


def running_pods(cluster: Any, ns: str, app: str, count: int) -> list[dict[str, Any]]:
    def ready() -> list[dict[str, Any]] | None:
        ps = [p for p in pods(cluster, ns, f"app={app}") if not p["metadata"].get("deletionTimestamp")]
        ok = len(ps) == count and all(p["spec"].get("nodeName") and p["status"].get("phase") == "Running"
                                      for p in ps)
        return ps if ok else None

    return list(wait(f"{count} {app} pods running", ready, timeout=90))


def placed_by_group(cluster: Any, ns: str, ps: list[dict[str, Any]]) -> dict[str, list[str]]:
    """FluxJob name -> nodes of its pods; each pod sits on the node its FluxJob chose for its slot."""
    out: dict[str, list[str]] = {}
    for p in ps:
        ann = p["metadata"].get("annotations") or {}
        name = ann["fluxnetes.io/fluxjob"]
        chosen = wait(f"FluxJob {name} status", lambda name=name: (fluxjob(cluster, ns, name).get("status") or {})
                      .get("nodes"), timeout=30)
        assert p["spec"]["nodeName"] == chosen[int(ann["fluxnetes.io/slot"])], (p["metadata"]["name"], chosen)
        out.setdefault(name, []).append(p["spec"]["nodeName"])
    return out


def base_group(cluster: Any, ns: str) -> str:
    """The Deployment's group (its FluxJob may be written a moment after its pods run)."""
    def find() -> str | None:
        names = [fj["metadata"]["name"] for fj in cluster.kubectl_json("get", "fluxjobs", "-n", ns)["items"]]
        return next((n for n in names if n.startswith("replicaset-web-") and "-scale-" not in n), None)

    return str(wait("the Deployment's FluxJob", find, timeout=30))


def test_deployment_scale_up_forms_a_matched_group_and_scale_down_releases(k8s_cluster: Any, ns: str) -> None:
    with OverbookingWatch(k8s_cluster) as watch:
        apply(k8s_cluster, ns, [deployment("web", 2, "16")])
        first = running_pods(k8s_cluster, ns, "web", 2)
        base = base_group(k8s_cluster, ns)
        assert set(placed_by_group(k8s_cluster, ns, first)) == {base}
        k8s_cluster.kubectl("scale", "deployment", "web", "-n", ns, "--replicas=4")
        four = running_pods(k8s_cluster, ns, "web", 4)
        groups = placed_by_group(k8s_cluster, ns, four)
        scale = f"{base}-scale-1"
        assert set(groups) == {base, scale}
        assert len(groups[scale]) == 2
        # 4 pods of 16 cpu on 4 nodes of 16 cpu: the matcher put the new two on the free nodes
        assert len({p["spec"]["nodeName"] for p in four}) == 4
        fj = fluxjob(k8s_cluster, ns, scale)
        assert fj["spec"]["size"] == 2 and fj["status"]["phase"] == "Running"
        assert fj["spec"]["workload"]["kind"] == "ReplicaSet"
        out = k8s_cluster.kubectl("get", "fluxjobs", "-n", ns).stdout
        assert scale in out
        # scale down: the removed pods' shares come back (a 2 x 16 cpu Job fits again)
        k8s_cluster.kubectl("scale", "deployment", "web", "-n", ns, "--replicas=2")
        running_pods(k8s_cluster, ns, "web", 2)
        apply(k8s_cluster, ns, [job("after", 2, "16")])
        wait("job after scale-down complete", lambda: job_complete(k8s_cluster, ns, "after"), timeout=90)
    assert watch.violations == []


def test_scale_up_is_all_or_nothing(k8s_cluster: Any, ns: str) -> None:
    with OverbookingWatch(k8s_cluster) as watch:
        apply(k8s_cluster, ns, [deployment("web", 2, "16")])
        running_pods(k8s_cluster, ns, "web", 2)
        base = base_group(k8s_cluster, ns)
        apply(k8s_cluster, ns, [pod("blocker", "16")])
        wait("blocker running", lambda: phase(k8s_cluster, ns, "pod-blocker") == "Running")
        k8s_cluster.kubectl("scale", "deployment", "web", "-n", ns, "--replicas=4")
        scale = f"{base}-scale-1"
        wait("scale group queued", lambda: phase(k8s_cluster, ns, scale) in ("Pending", "Reserved"))
        time.sleep(3)
        ps = [p for p in pods(k8s_cluster, ns, "app=web")]
        assert len(ps) == 4
        new = [p for p in ps if p["spec"].get("schedulingGates")]
        assert len(new) == 2 and not any(p["spec"].get("nodeName") for p in new)  # one free node: none starts
        k8s_cluster.kubectl("delete", "pod", "-n", ns, "blocker")
        four = running_pods(k8s_cluster, ns, "web", 4)
        assert len(placed_by_group(k8s_cluster, ns, four)[scale]) == 2
    assert watch.violations == []


def test_scale_up_before_the_group_started_resizes_it(k8s_cluster: Any, ns: str) -> None:
    apply(k8s_cluster, ns, [pod("blocker", "16")])
    wait("blocker running", lambda: phase(k8s_cluster, ns, "pod-blocker") == "Running")
    apply(k8s_cluster, ns, [deployment("web", 4, "16")])  # waits: 3 free nodes
    wait("web queued", lambda: any(
        (fj.get("status") or {}).get("phase") in ("Pending", "Reserved")
        for fj in k8s_cluster.kubectl_json("get", "fluxjobs", "-n", ns)["items"]
        if fj["metadata"]["name"].startswith("replicaset-web-")))
    k8s_cluster.kubectl("scale", "deployment", "web", "-n", ns, "--replicas=3")
    three = running_pods(k8s_cluster, ns, "web", 3)
    base = base_group(k8s_cluster, ns)
    assert set(placed_by_group(k8s_cluster, ns, three)) == {base}
    wait("FluxJob spec resized", lambda: fluxjob(k8s_cluster, ns, base)["spec"]["size"] == 3, timeout=30)
    assert len(fluxjob(k8s_cluster, ns, base)["status"]["nodes"]) == 3


def test_rolling_update_completes(k8s_cluster: Any, ns: str) -> None:
    """A rollout is a series of scale steps of two ReplicaSets: the new one grows by scale
    groups, the old one gives its shares back as it shrinks."""
    with OverbookingWatch(k8s_cluster) as watch:
        apply(k8s_cluster, ns, [deployment("web", 3, "4")])
        running_pods(k8s_cluster, ns, "web", 3)
        k8s_cluster.kubectl("set", "image", "deployment/web", "-n", ns, "c=nginx:2")
        k8s_cluster.kubectl("rollout", "status", "deployment/web", "-n", ns, "--timeout=120s", timeout=150)
        ps = running_pods(k8s_cluster, ns, "web", 3)
        assert all(p["spec"]["containers"][0]["image"] == "nginx:2" for p in ps)
        placed_by_group(k8s_cluster, ns, ps)
    assert watch.violations == []


def test_statefulset_scale_up_keeps_ordinals(k8s_cluster: Any, ns: str) -> None:
    sts = {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "db"},
           "spec": {"replicas": 2, "serviceName": "db", "podManagementPolicy": "Parallel",
                    "selector": {"matchLabels": {"app": "db"}},
                    "template": {"metadata": {"labels": {"app": "db"}},
                                 "spec": {"containers": [{"name": "db", "image": "postgres",
                                                          "resources": {"requests": {"cpu": "16"}}}]}}}}
    apply(k8s_cluster, ns, [sts])
    running_pods(k8s_cluster, ns, "db", 2)
    k8s_cluster.kubectl("scale", "statefulset", "db", "-n", ns, "--replicas=3")
    ps = running_pods(k8s_cluster, ns, "db", 3)
    groups = placed_by_group(k8s_cluster, ns, ps)
    assert groups.keys() == {"statefulset-db", "statefulset-db-scale-1"}
    assert len({p["spec"]["nodeName"] for p in ps}) == 3


# -- issue #29 item 2: an Unsatisfiable group follows a scale-down --------------------------------


def statefulset(name: str, replicas: int, cpu: str) -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": name},
            "spec": {"replicas": replicas, "serviceName": name, "podManagementPolicy": "Parallel",
                     "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": {"app": name}},
                                  "spec": {"containers": [{"name": "c", "image": "nginx",
                                                           "resources": {"requests": {"cpu": cpu}}}]}}}}


def label_group_deployment(name: str, replicas: int, cpu: str) -> dict[str, Any]:
    """A Deployment whose pods form label group ``name`` (sized by the Deployment)."""
    d = deployment(name, replicas, cpu)
    d["spec"]["template"]["metadata"]["labels"]["fluxnetes.io/group"] = name
    return d


def group_of(cluster: Any, ns: str, prefix: str) -> str:
    def find() -> str | None:
        names = [fj["metadata"]["name"] for fj in cluster.kubectl_json("get", "fluxjobs", "-n", ns)["items"]]
        return next((n for n in names if n.startswith(prefix) and "-scale-" not in n), None)

    return str(wait(f"the FluxJob {prefix}*", find, timeout=30))


@pytest.mark.parametrize("kind", ["deployment", "statefulset", "label-group"])
def test_an_unsatisfiable_workload_scaled_down_runs(k8s_cluster: Any, ns: str, kind: str) -> None:
    """Five pods of a whole node each on the four nodes: Unsatisfiable. Scaled to 4 (as
    `kubectl scale` does), the group is judged again at 4 and its pods bind."""
    cpus = [int(n["status"]["allocatable"]["cpu"]) for n in k8s_cluster.kubectl_json("get", "nodes")["items"]]
    whole, count = str(min(cpus)), len(cpus)
    make, prefix, resource = {
        "deployment": (deployment, "replicaset-web-", "deployment"),
        "statefulset": (statefulset, "statefulset-web", "statefulset"),
        "label-group": (label_group_deployment, "web", "deployment"),
    }[kind]
    with OverbookingWatch(k8s_cluster) as watch:
        apply(k8s_cluster, ns, [make("web", count + 1, whole)])
        name = group_of(k8s_cluster, ns, prefix)
        wait(f"{name} unsatisfiable", lambda: phase(k8s_cluster, ns, name) == "Unsatisfiable", timeout=60)
        k8s_cluster.kubectl("scale", resource, "web", "-n", ns, f"--replicas={count}")
        ps = running_pods(k8s_cluster, ns, "web", count)
        assert len({p["spec"]["nodeName"] for p in ps}) == count
        assert {p["metadata"]["annotations"]["fluxnetes.io/fluxjob"] for p in ps} == {name}
        wait(f"{name} Running at size {count}", lambda: phase(k8s_cluster, ns, name) == "Running"
             and fluxjob(k8s_cluster, ns, name)["spec"]["size"] == count, timeout=30)
        types = [h["phase"] for h in fluxjob(k8s_cluster, ns, name)["status"]["history"]]
        assert "Unsatisfiable" in types and types[-1] == "Running", types
    assert watch.violations == []
