"""Unit level (no cluster): the scheduling cycle (k8s/scheduling/cycle.py): a group no node can hold is
Unsatisfiable with the short resource named, and is queued again (then started) once a node
that fits it is added; groups wait while the cluster is full."""

from __future__ import annotations

import asyncio

from fluxnetes.k8s.persistence.fluxjob import Phase
from test_k8s_prune import job, make_controller, node, settle


def test_unsatisfiable_until_a_big_enough_node_comes() -> None:
    async def main() -> None:
        c, _ = make_controller()
        j = job("big", 1)
        j["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "20"
        c.handle(("Job", "ADDED", j))
        await settle(c)
        g = c.groups[("ns", "job-big")]
        assert g.phase == Phase.UNSATISFIABLE and "cpu" in g.reason
        big = node("big")
        big["status"]["allocatable"]["cpu"] = big["status"]["capacity"]["cpu"] = "32"
        c.handle(("Node", "ADDED", big))
        await settle(c)
        assert g.phase == Phase.RUNNING and g.slots == ["big"]

    asyncio.run(main())


def test_a_full_cluster_keeps_the_next_group_waiting_then_starts_it() -> None:
    async def main() -> None:
        c, _ = make_controller()
        first, second = job("a", 8), job("b", 8)  # 8 pods x 2 cpu on each of 4 nodes of 16
        for j in (first, second):
            c.handle(("Job", "ADDED", j))
        await settle(c)
        a, b = c.groups[("ns", "job-a")], c.groups[("ns", "job-b")]
        assert a.phase == Phase.RUNNING
        assert b.phase == Phase.RUNNING  # 16 + 16 cores of 64: both fit
        third = job("c", 20)  # 40 cores: more than what is left (32)
        c.handle(("Job", "ADDED", third))
        await settle(c)
        g = c.groups[("ns", "job-c")]
        assert g.phase in (Phase.PENDING, Phase.RESERVED) and c.scheduling.cycles >= 2
        c.handle(("Job", "DELETED", first))
        await settle(c)
        assert g.phase == Phase.RUNNING

    asyncio.run(main())
