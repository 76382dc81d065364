"""Unit level (no cluster): a running Job whose parallelism is RAISED (``kubectl patch job J -p
'{"spec":{"parallelism":4}}'``). The Job controller makes the extra pods; the webhook gates
them and they join the Job's group by owner. They must be placed (a scale group of the extra
pods, matched on what is free) in either order the watches deliver: the Job's change first or
its new pods first. A lowered parallelism keeps giving back empty slots only."""

from __future__ import annotations

import asyncio
from typing import Any

from fluxnetes.k8s.controller import Controller
from test_k8s_prune import bound, finished, job, make_controller, pod, settle

KEY = ("ns", "job-g")


def big_job(parallelism: int, completions: int = 8, suspend: bool = True) -> dict[str, Any]:
    """Job g asking 16 cpu a pod (one pod a node on n0..n3)."""
    j = job("g", parallelism)
    j["spec"]["completions"] = completions
    j["spec"]["suspend"] = suspend
    j["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "16"
    return j


def job_pod(i: int) -> dict[str, Any]:
    p = pod(f"g-{i}", owner=big_job(2))
    p["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "16"
    return p


def held(c: Controller) -> list[str]:
    """Node shares held by running groups (a 16-cpu pod takes a whole node: each at most once)."""
    return sorted(n for g in c.groups.values() if str(g.phase) == "Running" for n in g.held)


async def running_two(c: Controller, kube: Any, completions: int = 8) -> dict[str, str]:
    """The Job of 2 admitted, allocated, resumed, its 2 pods placed and bound: pod name -> node."""
    c.handle(("Job", "ADDED", big_job(2, completions)))
    await settle(c)
    c.handle(("Job", "MODIFIED", big_job(2, completions, suspend=False)))
    for i in range(2):
        c.handle(("Pod", "ADDED", job_pod(i)))
    await settle(c)
    g = c.groups[KEY]
    assert str(g.phase) == "Running" and sorted(kube.placed) == ["g-0", "g-1"], (g.phase, kube.placed)
    on = {}
    for slot, uid in enumerate(g.slot_pod):
        name = str(g.members[uid]["metadata"]["name"])
        on[name] = g.slots[slot]
        c.handle(("Pod", "MODIFIED", bound(g.members[uid], g.slots[slot])))
    return on


def placed_pods(c: Controller) -> dict[str, str]:
    """Pod name -> node of every pod holding a slot in a running group."""
    out = {}
    for g in c.groups.values():
        if str(g.phase) == "Running":
            for slot, uid in enumerate(g.slot_pod):
                if uid is not None and uid in g.members:
                    out[str(g.members[uid]["metadata"]["name"])] = g.slots[slot]
    return out


def check_four_placed(c: Controller, kube: Any, before: dict[str, str]) -> None:
    assert sorted(kube.placed) == ["g-0", "g-1", "g-2", "g-3"], kube.placed
    now = placed_pods(c)
    assert {k: now[k] for k in before} == before  # the running pods untouched
    assert sorted(now.values()) == ["n0", "n1", "n2", "n3"], now  # no node booked twice
    assert held(c) == ["n0", "n1", "n2", "n3"]
    assert c.cluster.foreign_node == {}


def test_parallelism_raised_then_new_pods_are_placed() -> None:
    async def main() -> None:
        c, kube = make_controller()
        before = await running_two(c, kube)
        c.handle(("Job", "MODIFIED", big_job(4, suspend=False)))
        for i in (2, 3):
            c.handle(("Pod", "ADDED", job_pod(i)))
        await settle(c)
        await settle(c)
        check_four_placed(c, kube, before)

    asyncio.run(main())


def test_new_pods_seen_before_the_raised_parallelism_are_placed() -> None:
    async def main() -> None:
        c, kube = make_controller()
        before = await running_two(c, kube)
        for i in (2, 3):  # the pod watch delivered them before the Job's MODIFIED event
            c.handle(("Pod", "ADDED", job_pod(i)))
        await settle(c)
        assert sorted(kube.placed) == ["g-0", "g-1"]  # the operator does not know they are wanted yet
        c.handle(("Job", "MODIFIED", big_job(4, suspend=False)))
        await settle(c)
        await settle(c)
        check_four_placed(c, kube, before)

    asyncio.run(main())


def test_parallelism_raised_beyond_the_free_nodes_waits_all_or_nothing() -> None:
    """Raised to 6 on 4 nodes: the 4 extra pods wait (queued as one group), nothing overbooked."""
    async def main() -> None:
        c, kube = make_controller()
        await running_two(c, kube)
        c.handle(("Job", "MODIFIED", big_job(6, suspend=False)))
        for i in range(2, 6):
            c.handle(("Pod", "ADDED", job_pod(i)))
        await settle(c)
        await settle(c)
        assert sorted(kube.placed) == ["g-0", "g-1"]
        assert len(held(c)) == 2
        (scale,) = c.scaling.scale_groups[KEY]  # one group of the 4 extra pods, not one per pod
        g = c.groups[scale]
        assert g.spec.size == 4 and len(g.members) == 4 and not g.held

    asyncio.run(main())


def test_parallelism_lowered_gives_back_empty_slots_and_forms_no_group() -> None:
    async def main() -> None:
        c, kube = make_controller()
        c.handle(("Job", "ADDED", big_job(4)))
        await settle(c)
        c.handle(("Job", "MODIFIED", big_job(4, suspend=False)))
        for i in range(3):  # pod 3 not made yet
            c.handle(("Pod", "ADDED", job_pod(i)))
        await settle(c)
        g = c.groups[KEY]
        assert str(g.phase) == "Running" and len(g.held) == 4
        c.handle(("Job", "MODIFIED", big_job(3, suspend=False)))
        await settle(c)
        assert not c.scaling.scale_groups
        assert len(held(c)) == 3 and sorted(kube.placed) == ["g-0", "g-1", "g-2"]

    asyncio.run(main())




def test_a_pod_that_succeeded_forms_no_group_while_the_jobs_count_lags() -> None:
    """A Job of 2 completions: pod 0 succeeds (its slot given back, no pod follows it) and the
    Job's next change still says 0 succeeded: no scale group (it would wait forever)."""
    async def main() -> None:
        c, kube = make_controller()
        on = await running_two(c, kube, completions=2)
        done = finished(bound(job_pod(0), on["g-0"]))
        c.handle(("Pod", "MODIFIED", done))
        two = big_job(2, completions=2, suspend=False)
        c.handle(("Job", "MODIFIED", two))
        await settle(c)
        assert not c.scaling.scale_groups and held(c) == [on["g-1"]]

    asyncio.run(main())


async def raised_to_four(c: Controller, kube: Any) -> dict[str, str]:
    """The Job of 2 running, raised to 4, its 2 new pods placed and bound: pod name -> node."""
    await running_two(c, kube)
    c.handle(("Job", "MODIFIED", big_job(4, suspend=False)))
    for i in (2, 3):
        c.handle(("Pod", "ADDED", job_pod(i)))
    await settle(c)
    on = placed_pods(c)
    for i in (2, 3):
        c.handle(("Pod", "MODIFIED", bound(job_pod(i), on[f"g-{i}"])))
    return on


def test_a_failed_pod_of_the_scale_group_is_replaced_on_its_slot() -> None:
    """Pod g-3 (scale group) fails; the Job makes g-4, which joins the Job's base group by owner:
    it takes g-3's kept slot in the scale group, no new group, no node twice."""
    async def main() -> None:
        c, kube = make_controller()
        on = await raised_to_four(c, kube)
        failed = bound(job_pod(3), on["g-3"])
        failed["status"]["phase"] = "Failed"
        c.handle(("Pod", "MODIFIED", failed))
        c.handle(("Pod", "ADDED", job_pod(4)))
        await settle(c)
        assert len(c.scaling.scale_groups[KEY]) == 1
        assert kube.placed[-1] == "g-4" and placed_pods(c)["g-4"] == on["g-3"], (kube.placed, placed_pods(c))
        assert held(c) == ["n0", "n1", "n2", "n3"]

    asyncio.run(main())


def test_lowered_after_a_raise_gives_back_the_deleted_pods_share() -> None:
    """Raised to 4 and running, then lowered to 3: the Job controller deletes g-3 (scale group);
    nothing replaces it, so its node goes back at once."""
    async def main() -> None:
        c, kube = make_controller()
        on = await raised_to_four(c, kube)
        c.handle(("Job", "MODIFIED", big_job(3, suspend=False)))
        c.handle(("Pod", "DELETED", bound(job_pod(3), on["g-3"])))
        await settle(c)
        assert held(c) == sorted(on[f"g-{i}"] for i in range(3)), (held(c), on)

    asyncio.run(main())


def test_a_raised_job_that_completes_gives_back_every_node() -> None:
    """Raised to 4 (8 completions), its 4 pods succeed before the Job says Complete (each slot
    kept for the pod the Job would make next): the Job's Complete gives back the scale group's
    kept slots too, not only the base group's."""
    async def main() -> None:
        c, kube = make_controller()
        on = await raised_to_four(c, kube)
        for i in range(4):
            c.handle(("Pod", "MODIFIED", finished(bound(job_pod(i), on[f"g-{i}"]))))
        await settle(c)
        assert held(c) == ["n0", "n1", "n2", "n3"]  # kept: the Job is not over yet
        done = big_job(4, suspend=False)
        done["status"] = {"conditions": [{"type": "Complete", "status": "True"}], "succeeded": 8}
        c.handle(("Job", "MODIFIED", done))
        await settle(c)
        assert held(c) == [] and not c.cluster.matcher.jobs, (held(c), c.cluster.matcher.jobs)

    asyncio.run(main())


def test_a_raised_job_that_fails_before_its_scale_group_ran_ends_that_group() -> None:
    """Raised to 6 on 4 nodes (the scale group of 4 waits), then the Job fails: the waiting
    scale group ends (never matched later), the running pods keep their nodes until they end."""
    async def main() -> None:
        c, kube = make_controller()
        on = await running_two(c, kube)
        c.handle(("Job", "MODIFIED", big_job(6, suspend=False)))
        for i in range(2, 6):
            c.handle(("Pod", "ADDED", job_pod(i)))
        await settle(c)
        (scale,) = c.scaling.scale_groups[KEY]
        sg = c.groups[scale]
        over = big_job(6, suspend=False)
        over["status"] = {"conditions": [{"type": "Failed", "status": "True"}]}
        c.handle(("Job", "MODIFIED", over))
        await settle(c)
        assert sg.phase.final and not sg.held, sg.phase
        assert held(c) == sorted(on.values())
        for i in range(2, 6):
            c.handle(("Pod", "DELETED", job_pod(i)))
        await settle(c)
        assert sorted(kube.placed) == ["g-0", "g-1"]

    asyncio.run(main())


def test_a_raised_job_comes_back_whole_after_a_restart() -> None:
    """Raised to 4 and all 4 placed, then the operator restarts: the base group and its scale
    group come back from their FluxJobs and pods, every node held once, no new group, nothing
    foreign, nothing placed again."""
    from test_k8s_recovery_unit import Kube, placed, restart
    from test_k8s_recovery_unit import controller as recovery_controller

    async def main() -> None:
        kube = Kube()
        c = recovery_controller(kube)
        c.reconciled = True
        await raised_to_four(c, kube)
        pods = []
        for g in (c.groups[KEY], *(c.groups[k] for k in c.scaling.scale_groups[KEY])):
            for slot, uid in enumerate(g.slot_pod):
                fresh = job_pod(int(str(g.members[uid]["metadata"]["name"]).split("-")[1]))
                pods.append(placed(fresh, g.slots[slot], slot, int(g.jobid or 0), g.spec.name))
        assert len(pods) == 4
        before = len(kube.placed)
        c2 = restart(kube, [big_job(4, suspend=False)], list(kube.fluxjobs.values()), pods)
        await settle(c2)
        await settle(c2)
        assert len(kube.placed) == before  # nothing placed again
        assert len(c2.scaling.scale_groups[KEY]) == 1
        assert held(c2) == ["n0", "n1", "n2", "n3"] and c2.cluster.foreign_node == {}

    asyncio.run(main())


def test_a_waiting_scale_group_of_a_job_keeps_its_pods_across_a_restart() -> None:
    """Raised to 6 on 4 nodes: the scale group of 4 waits, its pods gated. After a restart its
    pods (which join the Job's base group by owner in the replay) are the scale group's again,
    still one group of 4, none placed."""
    from test_k8s_recovery_unit import Kube, placed, restart
    from test_k8s_recovery_unit import controller as recovery_controller

    async def main() -> None:
        kube = Kube()
        c = recovery_controller(kube)
        c.reconciled = True
        await running_two(c, kube)
        c.handle(("Job", "MODIFIED", big_job(6, suspend=False)))
        for i in range(2, 6):
            c.handle(("Pod", "ADDED", job_pod(i)))
        await settle(c)
        base = c.groups[KEY]
        pods = [job_pod(i) for i in range(2, 6)]
        for slot, uid in enumerate(base.slot_pod):
            fresh = job_pod(int(str(base.members[uid]["metadata"]["name"]).split("-")[1]))
            pods.append(placed(fresh, base.slots[slot], slot, int(base.jobid or 0), base.spec.name))
        c2 = restart(kube, [big_job(6, suspend=False)], list(kube.fluxjobs.values()), pods)
        await settle(c2)
        await settle(c2)
        (scale,) = c2.scaling.scale_groups[KEY]
        sg = c2.groups[scale]
        assert sg.spec.size == 4 and len(sg.members) == 4 and not sg.held, (sg.spec.size, len(sg.members))
        assert not c2.groups[KEY].waiting() and sorted(kube.placed) == ["g-0", "g-1"]
        assert sorted(held(c2)) == sorted(base.slots)

    asyncio.run(main())


def test_a_jobs_ended_scale_group_spends_its_name_and_does_not_end_the_job() -> None:
    """After a restart the final FluxJob of a raised Job's scale group is listed: it spends its
    name (the store knows a group by namespace, name and workload uid: a second "scale-1" would
    be taken for the ended one) and does not mark the Job ended (only its base group's does)."""
    def fluxjob(name: str) -> dict[str, Any]:
        return {"apiVersion": "fluxnetes.io/v1alpha1", "kind": "FluxJob",
                "metadata": {"name": name, "namespace": "ns", "uid": f"fj-{name}"},
                "spec": {"workload": {"apiVersion": "batch/v1", "kind": "Job", "name": "g", "uid": "job-g"}},
                "status": {"phase": "Completed"}}

    c, _ = make_controller()
    c.scaling.on_fluxjob(fluxjob("job-g-scale-1"))
    assert not c.scaling.ended("job-g") and "job-g-scale-1" in c.scaling.spent_names["job-g"]
    assert c.scaling.next_scale_name(KEY, "job-g") == "job-g-scale-2"
    c.scaling.on_fluxjob(fluxjob("job-g"))
    assert c.scaling.ended("job-g")


def test_a_raised_job_that_failed_while_the_operator_was_away_ends_its_waiting_scale_group_as_live() -> None:
    """Raised to 6 on 4 nodes (the scale group of 4 waits), then the Job fails while the
    operator is away: after the restart the waiting scale group ends as it does when the
    operator sees the failure live (cancelled: it never ran), not with the Job's outcome."""
    from test_k8s_recovery_unit import Kube, placed, restart
    from test_k8s_recovery_unit import controller as recovery_controller

    async def main() -> None:
        kube = Kube()
        c = recovery_controller(kube)
        c.reconciled = True
        await running_two(c, kube)
        c.handle(("Job", "MODIFIED", big_job(6, suspend=False)))
        for i in range(2, 6):
            c.handle(("Pod", "ADDED", job_pod(i)))
        await settle(c)
        base = c.groups[KEY]
        (scale,) = c.scaling.scale_groups[KEY]
        pods = [job_pod(i) for i in range(2, 6)]
        for slot, uid in enumerate(base.slot_pod):
            fresh = job_pod(int(str(base.members[uid]["metadata"]["name"]).split("-")[1]))
            pods.append(placed(fresh, base.slots[slot], slot, int(base.jobid or 0), base.spec.name))
        over = big_job(6, suspend=False)
        over["status"] = {"conditions": [{"type": "Failed", "status": "True"}]}
        c2 = restart(kube, [over], list(kube.fluxjobs.values()), pods)
        await settle(c2)
        await settle(c2)
        st = kube.fluxjobs[scale]["status"]  # (the ended group itself is pruned)
        assert st["phase"] == "Cancelled" and not st.get("shares"), st
        assert "finished before this group was allocated" in st["reason"], st["reason"]
        assert sorted(kube.placed) == ["g-0", "g-1"]

    asyncio.run(main())
