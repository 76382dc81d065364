"""Kueue (the peer bench/peers.py measures) as a dev-cluster addon (`--addons kueue`): its
release's CRDs, webhooks (served with the dev cluster CA's certificate) and the configuration
of devcluster/addons.py. A Job naming a LocalQueue is suspended by Kueue's webhook, admitted
within its ClusterQueue's quota, and its pods are then placed by kube-scheduler on the kwok
nodes; a Job over the quota stays suspended. No fluxnetes operator runs here.

Needs the binary of `hack/build-addons.sh kueue`: skipped without it unless
FLUXNETES_REQUIRE_ADDONS=1, then failed.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from fluxnetes.devcluster import Cluster, NodeShape
from k8s_helpers import addon_cluster, wait

pytestmark = pytest.mark.k8s

NS = "kueue-demo"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    yield from addon_cluster(tmp_path_factory, "kueue-cluster", NodeShape(count=4, cpu="8", memory="32Gi"),
                             names=("kueue",))


def job(name: str, pods: int, cpu: str) -> dict[str, Any]:
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": name, "namespace": NS, "labels": {"kueue.x-k8s.io/queue-name": "lq"}},
            "spec": {"parallelism": pods, "completions": pods,
                     "template": {"spec": {"restartPolicy": "Never", "containers": [
                         {"name": "c", "image": "busybox", "resources": {"requests": {"cpu": cpu}}}]}}}}


def test_job_in_a_local_queue_is_admitted_and_placed_by_kube_scheduler(cluster: Cluster) -> None:
    cluster.kubectl("create", "namespace", NS)
    queues = [
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor", "metadata": {"name": "default"}},
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue", "metadata": {"name": "cq"},
         "spec": {"namespaceSelector": {}, "resourceGroups": [{"coveredResources": ["cpu"], "flavors": [
             {"name": "default", "resources": [{"name": "cpu", "nominalQuota": "16"}]}]}]}},
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue", "metadata": {"name": "lq", "namespace": NS},
         "spec": {"clusterQueue": "cq"}},
    ]
    cluster.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": queues}))
    wait("the ClusterQueue Active", timeout=90, cond=lambda: any(
        c.get("type") == "Active" and c.get("status") == "True"
        for c in (cluster.kubectl_json("get", "clusterqueue", "cq").get("status") or {})
        .get("conditions") or []))
    created = cluster.api_call("POST", f"/apis/batch/v1/namespaces/{NS}/jobs", job("fits", 3, "2"))
    assert created["spec"]["suspend"] is True, "Kueue's webhook did not suspend the Job at creation"
    big = cluster.api_call("POST", f"/apis/batch/v1/namespaces/{NS}/jobs", job("over-quota", 3, "8"))
    assert big["spec"]["suspend"] is True

    def workload_of(name: str) -> dict[str, Any] | None:
        items = cluster.kubectl_json("get", "workloads", "-n", NS)["items"]
        return next((w for w in items if any(o.get("name") == name for o in w["metadata"].get("ownerReferences") or [])),
                    None)

    def admitted(name: str) -> bool:
        w = workload_of(name)
        return bool(w) and any(c.get("type") == "Admitted" and c.get("status") == "True"
                               for c in (w.get("status") or {}).get("conditions") or [])

    wait("the Workload of job 'fits' admitted", lambda: admitted("fits"), timeout=90)
    nodes = {n["metadata"]["name"] for n in cluster.kubectl_json("get", "nodes")["items"]}
    pods = wait("3 pods of job 'fits' bound", timeout=90, cond=lambda: (ps := cluster.kubectl_json(
        "get", "pods", "-n", NS, "-l", "batch.kubernetes.io/job-name=fits")["items"])
        and len([p for p in ps if p["spec"].get("nodeName")]) == 3 and ps)
    assert {p["spec"]["nodeName"] for p in pods} <= nodes
    assert {p["spec"].get("schedulerName") for p in pods} == {"default-scheduler"}
    # 3 x 8 cpus is over the 16 of the quota, so Kueue keeps it suspended (the cluster has room):
    # wait until Kueue has looked at it and said why (QuotaReserved False), not for a time
    wait("Kueue's verdict on job 'over-quota'", timeout=90, cond=lambda: any(
        c.get("type") == "QuotaReserved" and c.get("status") == "False"
        for c in ((workload_of("over-quota") or {}).get("status") or {}).get("conditions") or []))
    assert not admitted("over-quota")
    assert cluster.kubectl_json("get", "job", "over-quota", "-n", NS)["spec"]["suspend"] is True
    assert not cluster.kubectl_json("get", "pods", "-n", NS, "-l", "batch.kubernetes.io/job-name=over-quota",
                                    )["items"]
