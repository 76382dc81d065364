"""Unit level (no cluster): a new leader whose start saw a ReplicaSet's pods still gated, though
the old leader had placed them just before it died (a standby whose pod watch lagged behind
through API server outages when it took over), while the ReplicaSet was scaled up meanwhile
(the chaos soak's "lost Deployments": two Deployments placed in the 3 s before the leader was
killed, scaled up during outages, whose new pods were never placed: no scale group formed).

The pods' placement is seen after the start. Before the fix they stayed members of a group
that had not started; with the store, the group took the store's allocation with none of its
pods in a slot, and the added replica waited gated for good. Now the group is taken back from
its placed pods as soon as one is seen (``recovery.take_back``), and the added replica gets a
scale group of its own, in either order of the ReplicaSet's change and its new pod.
"""

from __future__ import annotations

import asyncio
import copy
from pathlib import Path
from typing import Any

import pytest

from fluxnetes.k8s import names
from fluxnetes.k8s.kube import ApiError
from fluxnetes.k8s.persistence.fluxjob import Phase
from fluxnetes.k8s.scheduling.placement import assigned_node
from test_k8s_partial_placement_unit import PatchKube, apply_patch, big, placed_by
from test_k8s_prune import pod, settle
from test_k8s_recovery_unit import controller, restart, used


def rs(replicas: int) -> dict[str, Any]:
    """ReplicaSet web, pods of 16 cpu (one a node; 4 nodes)."""
    return {"apiVersion": "apps/v1", "kind": "ReplicaSet",
            "metadata": {"name": "web", "namespace": "ns", "uid": "rs-web"},
            "spec": {"replicas": replicas,
                     "template": {"metadata": {"labels": {names.LABEL_MANAGED: "true"}},
                                  "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "16"}}}]}}}}


class ApiServer(PatchKube):
    """Refuses a placement patch for a pod placed already, as the API server does (the patch
    tests the gate is still there): only the accepted ones are in ``patches``."""

    def __init__(self, placed: set[str]) -> None:
        super().__init__()
        self.already = placed

    async def patch(self, res: Any, name: str, body: Any, namespace: str | None = None, *,
                    sub: str | None = None, **kw: Any) -> dict[str, Any]:
        if res.plural == "pods" and name in self.already:
            raise ApiError(422, {"message": "the gate is gone: test failed"}, "PATCH", f"pods/{name}")
        return await super().patch(res, name, body, namespace, sub=sub, **kw)


def web(i: int) -> dict[str, Any]:
    return big(pod(f"web-{i}", owner=rs(2)))


async def first_life(url: str | None) -> dict[str, list[dict[str, Any]]]:
    """The old leader: the ReplicaSet of 2 allocated, both pods' placements sent (and, with a
    store, its row running with the allocation); then it dies."""
    kube = PatchKube()
    c = controller(kube, url)
    c.reconciled = True
    c.handle(("ReplicaSet", "ADDED", rs(2)))
    for i in range(2):
        c.handle(("Pod", "ADDED", web(i)))
    await settle(c)
    await settle(c)
    assert c.groups[("ns", "replicaset-web")].phase == Phase.RUNNING and len(kube.patches) == 2
    if c.journal is not None:
        assert c.journal.drain()
    await c.stop()
    return dict(kube.patches)


@pytest.mark.parametrize("with_store", [True, False], ids=["store", "no-store"])
@pytest.mark.parametrize("order", ["scaled-before-start", "rs-change-first", "new-pod-first"])
def test_placement_seen_after_the_start_then_a_scale_up_is_placed(tmp_path: Path, with_store: bool, order: str) -> None:
    """``scaled-before-start``: the new leader's caches show the ReplicaSet at 3 already (its
    watch caught up before the pods'); otherwise it is scaled after the start, its change
    seen before or after its new pod. (The last two passed before the fix as well: the group,
    complete at 2 in the stale view, is matched again on the same nodes here.)"""
    scaled_at_start = order == "scaled-before-start"
    rs_first = order == "rs-change-first"

    async def main() -> None:
        url = f"sqlite:///{tmp_path / 's.db'}" if with_store else None
        patches = await first_life(url)
        gated = [web(0), web(1)]
        placed = [placed_by(p, patches[p["metadata"]["name"]]) for p in gated]
        old_nodes = sorted(str(p["spec"]["nodeName"]) for p in placed)
        kube = ApiServer({"web-0", "web-1"})
        kube.pods = gated
        # the new leader's start: its caches show the pods gated (the placements not seen yet)
        c = restart(kube, [rs(3 if scaled_at_start else 2)], [], gated, store=url)
        await settle(c)
        for p in placed:  # its pod watch catches up
            c.handle(("Pod", "MODIFIED", p))
            await settle(c)
        live: list[Any] = [("Pod", "ADDED", web(2))]
        if not scaled_at_start:
            live = [("ReplicaSet", "MODIFIED", rs(3)), *live] if rs_first else [*live, ("ReplicaSet", "MODIFIED", rs(3))]
        for ev in live:
            c.handle(ev)
            await settle(c)
        await settle(c)
        base = c.groups[("ns", "replicaset-web")]
        assert base.phase == Phase.RUNNING and base.spec.size == 2, (base.phase, base.spec.size, base.reason)
        assert sorted(base.slots) == old_nodes  # the old leader's allocation, taken back
        assert sorted(u for u in base.slot_pod if u) == ["pod-web-0", "pod-web-1"]
        assert sorted(kube.patches) == ["web-2"], sorted(kube.patches)  # only the new pod is placed
        new_node = str(assigned_node(apply_patch(web(2), kube.patches["web-2"])))
        assert new_node not in old_nodes
        scale = c.groups[("ns", "replicaset-web-scale-1")]
        assert scale.phase == Phase.RUNNING and list(scale.slot_pod) == ["pod-web-2"]
        assert used(c) == {n: 16 for n in [*old_nodes, new_node]}  # each node once
        assert c.cluster.foreign_node == {}
        await c.stop()

    asyncio.run(main())


def test_a_preempted_groups_terminating_pods_do_not_take_it_back() -> None:
    """``take_back`` is for a group this leader never started. A group it preempted is not
    running either (Preempted) while its placed pods terminate; an update of one of them
    (its deletion under way) once took the allocation back from those very pods: the victim
    ran again under a second job id beside its first (both in the matcher: its nodes counted
    twice), and the preemptor waited for nothing. (Pods of 2 cpu on nodes of 16: the matcher
    has room to record the second allocation, as it has for any group smaller than its nodes.)"""

    async def main() -> None:
        kube = PatchKube()
        c = controller(kube, None)
        c.reconciled = True
        c.handle(("ReplicaSet", "ADDED", rs(2)))
        for i in range(2):
            c.handle(("Pod", "ADDED", pod(f"web-{i}", owner=rs(2))))
        await settle(c)
        await settle(c)
        g = c.groups[("ns", "replicaset-web")]
        assert g.phase == Phase.RUNNING and len(kube.patches) == 2
        placed = [placed_by(pod(f"web-{i}", owner=rs(2)), kube.patches[f"web-{i}"]) for i in range(2)]
        for p in placed:
            c.handle(("Pod", "MODIFIED", p))
        await settle(c)
        jobid, held = g.jobid, dict(g.held)
        before = used(c)
        c.status.set_phase(g, Phase.PREEMPTED, "preempted by ns/urgent")  # (as Preemption does)
        deleting = {**placed[0], "metadata": {**placed[0]["metadata"],
                                              "deletionTimestamp": "2026-01-01T00:00:00Z"}}
        c.handle(("Pod", "MODIFIED", deleting))
        await settle(c)
        assert g.phase == Phase.PREEMPTED, (g.phase, g.reason)
        assert g.jobid == jobid and g.held == held
        assert used(c) == before  # its nodes counted once
        await c.stop()

    asyncio.run(main())


def db(replicas: int) -> dict[str, Any]:
    """ReplicaSet db, pods of 16 cpu (one a node)."""
    out = rs(replicas)
    out["metadata"] = {"name": "db", "namespace": "ns", "uid": "rs-db"}
    return out


def test_placed_pods_whose_allocation_cannot_be_taken_back_are_charged() -> None:
    """The new leader sees web's 2 placed pods after its start, web scaled to 3 meanwhile and
    the pods without an allocation note (placed by a version before the note): ``take_back``
    cannot take the allocation back (2 of 3 slots known). Those pods stayed members of a
    group that holds nothing, their nodes free in the graph: ReplicaSet db of 4 pods of 16
    cpu was placed on all 4 nodes, 2 of them full already (double booking: the kubelet
    refuses with OutOfcpu). Now they leave the group and are charged as foreign pods: db
    waits; web's group is what is missing (1 pod), placed once its new pod comes, on a free
    node; when the placed pods end, their charge goes."""

    async def main() -> None:
        patches = await first_life(None)
        gated = [web(0), web(1)]
        placed = [placed_by(p, patches[p["metadata"]["name"]]) for p in gated]
        for p in placed:
            p["metadata"]["annotations"].pop(names.ANN_ALLOCATION)
        old_nodes = sorted(str(p["spec"]["nodeName"]) for p in placed)
        kube = ApiServer({"web-0", "web-1"})
        kube.pods = gated
        c = restart(kube, [rs(3)], [], gated)
        await settle(c)
        base = c.groups[("ns", "replicaset-web")]
        assert base.phase == Phase.PROVISIONAL, (base.phase, base.reason)  # 2 of 3 pods
        for p in placed:  # its pod watch catches up: not taken back (no note, slot 2 unknown)
            c.handle(("Pod", "MODIFIED", p))
            await settle(c)
        assert base.phase != Phase.RUNNING and not base.held
        c.handle(("ReplicaSet", "ADDED", db(4)))
        for i in range(4):
            c.handle(("Pod", "ADDED", big(pod(f"db-{i}", owner=db(4)))))
        c.handle(("Pod", "ADDED", web(2)))
        await settle(c)
        await settle(c)
        on: dict[str, list[str]] = {n: [str(p["metadata"]["name"])] for n, p in zip(old_nodes, placed, strict=True)}
        for name, ops in kube.patches.items():
            on.setdefault(str(assigned_node(apply_patch(web(0), ops))), []).append(name)
        assert all(len(names_) == 1 for names_ in on.values()), on  # one pod of 16 cpu a node
        assert not any(n.startswith("db-") for n in kube.patches), sorted(kube.patches)  # 4 nodes: 2 free
        assert "web-2" in kube.patches  # the group is what is missing: placed on a free node
        charged = dict(used(c))
        assert all(charged.get(n) == 16 for n in on), (charged, on)  # every busy node charged once
        assert all(v == 16 for v in charged.values()), charged
        assert sorted(c.cluster.foreign_node.items()) == sorted(  # (charged as foreign pods)
            (str(p["metadata"]["uid"]), str(p["spec"]["nodeName"])) for p in placed)
        assert base.phase == Phase.RUNNING
        for p in placed:  # seen again once the group runs: still foreign, not members again
            # (even under the job id the group has now: the earlier leader's matcher counted
            # its job ids from 1 as this one's does)
            p = copy.deepcopy(p)
            p["metadata"]["labels"][names.LABEL_JOBID] = str(base.jobid)
            c.handle(("Pod", "MODIFIED", p))
            await settle(c)
        assert not set(base.members) & {"pod-web-0", "pod-web-1"}, sorted(base.members)
        assert used(c) == charged and len(c.cluster.foreign_node) == 2
        for p in placed:  # the placed pods end: their charge goes
            c.handle(("Pod", "DELETED", p))
            await settle(c)
        assert c.cluster.foreign_node == {}
        assert not any(n in used(c) for n in old_nodes), used(c)
        await c.stop()

    asyncio.run(main())
