"""Unit level (no cluster): ``recovery.take_back`` that cannot take a group's allocation back
(``_charge_untaken``) for groups that are not replicated workloads: the placed pods leave the
group as foreign pods, and the group shrinks to the rest (``scaling.resize``). Why the take
back fails (no usable note, slots that disagree, no room to record it) is not the subject
here: the adoption is made to fail, so the test reaches the shrink whatever the reason.

(a) a Job of 4 with 2 pods placed by the earlier leader: the other 2 are placed as one group
of 2, the Job completes, no node is held twice, no pod waits gated; (b) the same for a label
group of 4 bare pods; (c) a multi-role group (MPIJob launcher + workers): a total size alone
cannot say which roles left, so the group keeps its pod sets (see recovery._charge_untaken).
"""

from __future__ import annotations

import asyncio
from typing import Any

from fluxnetes.k8s import names
from fluxnetes.k8s.controller import Controller
from fluxnetes.k8s.objects import _gated
from fluxnetes.k8s.persistence.fluxjob import Phase
from fluxnetes.k8s.scheduling.placement import assigned_node
from test_k8s_partial_placement_unit import PatchKube, apply_patch, big, first_life, placed_by
from test_k8s_prune import bound, finished, job, pod, settle
from test_k8s_recovery_unit import complete, restart, resumed, used


def no_take_back(c: Controller) -> None:
    """The allocation of the placed pods cannot be taken back (whatever the reason)."""
    c.recovery._adoption.adopt_annotated = lambda *a, **k: False  # type: ignore[method-assign]
    c.recovery.adopt_placed = lambda *a, **k: False  # type: ignore[method-assign]


async def shrunk(owner: dict[str, Any] | None, ps: list[dict[str, Any]], key: tuple[str, str],
                 owners_now: list[dict[str, Any]]) -> tuple[Controller, PatchKube, list[dict[str, Any]]]:
    """First life places all 4 pods; pods 0 and 1 were bound, the new leader's start saw only
    pods 0..2, gated (its watch lagged), and a pod not fluxnetes' on a third node (a Job is
    queued without its pods: this keeps it from running before its placed pods are seen);
    then it sees 0 and 1 placed (take_back fails), pod 3, and the other pod going."""
    slots, patches = await first_life(PatchKube(), owner, ps, key)
    two = [placed_by(p, patches[p["metadata"]["name"]]) for p in ps[:2]]
    for p in two:
        p["metadata"]["annotations"].pop(names.ANN_ALLOCATION, None)
    other = bound(big(pod("other")), slots[2])
    del other["metadata"]["labels"][names.LABEL_MANAGED]
    kube = PatchKube()
    kube.pods = [*ps[:3], other]
    c = restart(kube, owners_now, [], kube.pods)
    no_take_back(c)
    await settle(c)
    g = c.groups[key]
    assert g.phase != Phase.RUNNING, (g.phase, g.reason)
    for p in two:
        c.handle(("Pod", "MODIFIED", p))
        await settle(c)
    assert g.phase != Phase.RUNNING and g.spec.size == 2, (g.phase, g.spec.size, g.reason)
    for o in owners_now:  # a change of the workload seen now does not undo the shrink
        c.handle((o["kind"], "MODIFIED", o))
    await settle(c)
    c.handle(("Pod", "ADDED", ps[3]))
    c.handle(("Pod", "DELETED", other))
    await settle(c)
    await settle(c)
    return c, kube, two


def check_rest_placed(c: Controller, kube: PatchKube, g: Any, ps: list[dict[str, Any]],
                      two: list[dict[str, Any]]) -> set[str]:
    assert g.phase == Phase.RUNNING and g.spec.size == 2, (g.phase, g.spec.size, g.reason)
    assert sorted(kube.patches) == sorted(p["metadata"]["name"] for p in ps[2:]), sorted(kube.patches)
    old = {str(assigned_node(p)) for p in two}
    new = {str(assigned_node(apply_patch(p, kube.patches[p["metadata"]["name"]]))) for p in ps[2:]}
    assert len(new) == 2 and not new & old, (old, new)  # nothing double-booked
    assert used(c) == {n: 16 for n in new | old}  # its 2 pods and the 2 foreign ones, each once
    assert sorted(c.cluster.foreign_node.values()) == sorted(old)  # the placed pods: foreign
    assert sorted(u for u in g.slot_pod if u) == sorted(p["metadata"]["uid"] for p in ps[2:])
    assert not [u for u, p in g.members.items() if _gated(p) and u not in g.slot_pod]  # none left gated
    return new


def test_a_job_shrinks_to_its_gated_pods_and_completes() -> None:
    async def main() -> None:
        j = big(job("g", 4))
        ps = [big(pod(f"g-{i}", owner=j)) for i in range(4)]
        c, kube, two = await shrunk(j, ps, ("ns", "job-g"), [resumed(j)])
        g = c.groups[("ns", "job-g")]
        check_rest_placed(c, kube, g, ps, two)
        c.handle(("Job", "MODIFIED", resumed(j)))  # seen again once running: no group for more pods
        await settle(c)
        assert sorted(c.groups) == [("ns", "job-g")], sorted(c.groups)
        for p in ps[2:]:  # the rest runs and ends, then the old pods, then the Job completes
            done = finished(placed_by(p, kube.patches[p["metadata"]["name"]]))
            c.handle(("Pod", "MODIFIED", done))
            await settle(c)
        for p in two:
            c.handle(("Pod", "MODIFIED", finished(p)))
            await settle(c)
        c.handle(("Job", "MODIFIED", complete(j)))
        await settle(c)
        assert g.phase == Phase.COMPLETED, (g.phase, g.reason)
        assert used(c) == {} and c.cluster.foreign_node == {}
        await c.stop()

    asyncio.run(main())


def test_a_label_group_of_bare_pods_shrinks_to_its_gated_pods() -> None:
    async def main() -> None:
        labels = {names.LABEL_GROUP: "lg", names.LABEL_GROUP_SIZE: "4"}
        ps = [big(pod(f"lg-{i}", labels=labels)) for i in range(4)]
        c, kube, two = await shrunk(None, ps, ("ns", "lg"), [])
        g = c.groups[("ns", "lg")]
        check_rest_placed(c, kube, g, ps, two)
        for p in two:  # the old pods end: their charge goes, the group keeps its own
            c.handle(("Pod", "DELETED", p))
            await settle(c)
        assert c.cluster.foreign_node == {} and len(used(c)) == 2, used(c)
        await c.stop()

    asyncio.run(main())


async def mpi_pi_behind_other() -> tuple[Controller, Any, dict[str, Any], dict[str, Any], Any]:
    """MPIJob pi (a launcher and 3 workers of 16 cpu, one a node) queued behind a pod not
    fluxnetes' on n3: the controller, its kube, the MPIJob, that pod and the group."""
    from test_k8s_multirole_unit import controller as mr_controller
    from test_k8s_multirole_unit import mpijob, tmpl

    c, kube = mr_controller()
    job = mpijob("pi", 3, worker_cpu="16")
    job["spec"]["mpiReplicaSpecs"]["Launcher"]["template"] = tmpl("16")
    other = bound(big(pod("other")), "n3")
    del other["metadata"]["labels"][names.LABEL_MANAGED]
    c.handle(("Pod", "ADDED", other))
    c.handle(("MPIJob", "ADDED", job))
    await settle(c)
    return c, kube, job, other, c.groups[("ns", "mpijob-pi")]


def test_a_multi_role_group_shrinks_role_by_role() -> None:
    """(c) MPIJob pi: a launcher and 3 workers of 16 cpu (one a node), queued here behind a
    pod not fluxnetes' on the fourth node; workers 0 and 1 are seen placed by the earlier
    leader (their FluxJob annotation names the group), the allocation not taken back. The
    group is what is missing, role by role: 1 launcher and 1 worker (was: the total cut to 2
    while its pod sets and jobspec still asked for 1 + 3, a shape never matched while the
    workers run: the launcher waited gated for good). Once the other pod goes, the launcher
    and worker 2 are placed on the 2 free nodes, each in a slot of its own role."""
    from test_k8s_multirole_unit import mpi_pod

    async def main() -> None:
        c, _, job, other, g = await mpi_pi_behind_other()
        assert g.phase == Phase.PENDING and [(s.name, s.count) for s in g.sets] == [("launcher", 1), ("worker", 3)]
        no_take_back(c)
        pods = [mpi_pod(job, "launcher", None, "16"), *(mpi_pod(job, "worker", i, "16") for i in range(3))]
        for p in pods:
            c.handle(("Pod", "ADDED", p))
        await settle(c)
        placed = []
        for p, n in ((pods[1], "n0"), (pods[2], "n1")):  # workers 0 and 1, placed by the earlier leader
            p = bound(p, n)
            p["metadata"]["annotations"] = {names.ANN_FLUXJOB: g.spec.name}
            placed.append(p)
            c.handle(("Pod", "MODIFIED", p))
            await settle(c)
        assert sorted(c.cluster.foreign_node.values()) == ["n0", "n1", "n3"]
        assert g.phase != Phase.RUNNING and g.spec.size == 2, (g.phase, g.spec.size, g.reason)
        assert [(s.name, s.count) for s in g.sets] == [("launcher", 1), ("worker", 1)]
        c.handle(("MPIJob", "MODIFIED", job))  # a change of the workload does not undo it
        await settle(c)
        assert g.spec.size == 2 and [s.count for s in g.sets] == [1, 1]
        c.handle(("Pod", "DELETED", other))
        await settle(c)
        await settle(c)
        assert g.phase == Phase.RUNNING, (g.phase, g.reason)
        assert g.slot_set == ["launcher", "worker"] and sorted(g.slots) == ["n2", "n3"]
        assert g.slot_pod == ["pod-pi-launcher", "pod-pi-worker-2"]
        assert used(c) == {"n0": 16, "n1": 16, "n2": 16, "n3": 16}  # every node once
        await c.stop()

    asyncio.run(main())


def test_a_multi_role_group_whose_left_pods_fit_no_set_keeps_its_shape() -> None:
    """Two launchers placed for a group of one (a pod re-created while the first still ran),
    seen one after the other: the first leaves, and the group is its 3 workers; the second
    fits no set the group has left, so the group keeps the shape it has and says so (a
    Warning event), rather than one cut from the wrong set; the placed pods are charged as
    foreign pods all the same."""
    from test_k8s_multirole_unit import mpi_pod

    async def main() -> None:
        c, kube, job, _, g = await mpi_pi_behind_other()
        no_take_back(c)
        launchers = [mpi_pod(job, "launcher", None, "16", uid=f"pod-launcher-{i}") for i in range(2)]
        for p in launchers:
            c.handle(("Pod", "ADDED", p))
        await settle(c)
        placed = [bound(p, n) for p, n in zip(launchers, ("n0", "n1"), strict=True)]
        for p in placed:
            p["metadata"]["annotations"] = {names.ANN_FLUXJOB: g.spec.name}
        c.handle(("Pod", "MODIFIED", placed[0]))
        await settle(c)
        assert g.spec.size == 3 and [(s.name, s.count) for s in g.sets] == [("worker", 3)]
        assert not any(r == "ShapeKept" for _, r in kube.event_reasons)
        spec, jobspec = g.spec, g.jobspec
        c.handle(("Pod", "MODIFIED", placed[1]))
        await settle(c)
        assert sorted(c.cluster.foreign_node.values()) == ["n0", "n1", "n3"]
        assert g.spec == spec and g.jobspec == jobspec and [s.count for s in g.sets] == [3]
        assert any(r == "ShapeKept" for _, r in kube.event_reasons), kube.event_reasons
        await c.stop()

    asyncio.run(main())


USER_JOBSPEC = """version: 9999
resources:
  - type: node
    count: 4
    with:
      - type: slot
        count: 1
        label: s
        with:
          - type: core
            count: 16
tasks:
  - command: [app]
    slot: s
    count: {per_slot: 1}
attributes: {system: {duration: 0}}
"""


def test_a_label_group_with_its_users_jobspec_keeps_it_and_says_so() -> None:
    """A label group of 4 whose pods carry their user's jobspec (4 nodes of 16 cores): the
    group stands for its 2 pods left, but no cut of the user's shape is sure to be theirs: it
    is kept whole, and a ShapeKept Warning event says so (it waits while the pods that left
    run on the nodes it asks for)."""

    async def main() -> None:
        labels = {names.LABEL_GROUP: "lg", names.LABEL_GROUP_SIZE: "4"}
        ps = [big(pod(f"lg-{i}", labels=labels)) for i in range(4)]
        for p in ps:
            p["metadata"]["annotations"] = {names.ANN_JOBSPEC: USER_JOBSPEC}
        c, kube, two = await shrunk(None, ps, ("ns", "lg"), [])
        g = c.groups[("ns", "lg")]
        assert g.spec.size == 2 and g.spec.jobspec == USER_JOBSPEC
        assert g.phase == Phase.PENDING and not kube.patches  # 4 nodes asked, 2 held by the pods that left
        assert any(r == "ShapeKept" for _, r in kube.event_reasons), kube.event_reasons
        assert sorted(c.cluster.foreign_node.values()) == sorted(str(assigned_node(p)) for p in two)
        await c.stop()

    asyncio.run(main())
