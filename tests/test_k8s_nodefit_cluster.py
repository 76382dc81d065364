"""A pod's own node rules on the real control plane: fluxnetes only pins pods to nodes they may
run on (nodeSelector, required node affinity, taints and tolerations), so kube-scheduler binds
them there; work no node allows is Unsatisfiable with the rule named.

The dev cluster (tests/conftest.py) has kwok-node-0..3 (16 cpu each). For this module one node
is labelled and another tainted (before the operator starts, undone afterwards).
"""

from __future__ import annotations

import signal
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from k8s_helpers import Operator, bound_nodes, cleanup_webhooks, namespace
from test_k8s_operator import apply, fluxjob, job, phase, wait

pytestmark = pytest.mark.k8s

RUN = "r" + uuid.uuid4().hex[:6]  # a letter first: bare hex like "123e45" is a number in YAML
DISK_LABEL = "fluxnetes.io/test-disk"
DISK = f"ssd-{RUN}"
SSD_NODE = "kwok-node-2"
TAINT_KEY = "fluxnetes.io/test-dedicated"
TAINT = f"{TAINT_KEY}={RUN}:NoSchedule"
TAINTED_NODE = "kwok-node-1"
HOSTNAME = "kubernetes.io/hostname"


@pytest.fixture(scope="module")
def op(k8s_cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Operator]:
    k8s_cluster.kubectl("label", "node", SSD_NODE, f"{DISK_LABEL}={DISK}", "--overwrite")
    k8s_cluster.kubectl("taint", "node", TAINTED_NODE, TAINT, "--overwrite")
    o = Operator(k8s_cluster, tmp_path_factory.mktemp("operator-nodefit"))
    try:
        # the jobspec of a Job placed at once is read from its FluxJob below: every group gets
        # one (--fluxjobs all; the default, waiting, gives that Job none)
        o.start("--fluxjobs", "all")
        yield o
    finally:
        o.kill(signal.SIGTERM)
        cleanup_webhooks(k8s_cluster)
        k8s_cluster.kubectl("label", "node", SSD_NODE, f"{DISK_LABEL}-", check=False)
        k8s_cluster.kubectl("taint", "node", TAINTED_NODE, f"{TAINT_KEY}:NoSchedule-", check=False)


@pytest.fixture
def ns(k8s_cluster: Any, op: Operator) -> Iterator[str]:
    with namespace(k8s_cluster) as name:
        yield name


def job_with(name: str, size: int, cpu: str, **pod_spec: Any) -> dict[str, Any]:
    j = job(name, size, cpu)
    j["metadata"]["labels"] = {"app": name}
    j["spec"]["template"]["metadata"] = {"labels": {"app": name}}
    j["spec"]["template"]["spec"].update(pod_spec)
    return j


def unsatisfiable_reason(cluster: Any, ns: str, name: str) -> str:
    wait(f"{name} unsatisfiable", lambda: phase(cluster, ns, name) == "Unsatisfiable")
    return str(fluxjob(cluster, ns, name)["status"]["reason"])


def test_node_selector_pods_land_on_the_labelled_node(k8s_cluster: Any, ns: str) -> None:
    apply(k8s_cluster, ns, [job_with("ssd", 3, "1", nodeSelector={DISK_LABEL: DISK})])
    assert bound_nodes(k8s_cluster, ns, "app=ssd", 3) == [SSD_NODE] * 3
    spec = wait("FluxJob job-ssd", lambda: fluxjob(k8s_cluster, ns, "job-ssd"))["spec"]
    assert "hostlist" in spec["jobspec"] and SSD_NODE in spec["jobspec"]
    # a required node affinity is followed the same way
    aff = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": DISK_LABEL, "operator": "In", "values": [DISK, "other"]}]}]}}}
    apply(k8s_cluster, ns, [job_with("aff", 2, "1", affinity=aff)])
    assert bound_nodes(k8s_cluster, ns, "app=aff", 2) == [SSD_NODE] * 2


def test_a_tainted_node_takes_only_tolerating_pods(k8s_cluster: Any, ns: str) -> None:
    either = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": HOSTNAME, "operator": "In", "values": [TAINTED_NODE, "kwok-node-3"]}]}]}}}
    tolerate = [{"key": TAINT_KEY, "operator": "Equal", "value": RUN, "effect": "NoSchedule"}]
    apply(k8s_cluster, ns, [
        job_with("tolerant", 2, "1", nodeSelector={HOSTNAME: TAINTED_NODE}, tolerations=tolerate),
        job_with("plain", 2, "1", affinity=either),  # may not use the tainted one of its two nodes
    ])
    assert bound_nodes(k8s_cluster, ns, "app=tolerant", 2) == [TAINTED_NODE] * 2
    assert bound_nodes(k8s_cluster, ns, "app=plain", 2) == ["kwok-node-3"] * 2
    # without the toleration, the tainted node alone is no place at all
    apply(k8s_cluster, ns, [job_with("refused", 1, "1", nodeSelector={HOSTNAME: TAINTED_NODE})])
    reason = unsatisfiable_reason(k8s_cluster, ns, "job-refused")
    assert reason.startswith("can never run on this cluster") and TAINT_KEY in reason, reason


def test_a_selector_no_node_matches_is_unsatisfiable(k8s_cluster: Any, ns: str) -> None:
    apply(k8s_cluster, ns, [job_with("nowhere", 2, "1", nodeSelector={DISK_LABEL: "nvme"})])
    reason = unsatisfiable_reason(k8s_cluster, ns, "job-nowhere")
    assert reason == f"can never run on this cluster: no node matches nodeSelector {DISK_LABEL}=nvme"
    j = k8s_cluster.kubectl_json("get", "job", "-n", ns, "nowhere")
    assert j["spec"].get("suspend") is True  # never resumed: no pod was created
