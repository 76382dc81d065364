"""Unit level (no cluster): allocation (k8s/scheduling/allocation.py): a started group's pods get one slot
each and are pinned to its node (affinity + ungate) or bound (fluxnetes as their scheduler); a
pod that ends gives back its part of the node's share; the last one ends the group."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

from fluxnetes.k8s import names
from fluxnetes.k8s.persistence.fluxjob import Phase
from fluxnetes.k8s.scheduling import allocation_note
from fluxnetes.k8s.scheduling.placement import ANN_SLOT
from test_k8s_prune import (
    RecordingKube,
    bind_to_slots,
    bound,
    finished,
    make_controller,
    pod,
    settle,
    started_job,
)


class Recording(RecordingKube):
    def __init__(self) -> None:
        super().__init__()
        self.patches: dict[str, Any] = {}
        self.bindings: list[dict[str, Any]] = []

    async def patch(self, res: Any, name: str, body: Any, namespace: str | None = None, **kw: Any) -> dict[str, Any]:
        if res.plural == "pods":
            self.patches[name] = body
        return await super().patch(res, name, body, namespace, **kw)

    async def request(self, method: str, path: str, body: Any = None, **_: Any) -> Any:
        if path.endswith("/binding"):
            self.bindings.append(body)
        return {}


def started(c: Any, pods: list[dict[str, Any]]) -> Any:
    for p in pods:
        c.handle(("Pod", "ADDED", p))
    return c.groups[("ns", "g")]


def test_pods_get_one_slot_each_pinned_to_its_node_and_release_their_share() -> None:
    async def main() -> None:
        c, _ = make_controller()
        kube = c.kube = Recording()
        pods = [pod(f"g-{i}", labels={names.LABEL_GROUP: "g", names.LABEL_GROUP_SIZE: "2"}) for i in range(2)]
        g = started(c, pods)
        await settle(c)
        assert g.phase == Phase.RUNNING and sorted(u for u in g.slot_pod if u) == ["pod-g-0", "pod-g-1"]
        for p in pods:
            ops = kube.patches[p["metadata"]["name"]]
            slot = g.slot_pod.index(p["metadata"]["uid"])
            assert {"op": "remove", "path": "/spec/schedulingGates/0"} in ops  # ungated ...
            affinity = next(o["value"] for o in ops if o["path"] == "/spec/affinity")  # ... and pinned
            term = affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]
            assert term["matchFields"][0]["values"] == [g.slots[slot]]
            ann = next(o["value"] for o in ops if o["path"] == "/metadata/annotations")
            # (the group's whole allocation rides on each of its placements: allocation_note.py)
            note = allocation_note.encode(g.jobid, g.slots, g.alloc)
            assert note is not None
            assert ann == {names.ANN_FLUXJOB: "g", ANN_SLOT: str(slot), names.ANN_ALLOCATION: note}
        before = sum(s.cores for s in g.held.values())
        c.handle(("Pod", "MODIFIED", finished(bound(pods[0], g.slots[g.slot_pod.index("pod-g-0")]))))
        assert g.phase == Phase.RUNNING and len(g.released) == 1
        assert sum(s.cores for s in g.held.values()) == before - 2  # its 2 cpu went back
        assert sum(n.cores for n in c.cluster.matcher.jobs[g.jobid].nodes) == before - 2
        c.handle(("Pod", "MODIFIED", finished(bound(pods[1], g.slots[g.slot_pod.index("pod-g-1")]))))
        assert g.phase == Phase.COMPLETED and not g.held and g.jobid not in c.cluster.matcher.jobs

    asyncio.run(main())


def test_pods_fluxnetes_schedules_are_bound_to_their_slots_node() -> None:
    async def main() -> None:
        c, _ = make_controller()
        kube = c.kube = Recording()
        pods = [pod(f"g-{i}", labels={names.LABEL_GROUP: "g", names.LABEL_GROUP_SIZE: "2"}) for i in range(2)]
        for p in pods:  # held by their scheduler name instead of a gate (--placement bind)
            del p["spec"]["schedulingGates"]
            p["spec"]["schedulerName"] = names.SCHEDULER_NAME
        g = started(c, pods)
        await settle(c)
        assert g.phase == Phase.RUNNING and not kube.patches
        targets = sorted((b["metadata"]["name"], b["target"]["name"]) for b in kube.bindings)
        assert targets == sorted((f"g-{i}", g.slots[g.slot_pod.index(f"pod-g-{i}")]) for i in range(2))

    asyncio.run(main())


def test_a_cancelled_job_gives_everything_back() -> None:
    async def main() -> None:
        c, _ = make_controller()
        j, g = await started_job(c, "j", 3)
        assert g.phase == Phase.RUNNING and g.jobid in c.cluster.matcher.jobs and g.resumed
        c.handle(("Job", "DELETED", j))
        assert g.phase == Phase.CANCELLED and g.jobid not in c.cluster.matcher.jobs
        assert not g.held and g.released == set(range(len(g.slots)))

    asyncio.run(main())


def deleting(p: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(p)
    out["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return out


def test_a_deleted_jobs_room_goes_back_only_as_its_pods_go() -> None:
    """Deleting a Job whose pods run (or a pod being deleted) gives no room back until that
    pod is gone or has ended: the kubelet and kube-scheduler still count it on its node."""
    async def main() -> None:
        c, _ = make_controller()
        j, g = await started_job(c, "j", 2)
        pods = [pod(f"j-{i}", owner=j) for i in range(2)]
        for p in pods:
            c.handle(("Pod", "ADDED", p))
        await settle(c)
        assert g.phase == Phase.RUNNING and all(g.slot_pod)
        placed = bind_to_slots(c, g, pods)
        cores = sum(s.cores for s in g.held.values())
        c.handle(("Job", "DELETED", j))
        assert g.phase == Phase.CANCELLED
        assert sum(s.cores for s in g.held.values()) == cores and g.jobid in c.cluster.matcher.jobs  # both still run
        c.handle(("Pod", "MODIFIED", deleting(placed[0])))  # being deleted: still on its node
        assert sum(s.cores for s in g.held.values()) == cores
        c.handle(("Pod", "DELETED", deleting(placed[0])))
        assert sum(s.cores for s in g.held.values()) == cores - 2
        assert sum(n.cores for n in c.cluster.matcher.jobs[g.jobid].nodes) == cores - 2
        c.handle(("Pod", "MODIFIED", finished(deleting(placed[1]))))  # ended: its room is free
        assert not g.held and g.jobid not in c.cluster.matcher.jobs

    asyncio.run(main())


def test_a_foreign_pod_being_deleted_keeps_its_room_until_it_is_gone() -> None:
    async def main() -> None:
        c, _ = make_controller()
        await settle(c)
        other = bound(pod("other"), "n0")
        other["metadata"]["labels"] = {}
        c.handle(("Pod", "ADDED", other))
        c.handle(("Pod", "MODIFIED", deleting(other)))
        assert "pod-other" in c.cluster.foreign["n0"]
        c.handle(("Pod", "DELETED", deleting(other)))
        assert "pod-other" not in c.cluster.foreign.get("n0", {})

    asyncio.run(main())


class Restarting(Recording):
    """The API server restarts: the first pod writes fail to connect, later ones go through."""

    def __init__(self, failures: int) -> None:
        super().__init__()
        self.failures = failures

    async def patch(self, res: Any, name: str, body: Any, namespace: str | None = None, **kw: Any) -> dict[str, Any]:
        if res.plural == "pods" and self.failures > 0:
            self.failures -= 1
            raise ConnectionRefusedError(111, "Connect call failed")
        return await super().patch(res, name, body, namespace, **kw)


def test_a_placement_lost_to_an_api_server_restart_is_sent_again() -> None:
    """Issue #11's soak: a placement refused while the API server restarted was dropped, the
    pod stayed gated in its slot for good (until the next operator restart)."""
    async def main() -> None:
        c, _ = make_controller()
        kube = c.kube = Restarting(failures=2)
        pods = [pod(f"g-{i}", labels={names.LABEL_GROUP: "g", names.LABEL_GROUP_SIZE: "2"}) for i in range(2)]
        g = started(c, pods)
        await settle(c)
        assert g.phase == Phase.RUNNING and kube.failures == 0
        assert sorted(kube.patches) == ["g-0", "g-1"]  # both placed in the end

    asyncio.run(main())


def test_a_job_past_its_deadline_says_so() -> None:
    """Issue #29.4: a Job that ends DeadlineExceeded (the Job controller deletes its running
    pods) is Failed with the Job's own reason, not '0 pod(s) failed'."""
    async def main() -> None:
        c, kube = make_controller()
        j, g = await started_job(c, "j", 2)
        pods = [pod(f"j-{i}", owner=j) for i in range(2)]
        for p in pods:
            c.handle(("Pod", "ADDED", p))
        await settle(c)
        placed = bind_to_slots(c, g, pods)
        over = copy.deepcopy(j)
        over["spec"]["suspend"] = False
        over["status"] = {"conditions": [{"type": "Failed", "status": "True", "reason": "DeadlineExceeded",
                                          "message": "Job was active longer than specified deadline"}]}
        c.handle(("Job", "MODIFIED", over))
        assert g.phase == Phase.RUNNING  # its pods still run: their room is theirs until they go
        for p in placed:
            c.handle(("Pod", "DELETED", deleting(p)))
        await settle(c)
        assert g.phase == Phase.FAILED and not g.held
        assert g.reason == ("Job j failed: DeadlineExceeded: Job was active longer than specified "
                            "deadline"), g.reason
        assert kube.fluxjob_status[("ns", "job-j")]["reason"] == g.reason

    asyncio.run(main())


def test_a_gated_pod_labelled_held_by_the_scheduler_name_has_the_label_taken_off() -> None:
    """The gate's guard (ValidatingAdmissionPolicy, webhook) skips pods labelled
    fluxnetes.io/hold=scheduler-name; the webhook never leaves that label on a gated pod, but
    a webhook that did not know it (before the upgrade, or an old replica serving while a new
    one had installed the guard's selector) kept its user's. The operator takes it off such a
    pod when it sees it, so the guard sees its gate again; a pod held by the name keeps it.
    (Was: nothing did; its user could lift the gate and kube-scheduler placed it.)"""
    import asyncio

    from fluxnetes.k8s import names
    from fluxnetes.k8s.admission.hold import forged_hold_label_patch
    from test_k8s_prune import make_controller, pod, settle

    patches: list[tuple[str, object, str]] = []

    async def main() -> None:
        c, kube = make_controller()
        recorded = kube.patch

        async def patch(res: object, name: str, body: object, namespace: str | None = None, **kw: object) -> object:
            patches.append((name, body, str(kw.get("content_type", ""))))
            return await recorded(res, name, body, namespace, **kw)

        kube.patch = patch  # type: ignore[method-assign]
        forged = pod("forged", labels={names.LABEL_HOLD: names.HOLD_SCHEDULER_NAME})
        forged["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "64"  # (never placed here)
        plain = pod("plain")
        plain["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "64"
        for p in (forged, plain):
            c.handle(("Pod", "ADDED", p))
        await settle(c)
        path = "/metadata/labels/fluxnetes.io~1hold"
        assert patches == [("forged", [{"op": "test", "path": path, "value": "scheduler-name"},
                                       {"op": "remove", "path": path}], "application/json-patch+json")]

    asyncio.run(main())
    named = pod("named", labels={names.LABEL_HOLD: names.HOLD_SCHEDULER_NAME})
    named["spec"].pop("schedulingGates")
    named["spec"]["schedulerName"] = names.SCHEDULER_NAME
    assert forged_hold_label_patch(named) is None  # held by the name, no gate: the label is right
