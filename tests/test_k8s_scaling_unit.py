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


def rs_pod(i: int | str) -> dict[str, Any]:
    p = pod(f"web-{i}", owner=rs(0))
    p["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "16"
    return p


BASE = ("ns", "replicaset-web")
SCALE1 = ("ns", "replicaset-web-scale-1")


def live_controller(kube: Any) -> Controller:
    """A running operator (n0..n3, 16 cpu) over the FluxJob-keeping fake of the recovery tests."""
    from test_k8s_recovery_unit import controller

    c = controller(kube)
    c.reconciled = True
    return c


def held_nodes(c: Controller) -> list[str]:
    """Every node share held by a running group (a node may appear once: 16 cpu pods)."""
    return sorted(n for g in c.groups.values() if str(g.phase) == "Running" for n in g.held)


def start_two(c: Controller) -> list[dict[str, Any]]:
    c.handle(("ReplicaSet", "ADDED", rs(2)))
    ps = [rs_pod(i) for i in range(2)]
    for p in ps:
        c.handle(("Pod", "ADDED", p))
    return ps


async def started_then_node_lost(c: Controller) -> tuple[Any, list[dict[str, Any]], dict[str, str]]:
    """Two replicas started and bound (one per node); the node of the first is deleted.
    Returns (the base group, the two pods, pod uid -> node)."""
    from test_k8s_prune import node

    ps = start_two(c)
    await settle(c)
    base = c.groups[BASE]
    on = {uid: base.slots[i] for i, uid in enumerate(base.slot_pod)}
    for p in ps:
        c.handle(("Pod", "MODIFIED", bound(p, on[p["metadata"]["uid"]])))
    c.handle(("Node", "DELETED", node(on[ps[0]["metadata"]["uid"]])))
    return base, ps, on


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
        assert not c.scaling.scale_groups  # the workload still wants 2: no scale group
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


def test_scale_group_keeps_its_pods_across_a_restart() -> None:
    """A restart while a scale group collects its pods (issue #11's soak): the replay lists
    pods by name, so the scale group's gated pods ("web-a", "web-b") come before the running
    pods of the base group ("web-y", "web-z") have claimed their slots again. They must end
    up in the scale group, not wait forever as strays of the base group."""
    from test_k8s_recovery_unit import Kube, placed, restart

    async def main() -> None:
        kube = Kube()
        c = live_controller(kube)
        c.handle(("ReplicaSet", "ADDED", rs(2)))
        running = [rs_pod(i) for i in ("y", "z")]
        for p in running:
            c.handle(("Pod", "ADDED", p))
        await settle(c)
        base = c.groups[BASE]
        assert str(base.phase) == "Running"
        c.handle(("ReplicaSet", "MODIFIED", rs(4)))
        await settle(c)
        assert str(c.groups[SCALE1].phase) == "Provisional"
        # the operator dies; the ReplicaSet creates its two new pods, gated
        slots = {uid: i for i, uid in enumerate(base.slot_pod)}
        pods = [rs_pod(i) for i in ("a", "b")]  # listed first: names sort before the running ones
        pods += [placed(p, base.slots[slots[p["metadata"]["uid"]]], slots[p["metadata"]["uid"]],
                        int(base.jobid or 0), base.spec.name) for p in running]
        c2 = restart(kube, [rs(4)], list(kube.fluxjobs.values()), pods)
        await settle(c2)
        g = c2.groups[SCALE1]
        assert sorted(p["metadata"]["name"] for p in g.members.values()) == ["web-a", "web-b"]
        assert str(g.phase) == "Running"
        assert sorted(held_nodes(c2)) == ["n0", "n1", "n2", "n3"]

    asyncio.run(main())


def test_a_scale_down_seen_in_the_replay_gives_back_the_slot_without_a_pod() -> None:
    """A ReplicaSet scaled down (4 -> 3, one pod deleted) while the operator was away (issue
    #11's soak). Its replayed ADDED event may come before its pods have claimed their slots
    again: the slot given back must be the one whose pod is gone, not the first slot."""
    from test_k8s_recovery_unit import Kube, placed

    async def main() -> None:
        kube = Kube()
        c = live_controller(kube)
        c.handle(("ReplicaSet", "ADDED", rs(4, cpu="8")))
        ps = [rs_pod(i) for i in range(4)]
        for p in ps:
            p["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "8"
            c.handle(("Pod", "ADDED", p))
        await settle(c)
        base = c.groups[BASE]
        assert str(base.phase) == "Running" and len(set(base.slots)) == 2  # two pods per node
        slot_of = {uid: i for i, uid in enumerate(base.slot_pod)}
        live = [placed(p, base.slots[slot_of[p["metadata"]["uid"]]], slot_of[p["metadata"]["uid"]],
                       int(base.jobid or 0), base.spec.name) for p in ps]
        gone = live.pop()  # the operator dies; the ReplicaSet goes to 3 and deletes one pod
        c2 = live_controller(kube)
        c2.reconciled = False  # a new operator: the replay comes first
        owner = rs(3, cpu="8")
        c2.book.set_owner("ReplicaSet", "ns", "web", owner)
        c2.recovery.recover(list(kube.fluxjobs.values()))
        c2.recovery.recover_from_cluster(live, list(kube.fluxjobs.values()))
        c2.handle(("ReplicaSet", "ADDED", owner))  # the owner's replay first, then its pods
        for p in live:
            c2.handle(("Pod", "ADDED", p))
        c2.reconciled = True
        c2.recovery.reconcile()
        await settle(c2)
        g = c2.groups[BASE]
        gone_slot = int(gone["metadata"]["annotations"]["fluxnetes.io/slot"])
        assert g.released == {gone_slot}
        assert sorted(u for u in g.slot_pod if u) == sorted(p["metadata"]["uid"] for p in live)
        # what the group holds is exactly what its three bound pods ask, node by node
        want: dict[str, int] = {}
        for p in live:
            want[p["spec"]["nodeName"]] = want.get(p["spec"]["nodeName"], 0) + 8
        assert {n: s.cores for n, s in g.held.items() if s.cores} == want

    asyncio.run(main())


def test_a_scale_group_placed_before_its_fluxjob_existed_is_recovered_from_its_pods() -> None:
    """The leader allocated a scale group and placed its pods, then died (an API server
    restart) before the group's FluxJob was created and before the store heard of it (issue
    #11's soak): the next leader must take the group back from its placed pods, not count
    them as foreign and wait forever for pods that will never come."""
    from test_k8s_recovery_unit import Kube, placed, restart

    async def main() -> None:
        kube = Kube()
        c = live_controller(kube)
        c.handle(("ReplicaSet", "ADDED", rs(2)))
        ps = [rs_pod(i) for i in range(4)]
        for p in ps[:2]:
            c.handle(("Pod", "ADDED", p))
        await settle(c)
        c.handle(("ReplicaSet", "MODIFIED", rs(4)))
        for p in ps[2:]:
            c.handle(("Pod", "ADDED", p))
        c.scheduling.run_cycle()  # allocated and placed; no FluxJob write, no store write got out
        base, scale = c.groups[BASE], c.groups[SCALE1]
        assert str(scale.phase) == "Running"
        pods = []
        for g in (base, scale):
            for slot, uid in enumerate(g.slot_pod):
                p = next(x for x in ps if x["metadata"]["uid"] == uid)
                pods.append(placed(p, g.slots[slot], slot, int(g.jobid or 0), g.spec.name))
        fjs = [fj for k, fj in kube.fluxjobs.items() if k[1] == BASE[1]]
        c2 = restart(kube, [rs(4)], fjs, pods)
        await settle(c2)
        g = c2.groups[SCALE1]
        assert str(g.phase) == "Running" and len(g.members) == 2
        assert not c2.cluster.foreign_node  # none of them counted as a foreign pod
        assert sorted(held_nodes(c2)) == ["n0", "n1", "n2", "n3"]
        assert SCALE1[1] + "-scale-2" not in {k[1] for k in c2.groups}  # no second scale group

    asyncio.run(main())


def test_a_group_the_store_saw_fail_is_not_matched_again_when_its_fluxjob_lags(tmp_path: Any) -> None:
    """Issue #11's soak: a Deployment's group failed by node loss; its FluxJob status still
    said Pending (every status write of the old leader was lost with an API server outage)
    while the store recorded running, then failed. The next leader must end it as the store
    says: its surviving pod counts as a foreign pod, nothing is matched again for it."""
    from fluxnetes.k8s.persistence.fluxjob import Phase
    from fluxnetes.k8s.persistence.journal import GroupRecord, Journal
    from fluxnetes.k8s.scheduling.shares import Share
    from test_k8s_recovery_unit import Kube, placed, restart

    url = f"sqlite:///{tmp_path / 'store.db'}"
    j = Journal(url)
    rec = GroupRecord(namespace="ns", name=BASE[1], uid="rs-web", kind="ReplicaSet", jobspec="", size=2,
                      duration=0, priority=0, submit=1, phase=Phase.PENDING, reason="queued")
    share = (Share("n0", 16, 0, 0), Share("n1", 16, 0, 0))
    j.record(rec, now=1)
    j.record(GroupRecord(**{**rec.__dict__, "phase": Phase.RUNNING, "reason": "allocated", "start": 2,
                            "shares": share}), now=2)
    j.record(GroupRecord(**{**rec.__dict__, "phase": Phase.FAILED, "reason": "node n1 was removed",
                            "start": 2, "shares": share}), now=3)
    j.close()
    fj = {"apiVersion": "fluxnetes.io/v1alpha1", "kind": "FluxJob",
          "metadata": {"name": BASE[1], "namespace": "ns", "uid": "fj-web",
                       "creationTimestamp": "2026-01-01T00:00:00Z"},
          "spec": {"size": 2, "duration": 0, "priority": 0, "request": {"cpu": 16000},
                   "workload": {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web", "uid": "rs-web"}},
          "status": {"phase": "Pending", "reason": "queued"}}
    survivor = placed(rs_pod(0), "n0", 0, 1, BASE[1])

    async def main() -> None:
        kube = Kube()
        c = restart(kube, [rs(2)], [fj], [survivor], store=url)
        await settle(c)
        g = c.groups[BASE]
        assert str(g.phase) == "Failed" and "store" in g.reason
        assert c.cluster.foreign_node == {survivor["metadata"]["uid"]: "n0"}
        assert not any(str(x.phase) in ("Pending", "Reserved", "Running") for x in c.groups.values())
        if c.journal is not None:
            c.journal.close()

    asyncio.run(main())


def test_a_deployment_that_lost_a_node_gets_its_replacement_pod_placed() -> None:
    """Node loss under the default `fail` policy ends the group, its survivor keeps running
    (and its share); the ReplicaSet re-creates the pod that was on the lost node. That pod
    must be placed (a group of what the workload misses), not wait forever in the failed
    group, nor in a new group of the full size waiting for pods that never come."""
    async def main() -> None:
        c, kube = make_controller()
        base, ps, on = await started_then_node_lost(c)
        lost, kept = on[ps[0]["metadata"]["uid"]], on[ps[1]["metadata"]["uid"]]
        c.handle(("Pod", "DELETED", bound(ps[0], lost)))
        await settle(c)
        assert str(base.phase) == "Failed" and list(base.held) == [kept]
        c.handle(("Pod", "ADDED", rs_pod(9)))  # the ReplicaSet's replacement
        await settle(c)
        assert kube.placed[-1] == "web-9"
        g = c.groups[SCALE1]
        assert str(g.phase) == "Running" and g.spec.size == 1
        assert g.slots[0] not in (lost, kept)  # 16-cpu pods: a node of its own
        c.handle(("ReplicaSet", "MODIFIED", rs(2)))  # a status update of the owner: nothing changes
        await settle(c)
        assert [k for k in c.groups if k[1].startswith(BASE[1])] == [BASE, SCALE1]
        c.cluster.matcher.check_invariants()

    asyncio.run(main())


def test_a_group_name_is_never_used_twice_for_one_workload() -> None:
    """Issue #11's soak: a Deployment's group failed by node loss and every pod ended; the
    ReplicaSet's new pods formed a group of the failed group's name, which the store (it knows
    a group by namespace, name and workload uid) took for the failed one after a restart and
    ended. New pods of that workload form "-scale-N" groups instead, in the same process and
    after a restart (the failed FluxJob spends the name before any pod is replayed)."""
    from test_k8s_recovery_unit import Kube, restart

    async def main() -> None:
        c, kube = make_controller()
        _, ps, on = await started_then_node_lost(c)
        for p in ps:  # the survivor ends too: the failed group has no pod left
            c.handle(("Pod", "DELETED", bound(p, on[p["metadata"]["uid"]])))
        await settle(c)
        c.prune_finished()
        assert BASE not in c.groups and "replicaset-web" in c.scaling.spent_names["rs-web"]
        for i in (7, 8):
            c.handle(("Pod", "ADDED", rs_pod(i)))
        await settle(c)
        assert BASE not in c.groups
        g = c.groups[SCALE1]
        assert str(g.phase) == "Running" and sorted(kube.placed)[-2:] == ["web-7", "web-8"]

        # after a restart: the base FluxJob says Failed, nothing runs; new pods come
        failed = {"apiVersion": "fluxnetes.io/v1alpha1", "kind": "FluxJob",
                  "metadata": {"name": BASE[1], "namespace": "ns", "uid": "fj-web"},
                  "spec": {"size": 2, "request": {"cpu": 16000},
                           "workload": {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web",
                                        "uid": "rs-web"}},
                  "status": {"phase": "Failed", "reason": "node n1 was removed"}}
        c2 = restart(Kube(), [rs(2)], [failed], [rs_pod(5), rs_pod(6)])
        await settle(c2)
        assert BASE not in c2.groups or str(c2.groups[BASE].phase) == "Failed"
        assert str(c2.groups[SCALE1].phase) == "Running" and len(c2.groups[SCALE1].members) == 2

    asyncio.run(main())


# ---------------------------------------------------------------- issue #29 item 2: an
# Unsatisfiable group follows a scale-down (as a Pending one does): judged again at its new
# size, it runs once it fits


def sts(replicas: int) -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": "StatefulSet",
            "metadata": {"name": "db", "namespace": "ns", "uid": "sts-db"},
            "spec": {"replicas": replicas, "podManagementPolicy": "Parallel",
                     "template": {"metadata": {"labels": {names.LABEL_MANAGED: "true"}},
                                  "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "16"}}}]}}}}


def sts_pod(i: int) -> dict[str, Any]:
    p = pod(f"db-{i}", owner=sts(0))
    p["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "16"
    return p


def label_pod(i: int, size: int | None) -> dict[str, Any]:
    """A ReplicaSet's pod in label group "lg" (its size from the label, or else the owner)."""
    labels = {names.LABEL_GROUP: "lg", **({names.LABEL_GROUP_SIZE: str(size)} if size else {})}
    p = pod(f"web-{i}", owner=rs(0), labels=labels)
    p["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "16"
    return p


async def unsatisfiable_then_scaled_down(c: Controller, owner: Any, make_pod: Any, key: tuple[str, str]) -> Any:
    """Five 16-cpu pods on four 16-cpu nodes: Unsatisfiable. The owner is scaled to 4 and
    its controller deletes the fifth pod. Returns the group."""
    c.handle((owner(5)["kind"], "ADDED", owner(5)))
    ps = [make_pod(i) for i in range(5)]
    for p in ps:
        c.handle(("Pod", "ADDED", p))
    await settle(c)
    g = c.groups[key]
    assert str(g.phase) == "Unsatisfiable" and g.spec.size == 5, g.reason
    c.handle((owner(4)["kind"], "MODIFIED", owner(4)))
    c.handle(("Pod", "DELETED", ps[4]))
    await settle(c)
    return c.groups[key]


def test_an_unsatisfiable_replicaset_scaled_down_runs_at_its_new_size() -> None:
    async def main() -> None:
        c, kube = make_controller()
        g = await unsatisfiable_then_scaled_down(c, rs, rs_pod, BASE)
        assert str(g.phase) == "Running" and g.spec.size == 4, g.reason
        assert sorted(kube.placed) == ["web-0", "web-1", "web-2", "web-3"]
        assert held_nodes(c) == ["n0", "n1", "n2", "n3"]
        conds = [cd["type"] for cd in kube.fluxjob_status[BASE]["conditions"]]
        assert "Unsatisfiable" in conds and "Running" in conds

    asyncio.run(main())


def test_an_unsatisfiable_statefulset_scaled_down_runs_at_its_new_size() -> None:
    async def main() -> None:
        c, kube = make_controller()
        g = await unsatisfiable_then_scaled_down(c, sts, sts_pod, ("ns", "statefulset-db"))
        assert str(g.phase) == "Running" and g.spec.size == 4, g.reason
        assert sorted(kube.placed) == ["db-0", "db-1", "db-2", "db-3"]

    asyncio.run(main())


def test_an_unsatisfiable_label_group_follows_its_owners_scale_down() -> None:
    for size in (None, 5):  # sized by the ReplicaSet, or by its size label
        async def main(size: int | None = size) -> None:
            c, kube = make_controller()
            g = await unsatisfiable_then_scaled_down(c, rs, lambda i: label_pod(i, size), ("ns", "lg"))
            assert str(g.phase) == "Running" and g.spec.size == 4, (size, g.reason)
            assert sorted(kube.placed) == ["web-0", "web-1", "web-2", "web-3"]

        asyncio.run(main())


def test_a_pending_label_group_follows_its_owners_scale_down() -> None:
    async def main() -> None:
        c, kube = make_controller()
        blocker = bound(pod("other"), "n0")
        blocker["metadata"]["labels"] = {}
        blocker["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "16"
        c.handle(("Pod", "ADDED", blocker))  # a foreign pod fills n0: 4 pods wait
        c.handle(("ReplicaSet", "ADDED", rs(4)))
        ps = [label_pod(i, 4) for i in range(4)]
        for p in ps:
            c.handle(("Pod", "ADDED", p))
        await settle(c)
        g = c.groups[("ns", "lg")]
        assert str(g.phase) in ("Pending", "Reserved")
        c.handle(("ReplicaSet", "MODIFIED", rs(3)))
        c.handle(("Pod", "DELETED", ps[3]))
        await settle(c)
        assert str(g.phase) == "Running" and g.spec.size == 3 and len(kube.placed) == 3

    asyncio.run(main())


def test_an_unsatisfiable_scale_group_scaled_down_runs_at_its_new_size() -> None:
    async def main() -> None:
        c, kube = make_controller()
        start_two(c)
        await settle(c)
        c.handle(("ReplicaSet", "MODIFIED", rs(7)))  # 5 more 16-cpu pods: 2 nodes left, 4 in all
        for i in range(2, 7):
            c.handle(("Pod", "ADDED", rs_pod(i)))
        await settle(c)
        g = c.groups[SCALE1]
        assert str(g.phase) == "Unsatisfiable" and g.spec.size == 5, g.reason
        c.handle(("ReplicaSet", "MODIFIED", rs(4)))
        for i in (4, 5, 6):
            c.handle(("Pod", "DELETED", rs_pod(i)))
        await settle(c)
        assert str(g.phase) == "Running" and g.spec.size == 2, g.reason
        assert sorted(kube.placed[2:]) == ["web-2", "web-3"] and held_nodes(c) == ["n0", "n1", "n2", "n3"]

    asyncio.run(main())


def test_an_unsatisfiable_replicaset_scaled_to_zero_is_cancelled() -> None:
    async def main() -> None:
        c, kube = make_controller()
        c.handle(("ReplicaSet", "ADDED", rs(5)))
        for i in range(5):
            c.handle(("Pod", "ADDED", rs_pod(i)))
        await settle(c)
        g = c.groups[BASE]
        assert str(g.phase) == "Unsatisfiable"
        c.handle(("ReplicaSet", "MODIFIED", rs(0)))
        await settle(c)
        assert str(g.phase) == "Cancelled" and not kube.placed
        # its pods (being deleted) wait for the ReplicaSet to want pods again: no group of 0
        assert list(c.groups) == [BASE] and len(c.book.parked) == 5
        c.handle(("ReplicaSet", "MODIFIED", rs(3)))  # it changed its mind before deleting them
        await settle(c)
        assert str(c.groups[SCALE1].phase) == "Running" and len(kube.placed) == 3

    asyncio.run(main())


def test_a_deployment_placed_before_its_fluxjob_and_scaled_up_is_recovered_exactly() -> None:
    """The default mode's window (``--fluxjobs all``): the leader placed a ReplicaSet's group
    and died before the group's FluxJob was first written (``status_interval``); the
    Deployment was then scaled up (the short chaos soak, seed 1). The next leader must take
    the group back at the size it was placed with, from its placed pods, exactly (the graph
    holds what the bound pods ask), and give the added replica a scale group of its own."""
    from test_k8s_recovery_unit import Kube, placed, restart, used

    async def main() -> None:
        kube = Kube()
        c = live_controller(kube)
        c.handle(("ReplicaSet", "ADDED", rs(2)))
        ps = [rs_pod(i) for i in range(3)]
        for p in ps[:2]:
            c.handle(("Pod", "ADDED", p))
        c.scheduling.run_cycle()  # allocated and placed; the operator dies before any write
        base = c.groups[BASE]
        assert str(base.phase) == "Running" and not kube.fluxjobs
        pods = [placed(ps[slot], base.slots[slot], slot, int(base.jobid or 0), base.spec.name)
                for slot in range(2)]
        pods.append(ps[2])  # the scale-up's pod, gated
        kube.pods = pods  # (what the accounting check lists)
        c2 = restart(kube, [rs(3)], [], pods)
        await settle(c2)
        g = c2.groups[BASE]
        assert str(g.phase) == "Running" and g.spec.size == 2 and len(g.members) == 2
        assert sorted(g.held) == sorted(base.slots)
        assert not c2.cluster.foreign_node  # its pods are the group's, not foreign
        assert sum(used(c2).values()) == 16 * 3  # the two placed pods and the scale group's one
        check = await c2.accounting.accounting_check()
        assert check is not None and check["ok"], check

    asyncio.run(main())


def test_a_deployment_placed_before_its_fluxjob_and_scaled_up_is_recovered_from_the_store(
        tmp_path: Any) -> None:
    """As above with a store that heard of the allocation (the soak's case: the group came
    back Running at the new replica count, the graph below its bound pods): the group takes
    its row over at the size it was placed with, and holds exactly what its pods ask."""
    from fluxnetes.k8s.persistence.fluxjob import Phase
    from fluxnetes.k8s.persistence.journal import GroupRecord, Journal
    from fluxnetes.k8s.scheduling.shares import Share
    from test_k8s_recovery_unit import Kube, placed, restart, used

    url = f"sqlite:///{tmp_path / 'store.db'}"
    j = Journal(url)
    rec = GroupRecord(namespace="ns", name=BASE[1], uid="rs-web", kind="ReplicaSet", jobspec="", size=2,
                      duration=0, priority=0, submit=1, phase=Phase.PENDING, reason="queued")
    j.record(rec, now=1)
    j.record(GroupRecord(**{**rec.__dict__, "phase": Phase.RUNNING, "reason": "allocated", "start": 2,
                            "shares": (Share("n1", 16, 0, 0), Share("n2", 16, 0, 0))}), now=2)
    j.close()
    ps = [rs_pod(i) for i in range(3)]
    pods = [placed(ps[0], "n1", 0, 1, BASE[1]), placed(ps[1], "n2", 1, 1, BASE[1]), ps[2]]

    async def main() -> None:
        kube = Kube()
        kube.pods = pods
        c = restart(kube, [rs(3)], [], pods, store=url)
        await settle(c)
        g = c.groups[BASE]
        assert str(g.phase) == "Running" and g.spec.size == 2 and sorted(g.held) == ["n1", "n2"]
        assert not c.cluster.foreign_node
        assert used(c).get("n1") == 16 and used(c).get("n2") == 16
        assert sum(used(c).values()) == 16 * 3  # and the scale group's pod on a third node
        check = await c.accounting.accounting_check()
        assert check is not None and check["ok"], check
        if c.journal is not None:
            c.journal.close()

    asyncio.run(main())
