"""Multi-role workloads through the fluxnetes operator, with their REAL controllers.

MPIJob (MPI Operator), JobSet, TrainJob (Kubeflow Trainer) and LeaderWorkerSet run in the dev
cluster (`--addons all`); the operator (a subprocess, as a user runs it) finds their CRDs,
installs their admission rules, holds each workload, makes one gang of its pod sets, resumes
it once the whole gang is allocated and puts every pod on a node of its own pod set.

One cluster and one operator for the module: 10 kwok nodes of 4 cpu. Job pods annotated with
kwok's delay run that long (timed pods); other Job pods end at once. Needs the binaries of
hack/build-addons.sh: skipped without them unless FLUXNETES_REQUIRE_ADDONS=1, then failed.
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fluxnetes.devcluster import Cluster, NodeShape
from fluxnetes.devcluster.components import TIMED_POD_ANNOTATION
from k8s_helpers import addon_cluster
from test_k8s_operator import OperatorProc, apply, fluxjob, pods, wait

pytestmark = pytest.mark.k8s

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
NS = "flux-demo"  # the examples' namespace (examples/k8s/namespace.yaml opts it in)
MPI_NAME = "training.kubeflow.org/job-name"
LONG = {TIMED_POD_ANNOTATION: "1h"}  # a Job pod that keeps running (kwok)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    yield from addon_cluster(tmp_path_factory, "multirole-cluster", NodeShape(count=10, cpu="4", memory="16Gi"),
                             timed_pods=True)


@pytest.fixture(scope="module")
def op(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OperatorProc]:
    o = OperatorProc(cluster, tmp_path_factory.mktemp("operator-multirole"))
    o.start()
    cluster.kubectl("apply", "-f", str(EXAMPLES / "k8s" / "namespace.yaml"))
    try:
        yield o
    finally:
        o.kill(signal.SIGTERM)


def test_operator_admits_the_served_kinds(cluster: Cluster, op: OperatorProc) -> None:
    cfg = cluster.kubectl_json("get", "mutatingwebhookconfiguration", "fluxnetes.io")
    multi = next(w for w in cfg["webhooks"] if w["name"] == "multirole.mutate.fluxnetes.io")
    resources = {r for rule in multi["rules"] for r in rule["resources"]}
    assert resources == {"mpijobs", "jobsets", "trainjobs", "leaderworkersets"}


# -- helpers -------------------------------------------------------------------------------------
def mpijob(name: str, workers: int, worker_cpu: str, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    def tmpl(cname: str, cpu: str, ann: dict[str, str] | None = None) -> dict[str, Any]:
        return {"metadata": {"annotations": ann or {}},
                "spec": {"containers": [{"name": cname, "image": "mpioperator/mpi-pi:openmpi",
                                         "resources": {"requests": {"cpu": cpu, "memory": "1Gi"}}}]}}

    return {"apiVersion": "kubeflow.org/v2beta1", "kind": "MPIJob",
            "metadata": {"name": name, "annotations": annotations or {}},
            "spec": {"slotsPerWorker": 1, "runPolicy": {"cleanPodPolicy": "Running"},
                     "mpiReplicaSpecs": {
                         # the launcher's pod belongs to a Job: kwok would end it at once
                         "Launcher": {"replicas": 1, "template": tmpl("launcher", "1", LONG)},
                         "Worker": {"replicas": workers, "template": tmpl("worker", worker_cpu)}}}}


def blocker(nodes: int) -> dict[str, Any]:
    """A fluxnetes Job taking ``nodes`` whole 4-cpu nodes until deleted."""
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "block"},
            "spec": {"parallelism": nodes, "completions": nodes, "completionMode": "Indexed",
                     "template": {"metadata": {"annotations": LONG, "labels": {"app": "block"}},
                                  "spec": {"restartPolicy": "Never", "containers": [
                                      {"name": "c", "image": "busybox", "resources": {"requests": {"cpu": "4"}}}]}}}}


def block(cluster: Cluster, nodes: int) -> None:
    apply(cluster, NS, [blocker(nodes)])
    wait(f"{nodes} blocking pods bound", lambda: len([p for p in pods(cluster, NS, "app=block")
                                                     if p["spec"].get("nodeName")]) == nodes, timeout=90)


def unblock(cluster: Cluster) -> None:
    cluster.kubectl("delete", "job", "block", "-n", NS, "--ignore-not-found", "--cascade=foreground",
                    timeout=120)


def bound(cluster: Cluster, selector: str, count: int, timeout: float = 120) -> list[dict[str, Any]]:
    def ready() -> list[dict[str, Any]] | None:
        ps = [p for p in pods(cluster, NS, selector) if not p["metadata"].get("deletionTimestamp")]
        return ps if len(ps) == count and all(p["spec"].get("nodeName") for p in ps) else None

    return list(wait(f"{count} pods bound ({selector})", ready, timeout=timeout))


def fj_phase(cluster: Cluster, name: str) -> str:
    return str((fluxjob(cluster, NS, name).get("status") or {}).get("phase", ""))


def one_gang(ps: list[dict[str, Any]], group: str) -> None:
    """Every pod was placed by fluxnetes for ``group``, each in a slot of its own."""
    anns = [p["metadata"].get("annotations") or {} for p in ps]
    assert {a.get("fluxnetes.io/fluxjob") for a in anns} == {group}, anns
    slots = [a.get("fluxnetes.io/slot") for a in anns]
    assert len(set(slots)) == len(ps), slots


def delete(cluster: Cluster, kind: str, name: str, selector: str) -> None:
    cluster.kubectl("delete", kind, name, "-n", NS, "--ignore-not-found", timeout=120)
    wait(f"pods of {kind} {name} gone", lambda: not pods(cluster, NS, selector), timeout=120)


def groups_are(cluster: Cluster, workload: str, expected: list[str]) -> None:
    """The FluxJobs of ``workload`` are exactly ``expected`` (a FluxJob is created with its
    group's first status write, a moment after the group: waited for)."""
    wait(f"FluxJobs {expected}", lambda: group_names(cluster, workload) == expected, timeout=30)
    assert group_names(cluster, workload) == expected


def group_names(cluster: Cluster, workload: str) -> list[str]:
    """The FluxJobs of the workloads named ``workload`` ("<kind>-<name>[-<i>]")."""
    names = [fj["metadata"]["name"] for fj in cluster.kubectl_json("get", "fluxjobs", "-n", NS)["items"]]
    return sorted(n for n in names if n.endswith(f"-{workload}") or f"-{workload}-" in n)


# -- MPIJob ----------------------------------------------------------------------------------------
def test_mpijob_waits_for_room_then_starts_whole_and_a_recreated_worker_keeps_its_node(
        cluster: Cluster, op: OperatorProc) -> None:
    block(cluster, 3)  # 7 free nodes: 8 workers of 4 cpu (and a launcher) cannot all fit
    apply(cluster, NS, [mpijob("mpi8", 8, "4")])
    wait("the MPIJob queued", lambda: fj_phase(cluster, "mpijob-mpi8") in ("Pending", "Reserved"))
    time.sleep(3)  # several cycles: still nothing of it may start
    assert fj_phase(cluster, "mpijob-mpi8") in ("Pending", "Reserved")
    obj = cluster.kubectl_json("get", "mpijob", "mpi8", "-n", NS)
    assert obj["spec"]["runPolicy"]["suspend"] is True
    assert not [p for p in pods(cluster, NS, f"{MPI_NAME}=mpi8") if p["spec"].get("nodeName")]
    unblock(cluster)
    ps = bound(cluster, f"{MPI_NAME}=mpi8", 9)
    one_gang(ps, "mpijob-mpi8")
    workers = {p["metadata"]["name"]: p["spec"]["nodeName"] for p in ps
               if p["metadata"]["labels"].get("training.kubeflow.org/job-role") == "worker"}
    assert len(workers) == 8 and len(set(workers.values())) == 8
    # the FluxJob's status is written a moment after the pods are placed (coalesced writes)
    wait("the FluxJob Running", lambda: fj_phase(cluster, "mpijob-mpi8") == "Running", timeout=30)
    # `kubectl fluxnetes explain` shows the pod sets and where each went
    from typer.testing import CliRunner

    from fluxnetes.cli.ctl import build

    res = CliRunner().invoke(build(), ["explain", f"{NS}/mpijob-mpi8", "-o", "json", "--kubeconfig", str(cluster.kubeconfig)])
    assert res.exit_code == 0, res.output
    shown = {s["name"]: sorted(s["nodes"]) for s in json.loads(res.stdout)["podSets"]}
    launcher = [p["spec"]["nodeName"] for p in ps
                if p["metadata"]["labels"].get("training.kubeflow.org/job-role") == "launcher"]
    assert shown == {"launcher": launcher, "worker": sorted(workers.values())}
    assert cluster.kubectl_json("get", "mpijob", "mpi8", "-n", NS)["spec"]["runPolicy"]["suspend"] is False
    # a worker deleted is re-created by the MPI Operator and goes back to its slot's node
    victim = "mpi8-worker-3"
    old = next(p for p in ps if p["metadata"]["name"] == victim)
    cluster.kubectl("delete", "pod", victim, "-n", NS, "--grace-period=0", timeout=60)

    def again() -> dict[str, Any] | None:
        p = cluster.kubectl_json("get", "pod", victim, "-n", NS)
        return p if p["metadata"]["uid"] != old["metadata"]["uid"] and p["spec"].get("nodeName") else None

    new = wait("the re-created worker placed", again, timeout=90)
    assert new["spec"]["nodeName"] == old["spec"]["nodeName"]
    assert new["metadata"]["annotations"]["fluxnetes.io/slot"] == old["metadata"]["annotations"]["fluxnetes.io/slot"]
    delete(cluster, "mpijob", "mpi8", f"{MPI_NAME}=mpi8")


def test_mpijob_exclusive_nodes_put_no_two_workers_together(cluster: Cluster, op: OperatorProc) -> None:
    apply(cluster, NS, [mpijob("mpix", 4, "1", {"fluxnetes.io/exclusive": "node"})])
    ps = bound(cluster, f"{MPI_NAME}=mpix", 5)
    one_gang(ps, "mpijob-mpix")
    nodes = [p["spec"]["nodeName"] for p in ps]
    assert len(set(nodes)) == 5, nodes  # launcher included: whole nodes each
    delete(cluster, "mpijob", "mpix", f"{MPI_NAME}=mpix")


def test_mpijob_example_runs_as_one_gang(cluster: Cluster, op: OperatorProc) -> None:
    cluster.kubectl("apply", "-f", str(EXAMPLES / "mpijob.yaml"))
    wait("the example's FluxJob allocated 5 slots",
         lambda: len((fluxjob(cluster, NS, "mpijob-pi").get("status") or {}).get("nodes") or []) == 5)
    groups_are(cluster, "pi", ["mpijob-pi"])  # its launcher Job is not a group
    delete(cluster, "mpijob", "pi", f"{MPI_NAME}=pi")


def ctl_json(cluster: Cluster, *args: str) -> Any:
    """``kubectl fluxnetes ARGS -o json`` (the plugin's CLI, in process)."""
    from typer.testing import CliRunner

    from fluxnetes.cli.ctl import build

    res = CliRunner().invoke(build(), [*args, "-o", "json", "--kubeconfig", str(cluster.kubeconfig)])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def test_plugin_views_show_each_pod_set_at_its_own_shape(cluster: Cluster, op: OperatorProc) -> None:
    """Issue #29 item 6: an MPIJob of a 1-cpu launcher and 4-cpu workers was charged 4 cpu a
    pod: `nodes` said the launcher's node was full and disagreed with its pods, `queue` and
    `explain` showed 4c a pod and counted the room at that shape."""
    wait("no other pod bound", lambda: not [p for p in pods(cluster, NS, "") if p["spec"].get("nodeName")],
         timeout=120)
    apply(cluster, NS, [mpijob("shapes", 8, "4")])  # 8 nodes full, the launcher on a 9th
    ps = bound(cluster, f"{MPI_NAME}=shapes", 9)
    launcher = next(p["spec"]["nodeName"] for p in ps
                    if p["metadata"]["labels"].get("training.kubeflow.org/job-role") == "launcher")
    wait("the FluxJob Running", lambda: fj_phase(cluster, "mpijob-shapes") == "Running", timeout=30)
    rows = {r["node"]: r for r in ctl_json(cluster, "nodes")}
    assert (rows[launcher]["coresUsed"], rows[launcher]["coresFree"], rows[launcher]["agrees"]) == (1, 3, "yes")
    assert all(r["agrees"] == "yes" and r["coresFree"] >= 0 for r in rows.values()), rows
    row = next(r for r in ctl_json(cluster, "queue", "-n", NS) if r["name"] == "mpijob-shapes")
    assert row["request"] == "launcher 1c,1Gi; worker 4c,1Gi", row
    # a second gang of 2 workers and a launcher: a free node takes a worker, the launcher's
    # node (3 cpu free) the launcher: 2 of its 3 pods have room now (at 4 cpu a pod: 1)
    apply(cluster, NS, [mpijob("waits", 2, "4")])
    wait("the second MPIJob queued", lambda: fj_phase(cluster, "mpijob-waits") in ("Pending", "Reserved"))
    info = ctl_json(cluster, "explain", f"{NS}/mpijob-waits")
    assert info["shape"] == "launcher 1 x (1c,1Gi), worker 2 x (4c,1Gi)", info
    assert info["short"].startswith("room for 2 of 3 pod(s) now; short of cores"), info["short"]
    from typer.testing import CliRunner

    from fluxnetes.cli.ctl import build

    table = CliRunner().invoke(build(), ["explain", f"{NS}/mpijob-waits", "--kubeconfig", str(cluster.kubeconfig)])
    assert "size 3: launcher 1 x (1c,1Gi), worker 2 x (4c,1Gi)" in table.output, table.output
    history = [h["state"] for h in info["history"]]
    assert history[-1] in ("Pending", "Reserved") and history == [h["state"] for h in sorted(
        info["history"], key=lambda h: h["time"])], info["history"]
    delete(cluster, "mpijob", "waits", f"{MPI_NAME}=waits")
    delete(cluster, "mpijob", "shapes", f"{MPI_NAME}=shapes")


# -- JobSet ----------------------------------------------------------------------------------------
def test_jobset_example_starts_all_or_nothing(cluster: Cluster, op: OperatorProc) -> None:
    block(cluster, 7)  # 12 cpu free: the driver (1) and 8 workers of 2 cpu need 17
    cluster.kubectl("apply", "-f", str(EXAMPLES / "jobset.yaml"))
    wait("the JobSet queued", lambda: fj_phase(cluster, "jobset-train") in ("Pending", "Reserved"))
    time.sleep(3)
    assert fj_phase(cluster, "jobset-train") in ("Pending", "Reserved")
    assert cluster.kubectl_json("get", "jobset", "train", "-n", NS)["spec"]["suspend"] is True
    assert not pods(cluster, NS, "jobset.sigs.k8s.io/jobset-name=train")
    unblock(cluster)
    # the pods of its Jobs end at once (kwok): each was bound, all in one allocation
    ps = wait("9 pods placed", lambda: (p := pods(cluster, NS, "jobset.sigs.k8s.io/jobset-name=train"))
              and len(p) == 9 and all(x["spec"].get("nodeName") for x in p) and p, timeout=120)
    one_gang(ps, "jobset-train")
    groups_are(cluster, "train", ["jobset-train"])  # its Jobs are not groups
    delete(cluster, "jobset", "train", "jobset.sigs.k8s.io/jobset-name=train")


# -- TrainJob --------------------------------------------------------------------------------------
def test_trainjob_example_is_exactly_one_group(cluster: Cluster, op: OperatorProc) -> None:
    cluster.kubectl("apply", "-f", str(EXAMPLES / "trainjob.yaml"))
    ps = wait("2 pods placed", lambda: (p := pods(cluster, NS, "jobset.sigs.k8s.io/jobset-name=mnist"))
              and len(p) == 2 and all(x["spec"].get("nodeName") for x in p) and p, timeout=120)
    one_gang(ps, "trainjob-mnist")
    groups_are(cluster, "mnist", ["trainjob-mnist"])  # not its JobSet, not its Jobs
    delete(cluster, "trainjob", "mnist", "jobset.sigs.k8s.io/jobset-name=mnist")


# -- LeaderWorkerSet -------------------------------------------------------------------------------
def test_lws_example_is_a_gang_per_replica_and_scaling_adds_one(cluster: Cluster, op: OperatorProc) -> None:
    sel = "leaderworkerset.sigs.k8s.io/name=serve"
    cluster.kubectl("apply", "-f", str(EXAMPLES / "lws.yaml"))
    ps = bound(cluster, sel, 12)
    gangs = [f"leaderworkerset-serve-{i}" for i in range(3)]
    for i, g in enumerate(gangs):
        one_gang([p for p in ps if p["metadata"]["labels"]["leaderworkerset.sigs.k8s.io/group-index"] == str(i)], g)
    groups_are(cluster, "serve", gangs)
    cluster.kubectl("scale", "leaderworkerset", "serve", "-n", NS, "--replicas=4")
    ps = bound(cluster, sel, 16)
    one_gang([p for p in ps if p["metadata"]["labels"]["leaderworkerset.sigs.k8s.io/group-index"] == "3"],
             "leaderworkerset-serve-3")
    groups_are(cluster, "serve", [*gangs, "leaderworkerset-serve-3"])
    delete(cluster, "leaderworkerset", "serve", sel)


def test_lws_scaled_down_cancels_its_unsatisfiable_replicas(cluster: Cluster, op: OperatorProc) -> None:
    """Issue #29 item 2: each replica of 12 pods of 4 cpu can never fit 10 nodes; scaled to 1,
    the removed replica's gang is Cancelled, not left Unsatisfiable."""
    sel = "leaderworkerset.sigs.k8s.io/name=huge"
    tmpl = {"spec": {"containers": [{"name": "c", "image": "busybox",
                                     "resources": {"requests": {"cpu": "4"}}}]}}
    lws = {"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet", "metadata": {"name": "huge"},
           "spec": {"replicas": 2, "leaderWorkerTemplate": {"size": 12, "workerTemplate": tmpl}}}
    apply(cluster, NS, [lws])
    gangs = ["leaderworkerset-huge-0", "leaderworkerset-huge-1"]
    for g in gangs:
        wait(f"{g} Unsatisfiable", lambda g=g: fj_phase(cluster, g) == "Unsatisfiable", timeout=90)
    cluster.kubectl("scale", "leaderworkerset", "huge", "-n", NS, "--replicas=1")
    wait("the removed replica's gang Cancelled", lambda: fj_phase(cluster, gangs[1]) == "Cancelled", timeout=60)
    assert fj_phase(cluster, gangs[0]) == "Unsatisfiable"
    delete(cluster, "leaderworkerset", "huge", sel)


# -- restarts --------------------------------------------------------------------------------------
def test_an_operator_restart_while_an_mpijob_waits_loses_nothing(cluster: Cluster, op: OperatorProc) -> None:
    """Nothing is lost when the operator restarts mid-admission: the MPIJob was held and
    queued (nothing placed) when the operator was SIGKILLed; the new one finds it again, keeps
    it held while it cannot fit, and starts it whole once room comes."""
    block(cluster, 3)
    apply(cluster, NS, [mpijob("mpir", 8, "4")])
    wait("the MPIJob queued", lambda: fj_phase(cluster, "mpijob-mpir") in ("Pending", "Reserved"))
    op.kill(signal.SIGKILL)
    op.start()
    time.sleep(3)  # several cycles of the new operator: still nothing of it may start
    assert cluster.kubectl_json("get", "mpijob", "mpir", "-n", NS)["spec"]["runPolicy"]["suspend"] is True
    assert fj_phase(cluster, "mpijob-mpir") in ("Pending", "Reserved")
    unblock(cluster)
    ps = bound(cluster, f"{MPI_NAME}=mpir", 9)
    one_gang(ps, "mpijob-mpir")
    workers = {p["spec"]["nodeName"] for p in ps
               if p["metadata"]["labels"].get("training.kubeflow.org/job-role") == "worker"}
    assert len(workers) == 8
    groups_are(cluster, "mpir", ["mpijob-mpir"])  # one group, not a second one after the restart
    delete(cluster, "mpijob", "mpir", f"{MPI_NAME}=mpir")
