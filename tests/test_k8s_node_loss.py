"""A node that runs one pod of a group is deleted: with the default ``--on-node-lost fail`` the
group fails, the lost node's share is given back, and the surviving pods keep their shares until
they end (nothing new may be placed on what they use), in both placement modes.

Unit level: the Controller driven by watch events (the recording fake of test_k8s_prune).
Cluster level: real control plane, two extra kwok nodes of 4 cpu used only by this module.
"""

from __future__ import annotations

import asyncio
import json
import signal
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from fluxnetes.k8s import names
from fluxnetes.k8s.controller import Controller
from k8s_helpers import Operator, OverbookingWatch, cleanup_webhooks, namespace
from test_k8s_operator import apply, fluxjob, phase, pods, wait
from test_k8s_prune import bound, make_controller, node, settle

# ---------------------------------------------------------------- unit level


def cpu_pod(name: str, cpu: str, group: str, size: int) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "ns", "uid": f"pod-{name}",
                         "labels": {names.LABEL_MANAGED: "true", names.LABEL_GROUP: group,
                                    names.LABEL_GROUP_SIZE: str(size)}},
            "spec": {"schedulingGates": [{"name": names.GATE}],
                     "containers": [{"name": "c", "resources": {"requests": {"cpu": cpu}}}]},
            "status": {"phase": "Pending"}}


def node_of(c: Controller, key: tuple[str, str], p: dict[str, Any]) -> str:
    g = c.groups[key]
    return g.slots[g.slot_pod.index(p["metadata"]["uid"])]


def test_node_loss_gives_back_the_lost_share_and_keeps_the_survivors() -> None:
    async def main() -> None:
        c, _kube = make_controller()  # n0..n3, 16 cpu each
        gang = [cpu_pod(f"g-{i}", "16", "g", 2) for i in range(2)]
        for p in gang:
            c.handle(("Pod", "ADDED", p))
        await settle(c)
        g = c.groups[("ns", "g")]
        assert str(g.phase) == "Running"
        on = {p["metadata"]["name"]: node_of(c, g.key, p) for p in gang}
        for p in gang:
            c.handle(("Pod", "MODIFIED", bound(p, on[p["metadata"]["name"]])))
        lost, kept = on["g-0"], on["g-1"]
        c.handle(("Node", "DELETED", node(lost)))
        await settle(c)
        assert str(g.phase) == "Failed" and lost in g.reason
        assert list(g.held) == [kept]  # the survivor's share is still held
        c.cluster.matcher.check_invariants()
        # three nodes are left, one of them still used by g-1: a gang of 3 waits
        wide = [cpu_pod(f"w-{i}", "16", "w", 3) for i in range(3)]
        for p in wide:
            c.handle(("Pod", "ADDED", p))
        await settle(c)
        w = c.groups[("ns", "w")]
        assert str(w.phase) in ("Pending", "Reserved")
        # the surviving pod ends: its share comes back, and the gang runs, on its node too
        c.handle(("Pod", "DELETED", bound(gang[1], kept)))
        await settle(c)
        assert not g.held and str(g.phase) == "Failed"
        assert str(w.phase) == "Running" and kept in w.slots
        # the lost node's pod is deleted later (pod GC): nothing changes
        c.handle(("Pod", "DELETED", bound(gang[0], lost)))
        await settle(c)
        assert str(w.phase) == "Running" and len(set(w.slots)) == 3
        c.cluster.matcher.check_invariants()

    asyncio.run(main())


def test_a_second_lost_node_of_a_failed_group_gives_its_share_back() -> None:
    async def main() -> None:
        c, _kube = make_controller()
        gang = [cpu_pod(f"g-{i}", "16", "g", 3) for i in range(3)]
        for p in gang:
            c.handle(("Pod", "ADDED", p))
        await settle(c)
        g = c.groups[("ns", "g")]
        on = [node_of(c, g.key, p) for p in gang]
        for p, n in zip(gang, on, strict=True):
            c.handle(("Pod", "MODIFIED", bound(p, n)))
        c.handle(("Node", "DELETED", node(on[0])))
        c.handle(("Node", "DELETED", node(on[1])))
        await settle(c)
        assert str(g.phase) == "Failed" and list(g.held) == [on[2]]
        c.handle(("Pod", "MODIFIED", {**bound(gang[2], on[2]), "status": {"phase": "Succeeded"}}))
        await settle(c)
        assert not g.held and g.jobid not in c.cluster.matcher.jobs
        c.cluster.matcher.check_invariants()

    asyncio.run(main())


def test_requeue_keeps_the_survivors_nodes_until_their_pods_are_gone() -> None:
    """``--on-node-lost requeue``: the gang is matched again at once, but not onto the node
    its surviving pod still runs on (that pod is followed as a foreign pod until it goes)."""
    from test_k8s_scaling_unit import rs, rs_pod

    async def main() -> None:
        c, kube = make_controller()
        c.config.on_node_lost = "requeue"
        deleted: list[str] = []

        async def delete(res: Any, name: str, namespace: str | None = None, **_: Any) -> dict[str, Any]:
            deleted.append(name)
            return {}

        kube.delete = delete  # type: ignore[attr-defined]
        c.handle(("ReplicaSet", "ADDED", rs(2)))
        web = [rs_pod(i) for i in range(2)]
        for p in web:
            c.handle(("Pod", "ADDED", p))
        await settle(c)
        key = ("ns", "replicaset-web")
        on = [node_of(c, key, p) for p in web]
        for p, n in zip(web, on, strict=True):
            c.handle(("Pod", "MODIFIED", bound(p, n)))
        c.handle(("Node", "DELETED", node(on[0])))
        await settle(c)
        assert sorted(deleted) == ["web-0", "web-1"]
        g = c.groups[key]
        # matched again on the two nodes nobody uses: not on web-1's, which still runs there
        assert str(g.phase) == "Running" and on[1] not in g.slots and on[0] not in g.slots
        assert c.cluster.foreign_node.get("pod-web-1") == on[1]
        c.handle(("Pod", "DELETED", bound(web[1], on[1])))
        await settle(c)
        assert "pod-web-1" not in c.cluster.foreign_node
        c.cluster.matcher.check_invariants()

    asyncio.run(main())


def test_a_node_gone_during_a_restart_keeps_the_survivors_shares() -> None:
    """After a restart a Running FluxJob names a node that is gone: the group fails, and
    what its placed pod holds on the node that is left is recorded again (not given away)."""
    async def main() -> None:
        c, _kube = make_controller()
        fj = {"apiVersion": "fluxnetes.io/v1alpha1", "kind": "FluxJob",
              "metadata": {"name": "g", "namespace": "ns", "uid": "fj-g"},
              "spec": {"size": 2, "request": {"cpu": 16000}, "duration": 0, "priority": 0},
              "status": {"phase": "Running", "jobid": 7, "nodes": ["gone", "n0"], "released": [],
                         "shares": [{"node": "gone", "cores": 16}, {"node": "n0", "cores": 16}]}}
        c.recovery.recover([fj])
        for i, n in enumerate(["gone", "n0"]):
            p = cpu_pod(f"g-{i}", "16", "g", 2)
            p["metadata"]["annotations"] = {names.ANN_FLUXJOB: "g", "fluxnetes.io/slot": str(i)}
            p["metadata"]["labels"][names.LABEL_JOBID] = "7"
            c.handle(("Pod", "ADDED", bound(p, n)))
        c.recovery.reconcile()
        g = c.groups[("ns", "g")]
        assert str(g.phase) == "Failed" and list(g.held) == ["n0"]
        wide = [cpu_pod(f"w-{i}", "16", "w", 4) for i in range(4)]
        for p in wide:
            c.handle(("Pod", "ADDED", p))
        await settle(c)
        assert str(c.groups[("ns", "w")].phase) in ("Pending", "Reserved")  # n0 is still used
        c.handle(("Pod", "DELETED", bound(cpu_pod("g-1", "16", "g", 2), "n0")))
        await settle(c)
        assert str(c.groups[("ns", "w")].phase) == "Running"
        c.cluster.matcher.check_invariants()

    asyncio.run(main())


# ---------------------------------------------------------------- cluster level

RUN = "r" + uuid.uuid4().hex[:6]  # a letter first: bare hex like "123e45" is a number in YAML
LABEL = "fluxnetes.io/test-node-loss"
NODES = [f"kwok-loss-{RUN}-{i}" for i in range(2)]


def kwok_node(name: str, cpu: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name,
                         "annotations": {"node.alpha.kubernetes.io/ttl": "0", "kwok.x-k8s.io/node": "fake"},
                         "labels": {"kubernetes.io/hostname": name, "type": "kwok", LABEL: RUN}},
            "status": {"allocatable": {"cpu": cpu, "memory": "16Gi", "pods": "110"},
                       "capacity": {"cpu": cpu, "memory": "16Gi", "pods": "110"}}}


def add_nodes(cluster: Any, names_: list[str], cpu: str = "4") -> None:
    for n in names_:
        cluster.kubectl("apply", "-f", "-", input=json.dumps(kwok_node(n, cpu)))
    for n in names_:
        wait(f"node {n} ready", lambda n=n: any(
            c["type"] == "Ready" and c["status"] == "True"
            for c in cluster.kubectl_json("get", "node", n)["status"].get("conditions", []))
            and not cluster.kubectl_json("get", "node", n)["spec"].get("taints"))


def here(name: str, group: str, size: int) -> dict[str, Any]:
    """A pod of 4 cpu that may run only on this module's nodes (a whole one of them)."""
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": {"fluxnetes.io/group": group,
                                                  "fluxnetes.io/group-size": str(size), "app": group}},
            "spec": {"nodeSelector": {LABEL: RUN},
                     "containers": [{"name": "c", "image": "busybox", "resources": {"requests": {"cpu": "4"}}}]}}


@pytest.fixture(params=["affinity", "bind"])
def op(request: pytest.FixtureRequest, k8s_cluster: Any,
       tmp_path_factory: pytest.TempPathFactory) -> Iterator[Operator]:
    o = Operator(k8s_cluster, tmp_path_factory.mktemp(f"operator-loss-{request.param}"))
    try:
        o.start("--placement", request.param)
        o.placement = request.param  # type: ignore[attr-defined]
        yield o
    finally:
        o.kill(signal.SIGTERM)
        cleanup_webhooks(k8s_cluster)


@pytest.mark.k8s
def test_node_loss_releases_exactly_the_pods_that_ended(k8s_cluster: Any, op: Operator) -> None:
    nodes = [f"{n}-{op.placement}" for n in NODES]  # type: ignore[attr-defined]
    add_nodes(k8s_cluster, nodes)
    try:
        with namespace(k8s_cluster) as ns, OverbookingWatch(k8s_cluster) as watch:
            apply(k8s_cluster, ns, [here(f"gang-{i}", "gang", 2) for i in range(2)])
            wait("gang running", lambda: phase(k8s_cluster, ns, "gang") == "Running")
            wait("both bound", lambda: len([p for p in pods(k8s_cluster, ns, "app=gang")
                                            if p["spec"].get("nodeName")]) == 2, timeout=90)
            placed = {p["metadata"]["name"]: p["spec"]["nodeName"] for p in pods(k8s_cluster, ns, "app=gang")}
            lost, kept = placed["gang-0"], placed["gang-1"]
            assert lost != kept
            k8s_cluster.kubectl("delete", "node", lost)
            wait("gang failed", lambda: phase(k8s_cluster, ns, "gang") == "Failed")
            assert lost in fluxjob(k8s_cluster, ns, "gang")["status"]["reason"]
            # gang-1 still runs on `kept`: a new pod for these nodes must wait
            apply(k8s_cluster, ns, [here("next", "next", 1)])
            wait("next queued", lambda: phase(k8s_cluster, ns, "next") in ("Pending", "Reserved"))
            time.sleep(3)
            assert phase(k8s_cluster, ns, "next") in ("Pending", "Reserved")
            assert not pods(k8s_cluster, ns, "app=next")[0]["spec"].get("nodeName")
            # gang-1 ends: its share comes back and `next` runs there
            k8s_cluster.kubectl("delete", "pod", "-n", ns, "gang-1", "--wait=false")
            wait("next running", lambda: phase(k8s_cluster, ns, "next") == "Running")
            wait("next bound on the freed node", lambda: pods(k8s_cluster, ns, "app=next")[0]["spec"].get(
                "nodeName") == kept, timeout=90)
        assert watch.violations == []
    finally:
        for n in nodes:
            k8s_cluster.kubectl("delete", "node", n, "--ignore-not-found", check=False)



def small_node(name: str) -> dict[str, Any]:
    n = node(name)
    n["metadata"]["labels"]["shape"] = "small"
    for k in ("allocatable", "capacity"):
        n["status"][k].update({"cpu": "4", "memory": "16Gi"})
    return n


def on_small(p: dict[str, Any], hostname: str | None = None) -> dict[str, Any]:
    p["spec"]["nodeSelector"] = {"shape": "small", **({"kubernetes.io/hostname": hostname} if hostname else {})}
    return p


async def small_gang(size: int) -> tuple[Controller, list[dict[str, Any]], list[str]]:
    """``size`` nodes of 4 cpu labelled shape=small, and a running gang ``g`` of ``size`` pods
    of 3 cpu bound on them: (the controller, its pods, the node of each)."""
    c, _kube = make_controller()
    for i in range(size):
        c.handle(("Node", "ADDED", small_node(f"s{i}")))
    await settle(c)
    gang = [on_small(cpu_pod(f"g-{i}", "3", "g", size)) for i in range(size)]
    for p in gang:
        c.handle(("Pod", "ADDED", p))
    await settle(c)
    g = c.groups[("ns", "g")]
    on = [node_of(c, g.key, p) for p in gang]
    for p, n in zip(gang, on, strict=True):
        c.handle(("Pod", "MODIFIED", bound(p, n)))
    return c, gang, on


def test_each_survivor_gives_its_node_back_when_it_ends() -> None:
    """Issue #29.3: a gang of 3 (3 of 4 cpu each) loses a node; each surviving pod's share
    goes back the moment that pod ends, not when the last survivor does: a pod waiting for
    that whole node runs at once, ahead of a later small one."""
    async def main() -> None:
        c, gang, on = await small_gang(3)
        g = c.groups[("ns", "g")]
        c.handle(("Node", "DELETED", small_node(on[2])))
        await settle(c)
        assert str(g.phase) == "Failed" and sorted(g.held) == sorted(on[:2])
        c.handle(("Pod", "ADDED", on_small(cpu_pod("big", "4", "big", 1), on[0])))
        await settle(c)
        b = c.groups[("ns", "big")]
        assert str(b.phase) in ("Pending", "Reserved")  # g-0 still runs there
        c.handle(("Pod", "DELETED", bound(gang[0], on[0])))
        await settle(c)
        assert list(g.held) == [on[1]]  # only g-1 still holds
        assert str(b.phase) == "Running" and b.slots == [on[0]], (b.phase, b.reason)
        c.handle(("Pod", "ADDED", on_small(cpu_pod("small", "1", "small", 1), on[0])))
        await settle(c)
        assert str(c.groups[("ns", "small")].phase) != "Running"  # big has the whole node
        c.cluster.matcher.check_invariants()

    asyncio.run(main())


def test_a_gang_pod_that_ends_wakes_work_waiting_for_its_whole_node() -> None:
    """The same without a lost node: one pod of a running gang ends, and a pod waiting for
    that whole node (parked as unable to start) is woken and runs."""
    async def main() -> None:
        c, gang, on = await small_gang(2)
        g = c.groups[("ns", "g")]
        c.handle(("Pod", "ADDED", on_small(cpu_pod("big", "4", "big", 1), on[0])))
        await settle(c)
        b = c.groups[("ns", "big")]
        assert str(b.phase) in ("Pending", "Reserved")
        c.handle(("Pod", "MODIFIED", {**bound(gang[0], on[0]), "status": {"phase": "Succeeded"}}))
        await settle(c)
        assert str(g.phase) == "Running" and list(g.held) == [on[1]]
        assert str(b.phase) == "Running" and b.slots == [on[0]], (b.phase, b.reason)

    asyncio.run(main())


@pytest.mark.k8s
def test_each_survivor_frees_its_node_when_it_ends_and_views_charge_it(k8s_cluster: Any, op: Operator) -> None:
    """Issue #29.3, as a user drives it: a gang of 3 (3 of 4 cpu each) loses a node; a pod
    pinned to a survivor's node waits; that survivor ends and the pinned pod runs there at once,
    while the other survivor still runs. Meanwhile the plugin charges the survivors' nodes."""
    from fluxnetes.cli.ctl.nodes import node_rows

    nodes = [f"kwok-surv-{RUN}-{i}-{op.placement}" for i in range(3)]  # type: ignore[attr-defined]
    add_nodes(k8s_cluster, nodes)

    def three(name: str, cpu: str, group: str, size: int, on: str | None = None) -> dict[str, Any]:
        p = here(name, group, size)
        p["spec"]["containers"][0]["resources"]["requests"]["cpu"] = cpu
        if on is not None:
            p["spec"]["nodeSelector"]["kubernetes.io/hostname"] = on
        return p

    try:
        with namespace(k8s_cluster) as ns, OverbookingWatch(k8s_cluster) as watch:
            apply(k8s_cluster, ns, [three(f"gang-{i}", "3", "gang", 3) for i in range(3)])
            wait("gang running", lambda: phase(k8s_cluster, ns, "gang") == "Running")
            wait("all bound", lambda: len([p for p in pods(k8s_cluster, ns, "app=gang")
                                           if p["spec"].get("nodeName")]) == 3, timeout=90)
            placed = {p["metadata"]["name"]: p["spec"]["nodeName"] for p in pods(k8s_cluster, ns, "app=gang")}
            lost, first, second = placed["gang-2"], placed["gang-0"], placed["gang-1"]
            k8s_cluster.kubectl("delete", "node", lost)
            wait("gang failed", lambda: phase(k8s_cluster, ns, "gang") == "Failed")
            apply(k8s_cluster, ns, [three("big", "4", "big", 1, on=first)])
            wait("big queued", lambda: phase(k8s_cluster, ns, "big") in ("Pending", "Reserved"))

            def charged() -> dict[str, int]:
                rows = node_rows(k8s_cluster.kubectl_json("get", "nodes")["items"],
                                 k8s_cluster.kubectl_json("get", "pods", "-A")["items"],
                                 k8s_cluster.kubectl_json("get", "fluxjobs", "-A")["items"])
                return {r["node"]: r["coresUsed"] for r in rows if r["node"] in (first, second)}

            wait("the survivors' cores shown as used", lambda: charged() == {first: 3, second: 3})
            k8s_cluster.kubectl("delete", "pod", "-n", ns, "gang-0", "--wait=false")
            wait("big running while gang-1 still runs", lambda: phase(k8s_cluster, ns, "big") == "Running")
            assert any(p["metadata"]["name"] == "gang-1" and p["status"].get("phase") == "Running"
                       for p in pods(k8s_cluster, ns, "app=gang"))
            wait("big bound on the freed node", lambda: pods(k8s_cluster, ns, "app=big")[0]["spec"].get(
                "nodeName") == first, timeout=90)
            wait("gang-1's node still charged", lambda: charged().get(second) == 3)
        assert watch.violations == []
    finally:
        for n in nodes:
            k8s_cluster.kubectl("delete", "node", n, "--ignore-not-found", check=False)
