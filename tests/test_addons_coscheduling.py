"""scheduler-plugins' coscheduling (the peer bench/peers.py measures) as a dev-cluster addon
(`--addons coscheduling`): the PodGroup CRD, the PodGroup controller and a second scheduler whose
profile `scheduler-plugins-scheduler` runs the Coscheduling plugin (devcluster/addons.py). Pods
naming that scheduler and a PodGroup are bound all together or not at all; pods naming it
without a PodGroup are bound one by one. The MPI Operator runs beside it, as bench/peers.py's
row c has it: with coscheduling on the cluster it is started with
`--gang-scheduling=scheduler-plugins-scheduler` and makes each MPIJob's PodGroup itself. No
fluxnetes operator runs here.

Needs the binaries of `hack/build-addons.sh coscheduling mpi`: skipped without them unless
FLUXNETES_REQUIRE_ADDONS=1, then failed.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from fluxnetes.devcluster import Cluster, NodeShape
from fluxnetes.devcluster.addons import SCHEDULER_NAME
from k8s_helpers import addon_cluster, wait

pytestmark = pytest.mark.k8s

NS = "cosched-demo"
GROUP_LABEL = "scheduling.x-k8s.io/pod-group"
NODES, NODE_CPU = 4, 16


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    for c in addon_cluster(tmp_path_factory, "cosched-cluster",
                           NodeShape(count=NODES, cpu=str(NODE_CPU), memory="64Gi"), names=("mpi", "coscheduling")):
        c.kubectl("create", "namespace", NS)
        yield c


def pod(name: str, cpu: str, group: str | None) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": NS, "labels": {GROUP_LABEL: group} if group else {}},
            "spec": {"schedulerName": SCHEDULER_NAME, "containers": [
                {"name": "c", "image": "busybox", "resources": {"requests": {"cpu": cpu}}}]}}


def create_group(cluster: Cluster, group: str, members: int, cpu: str) -> None:
    items = [{"apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup",
              "metadata": {"name": group, "namespace": NS}, "spec": {"minMember": members}}]
    items += [pod(f"{group}-{i}", cpu, group) for i in range(members)]
    cluster.kubectl("create", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))


def pods_of(cluster: Cluster, selector: str) -> list[dict[str, Any]]:
    return list(cluster.kubectl_json("get", "pods", "-n", NS, "-l", selector)["items"])


def bound(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [p for p in pods if p["spec"].get("nodeName")]


def scheduler_events(cluster: Cluster, reason: str) -> list[dict[str, Any]]:
    return [e for e in cluster.kubectl_json("get", "events", "-n", NS)["items"]
            if e.get("reason") == reason and e.get("reportingComponent") == SCHEDULER_NAME]


def test_a_pod_group_that_fits_is_bound_whole_by_the_second_scheduler(cluster: Cluster) -> None:
    create_group(cluster, "fits", 3, "1")
    pods = wait("the 3 pods of PodGroup 'fits' bound", timeout=90,
                cond=lambda: (ps := pods_of(cluster, f"{GROUP_LABEL}=fits")) and len(bound(ps)) == 3 and ps)
    nodes = {n["metadata"]["name"] for n in cluster.kubectl_json("get", "nodes")["items"]}
    assert {p["spec"]["nodeName"] for p in pods} <= nodes
    # bound by scheduler-plugins' scheduler (kube-scheduler ignores pods naming another one)
    scheduled = {e["involvedObject"]["name"] for e in scheduler_events(cluster, "Scheduled")}
    assert {p["metadata"]["name"] for p in pods} <= scheduled
    # the PodGroup controller counts them once kwok runs them
    wait("PodGroup 'fits' Running", timeout=90, cond=lambda: (
        cluster.kubectl_json("get", "podgroup", "fits", "-n", NS).get("status") or {}).get("phase") == "Running")


def test_a_pod_group_that_cannot_fit_gets_no_node_at_all(cluster: Cluster) -> None:
    # one 12-cpu pod per 16-cpu node: 4 of the 5 would fit alone (kube-scheduler would bind
    # them), the group does not
    create_group(cluster, "too-big", NODES + 1, "12")
    wait("the scheduler's rejection of PodGroup 'too-big'", timeout=120, cond=lambda: [
        e for e in scheduler_events(cluster, "FailedScheduling")
        if "PodGroup" in e.get("message", "") and "too-big" in e.get("message", "") and "rejected" in e["message"]])
    assert bound(pods_of(cluster, f"{GROUP_LABEL}=too-big")) == []
    phase = (cluster.kubectl_json("get", "podgroup", "too-big", "-n", NS).get("status") or {}).get("phase")
    assert phase in ("Pending", "Scheduling", None), phase


def test_plain_pods_naming_the_scheduler_are_bound(cluster: Cluster) -> None:
    items = [pod(f"plain-{i}", "1", None) for i in range(2)]
    cluster.kubectl("create", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
    wait("the 2 plain pods bound", timeout=90, cond=lambda: len(bound(
        [p for p in cluster.kubectl_json("get", "pods", "-n", NS)["items"]
         if p["metadata"]["name"].startswith("plain-")])) == 2)


def test_the_mpi_operator_makes_the_podgroup_of_an_mpijob(cluster: Cluster) -> None:
    """An MPIJob that names no scheduler and no PodGroup: the MPI Operator makes its PodGroup
    (minMember = 1 launcher + 2 workers, owned by the MPIJob) and hands its pods to the second
    scheduler, which binds all three."""
    replica = {"replicas": 1, "template": {"spec": {"containers": [
        {"name": "c", "image": "busybox", "resources": {"requests": {"cpu": "1"}}}]}}}
    mpijob = {"apiVersion": "kubeflow.org/v2beta1", "kind": "MPIJob", "metadata": {"name": "pi", "namespace": NS},
              "spec": {"slotsPerWorker": 1, "runPolicy": {"cleanPodPolicy": "Running"},
                       "mpiReplicaSpecs": {"Launcher": replica, "Worker": {**replica, "replicas": 2}}}}
    cluster.kubectl("create", "-f", "-", input=json.dumps(mpijob))
    group = wait("the MPI Operator's PodGroup 'pi'", timeout=300, cond=lambda: next(
        (g for g in cluster.kubectl_json("get", "podgroups", "-n", NS)["items"] if g["metadata"]["name"] == "pi"), None))
    assert group["spec"]["minMember"] == 3
    assert [o["kind"] for o in group["metadata"]["ownerReferences"]] == ["MPIJob"]
    pods = wait("the MPIJob's 3 pods bound", timeout=300,
                cond=lambda: (ps := pods_of(cluster, f"{GROUP_LABEL}=pi")) and len(bound(ps)) == 3 and ps)
    assert {p["spec"]["schedulerName"] for p in pods} == {SCHEDULER_NAME}
    scheduled = {e["involvedObject"]["name"] for e in scheduler_events(cluster, "Scheduled")}
    assert {p["metadata"]["name"] for p in pods} <= scheduled
