"""Unit level (no cluster): the group book (k8s/groups/groupbook.py): pods join their group, a pod-made
group waits Provisional until it is complete, a pod that goes before the start makes it wait
again, pods that come before their owner wait for it, a workload made again under its old
name is a new workload."""

from __future__ import annotations

import asyncio
from typing import Any

from fluxnetes.k8s import names
from fluxnetes.k8s.persistence.fluxjob import Phase
from test_k8s_prune import job, make_controller, pod, settle


def labelled(name: str) -> dict[str, Any]:
    return pod(name, labels={names.LABEL_GROUP: "g", names.LABEL_GROUP_SIZE: "3"})


def replicaset(name: str, replicas: int) -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": "ReplicaSet",
            "metadata": {"name": name, "namespace": "ns", "uid": f"rs-{name}"},
            "spec": {"replicas": replicas,
                     "template": {"metadata": {"labels": {names.LABEL_MANAGED: "true"}},
                                  "spec": {"containers": [{"name": "c"}]}}}}


def test_a_label_group_waits_until_complete_and_again_when_a_pod_goes() -> None:
    async def main() -> None:
        c, _ = make_controller()
        pods = [labelled(f"g-{i}") for i in range(3)]
        c.handle(("Pod", "ADDED", pods[0]))
        c.handle(("Pod", "ADDED", pods[1]))
        g = c.groups[("ns", "g")]
        assert g.phase == Phase.PROVISIONAL and g.reason == "waiting for the group: 2/3 pods"
        assert c.member_of == {"pod-g-0": ("ns", "g"), "pod-g-1": ("ns", "g")}
        c.handle(("Pod", "ADDED", pods[2]))
        assert g.phase == Phase.PENDING and g.submit is not None
        c.handle(("Pod", "DELETED", pods[2]))  # gone before the group started
        assert g.phase == Phase.PROVISIONAL and g.reason == "waiting for the group: 2/3 pods"
        assert "pod-g-2" not in c.member_of
        for p in pods[:2]:
            c.handle(("Pod", "DELETED", p))
        assert g.phase == Phase.CANCELLED and not c.member_of
        await settle(c)

    asyncio.run(main())


def test_pods_before_their_owner_are_parked_then_join_its_group() -> None:
    async def main() -> None:
        c, _ = make_controller()
        rs = replicaset("web", 2)
        pods = [pod(f"web-{i}", owner=rs) for i in range(2)]
        for p in pods:
            c.handle(("Pod", "ADDED", p))
        assert set(c.book.parked) == {"pod-web-0", "pod-web-1"} and not c.groups
        c.handle(("ReplicaSet", "ADDED", rs))
        assert not c.book.parked
        g = c.groups[("ns", "replicaset-web")]
        assert set(g.members) == {"pod-web-0", "pod-web-1"} and g.phase == Phase.PENDING
        assert g.spec.owner is not None and g.spec.owner.uid == "rs-web"
        await settle(c)

    asyncio.run(main())


def test_a_job_made_again_under_its_name_cancels_and_replaces_the_earlier_group() -> None:
    async def main() -> None:
        c, _ = make_controller()
        old = job("j", 2)
        c.handle(("Job", "ADDED", old))
        await settle(c)
        first = c.groups[("ns", "job-j")]
        assert first.phase == Phase.RUNNING and first.jobid in c.cluster.matcher.jobs
        new = job("j", 1)
        new["metadata"]["uid"] = "job-j-again"
        c.handle(("Job", "ADDED", new))
        assert first.phase == Phase.CANCELLED and first.jobid not in c.cluster.matcher.jobs
        second = c.groups[("ns", "job-j")]
        assert second is not first and second.spec.size == 1
        assert second.spec.owner is not None and second.spec.owner.uid == "job-j-again"
        c.handle(("Pod", "ADDED", pod("j-old", owner=old)))  # a pod of the earlier Job
        assert "pod-j-old" not in second.members

    asyncio.run(main())


def _named(obj: dict[str, Any], spec: dict[str, Any]) -> None:
    """What its user wrote where no webhook ran: schedulerName fluxnetes, no label, no gate."""
    (obj["metadata"].get("labels") or {}).pop(names.LABEL_MANAGED, None)
    spec.pop("schedulingGates", None)
    spec["schedulerName"] = names.SCHEDULER_NAME


def test_workloads_naming_fluxnetes_as_their_scheduler_are_placed_without_the_webhook() -> None:
    """A namespace without the label (no webhook call): a Job and a labelled group of bare
    pods whose user wrote schedulerName: fluxnetes are fluxnetes' own, queued and bound;
    a pod naming another scheduler is not."""
    async def main() -> None:
        c, kube = make_controller()
        j = job("mpi", 3)
        j["metadata"].pop("annotations")  # not suspended: no webhook saw it
        j["spec"].pop("suspend")
        tmpl = j["spec"]["template"]
        tmpl["metadata"].pop("labels")
        _named(tmpl, tmpl["spec"])
        c.handle(("Job", "ADDED", j))
        assert c.groups[("ns", "job-mpi")].phase == Phase.PENDING  # known from the Job itself
        pods = [pod(f"mpi-{i}", owner=j) for i in range(3)] + [labelled(f"g-{i}") for i in range(3)]
        other = pod("volcano")
        for p in [*pods, other]:
            _named(p, p["spec"])
        other["spec"]["schedulerName"] = "volcano"
        for p in [*pods, other]:
            c.handle(("Pod", "ADDED", p))
        assert "pod-volcano" not in c.member_of
        await settle(c)
        assert c.groups[("ns", "job-mpi")].phase == Phase.RUNNING
        assert c.groups[("ns", "g")].phase == Phase.RUNNING
        assert sorted(kube.placed) == sorted(p["metadata"]["name"] for p in pods)  # Bindings
        assert kube.resumed == []  # nothing to resume: the Job was never suspended

    asyncio.run(main())


def test_a_group_going_on_under_a_new_store_row_counts_its_suffix_up() -> None:
    """Preempted and queued again, suspended by its user, or an Unsatisfiable group judged
    again: the group's earlier store row is final and it goes on under ``uid~requeue-N``
    (Group.new_store_row, the one place that counts N)."""
    from fluxnetes.k8s.groups import GroupSpec
    from fluxnetes.k8s.groups.group import Group
    from fluxnetes.k8s.resources import PodResources

    g = Group(spec=GroupSpec(namespace="ns", name="g", size=1, request=PodResources(1000, 0, 0, {}),
                             duration=0, priority=0, owner=None), phase=Phase.PENDING)
    g.store_id = 7
    seen = []
    for base in ("job-g", None, None, "a~requeue-x", "~requeue-3"):
        g.new_store_row(g.store_uid if base is None else base)
        seen.append(g.store_uid)
        assert g.store_id is None
    assert seen == ["job-g~requeue-1", "job-g~requeue-2", "job-g~requeue-3",
                    "a~requeue-x~requeue-1", "~requeue-3~requeue-1"]
