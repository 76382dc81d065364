"""Unit level (no cluster): a user suspends a Job, then resumes it (``kubectl patch job J -p
'{"spec":{"suspend":true}}'``, later ``false``), the workflow of Kueue and of the Job controller's
own docs. Suspended, the Job's controller deletes its pods; its group gives back everything it
holds and waits (Provisional, "suspended by its user"), never resumed by fluxnetes. Resumed,
the Job's new pods (born gated) are queued and placed again, all-or-nothing, on what is free
then; nothing is held twice. In both orders the watches may deliver: the Job's change before
or after its pods' deletion; for a running Job and a queued one; for a Job fluxnetes held at
admission (marked) and one its user created suspended."""

from __future__ import annotations

from typing import Any

import pytest

from fluxnetes.k8s.controller import Controller
from fluxnetes.k8s.workloads.job import ANN_SUSPENDED_BY
from test_k8s_job_parallelism_unit import KEY, big_job, held, job_pod, placed_pods
from test_k8s_prune import bound, make_controller, pod, settle


def the_job(suspend: bool, marked: bool) -> dict[str, Any]:
    j = big_job(2, completions=2, suspend=suspend)
    if not marked:  # its user created it suspended: fluxnetes never marked it
        j["metadata"]["annotations"].pop(ANN_SUSPENDED_BY)
    return j


async def running(c: Controller, kube: Any, marked: bool) -> list[dict[str, Any]]:
    """The Job of 2 (16 cpu a pod: a node each) allocated and running: its 2 bound pods."""
    c.handle(("Job", "ADDED", the_job(True, marked)))
    if not marked:  # its user resumes it: queued, allocated
        c.handle(("Job", "MODIFIED", the_job(False, marked)))
    await settle(c)
    assert str(c.groups[KEY].phase) == "Running"
    c.handle(("Job", "MODIFIED", the_job(False, marked)))
    for i in range(2):
        c.handle(("Pod", "ADDED", job_pod(i)))
    await settle(c)
    g = c.groups[KEY]
    out = []
    for slot, uid in enumerate(g.slot_pod):
        assert uid is not None
        b = bound(g.members[uid], g.slots[slot])
        c.handle(("Pod", "MODIFIED", b))
        out.append(b)
    assert sorted(kube.placed) == ["g-0", "g-1"] and len(held(c)) == 2
    return out


async def suspend_then_resume(c: Controller, kube: Any, pods: list[dict[str, Any]], marked: bool,
                              job_first: bool) -> None:
    resumes = list(kube.resumed)
    if job_first:
        c.handle(("Job", "MODIFIED", the_job(True, marked)))
        await settle(c)
        g = c.groups[KEY]
        assert str(g.phase) == "Provisional" and "suspended by its user" in g.reason, (g.phase, g.reason)
        # its pods still run while they are deleted: their nodes stay taken until they are gone
        assert held(c) == [] and sorted(c.cluster.foreign_node.values()) == sorted(p["spec"]["nodeName"] for p in pods)
    for p in pods:
        c.handle(("Pod", "DELETED", p))
    await settle(c)
    if not job_first:
        c.handle(("Job", "MODIFIED", the_job(True, marked)))
        await settle(c)
    g = c.groups[KEY]
    assert str(g.phase) == "Provisional" and "suspended by its user" in g.reason, (g.phase, g.reason)
    assert held(c) == [] and c.cluster.foreign_node == {} and not g.held
    assert len(c.cluster.matcher.jobs) == 0, c.cluster.matcher.jobs  # the graph holds nothing
    await settle(c)  # with the whole cluster free, still not resumed by fluxnetes
    assert kube.resumed == resumes and str(g.phase) == "Provisional"
    # the user resumes it: queued; its controller makes 2 new pods, born gated
    c.handle(("Job", "MODIFIED", the_job(False, marked)))
    await settle(c)
    assert str(g.phase) in ("Pending", "Running"), g.phase
    for i in (2, 3):
        c.handle(("Pod", "ADDED", job_pod(i)))
    await settle(c)
    assert str(g.phase) == "Running", (g.phase, g.reason)
    assert sorted(kube.placed) == ["g-0", "g-1", "g-2", "g-3"], kube.placed
    now = placed_pods(c)
    assert sorted(now) == ["g-2", "g-3"] and len(set(now.values())) == 2, now
    assert held(c) == sorted(now.values()) and c.cluster.foreign_node == {}
    assert list(c.cluster.matcher.jobs) == [g.jobid]  # one allocation: nothing counted twice
    assert kube.resumed == resumes  # the user resumed it, not fluxnetes


@pytest.mark.parametrize("job_first", [True, False], ids=["job-change-first", "pods-deleted-first"])
@pytest.mark.parametrize("marked", [True, False], ids=["held-by-fluxnetes", "created-suspended"])
def test_a_running_job_suspended_gives_everything_back_and_runs_again_when_resumed(marked: bool, job_first: bool) -> None:
    async def main() -> None:
        c, kube = make_controller()
        pods = await running(c, kube, marked)
        await suspend_then_resume(c, kube, pods, marked, job_first)

    import asyncio
    asyncio.run(main())


def blocker(c: Controller) -> dict[str, Any]:
    """A lone pod of 16 cpu on each of n0..n3 (foreign): the Job waits in the queue."""
    out = []
    for n in ("n0", "n1", "n2", "n3"):
        p = bound(pod(f"b-{n}"), n)
        p["metadata"]["labels"] = {}
        p["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "16"
        c.handle(("Pod", "ADDED", p))
        out.append(p)
    return {"pods": out}


def test_a_queued_job_resumed_then_suspended_by_its_user_waits_for_its_user() -> None:
    """A queued Job (held by fluxnetes) that its user resumes (its pods are born gated: they
    wait with the group) and then suspends again: the group leaves the queue and, when the
    cluster frees, fluxnetes does not resume it; resumed again, it is placed."""
    import asyncio

    async def main() -> None:
        c, kube = make_controller()
        b = blocker(c)
        c.handle(("Job", "ADDED", the_job(True, True)))
        await settle(c)
        g = c.groups[KEY]
        assert str(g.phase) == "Pending"
        c.handle(("Job", "MODIFIED", the_job(False, True)))  # resumed by its user while queued
        pods = [job_pod(0), job_pod(1)]
        for p in pods:
            c.handle(("Pod", "ADDED", p))
        await settle(c)
        assert str(g.phase) == "Pending" and kube.placed == []
        c.handle(("Job", "MODIFIED", the_job(True, True)))  # and suspended again: its pods go
        for p in pods:
            c.handle(("Pod", "DELETED", p))
        await settle(c)
        assert str(g.phase) == "Provisional" and "suspended by its user" in g.reason, (g.phase, g.reason)
        for p in b["pods"]:
            c.handle(("Pod", "DELETED", p))
        await settle(c)
        assert str(g.phase) == "Provisional" and kube.resumed == [] and held(c) == []
        c.handle(("Job", "MODIFIED", the_job(False, True)))
        for i in (2, 3):
            c.handle(("Pod", "ADDED", job_pod(i)))
        await settle(c)
        await settle(c)
        assert str(g.phase) == "Running" and sorted(kube.placed) == ["g-2", "g-3"], (g.phase, kube.placed)
        assert len(held(c)) == 2 and kube.resumed == []

    asyncio.run(main())


def test_a_queued_job_suspended_by_its_user_in_place_stays_queued_and_is_placed_when_resumed() -> None:
    """A Job still held by fluxnetes (queued: suspended and marked) that its user "suspends"
    changes nothing in the object; resumed by its user later, its gated pods wait with the
    group and are placed once it is allocated, once each."""
    import asyncio

    async def main() -> None:
        c, kube = make_controller()
        b = blocker(c)
        c.handle(("Job", "ADDED", the_job(True, True)))
        await settle(c)
        g = c.groups[KEY]
        c.handle(("Job", "MODIFIED", the_job(True, True)))
        await settle(c)
        assert str(g.phase) == "Pending"
        c.handle(("Job", "MODIFIED", the_job(False, True)))
        for i in (0, 1):
            c.handle(("Pod", "ADDED", job_pod(i)))
        await settle(c)
        assert str(g.phase) == "Pending" and kube.placed == []
        for p in b["pods"]:
            c.handle(("Pod", "DELETED", p))
        await settle(c)
        await settle(c)
        assert str(g.phase) == "Running" and sorted(kube.placed) == ["g-0", "g-1"]
        assert len(held(c)) == 2

    asyncio.run(main())


def test_with_a_store_the_suspended_run_ends_and_the_resumed_one_is_a_new_row(tmp_path: Any) -> None:
    """The store keeps each run: the one its user suspended ends cancelled, the group goes on
    under a new row (as after preemption), running once it is placed again."""
    import asyncio

    async def main() -> None:
        c, kube = make_controller(f"sqlite:///{tmp_path / 's.db'}")
        try:
            pods = await running(c, kube, True)
            await suspend_then_resume(c, kube, pods, True, True)
            assert c.journal.drain()
            rows = sorted((r.uid, str(r.state)) for r in c.journal.store.jobs() if r.name == "job-g")
            assert rows == [("job-g", "cancelled"), ("job-g~requeue-1", "running")], rows
        finally:
            await c.stop()

    asyncio.run(main())


def merge_patched(obj: dict[str, Any], body: dict[str, Any]) -> dict[str, Any]:
    """``obj`` after a JSON merge patch (RFC 7386: null removes a key), as the API server
    applies the operator's patches."""
    out = dict(obj)
    for k, v in body.items():
        if v is None:
            out.pop(k, None)
        elif isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = merge_patched(out[k], v)
        else:
            out[k] = v
    return out


@pytest.mark.parametrize("marked", [True, False], ids=["held-by-fluxnetes", "created-suspended"])
def test_a_users_suspension_outlives_the_leader_that_saw_it(marked: bool) -> None:
    """The user suspends a running Job; the leader that saw it dies. The next leader lists the
    Job as the API server has it after the first one's writes: it must not resume it. A Job
    fluxnetes resumed kept fluxnetes' hold mark, so a new leader took the user's suspension
    for fluxnetes' own hold (its first leader's ``suspended_by_user`` is memory only), queued
    the Job and resumed it once it fitted: the first leader now takes the mark off."""
    import asyncio

    async def main() -> None:
        c, kube = make_controller()
        pods = await running(c, kube, marked)
        c.handle(("Job", "MODIFIED", the_job(True, marked)))
        for p in pods:
            c.handle(("Pod", "DELETED", p))
        await settle(c)
        assert str(c.groups[KEY].phase) == "Provisional"
        await c.stop()
        assert [name for name, _ in kube.job_metadata] == (["g"] if marked else [])  # (none to take off)
        job = the_job(True, marked)
        for _, body in kube.job_metadata:
            job = merge_patched(job, body)
        c2, kube2, g = await next_leader_waits_for_user(job)
        c2.handle(("Job", "MODIFIED", the_job(False, False)))  # its user resumes it: it runs again
        for i in (2, 3):
            c2.handle(("Pod", "ADDED", job_pod(i)))
        await settle(c2)
        await settle(c2)
        assert str(g.phase) == "Running" and sorted(kube2.placed) == ["g-2", "g-3"], (g.phase, kube2.placed)
        assert kube2.resumed == []
        await c2.stop()

    asyncio.run(main())


async def next_leader_waits_for_user(job: dict[str, Any]) -> tuple[Any, Any, Any]:
    """The next leader, over the cluster as it is (the suspended Job): the group waits for its
    user, neither resumed nor held. Returns the controller, its kube and the group."""
    c2, kube2 = make_controller()
    c2.handle(("Job", "ADDED", job))
    await settle(c2)
    await settle(c2)
    g = c2.groups[KEY]
    assert str(g.phase) == "Provisional" and "suspended by its user" in g.reason, (g.phase, g.reason)
    assert kube2.resumed == [] and held(c2) == []
    return c2, kube2, g


def test_a_users_suspension_while_no_operator_runs_is_never_resumed() -> None:
    """fluxnetes resumes the Job it held at admission; its leader dies; while no operator
    runs, its user suspends it (the Job controller deletes its pods). The next leader sees no
    change, only a suspended Job: the resume took fluxnetes' hold mark off with the hold, so
    the suspension reads as the user's: the group waits for its user, never resumed. (Was:
    the resume left the mark on, and the next leader took the user's suspension for
    fluxnetes' own hold: it queued the Job and resumed it once it fitted.)"""
    import asyncio

    async def main() -> None:
        c, kube = make_controller()
        await running(c, kube, marked=True)
        await c.stop()
        job = the_job(True, True)  # as admitted: suspended, marked
        assert [name for name, _ in kube.resume_bodies] == ["g"]
        for _, body in kube.resume_bodies:
            job = merge_patched(job, body)
        assert job["spec"]["suspend"] is False and ANN_SUSPENDED_BY not in job["metadata"]["annotations"], job
        job = merge_patched(job, {"spec": {"suspend": True}})  # its user, while no operator runs
        c2, _, _ = await next_leader_waits_for_user(job)
        await c2.stop()

    asyncio.run(main())
