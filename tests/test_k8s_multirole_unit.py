"""Unit level (no cluster): the operator's multi-role part (k8s/groups/podset_groups.py) driven by
watch events: one group of pod sets per workload, resumed once allocated, each pod in a slot
of its own set (a re-created pod in its predecessor's), the objects a controller makes for a
workload never grouped, one gang per LeaderWorkerSet replica, a TrainJob's group made once
its JobSet is known. The real controllers: tests/test_k8s_multirole.py."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

from fluxnetes.k8s import names
from fluxnetes.k8s.persistence.fluxjob import Phase
from fluxnetes.k8s.workloads import ADDON_KINDS
from fluxnetes.k8s.workloads.base import ANN_SUSPENDED_BY, SUSPENDED_BY_US
from test_k8s_prune import RecordingKube, bound, make_controller, settle


class Recording(RecordingKube):
    def __init__(self) -> None:
        super().__init__()
        self.workload_patches: list[tuple[str, str, Any]] = []

    async def patch(self, res: Any, name: str, body: Any, namespace: str | None = None, **kw: Any) -> dict[str, Any]:
        if res.plural not in ("pods", "jobs", "fluxjobs"):
            self.workload_patches.append((res.plural, name, body))
        return await super().patch(res, name, body, namespace, **kw)


def tmpl(cpu: str) -> dict[str, Any]:
    return {"metadata": {"labels": {names.LABEL_MANAGED: "true"}},
            "spec": {"schedulingGates": [{"name": names.GATE}],
                     "containers": [{"name": "c", "resources": {"requests": {"cpu": cpu}}}]}}


def mpijob(name: str, workers: int, worker_cpu: str = "8", annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {"apiVersion": "kubeflow.org/v2beta1", "kind": "MPIJob",
            "metadata": {"name": name, "namespace": "ns", "uid": f"mpi-{name}",
                         "annotations": {ANN_SUSPENDED_BY: SUSPENDED_BY_US, **(annotations or {})}},
            "spec": {"runPolicy": {"suspend": True}, "mpiReplicaSpecs": {
                "Launcher": {"replicas": 1, "template": tmpl("1")},
                "Worker": {"replicas": workers, "template": tmpl(worker_cpu)}}}}


def mpi_pod(job: dict[str, Any], role: str, index: int | None, cpu: str, uid: str | None = None) -> dict[str, Any]:
    name = f"{job['metadata']['name']}-{role}" + ("" if index is None else f"-{index}")
    labels = {names.LABEL_MANAGED: "true", "training.kubeflow.org/job-name": job["metadata"]["name"],
              "training.kubeflow.org/job-role": role, "training.kubeflow.org/operator-name": "mpi-operator"}
    if index is not None:
        labels["training.kubeflow.org/replica-index"] = str(index)
    owner = {"apiVersion": "kubeflow.org/v2beta1", "kind": "MPIJob", "name": job["metadata"]["name"],
             "uid": job["metadata"]["uid"], "controller": True}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "ns", "uid": uid or f"pod-{name}", "labels": labels,
                         "ownerReferences": [owner]},
            "spec": {"schedulingGates": [{"name": names.GATE}],
                     "containers": [{"name": "c", "resources": {"requests": {"cpu": cpu}}}]},
            "status": {"phase": "Pending"}}


def controller(kinds_on: bool = True) -> tuple[Any, Recording]:
    c, _ = make_controller()  # 4 nodes of 16 cpu
    kube = c.kube = Recording()
    if kinds_on:  # every multi-role kind served (their informers made, not started)
        c.podsets.enable_addons({(k.api_version, k.plural) for k in ADDON_KINDS.values()}, started=False)
    return c, kube


def test_mpijob_is_one_gang_of_two_pod_sets_resumed_then_placed_per_set() -> None:
    async def main() -> None:
        c, kube = controller()
        job = mpijob("pi", 4)
        c.handle(("MPIJob", "ADDED", job))
        g = c.groups[("ns", "mpijob-pi")]
        assert g.phase == Phase.PENDING and g.spec.size == 5
        assert [(s.name, s.count) for s in g.sets] == [("launcher", 1), ("worker", 4)]
        await settle(c)
        assert g.phase == Phase.RUNNING and g.slot_set == ["launcher"] + ["worker"] * 4
        # resumed, and fluxnetes' hold mark taken off with the hold (a later suspension is its user's)
        assert ("mpijobs", "pi", {"spec": {"runPolicy": {"suspend": False}},
                                  "metadata": {"annotations": {"fluxnetes.io/suspended-by": None}}}) \
            in kube.workload_patches
        # the FluxJob status shows the pod sets, each one's own request (kubectl fluxnetes
        # charges each set its shape) and the node of each of their slots
        assert kube.fluxjob_status[("ns", "mpijob-pi")]["podSets"] == [
            {"name": "launcher", "count": 1, "request": {"cpu": 1000}, "nodes": g.slots[:1]},
            {"name": "worker", "count": 4, "request": {"cpu": 8000}, "nodes": g.slots[1:]}]
        pods = [mpi_pod(job, "worker", i, "8") for i in (3, 1, 0, 2)] + [mpi_pod(job, "launcher", None, "1")]
        for p in pods:
            c.handle(("Pod", "ADDED", p))
        await settle(c)
        for p in pods:
            slot = g.slot_pod.index(p["metadata"]["uid"])
            labels = p["metadata"]["labels"]
            assert g.slot_set[slot] == labels["training.kubeflow.org/job-role"]
            if "training.kubeflow.org/replica-index" in labels:  # worker i: the set's slot i
                assert slot == 1 + int(labels["training.kubeflow.org/replica-index"])
        # worker 2 is deleted and re-created: it goes back to its slot's node
        w2 = pods[3]
        slot = g.slot_pod.index(w2["metadata"]["uid"])
        c.handle(("Pod", "DELETED", bound(w2, g.slots[slot])))
        assert g.phase == Phase.RUNNING and slot not in g.released  # its share waits for the new pod
        again = mpi_pod(job, "worker", 2, "8", uid="pod-new-worker-2")
        c.handle(("Pod", "ADDED", again))
        await settle(c)
        assert g.slot_pod[slot] == "pod-new-worker-2"

    asyncio.run(main())


def test_mpijob_that_cannot_fit_whole_starts_nothing() -> None:
    async def main() -> None:
        c, kube = controller()
        c.handle(("MPIJob", "ADDED", mpijob("big", 8, "16")))  # 8 whole nodes + a launcher: 4 exist
        await settle(c)
        g = c.groups[("ns", "mpijob-big")]
        assert g.phase == Phase.UNSATISFIABLE and not kube.workload_patches

    asyncio.run(main())


def test_exclusive_mpijob_gives_every_pod_its_own_node() -> None:
    async def main() -> None:
        c, _ = controller()
        c.handle(("MPIJob", "ADDED", mpijob("x", 3, "1", {"fluxnetes.io/exclusive": "node"})))
        await settle(c)
        g = c.groups[("ns", "mpijob-x")]
        assert g.phase == Phase.RUNNING and len(set(g.slots)) == 4

    asyncio.run(main())


def test_objects_made_for_a_workload_are_never_grouped() -> None:
    async def main() -> None:
        c, _ = controller()
        launcher_job = {"apiVersion": "batch/v1", "kind": "Job",
                        "metadata": {"name": "pi-launcher", "namespace": "ns", "uid": "job-1",
                                     "ownerReferences": [{"apiVersion": "kubeflow.org/v2beta1", "kind": "MPIJob",
                                                          "name": "pi", "uid": "mpi-pi", "controller": True}]},
                        "spec": {"suspend": True, "parallelism": 1, "template": tmpl("1")}}
        c.handle(("Job", "ADDED", launcher_job))
        assert not c.groups

    asyncio.run(main())


def test_pod_of_an_unknown_workload_waits_for_it() -> None:
    async def main() -> None:
        c, _ = controller()
        job = mpijob("late", 1)
        p = mpi_pod(job, "worker", 0, "8")
        c.handle(("Pod", "ADDED", p))
        assert not c.groups and p["metadata"]["uid"] in c.book.parked
        c.handle(("MPIJob", "ADDED", job))
        g = c.groups[("ns", "mpijob-late")]
        assert p["metadata"]["uid"] in g.members and not c.book.parked

    asyncio.run(main())


def lws(replicas: int) -> dict[str, Any]:
    return {"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet",
            "metadata": {"name": "serve", "namespace": "ns", "uid": "lws-1"},
            "spec": {"replicas": replicas, "leaderWorkerTemplate": {
                "size": 3, "leaderTemplate": tmpl("2"), "workerTemplate": tmpl("1")}}}


def lws_pod(group: int, worker: int) -> dict[str, Any]:
    name = f"serve-{group}" + ("" if worker == 0 else f"-{worker}")
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "ns", "uid": f"pod-{name}",
                         "labels": {names.LABEL_MANAGED: "true", "leaderworkerset.sigs.k8s.io/name": "serve",
                                    "leaderworkerset.sigs.k8s.io/group-index": str(group),
                                    "leaderworkerset.sigs.k8s.io/worker-index": str(worker)}},
            "spec": {"schedulingGates": [{"name": names.GATE}],
                     "containers": [{"name": "c", "resources": {"requests": {"cpu": "2" if worker == 0 else "1"}}}]},
            "status": {"phase": "Pending"}}


def test_lws_is_a_gang_per_replica_scaled_up_and_down() -> None:
    async def main() -> None:
        c, _ = controller()
        c.handle(("LeaderWorkerSet", "ADDED", lws(2)))
        keys = [("ns", "leaderworkerset-serve-0"), ("ns", "leaderworkerset-serve-1")]
        assert sorted(c.groups) == keys and all(c.groups[k].phase == Phase.PROVISIONAL for k in keys)
        for gi in (0, 1):
            for w in range(3):
                c.handle(("Pod", "ADDED", lws_pod(gi, w)))
        await settle(c)
        assert all(c.groups[k].phase == Phase.RUNNING for k in keys)
        c.handle(("LeaderWorkerSet", "MODIFIED", lws(3)))
        assert ("ns", "leaderworkerset-serve-2") in c.groups
        c.handle(("LeaderWorkerSet", "MODIFIED", lws(1)))
        assert c.groups[keys[1]].phase == Phase.CANCELLED and c.groups[keys[0]].phase == Phase.RUNNING

    asyncio.run(main())


def test_lws_unsatisfiable_replicas_scaled_away_are_cancelled() -> None:
    """Issue #29 item 2: a scale-down ends the gangs of the replicas it removes, Unsatisfiable
    ones too (they stayed Unsatisfiable, their FluxJobs saying so after their pods went)."""
    def big(replicas: int) -> dict[str, Any]:
        obj = lws(replicas)
        obj["spec"]["leaderWorkerTemplate"].update(size=5, workerTemplate=tmpl("16"))
        return obj

    async def main() -> None:
        c, _ = controller()
        c.handle(("LeaderWorkerSet", "ADDED", big(2)))
        keys = [("ns", "leaderworkerset-serve-0"), ("ns", "leaderworkerset-serve-1")]
        for gi in (0, 1):
            for w in range(5):
                p = lws_pod(gi, w)
                p["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "2" if w == 0 else "16"
                c.handle(("Pod", "ADDED", p))
        await settle(c)
        assert [c.groups[k].phase for k in keys] == [Phase.UNSATISFIABLE] * 2
        c.handle(("LeaderWorkerSet", "MODIFIED", big(1)))
        assert c.groups[keys[1]].phase == Phase.CANCELLED and c.groups[keys[0]].phase == Phase.UNSATISFIABLE
        assert "scaled down" in c.groups[keys[1]].reason

    asyncio.run(main())


def test_trainjob_group_is_made_once_its_jobset_is_known() -> None:
    async def main() -> None:
        c, _ = controller()
        tj = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
              "metadata": {"name": "mnist", "namespace": "ns", "uid": "tj-1",
                           "annotations": {ANN_SUSPENDED_BY: SUSPENDED_BY_US}},
              "spec": {"suspend": True, "trainer": {"numNodes": 2}}}
        c.handle(("TrainJob", "ADDED", tj))
        assert not c.groups
        js = {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
              "metadata": {"name": "mnist", "namespace": "ns", "uid": "js-1",
                           "ownerReferences": [{"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
                                                "name": "mnist", "uid": "tj-1", "controller": True}]},
              "spec": {"suspend": True, "replicatedJobs": [
                  {"name": "node", "replicas": 1, "template": {"spec": {"parallelism": 2, "completions": 2,
                                                                        "template": tmpl("2")}}}]}}
        c.handle(("JobSet", "ADDED", copy.deepcopy(js)))
        assert list(c.groups) == [("ns", "trainjob-mnist")]  # the TrainJob's, not its JobSet's
        g = c.groups[("ns", "trainjob-mnist")]
        assert [(s.name, s.count) for s in g.sets] == [("node", 2)] and g.phase == Phase.PENDING

    asyncio.run(main())


def test_explain_shows_the_pod_sets_and_their_nodes() -> None:
    from fluxnetes.cli.ctl.explain import pod_sets_of
    from fluxnetes.jobspec.packing import Packing
    from fluxnetes.jobspec.pods import PodRequest
    from fluxnetes.jobspec.podsets import PodSet, jobspec_from_podsets

    sets = [PodSet("launcher", 1, PodRequest(1000)), PodSet("worker", 3, PodRequest(4000))]
    for packing in (Packing(), Packing(exclusive=True), Packing(pack="rack", exclusive=True)):
        text = jobspec_from_podsets(sets, packing=packing, name="mpijob-pi").to_yaml()
        got = pod_sets_of({"jobspec": text}, ["a", "b", "c", "d"])
        assert got == [{"name": "launcher", "count": 1, "nodes": ["a"]},
                       {"name": "worker", "count": 3, "nodes": ["b", "c", "d"]}], packing
    one = jobspec_from_podsets([PodSet("main", 2, PodRequest(1000))], name="job-x").to_yaml()
    assert pod_sets_of({"jobspec": one}, []) == [] and pod_sets_of({}, []) == []


def test_a_kind_turns_on_when_its_crd_is_served() -> None:
    async def main() -> None:
        c, _ = controller(kinds_on=False)
        before = len(c.informers)
        assert c.podsets.enable_addons({("kubeflow.org/v2beta1", "mpijobs")}, started=False) == ["MPIJob"]
        # TrainJob needs JobSet: served alone it stays off
        served = {("kubeflow.org/v2beta1", "mpijobs"), ("trainer.kubeflow.org/v1alpha1", "trainjobs")}
        assert c.podsets.enable_addons(served, started=True) == []
        served.add(("jobset.x-k8s.io/v1alpha2", "jobsets"))
        assert c.podsets.enable_addons(served, started=True) == ["JobSet", "TrainJob"]
        assert sorted(c.podsets.addon_on) == ["JobSet", "MPIJob", "TrainJob"]
        assert [i.kind for i in c.informers[before:]] == ["MPIJob", "JobSet", "TrainJob"]
        for t in list(c._tasks):
            t.cancel()
        await asyncio.gather(*c._tasks, return_exceptions=True)

    asyncio.run(main())


def test_a_group_recovered_after_a_restart_gets_its_pod_sets_back() -> None:
    async def main() -> None:
        from fluxnetes.k8s.persistence import fluxjob as fj_mod

        c, kube = controller()
        job = mpijob("pi", 2)
        c.handle(("MPIJob", "ADDED", job))
        await settle(c)
        g = c.groups[("ns", "mpijob-pi")]
        assert g.phase == Phase.RUNNING
        body = fj_mod.manifest(g.spec, jobspec=c.status.jobspec_text(g), match_policy=c.config.match_policy)
        body["metadata"]["uid"] = "fj-1"
        body["status"] = kube.fluxjob_status[("ns", "mpijob-pi")]
        # a new operator: the FluxJob, then the (resumed) MPIJob and its pods as the watch replays them
        c2, _ = controller()
        c2.reconciled = False
        resumed = copy.deepcopy(job)
        resumed["spec"]["runPolicy"]["suspend"] = False
        c2.book.set_owner("MPIJob", "ns", "pi", resumed)
        c2.recovery.recover([body], set())
        c2.handle(("MPIJob", "ADDED", resumed))
        g2 = c2.groups[("ns", "mpijob-pi")]
        assert g2.kind is not None and g2.kind.kind == "MPIJob"
        assert g2.slot_set == ["launcher", "worker", "worker"] and g2.slots == g.slots
        c2.reconciled = True
        again = mpi_pod(job, "worker", 1, "8", uid="pod-w1-new")
        c2.handle(("Pod", "ADDED", again))
        await settle(c2)
        assert g2.slot_pod[2] == "pod-w1-new"  # worker 1: the worker set's second slot

    asyncio.run(main())


def test_a_kind_the_operator_may_not_list_stays_off_with_a_line_saying_why() -> None:
    from fluxnetes.k8s.groups.podset_groups import addon_kinds_served
    from fluxnetes.k8s.kube import ApiError

    class Discovery:
        async def request(self, method: str, path: str, body: Any = None, **_: Any) -> Any:
            if path.startswith("/apis/kubeflow.org/v2beta1/mpijobs"):
                raise ApiError(403, {"reason": "Forbidden"}, method, path)
            if path == "/apis/kubeflow.org/v2beta1":
                return {"groupVersion": "kubeflow.org/v2beta1", "resources": [{"name": "mpijobs"}]}
            if path == "/apis/jobset.x-k8s.io/v1alpha2":
                return {"groupVersion": "jobset.x-k8s.io/v1alpha2", "resources": [{"name": "jobsets"}]}
            if path.startswith("/apis/jobset.x-k8s.io/v1alpha2/jobsets"):
                return {"items": []}
            raise ApiError(404, {}, method, path)

    lines: list[str] = []
    kinds = asyncio.run(addon_kinds_served(Discovery(), lines.append))  # type: ignore[arg-type]
    assert [k.kind for k in kinds] == ["JobSet"]
    assert [line for line in lines if "MPIJob" in line] == [
        "workload kind MPIJob is off: the operator may not list mpijobs.kubeflow.org (HTTP 403); "
        "grant get, list, watch and patch on it"]
    assert any("LeaderWorkerSet is off" in line and "CRD not installed" in line for line in lines)


def test_mpijob_pods_that_succeed_give_their_share_back_one_by_one() -> None:
    async def main() -> None:
        from test_k8s_prune import finished

        c, _ = controller()
        job = mpijob("done", 2)
        c.handle(("MPIJob", "ADDED", job))
        await settle(c)
        g = c.groups[("ns", "mpijob-done")]
        pods = [mpi_pod(job, "launcher", None, "1"), mpi_pod(job, "worker", 0, "8"), mpi_pod(job, "worker", 1, "8")]
        for p in pods:
            c.handle(("Pod", "ADDED", p))
        await settle(c)
        held = sum(s.cores for s in g.held.values())
        w0 = pods[1]
        c.handle(("Pod", "MODIFIED", finished(bound(w0, g.slots[g.slot_pod.index(w0["metadata"]["uid"])]))))
        assert g.phase == Phase.RUNNING and sum(s.cores for s in g.held.values()) == held - 8
        for p in (pods[0], pods[2]):
            c.handle(("Pod", "MODIFIED", finished(bound(p, g.slots[g.slot_pod.index(p["metadata"]["uid"])]))))
        assert g.phase == Phase.COMPLETED and not g.held

    asyncio.run(main())


def test_a_workload_that_succeeded_completes_its_group_though_its_controller_deletes_pods() -> None:
    async def main() -> None:
        c, _ = controller()
        job = mpijob("ok", 2)
        c.handle(("MPIJob", "ADDED", job))
        await settle(c)
        g = c.groups[("ns", "mpijob-ok")]
        pods = [mpi_pod(job, "worker", i, "8") for i in (0, 1)]
        for p in pods:
            c.handle(("Pod", "ADDED", p))
        await settle(c)
        done = copy.deepcopy(job)
        done["spec"]["runPolicy"]["suspend"] = False
        done["status"] = {"conditions": [{"type": "Succeeded", "status": "True"}]}
        c.handle(("MPIJob", "MODIFIED", done))  # cleanPodPolicy then deletes the running workers
        for p in pods:
            c.handle(("Pod", "DELETED", bound(p, g.slots[g.slot_pod.index(p["metadata"]["uid"])])))
        assert g.phase == Phase.COMPLETED and not g.held

    asyncio.run(main())


def test_a_succeeded_mpijob_keeps_its_workers_nodes_until_they_end() -> None:
    """An MPIJob is Succeeded when its launcher ends; its workers run on until the MPI
    Operator deletes them (minutes under load: bench/mpijob_bench.py at 1,000 nodes). Giving
    their nodes back at the Succeeded condition let the next gang start its launcher there
    while its workers stayed pending: a partial run. Each node goes back as its pod ends."""
    from test_k8s_prune import finished

    async def main() -> None:
        c, _ = controller()  # 4 nodes of 16 cpu: the 2 workers of 16 cpu take 2 whole nodes
        job = mpijob("ok", 2, worker_cpu="16")
        c.handle(("MPIJob", "ADDED", job))
        await settle(c)
        g = c.groups[("ns", "mpijob-ok")]
        pods = [mpi_pod(job, "launcher", None, "1")] + [mpi_pod(job, "worker", i, "16") for i in (0, 1)]
        for p in pods:
            c.handle(("Pod", "ADDED", p))
        await settle(c)
        on = {p["metadata"]["uid"]: g.slots[g.slot_pod.index(p["metadata"]["uid"])] for p in pods}
        placed = [bound(p, on[p["metadata"]["uid"]]) for p in pods]
        for p in placed:
            c.handle(("Pod", "MODIFIED", p))
        c.handle(("Pod", "MODIFIED", finished(placed[0])))  # the launcher ends
        done = copy.deepcopy(job)
        done["spec"]["runPolicy"]["suspend"] = False
        done["status"] = {"conditions": [{"type": "Succeeded", "status": "True"}]}
        c.handle(("MPIJob", "MODIFIED", done))
        workers = sorted(on[p["metadata"]["uid"]] for p in pods[1:])
        assert g.phase == Phase.RUNNING and sorted(g.held) == workers  # still running there
        c.handle(("Pod", "DELETED", placed[1]))  # cleanPodPolicy: the MPI Operator deletes them
        assert g.phase == Phase.RUNNING and list(g.held) == [on[pods[2]["metadata"]["uid"]]]
        c.handle(("Pod", "DELETED", placed[2]))
        assert g.phase == Phase.COMPLETED and not g.held
        c.cluster.matcher.check_invariants()

    asyncio.run(main())
