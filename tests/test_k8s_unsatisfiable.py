"""Unsatisfiable is judged for every queued group (not only the head the matcher reserves for),
names the short resource, and is not for ever: work too big for the cluster starts once nodes
are added (or relabelled) so that it fits. And the FluxJob tells the truth: a short job keeps
its Running condition, pods deleted while they run end the group as Cancelled.

Unit level: the Controller driven by watch events (the recording fake of test_k8s_prune).
Cluster level: the real control plane (4 kwok nodes of 16 cpu, plus one added here).
"""

from __future__ import annotations

import asyncio
import copy
import json
import signal
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from fluxnetes.k8s import names
from k8s_helpers import Operator, cleanup_webhooks, namespace
from test_k8s_node_loss import cpu_pod, kwok_node
from test_k8s_operator import apply, fluxjob, job, pod, wait
from test_k8s_operator import fluxjob_phase as phase  # (--fluxjobs all: what the FluxJob says)
from test_k8s_prune import make_controller, node, settle

# ---------------------------------------------------------------- unit level


def test_behind_a_reservation_an_impossible_pod_is_unsatisfiable_at_once() -> None:
    async def main() -> None:
        c, _kube = make_controller()  # n0..n3, 16 cpu each; EASY
        first = cpu_pod("first", "16", "first", 1)
        first["metadata"]["annotations"] = {names.ANN_DURATION: "1h"}
        c.handle(("Pod", "ADDED", first))
        await settle(c)
        # the head needs all four nodes: reserved for when `first` ends
        for p in [cpu_pod(f"all-{i}", "16", "all", 4) for i in range(4)]:
            c.handle(("Pod", "ADDED", p))
        await settle(c)
        assert str(c.groups[("ns", "all")].phase) == "Reserved"
        c.handle(("Pod", "ADDED", cpu_pod("huge", "1000", "huge", 1)))
        c.handle(("Pod", "ADDED", cpu_pod("wide", "20", "wide", 1)))
        c.handle(("Pod", "ADDED", cpu_pod("many", "12", "many", 5)))
        for i in range(1, 5):
            c.handle(("Pod", "ADDED", cpu_pod(f"many-{i}", "12", "many", 5)))
        await settle(c)
        reasons = {k: c.groups[("ns", k)].reason for k in ("huge", "wide", "many")}
        assert all(str(c.groups[("ns", k)].phase) == "Unsatisfiable" for k in reasons), reasons
        assert reasons["huge"] == "can never run on this cluster: needs 1000 cpu in all; the cluster has 64"
        assert reasons["wide"] == "can never run on this cluster: no node has 20 cpu; the largest has 16"
        assert reasons["many"] == ("can never run on this cluster: needs 5 pods of 12 cpu each; "
                                   "the nodes hold at most 4 of them")
        assert str(c.groups[("ns", "all")].phase) == "Reserved"  # the reservation stands

    asyncio.run(main())


def test_unsatisfiable_work_runs_once_a_node_makes_it_fit() -> None:
    async def main() -> None:
        c, _kube = make_controller()
        for p in [cpu_pod(f"five-{i}", "12", "five", 5) for i in range(5)]:
            c.handle(("Pod", "ADDED", p))
        await settle(c)
        g = c.groups[("ns", "five")]
        assert str(g.phase) == "Unsatisfiable"
        c.handle(("Node", "ADDED", node("n4")))
        await settle(c)
        await settle(c)
        assert str(g.phase) == "Running" and sorted(set(g.slots)) == ["n0", "n1", "n2", "n3", "n4"]
        conds = {cd["type"] for cd in _kube.fluxjob_status[("ns", "five")]["conditions"]}
        assert {"Unsatisfiable", "Pending", "Running"} <= conds

    asyncio.run(main())


def fpga_node(name: str, resource: str) -> dict[str, Any]:
    n = node(name)
    for k in ("allocatable", "capacity"):
        n["status"][k][resource] = "2"
    return n


def test_an_extended_resource_keeps_its_domain() -> None:
    """`example.com/fpga` is not `other.com/fpga`: the reason names the full resource, a node
    offering the other domain's device does not take the pod, one offering its own does."""
    async def main() -> None:
        c, _kube = make_controller()
        p = cpu_pod("fpga", "1", "fpga", 1)
        p["spec"]["containers"][0]["resources"]["requests"]["example.com/fpga"] = "1"
        c.handle(("Pod", "ADDED", p))
        await settle(c)
        g = c.groups[("ns", "fpga")]
        assert str(g.phase) == "Unsatisfiable"
        assert g.reason == ("can never run on this cluster: needs 1 example.com/fpga in all; "
                            "the cluster has 0"), g.reason
        c.handle(("Node", "ADDED", fpga_node("other", "other.com/fpga")))
        await settle(c)
        await settle(c)
        assert str(g.phase) == "Unsatisfiable", (g.phase, g.slots)
        c.handle(("Node", "ADDED", fpga_node("mine", "example.com/fpga")))
        await settle(c)
        await settle(c)
        assert str(g.phase) == "Running" and g.slots == ["mine"], (g.phase, g.slots)

    asyncio.run(main())


def test_a_relabelled_node_makes_a_node_selector_fit() -> None:
    async def main() -> None:
        c, _kube = make_controller()
        p = cpu_pod("ssd", "1", "ssd", 1)
        p["spec"]["nodeSelector"] = {"disk": "ssd"}
        c.handle(("Pod", "ADDED", p))
        await settle(c)
        g = c.groups[("ns", "ssd")]
        assert str(g.phase) == "Unsatisfiable" and "disk=ssd" in g.reason
        n2 = copy.deepcopy(node("n2"))
        n2["metadata"]["labels"]["disk"] = "ssd"
        c.handle(("Node", "MODIFIED", n2))
        await settle(c)
        await settle(c)
        assert str(g.phase) == "Running" and g.slots == ["n2"]

    asyncio.run(main())


def test_a_short_job_keeps_its_running_condition() -> None:
    async def main() -> None:
        c, kube = make_controller()
        p = cpu_pod("short", "1", "short", 1)
        c.handle(("Pod", "ADDED", p))
        c.scheduling.run_cycle()  # Pending -> Running before any status write
        from test_k8s_prune import bound
        g = c.groups[("ns", "short")]
        c.handle(("Pod", "MODIFIED", {**bound(p, g.slots[0]), "status": {"phase": "Succeeded"}}))
        await settle(c)
        st = kube.fluxjob_status[("ns", "short")]
        assert st["phase"] == "Completed"
        types = {cd["type"]: cd for cd in st["conditions"]}
        assert types["Running"]["status"] == "False" and "allocated on" in types["Running"]["message"]

    asyncio.run(main())


def test_deleting_a_running_groups_pods_is_a_cancellation() -> None:
    async def main() -> None:
        c, kube = make_controller()
        from test_k8s_prune import bound
        gang = [cpu_pod(f"d-{i}", "1", "d", 2) for i in range(2)]
        for p in gang:
            c.handle(("Pod", "ADDED", p))
        await settle(c)
        g = c.groups[("ns", "d")]
        for p in gang:
            c.handle(("Pod", "DELETED", bound(p, g.slots[0])))
        await settle(c)
        assert str(g.phase) == "Cancelled" and g.reason.startswith("pods deleted")
        assert kube.fluxjob_status[("ns", "d")]["phase"] == "Cancelled"

    asyncio.run(main())


# ---------------------------------------------------------------- cluster level

RUN = uuid.uuid4().hex[:6]
EXTRA = f"kwok-unsat-{RUN}"


@pytest.fixture(scope="module")
def op(k8s_cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Operator]:
    o = Operator(k8s_cluster, tmp_path_factory.mktemp("operator-unsat"))
    try:
        # the FluxJob's conditions of a Job placed at once are checked below: every group gets
        # one (--fluxjobs all; the default, waiting, gives that Job none: its pods' Events tell)
        o.start("--fluxjobs", "all")
        yield o
    finally:
        o.kill(signal.SIGTERM)
        cleanup_webhooks(k8s_cluster)
        k8s_cluster.kubectl("delete", "node", EXTRA, "--ignore-not-found", check=False)


@pytest.fixture
def ns(k8s_cluster: Any, op: Operator) -> Iterator[str]:
    with namespace(k8s_cluster) as name:
        yield name


def unsatisfiable_reason(cluster: Any, ns: str, name: str) -> str:
    wait(f"{name} unsatisfiable", lambda: phase(cluster, ns, name) == "Unsatisfiable", timeout=30)
    return str(fluxjob(cluster, ns, name)["status"]["reason"])


@pytest.mark.k8s
def test_impossible_work_behind_a_reservation_is_rejected_at_once(k8s_cluster: Any, ns: str) -> None:
    hold = pod("hold", "16", annotations={"fluxnetes.io/duration": "1h"})
    apply(k8s_cluster, ns, [hold])
    wait("hold running", lambda: phase(k8s_cluster, ns, "pod-hold") == "Running")
    apply(k8s_cluster, ns, [job("all", 4, "16")])  # the head: reserved until `hold` ends
    wait("all reserved", lambda: phase(k8s_cluster, ns, "job-all") == "Reserved")
    cpus = [int(n["status"]["allocatable"]["cpu"]) for n in k8s_cluster.kubectl_json("get", "nodes")["items"]]
    apply(k8s_cluster, ns, [pod("huge", "1000"), pod("wide", f"{max(cpus) + 4}")])
    assert unsatisfiable_reason(k8s_cluster, ns, "pod-huge") == \
        f"can never run on this cluster: needs 1000 cpu in all; the cluster has {sum(cpus)}"
    assert unsatisfiable_reason(k8s_cluster, ns, "pod-wide") == \
        f"can never run on this cluster: no node has {max(cpus) + 4} cpu; the largest has {max(cpus)}"
    assert phase(k8s_cluster, ns, "job-all") == "Reserved"


@pytest.mark.k8s
def test_a_job_too_big_for_the_nodes_starts_when_a_node_is_added(k8s_cluster: Any, ns: str) -> None:
    apply(k8s_cluster, ns, [job("five", 5, "12")])  # 60 of 64 cpu, but one pod per node
    reason = unsatisfiable_reason(k8s_cluster, ns, "job-five")
    assert "needs 5 pods of 12 cpu each; the nodes hold at most 4" in reason, reason
    k8s_cluster.kubectl("apply", "-f", "-", input=json.dumps(kwok_node(EXTRA, "16")))
    try:
        # kwok completes Job pods at once: the phase may go straight on to Completed
        wait("job-five ran", lambda: phase(k8s_cluster, ns, "job-five") == "Completed", timeout=90)
        st = fluxjob(k8s_cluster, ns, "job-five")["status"]
        assert EXTRA in st["nodes"]
        types = {c["type"] for c in st["conditions"]}
        assert {"Unsatisfiable", "Pending", "Running", "Completed"} <= types, st["conditions"]
    finally:
        k8s_cluster.kubectl("delete", "node", EXTRA, "--ignore-not-found", check=False)


@pytest.mark.k8s
def test_a_short_job_shows_running_and_deleted_pods_say_cancelled(k8s_cluster: Any, ns: str) -> None:
    apply(k8s_cluster, ns, [job("quick", 1, "1")])  # kwok completes Job pods at once
    wait("job-quick completed", lambda: phase(k8s_cluster, ns, "job-quick") == "Completed", timeout=90)
    conds = {c["type"]: c for c in fluxjob(k8s_cluster, ns, "job-quick")["status"]["conditions"]}
    assert "Running" in conds and conds["Running"]["message"].startswith("allocated on"), conds
    # a gang whose running pods are deleted was stopped, not completed
    labels = {"fluxnetes.io/group": "stopped", "fluxnetes.io/group-size": "2"}
    apply(k8s_cluster, ns, [pod(f"stopped-{i}", "1", labels=labels) for i in range(2)])
    wait("stopped running", lambda: phase(k8s_cluster, ns, "stopped") == "Running")
    k8s_cluster.kubectl("delete", "pod", "-n", ns, "stopped-0", "stopped-1")
    wait("stopped cancelled", lambda: phase(k8s_cluster, ns, "stopped") == "Cancelled")
    assert fluxjob(k8s_cluster, ns, "stopped")["status"]["reason"].startswith("pods deleted")


@pytest.mark.k8s
def test_an_extended_resource_is_matched_by_its_full_name(k8s_cluster: Any, ns: str) -> None:
    """Issue #29.1 as a user drives it: `example.com/fpga` is Unsatisfiable with the full name,
    a node offering `other.com/fpga` does not take it, one offering `example.com/fpga` does."""
    import time

    p = pod("fpga", "1")
    p["spec"]["containers"][0]["resources"]["requests"]["example.com/fpga"] = "1"
    p["spec"]["containers"][0]["resources"]["limits"] = {"example.com/fpga": "1"}
    apply(k8s_cluster, ns, [p])
    reason = unsatisfiable_reason(k8s_cluster, ns, "pod-fpga")
    assert "needs 1 example.com/fpga in all" in reason, reason
    other, mine = f"{EXTRA}-other", f"{EXTRA}-mine"
    try:
        for name, res in ((other, "other.com/fpga"), (mine, None)):
            n = kwok_node(name, "4")
            if res:
                n["status"]["allocatable"][res] = n["status"]["capacity"][res] = "2"
            k8s_cluster.kubectl("apply", "-f", "-", input=json.dumps(n))
        wait("nodes seen", lambda: all(k8s_cluster.kubectl("get", "node", n, check=False).returncode == 0
                                       for n in (other, mine)))
        time.sleep(5)  # the operator saw both nodes: the pod must still wait
        assert phase(k8s_cluster, ns, "pod-fpga") == "Unsatisfiable"
        assert not k8s_cluster.kubectl_json("get", "pod", "-n", ns, "fpga")["spec"].get("nodeName")
        patch = {"status": {"capacity": {"example.com/fpga": "2"}, "allocatable": {"example.com/fpga": "2"}}}
        k8s_cluster.kubectl("patch", "node", mine, "--subresource=status", "--type=merge", "-p", json.dumps(patch))
        wait("fpga bound on the node that has one", lambda: k8s_cluster.kubectl_json(
            "get", "pod", "-n", ns, "fpga")["spec"].get("nodeName") == mine, timeout=90)
    finally:
        for n in (other, mine):
            k8s_cluster.kubectl("delete", "node", n, "--ignore-not-found", check=False)
