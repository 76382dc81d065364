"""Unit level (no cluster): a multi-pod group placed in part when the leader died, before any
record of its allocation (no FluxJob status, no store). The first life is played for real (the
group allocated, its pods' placement patches recorded), then only some of the patches are
applied to the pods and a new operator starts over them (test_k8s_recovery_unit's
``restart``). The whole allocation comes back from the note the placed pods carry
(k8s/scheduling/allocation_note.py); the other pods are placed on the slots left for them.
The real control plane version: tests/test_k8s_partial_placement.py.
"""

from __future__ import annotations

import asyncio
import copy
import json
from typing import Any

from fluxnetes.k8s import names
from fluxnetes.k8s.controller import Controller
from fluxnetes.k8s.persistence.fluxjob import Phase
from fluxnetes.k8s.scheduling import allocation_note
from fluxnetes.k8s.scheduling.placement import ANN_SLOT, assigned_node, place_patch
from fluxnetes.k8s.scheduling.shares import Share
from test_k8s_prune import bound, finished, job, pod, settle
from test_k8s_recovery_unit import Kube, controller, restart, resumed, used


class PatchKube(Kube):
    """Kube that keeps each pod's placement patch."""

    def __init__(self) -> None:
        super().__init__()
        self.patches: dict[str, list[dict[str, Any]]] = {}

    async def patch(self, res: Any, name: str, body: Any, namespace: str | None = None, *,
                    sub: str | None = None, **kw: Any) -> dict[str, Any]:
        if res.plural == "pods":
            self.patches[name] = body
        return await super().patch(res, name, body, namespace, sub=sub, **kw)


def apply_patch(obj: dict[str, Any], ops: list[dict[str, Any]]) -> dict[str, Any]:
    """The JSON patch ops the placement sends (test, add, remove) applied to a copy of ``obj``."""
    out = copy.deepcopy(obj)
    for op in ops:
        parts = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
        parent: Any = out
        for p in parts[:-1]:
            parent = parent[int(p)] if isinstance(parent, list) else parent[p]
        last = parts[-1]
        if op["op"] == "test":
            assert (parent[int(last)] if isinstance(parent, list) else parent[last]) == op["value"]
        elif op["op"] == "remove":
            del parent[int(last) if isinstance(parent, list) else last]
        elif isinstance(parent, list):
            parent.append(op["value"]) if last == "-" else parent.insert(int(last), op["value"])
        else:
            parent[last] = op["value"]
    return out


def big(obj: dict[str, Any]) -> dict[str, Any]:
    """The pod (or a Job's template) asking for 16 cpu: one pod a node."""
    out = copy.deepcopy(obj)
    spec = out["spec"]["template"]["spec"] if out["kind"] == "Job" else out["spec"]
    spec["containers"][0]["resources"]["requests"]["cpu"] = "16"
    return out


async def first_life(kube: PatchKube, owner: dict[str, Any] | None, ps: list[dict[str, Any]],
                     key: tuple[str, str]) -> tuple[list[str], dict[str, list[dict[str, Any]]]]:
    """The group allocated and every pod's placement sent: (its slots' nodes, the patches)."""
    c = controller(kube)
    c.reconciled = True
    if owner is not None:
        c.handle((owner["kind"], "ADDED", owner))
    for p in ps:
        c.handle(("Pod", "ADDED", p))
    await settle(c)
    await settle(c)
    g = c.groups[key]
    assert g.phase == Phase.RUNNING and len(kube.patches) == len(ps)
    return list(g.slots), dict(kube.patches)


def placed_by(p: dict[str, Any], patch: list[dict[str, Any]], ended: bool = False) -> dict[str, Any]:
    """``p`` once its placement patch was applied and kube-scheduler bound it."""
    out = apply_patch(p, patch)
    out = bound(out | {"spec": {**out["spec"], "schedulingGates": []}}, str(assigned_node(out)))
    return finished(out) if ended else out


async def job_of_four_two_placed(name: str, note: bool = True) -> tuple[dict[str, Any], list[dict[str, Any]],
                                                                      list[dict[str, Any]]]:
    """A Job of 4 big pods after its first life, pods 0 and 1 placed and bound, 2 and 3 still
    gated: (the Job, its 4 pods as first made, the 2 placed); ``note=False`` takes the
    allocation note off the placed pods (placed by a version before the note)."""
    j = big(job(name, 4))
    ps = [big(pod(f"{name}-{i}", owner=j)) for i in range(4)]
    _, patches = await first_life(PatchKube(), j, ps, ("ns", f"job-{name}"))
    two = [placed_by(p, patches[p["metadata"]["name"]]) for p in ps[:2]]
    if not note:
        for p in two:
            p["metadata"]["annotations"].pop(names.ANN_ALLOCATION)
    return j, ps, two


def test_job_placed_in_part_comes_back_whole() -> None:
    """A Job of 4 pods of 16 cpu (the whole cluster): 2 placed (running, or ended as kwok
    makes them), the leader dies. The next one knows all 4 slots: the 2 gated pods are placed
    on the nodes their slots name, the graph holds what the live pods and the waiting slots
    hold, once, the group is never matched again. (Was: the group at size 2, its other
    pods waiting for a group that never formed.)"""
    async def main() -> None:
        for ended in (False, True):
            kube = PatchKube()
            j = big(job("g", 4))
            ps = [big(pod(f"g-{i}", owner=j)) for i in range(4)]
            slots, patches = await first_life(kube, j, ps, ("ns", "job-g"))
            assert len(set(slots)) == 4
            two = [placed_by(p, patches[p["metadata"]["name"]], ended) for p in ps[:2]]
            for p in two:  # the whole allocation on each placed pod, in its one patch
                note = allocation_note.of_pod(p)
                assert note is not None and list(note.slots) == slots
            pods_now = two + ps[2:]
            kube2 = PatchKube()
            kube2.pods = pods_now
            c = restart(kube2, [resumed(j)], [], pods_now)
            g = c.groups[("ns", "job-g")]
            assert g.phase == Phase.RUNNING and g.spec.size == 4, (ended, g.phase, g.spec.size)
            assert g.slots == slots
            await settle(c)
            assert sorted(kube2.patches) == ["g-2", "g-3"], (ended, sorted(kube2.patches))
            for p in ps[2:]:
                again = apply_patch(p, kube2.patches[p["metadata"]["name"]])
                slot = int(again["metadata"]["annotations"][ANN_SLOT])
                assert assigned_node(again) == slots[slot] and slot in (2, 3)
            held = {n: 16 for n in slots} if not ended else {n: 16 for n in slots[2:]}
            assert used(c) == held and c.cluster.foreign_node == {}
            assert len(c.cluster.matcher.jobs) == 1  # never matched a second time
            await settle(c)
            assert len(c.cluster.matcher.jobs) == 1

    asyncio.run(main())


def label_group(n: int) -> list[dict[str, Any]]:
    labels = {names.LABEL_GROUP: "lg", names.LABEL_GROUP_SIZE: str(n)}
    return [big(pod(f"lg-{i}", labels=labels)) for i in range(n)]


def test_label_group_placed_in_part_its_last_pod_placed_or_its_slot_given_back() -> None:
    """A label group of 3: 2 placed, the leader dies. The third pod gets the third slot's
    node; if it was deleted meanwhile, that slot is given back (nothing held for it)."""
    async def main() -> None:
        for deleted in (False, True):
            kube = PatchKube()
            ps = label_group(3)
            slots, patches = await first_life(kube, None, ps, ("ns", "lg"))
            two = [placed_by(p, patches[p["metadata"]["name"]]) for p in ps[:2]]
            pods_now = two if deleted else two + ps[2:]
            kube2 = PatchKube()
            kube2.pods = pods_now
            c = restart(kube2, [], [], pods_now)
            g = c.groups[("ns", "lg")]
            await settle(c)
            assert g.phase == Phase.RUNNING and g.slots == slots
            if deleted:
                assert kube2.patches == {} and used(c) == {slots[0]: 16, slots[1]: 16}
            else:
                last = apply_patch(ps[2], kube2.patches["lg-2"])
                assert assigned_node(last) == slots[2] and used(c) == {n: 16 for n in slots}
            check = await c.accounting.accounting_check()
            assert check is not None and check["ok"], check

    asyncio.run(main())


def test_job_deleted_after_a_partial_placement_gives_everything_back() -> None:
    """The Job of a group placed in part is deleted after the restart: the slots waiting for
    pods are given back at once, the placed pods' as they go; nothing held at the end."""
    async def main() -> None:
        j, ps, two = await job_of_four_two_placed("d")
        kube2 = PatchKube()
        kube2.pods = two + ps[2:]
        c = restart(kube2, [resumed(j)], [], two + ps[2:])
        g = c.groups[("ns", "job-d")]
        assert g.phase == Phase.RUNNING and len(g.slots) == 4
        c.handle(("Job", "DELETED", resumed(j)))
        await settle(c)
        for p in two + ps[2:]:
            c.handle(("Pod", "DELETED", p))
        await settle(c)
        assert used(c) == {} and g.phase.final

    asyncio.run(main())


def test_a_pod_that_disagrees_with_the_note_is_not_trusted() -> None:
    """A placed pod on another node than its slot's in the note (or two notes of one
    allocation that differ): the note is not used (the rules from before apply)."""
    async def main() -> None:
        kube = PatchKube()
        ps = label_group(3)
        slots, patches = await first_life(kube, None, ps, ("ns", "lg"))
        two = [placed_by(p, patches[p["metadata"]["name"]]) for p in ps[:2]]
        other = next(n for n in ("n0", "n1", "n2", "n3") if n not in slots)
        two[1]["spec"]["nodeName"] = other
        kube2 = PatchKube()
        kube2.pods = two + ps[2:]
        c = restart(kube2, [], [], two + ps[2:])
        g = c.groups[("ns", "lg")]
        assert g.phase != Phase.RUNNING or g.reason != ("allocated before the restart "
                                                        "(recovered from its placed pods' allocation note)")

    asyncio.run(main())


# ---------------------------------------------------------------- the note itself


def test_note_round_trip_and_its_bounds() -> None:
    held = [Share("n1", 8, 0, 1024), Share("n0", 16, 2, 2048, {"example.com/fpga": 1})]
    text = allocation_note.encode(7, ["n0", "n0", "n1"], held)
    assert text is not None
    note = allocation_note.decode(text)
    assert note == allocation_note.PlacedAllocation("7", ("n0", "n0", "n1"), (held[1], held[0]))
    assert allocation_note.encode(7, ["n0"], held[1:]) is None  # one pod: its own slot says it
    assert allocation_note.encode(7, ["n1", "n0"], held) is None  # not an allocation's layout
    assert allocation_note.encode(7, ["n0", "n9"], held) is None  # a slot on a node not held
    many = [Share(f"node-with-a-long-name-{i:04d}", 1) for i in range(200)]
    assert allocation_note.encode(1, sorted(s.node for s in many), many) is None  # over MAX_CHARS
    for bad in ("", "{", "[]", '{"j": 1}', '{"j": 1, "n": [["a", 1, 0, 0, "x"]]}',
                '{"j": 1, "n": [["a", 1, 0, 0, 1], ["a", 1, 0, 0, 1]]}', '{"j": 1, "n": [["a", 1, 0, 0, 1]]}'):
        assert allocation_note.decode(bad) is None, bad


def test_held_after_gives_back_as_release_slot_does() -> None:
    note = allocation_note.PlacedAllocation("1", ("n0", "n0", "n0", "n1"), (Share("n0", 12), Share("n1", 4)))
    assert allocation_note.held_after(note, set()) == [Share("n0", 12), Share("n1", 4)]
    assert allocation_note.held_after(note, {0}) == [Share("n0", 8), Share("n1", 4)]
    assert allocation_note.held_after(note, {0, 3}) == [Share("n0", 8)]
    assert allocation_note.held_after(note, {0, 1, 2}) == [Share("n1", 4)]


def test_single_pod_groups_carry_no_note() -> None:
    """Issue 31's rate: a group of one pod gets nothing more in its one placement write."""
    async def main() -> None:
        kube = PatchKube()
        j = job("one", 1)
        p = pod("one-0", owner=j)
        c: Controller = controller(kube)
        c.reconciled = True
        c.handle(("Job", "ADDED", j))
        c.handle(("Pod", "ADDED", p))
        await settle(c)
        await settle(c)
        ops = kube.patches["one-0"]
        assert not any(names.ANN_ALLOCATION in json.dumps(op) for op in ops)
        assert ops == place_patch(p, str(assigned_node(apply_patch(p, ops))), jobid=c.groups[("ns", "job-one")].jobid,
                                  fluxjob="job-one", slot=0)

    asyncio.run(main())


def test_two_leaders_in_a_row_place_parts_of_one_allocation() -> None:
    """The operator bench (1,000 nodes, gangs of 10 pods, the lease lost several times in a
    row): a leader places part of a Job and dies; the next adopts the allocation from the note
    (under its own matcher's job id), places one more pod and dies too. The third sees live
    pods whose notes name two job ids for the one allocation. It must still adopt it (same
    slots, same shares: one allocation, renumbered): the gated pods placed on their slots, the
    graph holding the allocation once. (Was: two job ids, so the note was not trusted, the
    placed pods counted as foreign, the group matched a second time for all its size while
    its last pods waited for slots no pod of it would fill; the bench saw 298 of 300 pods
    bound, the group Completed.)"""
    async def main() -> None:
        for ended in (False, True):
            kube = PatchKube()
            j = big(job("g", 4))
            ps = [big(pod(f"g-{i}", owner=j)) for i in range(4)]
            c1 = controller(kube)
            c1.cluster.matcher.reserve_jobid(40)  # a leader that ran a while: its ids are not the next one's
            c1.reconciled = True
            c1.handle(("Job", "ADDED", j))
            for p in ps:
                c1.handle(("Pod", "ADDED", p))
            await settle(c1)
            await settle(c1)
            slots = list(c1.groups[("ns", "job-g")].slots)
            first = placed_by(ps[0], kube.patches["g-0"], ended)  # only pod 0's placement landed
            # the second leader: adopts from pod 0's note, places the others; only pod 1's lands
            kube2 = PatchKube()
            kube2.pods = [first, *ps[1:]]
            c2 = restart(kube2, [resumed(j)], [], kube2.pods)
            g2 = c2.groups[("ns", "job-g")]
            assert g2.phase == Phase.RUNNING and g2.slots == slots
            await settle(c2)
            second = placed_by(ps[1], kube2.patches["g-1"])
            jids = {allocation_note.of_pod(p).jobid for p in (first, second)}  # type: ignore[union-attr]
            assert len(jids) == 2, jids  # the allocation under two job ids
            # the third leader
            kube3 = PatchKube()
            kube3.pods = [first, second, *ps[2:]]
            c = restart(kube3, [resumed(j)], [], kube3.pods)
            g = c.groups[("ns", "job-g")]
            assert g.phase == Phase.RUNNING and g.slots == slots, (ended, g.phase, g.reason)
            await settle(c)
            assert sorted(kube3.patches) == ["g-2", "g-3"], (ended, sorted(kube3.patches))
            for p in ps[2:]:
                again = apply_patch(p, kube3.patches[p["metadata"]["name"]])
                assert assigned_node(again) == slots[int(again["metadata"]["annotations"][ANN_SLOT])]
            # the allocation once (pod 0 ended: its slot given back), never a second match
            held = {n: 16 for n in slots} if not ended else {n: 16 for n in slots if n != slots[0]}
            assert used(c) == held and c.cluster.foreign_node == {}, (ended, used(c))
            assert len(c.cluster.matcher.jobs) == 1

    asyncio.run(main())


def test_job_placed_in_part_without_a_usable_note_places_its_other_pods() -> None:
    """The fallback when the note cannot be used (pods placed by a version before the note, or
    notes that disagree): a Job of 4 with pods 0 and 1 placed, 2 and 3 gated. Its 2 waiting pods
    must get slots (its group at its size, or a group of their own); the Job's parallelism is
    4 and never changed. They get a scale group of their own on the 2 nodes the placed pods do
    not hold: every node held once, no pod foreign. (Was: the group taken back at size 2, the
    waiting pods in it without a slot, forever.)"""
    async def main() -> None:
        j, ps, two = await job_of_four_two_placed("g", note=False)
        kube2 = PatchKube()
        kube2.pods = two + ps[2:]
        c = restart(kube2, [resumed(j)], [], kube2.pods)
        await settle(c)
        await settle(c)
        assert sorted(kube2.patches) == ["g-2", "g-3"], sorted(kube2.patches)
        held = {str(assigned_node(p)) for p in two}
        placed = {str(assigned_node(apply_patch(p, kube2.patches[p["metadata"]["name"]]))) for p in ps[2:]}
        assert len(placed) == 2 and not placed & held, (held, placed)
        assert used(c) == {n: 16 for n in held | placed} and c.cluster.foreign_node == {}

    asyncio.run(main())


def test_job_placed_in_part_without_a_usable_note_then_lowered_gets_no_slot_back() -> None:
    """The same Job of 4, its parallelism lowered to 2 while the operator was away, its
    controller yet to delete the gated pods 2 and 3: the group is the 2 placed pods, the
    waiting pods get no scale group and no slot (they are going), the graph holds 2 nodes."""
    async def main() -> None:
        j, ps, two = await job_of_four_two_placed("g", note=False)
        now = resumed(j)
        now["spec"]["parallelism"] = now["spec"]["completions"] = 2
        kube2 = PatchKube()
        kube2.pods = two + ps[2:]
        c = restart(kube2, [now], [], kube2.pods)
        await settle(c)
        await settle(c)
        assert kube2.patches == {} and not c.scaling.scale_groups, (kube2.patches, c.scaling.scale_groups)
        g = c.groups[("ns", "job-g")]
        assert g.phase == Phase.RUNNING and g.spec.size == 2
        assert used(c) == {str(assigned_node(p)): 16 for p in two} and c.cluster.foreign_node == {}

    asyncio.run(main())
