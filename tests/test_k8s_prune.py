"""Unit level: a long-running Controller forgets groups that are over (bounded memory).

The Controller is driven directly with watch events (no control plane); its API writes go to
a recording fake (the only fake here). Pods and Jobs go through their whole life: created
gated, allocated, placed, finished; afterwards every per-group map is back to where it began,
while the FluxJob (the fake's record of its last status) keeps the final phase.
"""

from __future__ import annotations

import asyncio
import copy
import itertools
from pathlib import Path
from typing import Any

import pytest

from fluxnetes.k8s import names
from fluxnetes.k8s.config import OperatorConfig
from fluxnetes.k8s.controller import Controller
from fluxnetes.k8s.persistence.fluxjob import Phase
from fluxnetes.k8s.workloads.job import ANN_SUSPENDED_BY, JobKind

_uids = itertools.count(1)


class RecordingKube:
    """Accepts every write and remembers FluxJob statuses (and how many FluxJob writes were
    sent) and pod patches."""

    def __init__(self) -> None:
        self.fluxjob_status: dict[tuple[str, str], dict[str, Any]] = {}
        self.fluxjob_writes = 0
        self.placed: list[str] = []
        self.resumed: list[str] = []
        self.resume_bodies: list[tuple[str, Any]] = []  # (workload, body) of each resume patch
        self.job_metadata: list[tuple[str, Any]] = []  # (Job, body) of each patch of its metadata only
        self.deleted: list[tuple[str, Any]] = []  # (path, body) of each DELETE
        self.event_reasons: list[tuple[str, str]] = []  # (involved object's kind, reason) of each Event

    async def request(self, method: str, path: str, body: Any = None, **_: Any) -> dict[str, Any]:
        if method == "POST" and path.endswith("/binding"):  # a pod held by the scheduler name
            self.placed.append(path.split("/")[-2])
            return {}
        assert method == "DELETE", f"unexpected {method} {path}"
        self.deleted.append((path, body))
        return {}

    async def create(self, res: Any, body: Any, namespace: str | None = None, **_: Any) -> dict[str, Any]:
        out = copy.deepcopy(dict(body))
        out.setdefault("metadata", {})["uid"] = f"created-{next(_uids)}"
        if res.plural == "events":
            self.event_reasons.append((body["involvedObject"]["kind"], body["reason"]))
        if res.plural == "fluxjobs":
            self.fluxjob_writes += 1
            if "status" in body:
                self.fluxjob_status[(namespace or "", body["metadata"]["name"])] = body["status"]
        return out

    async def patch(self, res: Any, name: str, body: Any, namespace: str | None = None, *,
                    sub: str | None = None, **_: Any) -> dict[str, Any]:
        if res.plural == "fluxjobs":
            self.fluxjob_writes += 1
            if "status" in body:
                self.fluxjob_status[(namespace or "", name)] = body["status"]
        elif res.plural == "pods":
            self.placed.append(name)
        elif res.plural == "jobs" and "spec" not in body:
            self.job_metadata.append((name, body))  # (fluxnetes' hold mark taken off)
        elif res.plural == "jobs":
            self.resumed.append(name)
            self.resume_bodies.append((name, body))
        return {}


def node(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "uid": f"node-{name}", "labels": {"kubernetes.io/hostname": name}},
            "status": {"allocatable": {"cpu": "16", "memory": "64Gi", "pods": "110"},
                       "capacity": {"cpu": "16", "memory": "64Gi", "pods": "110"},
                       "conditions": [{"type": "Ready", "status": "True"}]}}


def job(name: str, size: int) -> dict[str, Any]:
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": name, "namespace": "ns", "uid": f"job-{name}",
                         "annotations": {ANN_SUSPENDED_BY: "fluxnetes"}},
            "spec": {"parallelism": size, "completions": size, "suspend": True,
                     "template": {"metadata": {"labels": {names.LABEL_MANAGED: "true"}},
                                  "spec": {"schedulingGates": [{"name": names.GATE}],
                                           "containers": [{"name": "c", "resources": {"requests": {"cpu": "2"}}}]}}}}


def pod(name: str, owner: dict[str, Any] | None = None, labels: dict[str, str] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "ns", "uid": f"pod-{name}",
                            "labels": {names.LABEL_MANAGED: "true", **(labels or {})}}
    if owner is not None:
        meta["ownerReferences"] = [{"apiVersion": owner["apiVersion"], "kind": owner["kind"],
                                    "name": owner["metadata"]["name"], "uid": owner["metadata"]["uid"],
                                    "controller": True}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
            "spec": {"schedulingGates": [{"name": names.GATE}],
                     "containers": [{"name": "c", "resources": {"requests": {"cpu": "2"}}}]},
            "status": {"phase": "Pending"}}


def bound(p: dict[str, Any], node_name: str) -> dict[str, Any]:
    out = copy.deepcopy(p)
    out["spec"].pop("schedulingGates")
    out["spec"]["nodeName"] = node_name
    out["status"]["phase"] = "Running"
    return out


def bind_to_slots(c: Controller, g: Any, pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each pod bound to the node of its slot in ``g``, as the operator sees it come back."""
    placed = [bound(p, g.slots[g.slot_pod.index(p["metadata"]["uid"])]) for p in pods]
    for p in placed:
        c.handle(("Pod", "MODIFIED", p))
    return placed


def finished(p: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(p)
    out["status"]["phase"] = "Succeeded"
    return out


async def started_job(c: Controller, name: str, size: int) -> tuple[dict[str, Any], Any]:
    """A Job of ``size`` pods admitted and allocated: (the Job, its group)."""
    j = job(name, size)
    c.handle(("Job", "ADDED", j))
    await settle(c)
    return j, c.groups[("ns", f"job-{name}")]


async def settle(c: Controller) -> None:
    """One turn of the operator's loop: cycle, then FluxJob writes and API calls done."""
    c.scheduling.run_cycle()
    await asyncio.sleep(0)
    await c.status.flush_fluxjobs()
    while c._tasks:
        await asyncio.gather(*list(c._tasks), return_exceptions=True)


def sizes(c: Controller) -> dict[str, int]:
    sched = c.cluster.scheduler
    return {"groups": len(c.groups), "member_of": len(c.member_of), "finished": len(c.book.finished),
            "scale_groups": len(c.scaling.scale_groups), "matcher_jobs": len(c.cluster.matcher.jobs),
            "running": len(sched.running), "reservations": len(sched.reservations),
            "journal_ids": c.journal.tracked() if c.journal is not None else 0}


async def run_many(c: Controller, kube: RecordingKube, rounds: int) -> None:
    for r in range(rounds):
        # a Job of 2 and a labelled group of 3 standalone pods, at once
        j = job(f"j{r}", 2)
        c.handle(("Job", "ADDED", j))
        grp = [pod(f"g{r}-{i}", labels={names.LABEL_GROUP: f"g{r}", names.LABEL_GROUP_SIZE: "3"})
               for i in range(3)]
        for p in grp:
            c.handle(("Pod", "ADDED", p))
        await settle(c)
        assert f"j{r}" in kube.resumed
        jpods = [pod(f"j{r}-{i}", owner=j) for i in range(2)]
        for p in jpods:
            c.handle(("Pod", "ADDED", p))
        await settle(c)
        for p in [*jpods, *grp]:
            assert p["metadata"]["name"] in kube.placed
            c.handle(("Pod", "MODIFIED", bound(p, "n0")))
        for p in [*jpods, *grp]:
            c.handle(("Pod", "MODIFIED", finished(bound(p, "n0"))))
        done = copy.deepcopy(j)
        done["spec"]["suspend"] = False
        done["status"] = {"conditions": [{"type": "Complete", "status": "True"}]}
        c.handle(("Job", "MODIFIED", done))
        await settle(c)
        await settle(c)  # the final status was written: now the group may go


def make_controller(store: str | None = None) -> tuple[Controller, RecordingKube]:
    kube = RecordingKube()
    # these tests read each group's final FluxJob (what a pruned group leaves behind): every
    # group gets one (--fluxjobs all; the default, waiting, gives none to a group placed at once)
    c = Controller(kube, OperatorConfig(store=store, fluxjobs="all"))  # type: ignore[arg-type]
    for n in ("n0", "n1", "n2", "n3"):
        c.cluster.know_node(node(n))
    c.cluster.build_matcher()
    c.reconciled = True
    return c, kube


def test_finished_groups_are_forgotten_and_fluxjobs_keep_the_result() -> None:
    async def main() -> None:
        c, kube = make_controller()
        baseline = sizes(c)
        await run_many(c, kube, 40)
        assert sizes(c) == baseline
        assert kube.fluxjob_status[("ns", "job-j39")]["phase"] == "Completed"
        assert kube.fluxjob_status[("ns", "g39")]["phase"] == "Completed"
        c.status.update_queue_gauge()
        assert c.pruned == {"Completed": 80}  # the queue gauge still counts them
        # a name used again later is a new group, queued from scratch
        again = pod("again-0", labels={names.LABEL_GROUP: "g0", names.LABEL_GROUP_SIZE: "1"})
        c.handle(("Pod", "ADDED", again))
        await settle(c)
        assert str(c.groups[("ns", "g0")].phase) == "Running"

    asyncio.run(main())


def test_memory_stays_bounded_with_a_store(tmp_path: Path) -> None:
    async def main() -> None:
        c, kube = make_controller(f"sqlite:///{tmp_path / 's.db'}")
        try:
            await run_many(c, kube, 15)
            assert c.journal.drain()
            assert sizes(c)["groups"] == 0 and c.journal.tracked() == 0
            rows = c.journal.store.jobs()
            assert len(rows) == 30 and all(str(r.state) == "completed" for r in rows)
        finally:
            await c.stop()

    asyncio.run(main())


def test_unfinished_owner_keeps_its_group() -> None:
    """An Unsatisfiable Job still exists: forgetting it would queue it again on its next
    update, so it stays (bounded by the objects in the cluster)."""
    async def main() -> None:
        c, _ = make_controller()
        huge = job("huge", 2)
        huge["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "64"
        c.handle(("Job", "ADDED", huge))
        await settle(c)
        await settle(c)
        g = c.groups[("ns", "job-huge")]
        assert str(g.phase) == "Unsatisfiable"
        c.handle(("Job", "MODIFIED", huge))
        await settle(c)
        assert c.groups[("ns", "job-huge")] is g
        c.handle(("Job", "DELETED", huge))
        await settle(c)
        await settle(c)
        assert ("ns", "job-huge") not in c.groups

    asyncio.run(main())


def test_groups_kept_by_unfinished_jobs_are_looked_at_again_only_when_something_changes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Pods done, their Jobs not marked finished yet (a lagging Job controller, a mass delete):
    the groups stay, and a cycle does not look at them again until their Job changes (a sweep
    of them each cycle was a sixth of the operator's CPU); a Job's update lets its group go at
    once; a change no event reports is found by the sweep every PRUNE_SWEEP_SECONDS."""
    # imported here: bench/cycle_groups_bench.py loads this module's helpers into earlier checkouts
    from fluxnetes.k8s.groups.groupbook import PRUNE_SWEEP_SECONDS

    async def main() -> None:
        c, _ = make_controller()
        t = [1000.0]
        c.clock = lambda: t[0]
        jobs = [job(f"k{r}", 1) for r in range(12)]
        for j in jobs:
            c.handle(("Job", "ADDED", j))
        await settle(c)
        for j in jobs:
            p = pod(f"{j['metadata']['name']}-0", owner=j)
            c.handle(("Pod", "ADDED", p))
            await settle(c)
            c.handle(("Pod", "MODIFIED", finished(bound(p, "n0"))))
        await settle(c)
        await settle(c)
        keys = [("ns", f"job-k{r}") for r in range(12)]
        assert all(str(c.groups[k].phase) == "Completed" for k in keys)
        assert set(keys) <= c.book.finished  # kept: their Jobs are not finished

        looked: list[str] = []
        real = JobKind.finished

        def counted(self: JobKind, obj: Any) -> bool:
            looked.append(obj["metadata"]["name"])
            return real(self, obj)

        monkeypatch.setattr(JobKind, "finished", counted)
        for _ in range(5):
            c.scheduling.run_cycle()
        assert looked == []  # nothing changed: nothing looked at
        done = copy.deepcopy(jobs[3])
        done["status"] = {"conditions": [{"type": "Complete", "status": "True"}]}
        c.handle(("Job", "MODIFIED", done))
        looked.clear()
        c.scheduling.run_cycle()
        assert ("ns", "job-k3") not in c.groups  # its Job finished: forgotten at once
        assert looked.count("k3") >= 1 and set(looked) <= {"k3"}
        # a change no event reported (here: the cached Job edited in place) waits for the sweep
        c.book.owners[("Job", "ns", "k5")]["status"] = {"conditions": [{"type": "Complete", "status": "True"}]}
        c.scheduling.run_cycle()
        assert ("ns", "job-k5") in c.groups
        t[0] += PRUNE_SWEEP_SECONDS
        looked.clear()
        c.scheduling.run_cycle()
        assert ("ns", "job-k5") not in c.groups
        assert sorted(set(looked)) == sorted(f"k{r}" for r in range(12) if r not in (3,))
        assert len(c.book.finished) == 10

    asyncio.run(main())


def test_a_deleted_workloads_fluxjob_is_deleted_with_it() -> None:
    """Its FluxJob is owned by the workload and goes with it: the operator deletes it (its own,
    by uid) instead of writing a last status or waiting for the garbage collector (after a mass
    delete, minutes of FluxJobs shown Running for workloads long gone)."""
    async def main() -> None:
        c, kube = make_controller()
        j, g = await started_job(c, "j", 2)
        assert g.phase == Phase.RUNNING and kube.fluxjob_status[("ns", "job-j")]["phase"] == "Running"
        writes, uid = kube.fluxjob_writes, g.fj_uid
        assert uid
        c.handle(("Job", "DELETED", j))
        await settle(c)
        assert g.phase == Phase.CANCELLED and kube.fluxjob_writes == writes
        assert kube.deleted == [("/apis/fluxnetes.io/v1alpha1/namespaces/ns/fluxjobs/job-j",
                                 {"preconditions": {"uid": uid}})]
        assert not g.fj_exists
        await settle(c)
        assert len(kube.deleted) == 1  # once

    asyncio.run(main())


def test_a_single_pod_group_costs_one_event_a_gang_one_per_step() -> None:
    """kube-scheduler posts one Event per pod (Scheduled). A group of one pod costs the same:
    no group Events (Queued, Allocated) beside its pod's; a gang gets them once per group."""
    async def main() -> None:
        c, kube = make_controller()
        lone = pod("lone", labels={names.LABEL_GROUP: "lone", names.LABEL_GROUP_SIZE: "1"})
        lone["spec"]["schedulerName"] = "fluxnetes"
        lone["spec"].pop("schedulingGates", None)
        c.handle(("Pod", "ADDED", lone))
        await settle(c)
        assert str(c.groups[("ns", "lone")].phase) == "Running"
        assert kube.event_reasons == [("Pod", "Scheduled")]
        kube.event_reasons.clear()
        gang = [pod(f"gang-{i}", labels={names.LABEL_GROUP: "gang", names.LABEL_GROUP_SIZE: "3"}) for i in range(3)]
        for p in gang:
            c.handle(("Pod", "ADDED", p))
        await settle(c)
        assert sorted(kube.event_reasons) == [("FluxJob", "Allocated"), ("FluxJob", "Queued")]

    asyncio.run(main())


def test_a_single_pod_group_that_succeeds_posts_no_completed_event() -> None:
    """A group of one pod that succeeded gets no group Event for it (its FluxJob's phase, its
    pod and its workload's own Event say it: kube-scheduler's path makes no such write); a
    failed one keeps its Warning, and a gang still gets its one Completed."""
    async def main() -> None:
        c, kube = make_controller()
        lone = {}
        for name in ("ok", "bad"):
            p = pod(name, labels={names.LABEL_GROUP: name, names.LABEL_GROUP_SIZE: "1"})
            c.handle(("Pod", "ADDED", p))
            lone[name] = p
        gang = [pod(f"gang-{i}", labels={names.LABEL_GROUP: "gang", names.LABEL_GROUP_SIZE: "2"}) for i in range(2)]
        for p in gang:
            c.handle(("Pod", "ADDED", p))
        await settle(c)
        for p in [*lone.values(), *gang]:
            c.handle(("Pod", "MODIFIED", bound(p, "n0")))
        await settle(c)
        kube.event_reasons.clear()
        failed = finished(bound(lone["bad"], "n0"))
        failed["status"]["phase"] = "Failed"
        c.handle(("Pod", "MODIFIED", failed))
        for p in [lone["ok"], *gang]:
            c.handle(("Pod", "MODIFIED", finished(bound(p, "n0"))))
        await settle(c)
        assert {k: str(c.groups[("ns", k)].phase) for k in ("ok", "bad", "gang")} \
            == {"ok": "Completed", "bad": "Failed", "gang": "Completed"}
        assert sorted(kube.event_reasons) == [("FluxJob", "Completed"), ("FluxJob", "Failed")]
        assert kube.fluxjob_status[("ns", "ok")]["phase"] == "Completed"  # the FluxJob still says it

    asyncio.run(main())
