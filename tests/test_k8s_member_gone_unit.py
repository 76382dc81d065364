"""Unit level (no cluster): a pod of a running multi-pod group that is DELETED before it ended
(`kubectl delete pod`, an eviction, kwok's delete: its last state is still Running), not one
that ended (groups/groupbook.py ``member_gone``, scheduling/allocation.py ``release_slot``).

The rule: a slot is kept for the pod's replacement only when its workload's controller will
make one (a Job with completions left counts a deleted pod as failed and retries it; a
ReplicaSet keeps its replicas); a pod nothing re-creates (a label group of bare pods, a Job
whose parallelism was lowered, a suspended Job) gives its share back at once, and a pod that
comes later never gets a slot already given back (no double booking: it waits, gated).
"""

from __future__ import annotations

import asyncio
import copy
from typing import Any

from fluxnetes.k8s import names
from fluxnetes.k8s.controller import Controller
from fluxnetes.k8s.persistence.fluxjob import Phase
from fluxnetes.k8s.workloads.job import ANN_SUSPENDED_BY
from test_k8s_groupbook_unit import replicaset
from test_k8s_prune import RecordingKube, bind_to_slots, job, make_controller, pod, settle


def deleted(p: dict[str, Any]) -> dict[str, Any]:
    """A pod's last state as its DELETED event shows it when nothing ended it first."""
    out = copy.deepcopy(p)
    out["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return out


def held_cores(c: Controller, g: Any) -> int:
    """What the group holds, as the group says and as the matcher says (they must agree)."""
    mine = sum(s.cores for s in g.held.values())
    matcher = sum(n.cores for n in c.cluster.matcher.jobs[g.jobid].nodes) if g.jobid in c.cluster.matcher.jobs else 0
    assert mine == matcher, (mine, matcher)
    return mine


async def running_job(c: Controller, name: str, parallelism: int, completions: int | None,
                      resume_seen: bool = True) -> tuple[dict[str, Any], Any, list[dict[str, Any]]]:
    """A Job allocated, resumed (the Job controller's view: suspend false, unless not
    ``resume_seen`` yet) and its pods bound."""
    j = job(name, parallelism)
    j["spec"]["completions"] = completions
    c.handle(("Job", "ADDED", j))
    await settle(c)
    j = copy.deepcopy(j)
    j["spec"]["suspend"] = False  # what the operator's resume wrote, seen back
    if resume_seen:
        c.handle(("Job", "MODIFIED", j))
    g = c.groups[("ns", f"job-{name}")]
    size = parallelism if completions is None else min(parallelism, completions)
    pods = [pod(f"{name}-{i}", owner=j) for i in range(size)]
    for p in pods:
        c.handle(("Pod", "ADDED", p))
    await settle(c)
    assert g.phase == Phase.RUNNING and all(g.slot_pod)
    placed = bind_to_slots(c, g, pods)
    return j, g, placed


def test_a_job_pod_deleted_while_it_runs_keeps_its_slot_for_the_jobs_retry() -> None:
    """A Job of 3 completions, 3 at a time: a pod deleted while it runs is counted failed by
    the Job controller, which makes another. Its slot (and node share) waits for that pod,
    which is placed on the same node. (Before: the share was given back, and the Job's new
    pod waited gated for good: the Job never completed.)"""
    async def main() -> None:
        c, kube = make_controller()
        j, g, placed = await running_job(c, "j", 3, 3)
        cores = held_cores(c, g)
        slot = g.slot_pod.index("pod-j-0")
        c.handle(("Pod", "DELETED", deleted(placed[0])))
        assert g.phase == Phase.RUNNING and not g.released and held_cores(c, g) == cores
        again = pod("j-0-retry", owner=j)
        c.handle(("Pod", "ADDED", again))
        await settle(c)
        assert g.slot_pod[slot] == "pod-j-0-retry" and "j-0-retry" in kube.placed
        assert held_cores(c, g) == cores
        assert g.deleted_pods == 0  # retried, not stopped: the Job may still complete

    asyncio.run(main())


def test_a_job_pod_deleted_after_parallelism_was_lowered_gives_its_share_back() -> None:
    """Parallelism 3 -> 2 (completions 6): the Job controller deletes a running pod and makes
    none for it. Its share goes back at once; a pod the Job makes later (when parallelism is
    raised again) finds no slot and waits gated: the share given back is not booked twice."""
    async def main() -> None:
        c, kube = make_controller()
        j, g, placed = await running_job(c, "j", 3, 6)
        cores = held_cores(c, g)
        lower = copy.deepcopy(j)
        lower["spec"]["parallelism"] = 2
        c.handle(("Job", "MODIFIED", lower))
        assert not g.released  # every slot has its pod: given back as the pods go
        slot = g.slot_pod.index("pod-j-2")
        c.handle(("Pod", "DELETED", deleted(placed[2])))
        assert g.released == {slot} and held_cores(c, g) == cores - 2
        late = pod("j-late", owner=lower)
        c.handle(("Pod", "ADDED", late))
        await settle(c)
        assert "pod-j-late" not in g.slot_pod and "j-late" not in kube.placed
        assert g.slot_pod[slot] is None and held_cores(c, g) == cores - 2

    asyncio.run(main())


def test_a_label_group_pod_deleted_gives_its_share_back_and_a_late_pod_waits() -> None:
    """Bare pods of a label group: nothing re-creates a deleted one. Its share goes back at
    once; a pod of the same label created later joins the running group without a slot and
    stays gated (it would overbook the node the share went back to)."""
    async def main() -> None:
        c, kube = make_controller()
        pods = [pod(f"g-{i}", labels={names.LABEL_GROUP: "g", names.LABEL_GROUP_SIZE: "3"}) for i in range(3)]
        for p in pods:
            c.handle(("Pod", "ADDED", p))
        await settle(c)
        g = c.groups[("ns", "g")]
        placed = bind_to_slots(c, g, pods)
        cores = held_cores(c, g)
        slot = g.slot_pod.index("pod-g-1")
        c.handle(("Pod", "DELETED", deleted(placed[1])))
        assert g.released == {slot} and held_cores(c, g) == cores - 2
        late = pod("g-late", labels={names.LABEL_GROUP: "g", names.LABEL_GROUP_SIZE: "3"})
        c.handle(("Pod", "ADDED", late))
        await settle(c)
        assert "pod-g-late" in g.members and "pod-g-late" not in g.slot_pod
        assert "g-late" not in kube.placed and held_cores(c, g) == cores - 2
        c.handle(("Pod", "DELETED", deleted(placed[0])))
        c.handle(("Pod", "DELETED", deleted(placed[2])))
        assert g.phase == Phase.CANCELLED and not g.held and g.jobid not in c.cluster.matcher.jobs
        assert "g-late" not in kube.placed

    asyncio.run(main())


def test_pods_of_a_job_suspended_by_its_user_give_their_shares_back() -> None:
    """The user suspends a running Job (one fluxnetes did not hold: no mark of ours): the Job
    controller deletes its pods (here one ends Failed first) and makes none until it is
    resumed. The group gives its allocation back at once and waits for its user (a new run
    when resumed: tests/test_k8s_job_suspend_unit.py); its pods still running are followed as
    foreign pods until they go, not kept for replacements that will not come. (Before: the
    failed pod's share was kept; later: the group ended Cancelled and its Job, resumed, was
    never placed again.) A Job carrying fluxnetes' own hold mark whose resume was not seen
    yet keeps its shares instead (the next test)."""
    async def main() -> None:
        c, _ = make_controller()
        j, g, placed = await running_job(c, "j", 2, 2)
        jobid = g.jobid
        held = copy.deepcopy(j)
        held["spec"]["suspend"] = True
        held["metadata"]["annotations"].pop(ANN_SUSPENDED_BY)
        c.handle(("Job", "MODIFIED", held))
        assert g.phase == Phase.PROVISIONAL and not g.held and jobid not in c.cluster.matcher.jobs
        assert sorted(c.cluster.foreign_node) == sorted(p["metadata"]["uid"] for p in placed)
        failed = copy.deepcopy(placed[0])
        failed["status"]["phase"] = "Failed"
        c.handle(("Pod", "MODIFIED", failed))
        c.handle(("Pod", "DELETED", deleted(placed[1])))
        assert c.cluster.foreign_node == {} and g.phase == Phase.PROVISIONAL

    asyncio.run(main())


def test_a_resume_not_seen_yet_does_not_give_a_retried_pods_share_away() -> None:
    """Fluxnetes resumed the Job, but the Job's change has not come back on its watch (pods
    and Jobs are separate streams) when a running pod is deleted: the view still says "held
    by fluxnetes". The share waits for the Job's retry all the same."""
    async def main() -> None:
        c, _ = make_controller()
        j, g, placed = await running_job(c, "j", 2, 2, resume_seen=False)
        stale = copy.deepcopy(j)
        stale["spec"]["suspend"] = True  # as fluxnetes held it at admission (e.g. a status change)
        c.handle(("Job", "MODIFIED", stale))
        assert g.resumed
        cores = held_cores(c, g)
        c.handle(("Pod", "DELETED", deleted(placed[0])))
        assert not g.released and held_cores(c, g) == cores

    asyncio.run(main())


def test_a_replicaset_pod_deleted_keeps_its_slot_unless_scaled_down() -> None:
    """A ReplicaSet re-creates a deleted pod (its slot waits for it); scaled down, the pod it
    deletes gives its share back at once."""
    async def main() -> None:
        c, kube = make_controller()
        c.kube = kube = RecordingKube()
        rs = replicaset("web", 2)
        c.handle(("ReplicaSet", "ADDED", rs))
        pods = [pod(f"web-{i}", owner=rs) for i in range(2)]
        for p in pods:
            c.handle(("Pod", "ADDED", p))
        await settle(c)
        g = c.groups[("ns", "replicaset-web")]
        placed = bind_to_slots(c, g, pods)
        cores = held_cores(c, g)
        c.handle(("Pod", "DELETED", deleted(placed[0])))
        assert not g.released and held_cores(c, g) == cores
        again = pod("web-again", owner=rs)
        c.handle(("Pod", "ADDED", again))
        await settle(c)
        assert "pod-web-again" in g.slot_pod and "web-again" in kube.placed
        down = copy.deepcopy(rs)
        down["spec"]["replicas"] = 1
        c.handle(("ReplicaSet", "MODIFIED", down))
        c.handle(("Pod", "DELETED", deleted(placed[1])))
        assert len(g.released) == 1 and held_cores(c, g) == cores - 2

    asyncio.run(main())
