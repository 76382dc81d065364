"""Placement ``bind`` against the real control plane: pods carry ``schedulerName: fluxnetes``
(no gate) and the operator binds each one itself, on the node the matcher chose; a gang still
waits whole for room, and a restart finds its bound pods again."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from fluxnetes.k8s import names
from fluxnetes.k8s.admission import hold
from fluxnetes.k8s.admission import review as admission
from fluxnetes.k8s.scheduling import placement
from k8s_helpers import Operator, namespace, operator_session
from test_k8s_operator import (
    apply,
    example,
    job,
    job_complete,
    on_chosen_nodes,
    phase,
    pod,
    pods,
    wait,
)

pytestmark = pytest.mark.k8s


@pytest.fixture(scope="module")
def bind_operator(k8s_cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Operator]:
    with operator_session(k8s_cluster, tmp_path_factory, "bind-operator", "--placement", "bind") as op:
        yield op


def test_job_pods_are_bound_by_fluxnetes_on_the_chosen_nodes(k8s_cluster: Any, bind_operator: Operator) -> None:
    with namespace(k8s_cluster) as ns:
        # the gate rule is not installed in bind mode (nothing to protect)
        vap = k8s_cluster.kubectl("get", "validatingadmissionpolicy", "fluxnetes.io-gate", check=False)
        assert vap.returncode != 0
        apply(k8s_cluster, ns, example("job.yaml"))
        tmpl = k8s_cluster.kubectl_json("get", "job", "-n", ns, "job")["spec"]["template"]["spec"]
        assert tmpl["schedulerName"] == names.SCHEDULER_NAME and not tmpl.get("schedulingGates")
        wait("job complete", lambda: job_complete(k8s_cluster, ns, "job"))
        wait("FluxJob Completed", lambda: phase(k8s_cluster, ns, "job-job") == "Completed")
        ps = pods(k8s_cluster, ns, "job-name=job")
        assert len(ps) == 4
        on_chosen_nodes(k8s_cluster, ns, "job-job", ps)
        for p in ps:
            ann = p["metadata"]["annotations"]
            assert ann[names.LABEL_JOBID].isdigit()  # the Binding's annotations reached the pod
            assert not p["spec"].get("affinity")  # bound, not pinned
        # the pods' Scheduled events come from fluxnetes, none from kube-scheduler
        events = k8s_cluster.kubectl_json("get", "events", "-n", ns)["items"]
        sources = {e.get("reportingComponent") or (e.get("source") or {}).get("component")
                   for e in events if e.get("reason") == "Scheduled"}
        assert "default-scheduler" not in sources


def test_gang_waits_whole_then_binds_and_a_restart_adopts_bound_pods(
        k8s_cluster: Any, bind_operator: Operator) -> None:
    with namespace(k8s_cluster) as ns:
        apply(k8s_cluster, ns, [pod("blocker", "16")])
        wait("blocker bound", lambda: all(p["spec"].get("nodeName") for p in pods(k8s_cluster, ns)))
        apply(k8s_cluster, ns, [job("gang", 4, "16")])  # needs all 4 nodes: waits for the blocker
        wait("gang queued", lambda: phase(k8s_cluster, ns, "job-gang") in ("Pending", "Reserved"))
        time.sleep(2)
        assert not any(p["spec"].get("nodeName") for p in pods(k8s_cluster, ns, "job-name=gang"))
        k8s_cluster.kubectl("delete", "pod", "-n", ns, "blocker")
        wait("gang complete", lambda: job_complete(k8s_cluster, ns, "gang"))
        used = on_chosen_nodes(k8s_cluster, ns, "job-gang", pods(k8s_cluster, ns, "job-name=gang"))
        assert len(used) == 4
        # a long-running pod survives a SIGKILL of the operator and is adopted again: the node
        # it holds is not handed out twice (a whole-node job waits until it is deleted)
        apply(k8s_cluster, ns, [pod("keeper", "16")])
        wait("keeper bound", lambda: pods(k8s_cluster, ns, "!job-name")[0]["spec"].get("nodeName"))
        bind_operator.kill()
        bind_operator.start("--placement", "bind")
        apply(k8s_cluster, ns, [job("whole", 4, "16")])
        wait("whole queued", lambda: phase(k8s_cluster, ns, "job-whole") in ("Pending", "Reserved"))
        time.sleep(2)
        assert not any(p["spec"].get("nodeName") for p in pods(k8s_cluster, ns, "job-name=whole"))
        k8s_cluster.kubectl("delete", "pod", "-n", ns, "keeper")
        wait("whole complete", lambda: job_complete(k8s_cluster, ns, "whole"))


def test_admission_holds_by_scheduler_name() -> None:
    """Unit level: the scheduler-name hold replaces the gate, for pods and templates."""
    p = pod("p", "1", ns="ns")
    ops = admission.mutate_pod(p, hold.SCHEDULER)
    assert {"op": "add", "path": "/spec/schedulerName", "value": "fluxnetes"} in ops
    assert not any("schedulingGates" in o["path"] for o in ops)
    j = job("j", 2, "1")
    ops = admission.mutate_workload(j, hold=hold.SCHEDULER)
    assert {"op": "add", "path": "/spec/template/spec/schedulerName", "value": "fluxnetes"} in ops
    assert {"op": "add", "path": "/spec/suspend", "value": True} in ops
    # a pod naming another scheduler is left alone in both modes
    other = pod("o", "1", ns="ns")
    other["spec"]["schedulerName"] = "volcano"
    assert admission.mutate_pod(other, hold.SCHEDULER) == []
    # held: by the gate, or by the scheduler name until bound
    held = {"spec": {"schedulerName": "fluxnetes"}}
    assert hold.is_held(held) and not hold.gated(held)
    assert not hold.is_held({"spec": {"schedulerName": "fluxnetes", "nodeName": "n0"}})
    assert hold.is_held({"spec": {"schedulingGates": [{"name": names.GATE}]}})
    body = placement.binding({"metadata": {"name": "p", "namespace": "ns", "uid": "u"}}, "n1",
                             jobid=7, fluxjob="g", slot=2)
    assert body["target"]["name"] == "n1"
    assert body["metadata"]["annotations"] == {names.ANN_FLUXJOB: "g", placement.ANN_SLOT: "2",
                                               names.LABEL_JOBID: "7"}
    assert placement.placed_jobid({"metadata": {"annotations": {names.LABEL_JOBID: "7"}}}) == "7"
