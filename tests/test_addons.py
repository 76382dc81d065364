"""Multi-role workloads with their REAL controllers (JobSet, MPI Operator, LeaderWorkerSet,
Kubeflow Trainer) in the dev cluster (`fluxnetes dev cluster up --addons all`), admitted by
fluxnetes' real webhook server (k8s/admission/webhook.py, configured by webhook_config.mutating with the
kinds discovery shows): each workload is held at admission, its controller creates nothing
(or only gated pods), the resume patch lets the controller create pods that are born gated,
and every pod routes back to its workload, group and pod set. The examples a user applies
(examples/{mpijob,jobset,trainjob,lws}.yaml) are the objects used.

One cluster for the module (about 35 s to start on 2 cores). No fluxnetes operator runs here:
placing a pod is played by lifting its gate as the admin (the operator's job once it is wired).
Needs the binaries of hack/build-addons.sh: skipped without them unless
FLUXNETES_REQUIRE_ADDONS=1 (hack/test.sh sets it once they are built), then failed.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from fluxnetes.devcluster import Cluster, NodeShape
from fluxnetes.devcluster import addons as addon_defs
from fluxnetes.k8s import certs, names
from fluxnetes.k8s.admission import webhook_config
from fluxnetes.k8s.admission.webhook import WebhookServer
from fluxnetes.k8s.workloads import (
    ADDON_KINDS,
    ALL_KINDS,
    discovery_paths,
    enabled_kinds,
    made_for,
    route_pod,
    served_resources,
)
from fluxnetes.k8s.workloads.base import ANN_SUSPENDED_BY, PodRoute
from fluxnetes.k8s.workloads.trainjob import KIND as TRAINJOB
from k8s_helpers import addon_cluster

pytestmark = pytest.mark.k8s

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
NS = "flux-demo"  # the examples' namespace, opted in by examples/k8s/namespace.yaml
ALL = addon_defs.WORKLOAD_ADDONS


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    yield from addon_cluster(tmp_path_factory, "addons-cluster", NodeShape(count=4, cpu="16", memory="64Gi"))


def lookup_in(c: Cluster) -> Callable[[str, str, str], Mapping[str, Any] | None]:
    """The operator's cache, played by the API server."""
    def lookup(kind: str, ns: str, name: str) -> Mapping[str, Any] | None:
        k = ALL_KINDS[kind]
        try:
            return c.api_get(f"/apis/{k.api_version}/namespaces/{ns}/{k.plural}/{name}")  # type: ignore[no-any-return]
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            raise
    return lookup


@pytest.fixture(scope="module")
def served(cluster: Cluster) -> set[tuple[str, str]]:
    docs = []
    for path in discovery_paths():
        try:
            docs.append(cluster.api_get(path))
        except urllib.error.HTTPError as exc:
            assert exc.code == 404
    return served_resources(docs)


@pytest.fixture(scope="module")
def webhook(cluster: Cluster, served: set[tuple[str, str]]) -> Iterator[None]:
    """fluxnetes' webhook server (in a thread) with the mutating configuration the operator
    would install for the kinds discovery shows, and the examples' namespace opted in."""
    bundle = certs.make_bundle(["127.0.0.1"])
    server = WebhookServer("127.0.0.1", 0, bundle, lambda: {"kubernetes-admin"})
    port = asyncio.run(server.start_in_thread())
    kinds = [k for k in enabled_kinds(served).values() if k.addon]
    cfg = webhook_config.mutating(webhook_config.WebhookTarget(url=f"https://127.0.0.1:{port}"),
                                  webhook_config.Scope(), bundle.ca_crt, multi_role=kinds)
    cluster.api_call("POST", "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations", cfg)
    cluster.kubectl("apply", "-f", str(EXAMPLES / "k8s" / "namespace.yaml"))
    try:
        yield
    finally:
        cluster.kubectl("delete", "mutatingwebhookconfiguration", webhook_config.NAME, "--ignore-not-found",
                        check=False)
        asyncio.run(server.stop())


def wait(what: str, cond: Callable[[], Any], timeout: float = 60, interval: float = 0.3) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = cond()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out waiting for {what} (last: {last!r})")


def apply_example(c: Cluster, name: str) -> dict[str, Any]:
    """kubectl apply of examples/<name>.yaml (the API server validates it against the CRD)."""
    out = c.kubectl("apply", "-f", str(EXAMPLES / f"{name}.yaml"), "-o", "json").stdout
    return dict(json.loads(out))


def get(c: Cluster, kind: str, name: str) -> dict[str, Any]:
    obj = lookup_in(c)(kind, NS, name)
    assert obj is not None, f"{kind} {name} not found"
    return dict(obj)


def pods(c: Cluster, selector: str) -> list[dict[str, Any]]:
    return list(c.api_get(f"/api/v1/namespaces/{NS}/pods?labelSelector={selector}")["items"])


def jobs(c: Cluster, selector: str) -> list[dict[str, Any]]:
    return list(c.api_get(f"/apis/batch/v1/namespaces/{NS}/jobs?labelSelector={selector}")["items"])


def gated(pod: Mapping[str, Any]) -> bool:
    return any(g.get("name") == names.GATE for g in (pod.get("spec") or {}).get("schedulingGates") or [])


def resume(c: Cluster, kind: str, name: str) -> None:
    k = ALL_KINDS[kind]
    body = k.resume_patch(get(c, kind, name))
    c.api_call("PATCH", f"/apis/{k.api_version}/namespaces/{NS}/{k.plural}/{name}", body,
               content_type="application/merge-patch+json")


def ungate(c: Cluster, pod: Mapping[str, Any]) -> None:
    """What the operator does once the group is allocated (here without a node pin)."""
    gates = [g for g in pod["spec"].get("schedulingGates") or [] if g.get("name") != names.GATE]
    c.api_call("PATCH", f"/api/v1/namespaces/{NS}/pods/{pod['metadata']['name']}",
               [{"op": "replace", "path": "/spec/schedulingGates", "value": gates}],
               content_type="application/json-patch+json")


def routes(c: Cluster, ps: list[dict[str, Any]]) -> list[PodRoute]:
    lookup = lookup_in(c)
    out = [route_pod(p, lookup) for p in ps]
    assert all(r is not None for r in out), out
    return [r for r in out if r is not None]


# -- discovery ---------------------------------------------------------------------------------
def test_discovery_turns_the_kinds_on(served: set[tuple[str, str]]) -> None:
    on = enabled_kinds(served)
    assert set(ADDON_KINDS) <= set(on)
    lines: list[str] = []
    without_mpi = enabled_kinds(served - {("kubeflow.org/v2beta1", "mpijobs")}, log=lines.append)
    assert "MPIJob" not in without_mpi and "JobSet" in without_mpi
    assert len(lines) == 1 and "mpijobs.kubeflow.org" in lines[0]


# -- MPIJob ------------------------------------------------------------------------------------
def test_mpijob_held_then_born_gated(cluster: Cluster, webhook: None) -> None:
    k = ALL_KINDS["MPIJob"]
    apply_example(cluster, "mpijob")
    obj = get(cluster, "MPIJob", "pi")
    assert obj["spec"]["runPolicy"]["suspend"] is True and k.held_by_fluxnetes(obj)
    assert [(s.name, s.count) for s in k.pod_sets(obj)] == [("launcher", 1), ("worker", 4)]
    # suspended: the MPI Operator makes its launcher Job, suspended, and no pod; the Job is
    # part of the MPIJob's group: fluxnetes' Job webhook left it alone
    launcher = wait("the launcher Job", lambda: jobs(cluster, "app=pi"))[0]
    assert launcher["spec"]["suspend"] is True and made_for(launcher, "Job") == "MPIJob"
    assert ANN_SUSPENDED_BY not in (launcher["metadata"].get("annotations") or {})
    time.sleep(2)
    assert pods(cluster, "training.kubeflow.org/job-name=pi") == []
    resume(cluster, "MPIJob", "pi")
    ps = wait("5 pods", lambda: (p := pods(cluster, "training.kubeflow.org/job-name=pi")) and len(p) == 5 and p)
    assert all(gated(p) for p in ps), "a pod of the MPIJob was not born gated"
    got = sorted((r.kind, r.name, r.pod_set, r.slot) for r in routes(cluster, ps))
    assert got == [("MPIJob", "pi", "launcher", 0)] + [("MPIJob", "pi", "worker", i) for i in range(4)]
    time.sleep(1)
    assert all(p["status"].get("phase") == "Pending" and not p["spec"].get("nodeName")
               for p in pods(cluster, "training.kubeflow.org/job-name=pi")), "a pod started before allocation"
    assert not k.held_by_fluxnetes(get(cluster, "MPIJob", "pi"))
    # a worker deleted is re-created by the MPI Operator: born gated, same pod set and slot
    old_uid = next(p["metadata"]["uid"] for p in ps if p["metadata"]["name"] == "pi-worker-2")
    cluster.api_call("DELETE", f"/api/v1/namespaces/{NS}/pods/pi-worker-2", {"gracePeriodSeconds": 0})

    def recreated() -> list[dict[str, Any]]:
        return [p for p in pods(cluster, "training.kubeflow.org/job-name=pi")
                if p["metadata"]["name"] == "pi-worker-2" and p["metadata"]["uid"] != old_uid]
    (again,) = wait("pi-worker-2 re-created", recreated)
    assert gated(again) and route_pod(again) == PodRoute("MPIJob", NS, "pi", "worker", 2)
    ps = pods(cluster, "training.kubeflow.org/job-name=pi")
    for p in ps:
        ungate(cluster, p)
    wait("the MPIJob to finish", lambda: k.finished(get(cluster, "MPIJob", "pi")), timeout=90)
    assert not k.failed(get(cluster, "MPIJob", "pi"))


# -- JobSet ------------------------------------------------------------------------------------
def test_jobset_held_then_nine_gated_pods(cluster: Cluster, webhook: None) -> None:
    k = ALL_KINDS["JobSet"]
    apply_example(cluster, "jobset")
    obj = get(cluster, "JobSet", "train")
    assert obj["spec"]["suspend"] is True and k.held_by_fluxnetes(obj)
    assert [(s.name, s.count) for s in k.pod_sets(obj)] == [("driver", 1), ("workers", 8)]
    js = wait("3 Jobs", lambda: (j := jobs(cluster, "jobset.sigs.k8s.io/jobset-name=train")) and len(j) == 3 and j)
    assert all(made_for(j, "Job") == "JobSet" and j["spec"]["suspend"] is True for j in js)
    assert not any(ANN_SUSPENDED_BY in (j["metadata"].get("annotations") or {}) for j in js)
    time.sleep(2)
    assert pods(cluster, "jobset.sigs.k8s.io/jobset-name=train") == []
    resume(cluster, "JobSet", "train")
    ps = wait("9 pods", lambda: (p := pods(cluster, "jobset.sigs.k8s.io/jobset-name=train")) and len(p) == 9 and p)
    assert all(gated(p) for p in ps)
    got = sorted((r.kind, r.name, r.pod_set, r.slot) for r in routes(cluster, ps))
    assert got == [("JobSet", "train", "driver", 0)] + [("JobSet", "train", "workers", i) for i in range(8)]
    for p in ps:
        ungate(cluster, p)
    wait("the JobSet to finish", lambda: k.finished(get(cluster, "JobSet", "train")), timeout=90)


# -- LeaderWorkerSet ---------------------------------------------------------------------------
def test_lws_gangs_gated_per_replica_and_scale_up(cluster: Cluster, webhook: None) -> None:
    k = ALL_KINDS["LeaderWorkerSet"]
    apply_example(cluster, "lws")
    obj = get(cluster, "LeaderWorkerSet", "serve")
    assert k.replica_groups(obj) == 3
    assert [(s.name, s.count) for s in k.pod_sets(obj)] == [("leader", 1), ("worker", 3)]
    sel = "leaderworkerset.sigs.k8s.io/name=serve"
    ps = wait("12 pods", lambda: (p := pods(cluster, sel)) and len(p) == 12 and p)
    assert all(gated(p) for p in ps), "an LWS pod was not born gated"
    rs = routes(cluster, ps)
    by_group: dict[int | None, list[tuple[str, int | None]]] = {}
    for r in rs:
        by_group.setdefault(r.index, []).append((r.pod_set, r.slot))
    assert {g: sorted(v) for g, v in by_group.items()} == {
        g: [("leader", 0), ("worker", 0), ("worker", 1), ("worker", 2)] for g in range(3)}
    assert {r.group_base for r in rs} == {f"leaderworkerset-serve-{g}" for g in range(3)}
    sts = cluster.api_get(f"/apis/apps/v1/namespaces/{NS}/statefulsets")["items"]
    assert len(sts) == 4 and all(made_for(s, "StatefulSet") == "LeaderWorkerSet" for s in sts)
    # scaling up makes one more gang
    cluster.api_call("PATCH", f"/apis/{k.api_version}/namespaces/{NS}/{k.plural}/serve",
                     {"spec": {"replicas": 4}}, content_type="application/merge-patch+json")
    ps = wait("16 pods", lambda: (p := pods(cluster, sel)) and len(p) == 16 and p)
    new = [r for r in routes(cluster, ps) if r.index == 3]
    assert sorted((r.pod_set, r.slot) for r in new) == [("leader", 0), ("worker", 0), ("worker", 1), ("worker", 2)]
    assert all(gated(p) for p in ps)
    # scaling down removes the last replica's gang whole
    cluster.api_call("PATCH", f"/apis/{k.api_version}/namespaces/{NS}/{k.plural}/serve",
                     {"spec": {"replicas": 3}}, content_type="application/merge-patch+json")
    left = wait("group 3 gone", lambda: (p := pods(cluster, sel)) and all(
        not (q["metadata"].get("deletionTimestamp")) for q in p) and len(p) == 12 and p, timeout=90)
    assert {r.index for r in routes(cluster, left)} == {0, 1, 2}


# -- TrainJob ----------------------------------------------------------------------------------
def test_trainjob_is_one_group_with_its_jobset(cluster: Cluster, webhook: None) -> None:
    apply_example(cluster, "trainjob")
    obj = get(cluster, "TrainJob", "mnist")
    assert obj["spec"]["suspend"] is True and TRAINJOB.held_by_fluxnetes(obj)
    jobset = wait("the TrainJob's JobSet", lambda: lookup_in(cluster)("JobSet", NS, "mnist"))
    # exactly one JobSet, the TrainJob's: suspended by Trainer, not by fluxnetes (no second group)
    all_js = cluster.api_get(f"/apis/jobset.x-k8s.io/v1alpha2/namespaces/{NS}/jobsets")["items"]
    assert [j["metadata"]["name"] for j in all_js if made_for(j, "JobSet") == "TrainJob"] == ["mnist"]
    assert made_for(jobset) == "TrainJob" and TRAINJOB.owns_jobset(obj, jobset)
    assert not ALL_KINDS["JobSet"].held_by_fluxnetes(jobset)
    assert [(s.name, s.count) for s in TRAINJOB.pod_sets_with(obj, jobset)] == [("node", 2)]
    assert [(s.name, s.count) for s in TRAINJOB.pod_sets(obj)] == [("node", 2)]
    time.sleep(2)
    assert pods(cluster, "jobset.sigs.k8s.io/jobset-name=mnist") == []
    resume(cluster, "TrainJob", "mnist")
    ps = wait("2 pods", lambda: (p := pods(cluster, "jobset.sigs.k8s.io/jobset-name=mnist")) and len(p) == 2 and p)
    assert all(gated(p) for p in ps), "a TrainJob pod was not held by the pod webhook"
    got = sorted((r.kind, r.name, r.pod_set, r.slot) for r in routes(cluster, ps))
    assert got == [("TrainJob", "mnist", "node", 0), ("TrainJob", "mnist", "node", 1)]
    # without the cache, the pod is still known to be a JobSet's, never grouped by its Job
    assert route_pod(ps[0]) == PodRoute("JobSet", NS, "mnist", "node")


def test_user_suspended_workload_stays_the_users(cluster: Cluster, webhook: None) -> None:
    doc = yaml.safe_load((EXAMPLES / "jobset.yaml").read_text())
    doc["metadata"]["name"] = "mine"
    doc["spec"]["suspend"] = True
    cluster.kubectl("apply", "-f", "-", input=json.dumps(doc))
    obj = get(cluster, "JobSet", "mine")
    k = ALL_KINDS["JobSet"]
    assert k.held_by_user(obj) and not k.held_by_fluxnetes(obj)
    tmpl = obj["spec"]["replicatedJobs"][1]["template"]["spec"]["template"]
    assert tmpl["metadata"]["labels"][names.LABEL_MANAGED] == "true" and tmpl["spec"]["schedulingGates"]
