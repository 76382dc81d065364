"""The default modes (``--placement auto --job-mode auto``) against the real control plane.

Placement auto: a pod that needs none of kube-scheduler's own checks is held by fluxnetes'
scheduler name and bound by the operator; one that does (here a host port) is gated, pinned
by node affinity and bound by kube-scheduler; one group may hold both. Job mode auto: a Job
is only held through its pods (no suspend, no resume), unless it has activeDeadlineSeconds:
then it is suspended until allocated, so its deadline counts from its start."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import pytest

from fluxnetes.k8s import names
from fluxnetes.k8s.workloads.job import ANN_SUSPENDED_BY
from k8s_helpers import Operator, namespace, operator_session
from test_k8s_operator import apply, job, job_complete, on_chosen_nodes, phase, pod, pods, wait

pytestmark = pytest.mark.k8s

AUTO = ("--placement", "auto", "--job-mode", "auto")  # the defaults, over the suite's pinned modes


@pytest.fixture(scope="module")
def auto_operator(k8s_cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Operator]:
    with operator_session(k8s_cluster, tmp_path_factory, "auto-operator", *AUTO) as op:
        yield op


def with_host_port(obj: dict[str, Any], port: int) -> dict[str, Any]:
    out = copy.deepcopy(obj)
    spec = out["spec"]["template"]["spec"] if out["kind"] == "Job" else out["spec"]
    spec["containers"][0]["ports"] = [{"containerPort": port, "hostPort": port}]
    return out


def test_a_plain_job_is_bound_by_fluxnetes_and_never_suspended(k8s_cluster: Any, auto_operator: Operator) -> None:
    with namespace(k8s_cluster) as ns:
        apply(k8s_cluster, ns, [job("plain", 2, "4")])
        j = k8s_cluster.kubectl_json("get", "job", "-n", ns, "plain")
        assert not j["spec"].get("suspend") and ANN_SUSPENDED_BY not in (j["metadata"].get("annotations") or {})
        tmpl = j["spec"]["template"]["spec"]
        assert tmpl["schedulerName"] == names.SCHEDULER_NAME and not tmpl.get("schedulingGates")
        wait("plain complete", lambda: job_complete(k8s_cluster, ns, "plain"))
        wait("FluxJob Completed", lambda: phase(k8s_cluster, ns, "job-plain") == "Completed")
        ps = pods(k8s_cluster, ns, "job-name=plain")
        assert len(ps) == 2
        on_chosen_nodes(k8s_cluster, ns, "job-plain", ps)
        assert all(not p["spec"].get("affinity") for p in ps)  # bound, not pinned


def test_a_job_with_a_deadline_is_suspended_until_allocated(k8s_cluster: Any, auto_operator: Operator) -> None:
    with namespace(k8s_cluster) as ns:
        body = job("deadline", 2, "4")
        body["spec"]["activeDeadlineSeconds"] = 600
        apply(k8s_cluster, ns, [body])
        wait("deadline complete", lambda: job_complete(k8s_cluster, ns, "deadline"))
        # held at admission (suspended, marked), resumed once allocated: the resume takes the
        # hold mark off with the hold (a later suspension is its user's)
        j = k8s_cluster.kubectl_json("get", "job", "-n", ns, "deadline")
        assert j["spec"]["suspend"] is False and ANN_SUSPENDED_BY not in (j["metadata"].get("annotations") or {})
        # (the Job controller's word that it was suspended, then resumed)
        assert any(c["type"] == "Suspended" for c in (j.get("status") or {}).get("conditions") or []), j.get("status")
        on_chosen_nodes(k8s_cluster, ns, "job-deadline", pods(k8s_cluster, ns, "job-name=deadline"))


def test_a_pod_needing_kube_scheduler_is_gated_and_pinned_even_in_a_mixed_group(
        k8s_cluster: Any, auto_operator: Operator) -> None:
    with namespace(k8s_cluster) as ns:
        apply(k8s_cluster, ns, [with_host_port(job("ported", 1, "2"), 18080)])
        tmpl = k8s_cluster.kubectl_json("get", "job", "-n", ns, "ported")["spec"]["template"]["spec"]
        assert tmpl.get("schedulerName", "default-scheduler") == "default-scheduler"
        assert [g["name"] for g in tmpl["schedulingGates"]] == [names.GATE]
        wait("ported complete", lambda: job_complete(k8s_cluster, ns, "ported"))
        (p,) = pods(k8s_cluster, ns, "job-name=ported")
        assert p["spec"]["affinity"]["nodeAffinity"]  # pinned, then bound by kube-scheduler
        on_chosen_nodes(k8s_cluster, ns, "job-ported", [p])
        # a group of two pods, one of each hold, placed together
        group = {names.LABEL_GROUP: "mixed", names.LABEL_GROUP_SIZE: "2"}
        apply(k8s_cluster, ns, [pod("bare", "2", labels=group), with_host_port(pod("port", "2", labels=group), 18081)])
        wait("mixed group bound", lambda: all(
            p["spec"].get("nodeName") for p in pods(k8s_cluster, ns, f"{names.LABEL_GROUP}=mixed")))
        wait("FluxJob Running or Completed",
             lambda: phase(k8s_cluster, ns, "mixed") in ("Running", "Completed"))
        # (the gate may be gone already: the hold shows in how each was placed)
        placed = {p["metadata"]["name"]: p["spec"] for p in pods(k8s_cluster, ns, f"{names.LABEL_GROUP}=mixed")}
        assert placed["bare"].get("schedulerName") == names.SCHEDULER_NAME and not placed["bare"].get("affinity")
        assert placed["port"].get("schedulerName") == "default-scheduler"
        assert placed["port"]["affinity"]["nodeAffinity"]
        on_chosen_nodes(k8s_cluster, ns, "mixed", pods(k8s_cluster, ns, f"{names.LABEL_GROUP}=mixed"))



def test_the_gate_guard_skips_pods_held_by_the_name_and_no_gated_pod_gets_their_label(
        k8s_cluster: Any, auto_operator: Operator) -> None:
    """Each update of a pod the gate's policy selects costs the API server a CEL evaluation of
    the whole old and new pod (the Job controller's finalizer patch, for one: docs/scale.md).
    A pod held by the scheduler name has no gate to guard: labelled fluxnetes.io/hold, it is
    not selected. A gated pod never keeps that label (admission drops it) nor gets it later
    from anyone but the operator."""
    def get(ns: str, name: str) -> dict[str, Any]:
        return dict(k8s_cluster.kubectl_json("get", "pod", "-n", ns, name))

    def as_mallory(ns: str, *args: str) -> Any:
        return k8s_cluster.kubectl(*args, "-n", ns, "--as=mallory", check=False)

    ungate = ("patch", "pod", "--type=json", "-p", '[{"op": "remove", "path": "/spec/schedulingGates/0"}]')
    waits = {names.LABEL_GROUP_SIZE: "2"}  # groups of 2 with one pod each: they stay held
    with namespace(k8s_cluster) as ns:
        k8s_cluster.kubectl("create", "rolebinding", "mallory-edit", "-n", ns, "--clusterrole=edit", "--user=mallory")
        apply(k8s_cluster, ns, [pod("bare", "1", labels={names.LABEL_GROUP: "a", **waits}),
                                with_host_port(pod("ported", "1", labels={names.LABEL_GROUP: "b", **waits}), 18082)])
        bare, ported = get(ns, "bare"), get(ns, "ported")
        assert bare["metadata"]["labels"][names.LABEL_HOLD] == names.HOLD_SCHEDULER_NAME
        assert not bare["spec"].get("schedulingGates") and bare["spec"]["schedulerName"] == names.SCHEDULER_NAME
        assert names.LABEL_HOLD not in ported["metadata"]["labels"] and ported["spec"]["schedulingGates"]
        # nobody but the operator labels a gated pod so, or lifts its gate
        res = as_mallory(ns, "label", "pod", "ported", f"{names.LABEL_HOLD}={names.HOLD_SCHEDULER_NAME}")
        assert res.returncode != 0 and names.LABEL_HOLD in res.stderr
        res = as_mallory(ns, *ungate, "ported")
        assert res.returncode != 0 and names.GATE in res.stderr
        # a gated pod created with the label (as if made from a workload's template, which the
        # pod webhook skips) goes through the pod webhook all the same, and loses it
        forged = pod("forged", "1", labels={names.LABEL_GROUP: "c", names.LABEL_MANAGED: "true",
                                            names.LABEL_HOLD: names.HOLD_SCHEDULER_NAME, **waits})
        forged["spec"]["schedulingGates"] = [{"name": names.GATE}]
        apply(k8s_cluster, ns, [forged])
        assert names.LABEL_HOLD not in get(ns, "forged")["metadata"]["labels"]
        res = as_mallory(ns, *ungate, "forged")
        assert res.returncode != 0 and names.GATE in res.stderr
        # a pod no webhook saw (opted out, as one admitted by a webhook that did not know the
        # label) with the managed label and a gate is guarded; if it also carries the hold
        # label (which the policy's selector skips), the operator takes that label off
        for name, extra in (("guarded", {}), ("unforged", {names.LABEL_HOLD: names.HOLD_SCHEDULER_NAME})):
            p = pod(name, "1", labels={names.LABEL_ENABLED: "false", names.LABEL_MANAGED: "true",
                                       names.LABEL_GROUP: name, **waits, **extra})
            p["spec"]["schedulingGates"] = [{"name": names.GATE}]
            apply(k8s_cluster, ns, [p])
        res = as_mallory(ns, *ungate, "guarded")
        assert res.returncode != 0 and names.GATE in res.stderr
        wait("the hold label taken off the gated pod",
             lambda: names.LABEL_HOLD not in get(ns, "unforged")["metadata"]["labels"], timeout=30)
        res = as_mallory(ns, *ungate, "unforged")
        assert res.returncode != 0 and names.GATE in res.stderr
