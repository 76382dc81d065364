"""Unit level: a ReplicaSet scaled after its group was allocated (Controller driven with watch
events; API writes go to the recording fake of tests/test_k8s_prune.py)."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

from fluxnetes.k8s import names
from fluxnetes.k8s.controller import Controller
from test_k8s_prune import bound, make_controller, pod, settle


def rs(replicas: int, cpu: str = "16") -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": "ReplicaSet",
            "metadata": {"name": "web", "namespace": "ns", "uid": "rs-web"},
            "spec": {"replicas": replicas,
                     "template": {"metadata": {"labels": {names.LABEL_MANAGED: "true"}},
                                  "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": cpu}}}]}}}}


def rs_pod(i: int) -> dict[str, Any]:
    p = pod(f"web-{i}", owner=rs(0))
    p["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "16"
    return p


BASE = ("ns", "replicaset-web")
SCALE1 = ("ns", "replicaset-web-scale-1")


def held_nodes(c: Controller) -> list[str]:
    """Every node share held by a running group (a node may appear once: 16 cpu pods)."""
    return sorted(n for g in c.groups.values() if str(g.phase) == "Running" for n in g.held)


def start_two(c: Controller) -> list[dict[str, Any]]:
    c.handle(("ReplicaSet", "ADDED", rs(2)))
    ps = [rs_pod(i) for i in range(2)]
    for p in ps:
        c.handle(("Pod", "ADDED", p))
    return ps


def test_scale_up_forms_a_group_of_the_added_pods() -> None:
    async def main() -> None:
        c, kube = make_controller()
        start_two(c)
        await settle(c)
        assert str(c.groups[BASE].phase) == "Running" and len(kube.placed) == 2
        c.handle(("ReplicaSet", "MODIFIED", rs(4)))
        g = c.groups[SCALE1]
        assert str(g.phase) == "Provisional" and g.spec.size == 2
        c.handle(("Pod", "ADDED", rs_pod(2)))
        await settle(c)
        assert str(g.phase) == "Provisional" and len(kube.placed) == 2  # all or nothing
        c.handle(("Pod", "ADDED", rs_pod(3)))
        await settle(c)
        assert str(g.phase) == "Running" and sorted(kube.placed[2:]) == ["web-2", "web-3"]
        assert held_nodes(c) == ["n0", "n1", "n2", "n3"]  # four 16-cpu pods, four nodes, no overlap
        # scale down to 2: the controller deletes the added pods; their shares come back
        c.handle(("ReplicaSet", "MODIFIED", rs(2)))
        for i in (2, 3):
            c.handle(("Pod", "DELETED", bound(rs_pod(i), g.slots[0])))
        await settle(c)
        assert str(g.phase) == "Completed" and str(c.groups[BASE].phase) == "Running"
        assert len(held_nodes(c)) == 2

    asyncio.run(main())


def test_pods_seen_before_the_new_replica_count_join_the_scale_group() -> None:
    async def main() -> None:
        c, kube = make_controller()
        start_two(c)
        await settle(c)
        for i in (2, 3):  # the informer delivered the pods before the ReplicaSet's update
            c.handle(("Pod", "ADDED", rs_pod(i)))
        await settle(c)
        assert len(kube.placed) == 2
        c.handle(("ReplicaSet", "MODIFIED", rs(4)))
        await settle(c)
        g = c.groups[SCALE1]
        assert str(g.phase) == "Running" and sorted(kube.placed[2:]) == ["web-2", "web-3"]

    asyncio.run(main())


def test_scale_down_before_the_scale_group_started_cancels_it() -> None:
    async def main() -> None:
        c, kube = make_controller()
        start_two(c)
        await settle(c)
        c.handle(("ReplicaSet", "MODIFIED", rs(5)))  # 3 more: only 2 nodes free, it waits
        for i in (2, 3, 4):
            c.handle(("Pod", "ADDED", rs_pod(i)))
        await settle(c)
        g = c.groups[SCALE1]
        assert str(g.phase) in ("Pending", "Reserved") and len(kube.placed) == 2
        c.handle(("ReplicaSet", "MODIFIED", rs(4)))  # now 2 more: it fits
        await settle(c)
        assert g.spec.size == 2 and str(g.phase) == "Running"
        assert len(kube.placed) == 4 and len(held_nodes(c)) == 4
        leftover = [p for u, p in g.members.items() if u not in g.slot_pod]
        assert len(leftover) == 1  # the pod the ReplicaSet is about to delete waits, gated

    asyncio.run(main())


def test_replacement_pod_takes_the_kept_slot() -> None:
    async def main() -> None:
        c, kube = make_controller()
        ps = start_two(c)
        await settle(c)
        base = c.groups[BASE]
        failed = copy.deepcopy(bound(ps[0], base.slots[0]))
        failed["status"]["phase"] = "Failed"
        c.handle(("Pod", "MODIFIED", failed))
        assert not c.scale_groups  # the workload still wants 2: no scale group
        c.handle(("Pod", "ADDED", rs_pod(9)))
        await settle(c)
        assert kube.placed[-1] == "web-9" and SCALE1 not in c.groups

    asyncio.run(main())


def test_scale_down_before_the_base_group_started_resizes_it() -> None:
    """The ReplicaSet's new count is seen before the deletion of its surplus gated pod."""
    async def main() -> None:
        c, kube = make_controller()
        blocker = bound(pod("other"), "n0")
        blocker["metadata"]["labels"] = {}
        blocker["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "16"
        c.handle(("Pod", "ADDED", blocker))  # a foreign pod fills n0
        c.handle(("ReplicaSet", "ADDED", rs(4)))
        ps = [rs_pod(i) for i in range(4)]
        for p in ps:
            c.handle(("Pod", "ADDED", p))
        await settle(c)
        g = c.groups[BASE]
        assert str(g.phase) in ("Pending", "Reserved") and not kube.placed
        c.handle(("ReplicaSet", "MODIFIED", rs(3)))
        c.handle(("Pod", "DELETED", ps[3]))
        await settle(c)
        assert str(g.phase) == "Running" and g.spec.size == 3
        assert sorted(kube.placed) == ["web-0", "web-1", "web-2"] and "n0" not in g.held

    asyncio.run(main())
