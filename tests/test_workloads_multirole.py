"""The multi-role workload kinds on fixture objects: pod sets, sizes, holds, finished/failed,
routing a pod to its workload and pod set, admission patches, and which kinds are on.

The fixtures in tests/fixtures/addons/ are objects the real controllers made in the dev
cluster (`fluxnetes dev cluster up --addons all`, examples/*.yaml; managedFields dropped).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from fluxnetes.k8s import names
from fluxnetes.k8s.admission import review as admission
from fluxnetes.k8s.admission import webhook_config
from fluxnetes.k8s.workloads import (
    ADDON_KINDS,
    ALL_KINDS,
    KINDS,
    addon_pod,
    any_kind_of,
    discovery_paths,
    enabled_kinds,
    group_bases,
    kind_of,
    made_for,
    pod_sets_of,
    route_pod,
    served_resources,
)
from fluxnetes.k8s.workloads.base import ANN_SUSPENDED_BY, MAIN_POD_SET, PodRoute, PodSetSpec
from fluxnetes.k8s.workloads.jobset import KIND as JOBSET
from fluxnetes.k8s.workloads.lws import KIND as LWS
from fluxnetes.k8s.workloads.mpijob import KIND as MPIJOB
from fluxnetes.k8s.workloads.trainjob import KIND as TRAINJOB
from test_k8s_admission import apply_patch, review

FIXTURES = Path(__file__).parent / "fixtures" / "addons"
EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def fx(name: str) -> dict[str, Any]:
    return dict(json.loads((FIXTURES / f"{name}.json").read_text()))


def example(name: str) -> dict[str, Any]:
    return dict(yaml.safe_load((EXAMPLES / f"{name}.yaml").read_text()))


def sets(ps: list[PodSetSpec]) -> list[tuple[str, int]]:
    return [(p.name, p.count) for p in ps]


def lookup_of(*objs: dict[str, Any]) -> Any:
    by = {(o["kind"], o["metadata"]["namespace"], o["metadata"]["name"]): o for o in objs}
    return lambda kind, ns, name: by.get((kind, ns, name))


# -- the registry: built-in kinds unchanged ----------------------------------------------------
def test_builtin_kinds_unchanged_and_addons_apart() -> None:
    assert set(KINDS) == {"Job", "ReplicaSet", "Deployment", "StatefulSet"}
    assert set(ADDON_KINDS) == {"MPIJob", "JobSet", "TrainJob", "LeaderWorkerSet"}
    assert kind_of("MPIJob") is None and any_kind_of("MPIJob") is MPIJOB
    job = {"kind": "Job", "spec": {"parallelism": 3, "template": {"spec": {"containers": []}}}}
    (only,) = KINDS["Job"].pod_sets(job)
    assert (only.name, only.count, only.path) == (MAIN_POD_SET, 3, "/spec/template")
    assert KINDS["Job"].replica_groups(job) is None and KINDS["Job"].route(job) is None
    assert all(not k.addon and not k.children for k in KINDS.values())


# -- MPIJob ------------------------------------------------------------------------------------
def test_mpijob_pod_sets_size_and_finished() -> None:
    obj = fx("mpijob")
    assert sets(MPIJOB.pod_sets(obj)) == [("launcher", 1), ("worker", 4)]
    assert MPIJOB.size(obj) == 5 and MPIJOB.finished(obj) and not MPIJOB.failed(obj)
    assert MPIJOB.pod_sets(obj)[1].path == "/spec/mpiReplicaSpecs/Worker/template"
    assert MPIJOB.pod_sets(obj)[1].template["spec"]["containers"][0]["resources"]["requests"]["cpu"] == "4"
    running = copy.deepcopy(obj)
    running["status"]["conditions"] = [c for c in running["status"]["conditions"] if c["type"] != "Succeeded"]
    assert not MPIJOB.finished(running)
    failed = copy.deepcopy(running)
    failed["status"]["conditions"].append({"type": "Failed", "status": "True"})
    assert MPIJOB.finished(failed) and MPIJOB.failed(failed)
    # launcher only (runLauncherAsWorker, no Worker); WaitForWorkersReady defers the launcher
    solo = copy.deepcopy(obj)
    solo["spec"]["runLauncherAsWorker"] = True
    del solo["spec"]["mpiReplicaSpecs"]["Worker"]
    assert sets(MPIJOB.pod_sets(solo)) == [("launcher", 1)]
    wait = copy.deepcopy(obj)
    wait["spec"]["launcherCreationPolicy"] = "WaitForWorkersReady"
    assert [p.deferred for p in MPIJOB.pod_sets(wait)] == [True, False]


def test_mpijob_pods_route_to_it() -> None:
    worker, launcher = fx("mpijob-worker-pod"), fx("mpijob-launcher-pod")
    assert route_pod(worker) == PodRoute("MPIJob", "flux-demo", "pi2", "worker", 1)
    assert route_pod(launcher) == PodRoute("MPIJob", "flux-demo", "pi2", "launcher", 0)
    assert addon_pod(launcher) == "MPIJob" and route_pod(launcher, enabled=["JobSet"]) is None
    assert made_for(fx("mpijob-launcher-job")) == "MPIJob"
    assert PodRoute("MPIJob", "ns", "pi", "worker").group_base == "mpijob-pi"


def test_mpijob_hold_and_resume() -> None:
    obj = example("mpijob")
    out = apply_patch(obj, admission.mutate(review(obj)))
    assert out["spec"]["runPolicy"]["suspend"] is True
    assert out["metadata"]["annotations"][ANN_SUSPENDED_BY] == "fluxnetes"
    for role in ("Launcher", "Worker"):
        tmpl = out["spec"]["mpiReplicaSpecs"][role]["template"]
        assert tmpl["spec"]["schedulingGates"] == [{"name": names.GATE}]
        assert tmpl["metadata"]["labels"][names.LABEL_MANAGED] == "true"
    assert MPIJOB.held_by_fluxnetes(out) and not MPIJOB.held_by_user(out)
    assert MPIJOB.resume_patch(out) == {"spec": {"runPolicy": {"suspend": False}}}
    mine = copy.deepcopy(obj)
    mine["spec"]["runPolicy"]["suspend"] = True
    out = apply_patch(mine, admission.mutate(review(mine)))
    assert MPIJOB.held_by_user(out) and ANN_SUSPENDED_BY not in (out["metadata"].get("annotations") or {})
    # no runPolicy at all: the webhook makes one
    bare = copy.deepcopy(obj)
    del bare["spec"]["runPolicy"]
    assert apply_patch(bare, admission.mutate(review(bare)))["spec"]["runPolicy"] == {"suspend": True}
    # --job-mode gate: pods held, the workload not suspended
    out = apply_patch(obj, admission.mutate(review(obj), job_mode="gate"))
    assert "suspend" not in out["spec"]["runPolicy"]
    assert out["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["schedulingGates"]


# -- JobSet ------------------------------------------------------------------------------------
def test_jobset_pod_sets_every_replicated_job() -> None:
    obj = fx("jobset")
    assert sets(JOBSET.pod_sets(obj)) == [("driver", 1), ("workers", 8)]
    assert JOBSET.size(obj) == 9 and JOBSET.finished(obj) and not JOBSET.failed(obj)
    # parallelism capped by completions; InOrder startup defers the later replicated Jobs
    odd = copy.deepcopy(obj)
    odd["spec"]["replicatedJobs"][1]["template"]["spec"].update(parallelism=5, completions=3)
    odd["spec"]["startupPolicy"] = {"startupPolicyOrder": "InOrder"}
    assert sets(JOBSET.pod_sets(odd)) == [("driver", 1), ("workers", 6)]
    assert [p.deferred for p in JOBSET.pod_sets(odd)] == [False, True]
    running = copy.deepcopy(obj)
    running["status"] = {}
    assert not JOBSET.finished(running)
    running["status"] = {"terminalState": "Failed"}
    assert JOBSET.finished(running) and JOBSET.failed(running)


def test_jobset_pod_routes_with_its_slot() -> None:
    pod, obj = fx("jobset-pod"), fx("jobset")
    # job-index 0 of "workers" (4 pods a Job), completion index 0
    assert route_pod(pod, lookup_of(obj)) == PodRoute("JobSet", "flux-demo", "train", "workers", 0)
    second = copy.deepcopy(pod)
    second["metadata"]["labels"].update({"jobset.sigs.k8s.io/job-index": "1",
                                         "batch.kubernetes.io/job-completion-index": "2"})
    assert route_pod(second, lookup_of(obj)).slot == 6  # type: ignore[union-attr]
    assert route_pod(pod) == PodRoute("JobSet", "flux-demo", "train", "workers")
    # the JobSet is not cached yet: unknown (it may be a TrainJob's), but never a plain Job's
    assert route_pod(pod, lookup_of()) is None and addon_pod(pod) == "JobSet"


def test_jobset_hold_gates_each_replicated_job() -> None:
    obj = example("jobset")
    out = apply_patch(obj, admission.mutate(review(obj)))
    assert out["spec"]["suspend"] is True and JOBSET.held_by_fluxnetes(out)
    for rj in out["spec"]["replicatedJobs"]:
        tmpl = rj["template"]["spec"]["template"]
        assert tmpl["spec"]["schedulingGates"] == [{"name": names.GATE}]
        assert tmpl["metadata"]["labels"] == {names.LABEL_MANAGED: "true"}
    assert JOBSET.resume_patch(out) == {"spec": {"suspend": False}}


# -- TrainJob ----------------------------------------------------------------------------------
def test_trainjob_one_group_with_its_jobset() -> None:
    tj, js, pod = fx("trainjob"), fx("trainjob-jobset"), fx("trainjob-pod")
    assert sets(TRAINJOB.pod_sets(tj)) == [("node", 2)]
    assert TRAINJOB.pod_sets(tj)[0].template["spec"]["containers"][0]["resources"]["requests"]["cpu"] == "2"
    assert TRAINJOB.owns_jobset(tj, js) and sets(TRAINJOB.pod_sets_with(tj, js)) == [("node", 2)]
    assert all(p.path == "" for p in TRAINJOB.pod_sets_with(tj, js))
    assert TRAINJOB.finished(tj) and not TRAINJOB.failed(tj)
    assert made_for(js) == "TrainJob"
    # its pods route to the TrainJob (through the JobSet's owner), never to the JobSet
    assert route_pod(pod, lookup_of(js)) == PodRoute("TrainJob", "flux-demo", "mnist", "node", 0)
    user_js = copy.deepcopy(js)
    user_js["metadata"]["ownerReferences"] = []
    assert route_pod(pod, lookup_of(user_js)) == PodRoute("JobSet", "flux-demo", "mnist", "node", 0)


def test_trainjob_hold_and_its_jobset_left_alone() -> None:
    obj = example("trainjob")
    out = apply_patch(obj, admission.mutate(review(obj)))
    assert out["spec"]["suspend"] is True and TRAINJOB.held_by_fluxnetes(out)
    assert TRAINJOB.resume_patch(out) == {"spec": {"suspend": False}}
    js = fx("trainjob-jobset")
    js["spec"]["suspend"] = False
    assert admission.mutate(review(js))["response"].get("patch") is None
    # nor the Jobs a JobSet or an MPIJob makes, nor an LWS's StatefulSets
    job = fx("mpijob-launcher-job")
    job["spec"]["suspend"] = False
    assert admission.mutate(review(job))["response"].get("patch") is None
    sts = {"apiVersion": "apps/v1", "kind": "StatefulSet",
           "metadata": {"name": "serve-1", "namespace": "flux-demo",
                        "labels": {"leaderworkerset.sigs.k8s.io/name": "serve"},
                        "ownerReferences": [{"kind": "Pod", "name": "serve-1", "controller": True}]},
           "spec": {"replicas": 3, "template": {"spec": {"containers": [{"name": "w"}]}}}}
    assert made_for(sts) == "LeaderWorkerSet"
    assert admission.mutate(review(sts))["response"].get("patch") is None


# -- LeaderWorkerSet ---------------------------------------------------------------------------
def test_lws_groups_per_replica() -> None:
    obj = fx("lws")
    assert LWS.replica_groups(obj) == 3 and LWS.size(obj) == 4
    assert sets(LWS.pod_sets(obj)) == [("leader", 1), ("worker", 3)]
    assert LWS.pod_sets(obj)[0].template["spec"]["containers"][0]["name"] == "leader"
    assert not LWS.finished(obj) and LWS.resume_patch(obj) is None
    assert route_pod(fx("lws-leader-pod")) == PodRoute("LeaderWorkerSet", "flux-demo", "serve", "leader", 0, 1)
    r = route_pod(fx("lws-worker-pod"))
    assert r == PodRoute("LeaderWorkerSet", "flux-demo", "serve", "worker", 1, 1)
    assert r.group_base == "leaderworkerset-serve-1"  # type: ignore[union-attr]
    no_leader = copy.deepcopy(obj)
    del no_leader["spec"]["leaderWorkerTemplate"]["leaderTemplate"]
    no_leader["spec"]["startupPolicy"] = "LeaderReady"
    ps = LWS.pod_sets(no_leader)
    assert ps[0].path == ps[1].path == "/spec/leaderWorkerTemplate/workerTemplate" and ps[1].deferred


def test_lws_hold_gates_both_templates_once() -> None:
    obj = example("lws")
    out = apply_patch(obj, admission.mutate(review(obj)))
    lwt = out["spec"]["leaderWorkerTemplate"]
    for t in ("leaderTemplate", "workerTemplate"):
        assert lwt[t]["spec"]["schedulingGates"] == [{"name": names.GATE}]
    single = copy.deepcopy(obj)
    del single["spec"]["leaderWorkerTemplate"]["leaderTemplate"]
    out = apply_patch(single, admission.mutate(review(single)))
    assert out["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["schedulingGates"] == [{"name": names.GATE}]


# -- bad input ---------------------------------------------------------------------------------
def test_bad_pod_template_in_a_pod_set_is_refused_naming_it() -> None:
    obj = example("mpijob")
    obj["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["nodeName"] = "kwok-node-0"
    resp = admission.mutate(review(obj))["response"]
    assert resp["allowed"] is False
    assert "spec.mpiReplicaSpecs.Worker.template.spec.nodeName" in resp["status"]["message"]
    obj = example("jobset")
    obj["spec"]["replicatedJobs"][1]["template"]["spec"]["template"]["metadata"] = {
        "labels": {names.LABEL_GROUP_SIZE: "0", names.LABEL_GROUP: "g"}}
    assert admission.mutate(review(obj))["response"]["allowed"] is False
    other = example("jobset")
    other["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["schedulerName"] = "volcano"
    assert admission.mutate(review(other))["response"].get("patch") is None


# -- which kinds are on ------------------------------------------------------------------------
def test_enabled_kinds_from_discovery_and_crds() -> None:
    assert discovery_paths() == ["/apis/jobset.x-k8s.io/v1alpha2", "/apis/kubeflow.org/v2beta1",
                                 "/apis/leaderworkerset.x-k8s.io/v1", "/apis/trainer.kubeflow.org/v1alpha1"]
    lines: list[str] = []
    assert set(enabled_kinds([], log=lines.append)) == set(KINDS)
    assert len(lines) == 4 and all("is off" in ln for ln in lines)
    docs = [
        {"kind": "APIResourceList", "groupVersion": "kubeflow.org/v2beta1",
         "resources": [{"name": "mpijobs"}, {"name": "mpijobs/status"}]},
        {"kind": "CustomResourceDefinition",
         "spec": {"group": "trainer.kubeflow.org", "names": {"plural": "trainjobs"},
                  "versions": [{"name": "v1alpha1", "served": True}]},
         "status": {"conditions": [{"type": "Established", "status": "True"}]}},
        {"kind": "CustomResourceDefinition",  # not Established yet: not served
         "spec": {"group": "jobset.x-k8s.io", "names": {"plural": "jobsets"},
                  "versions": [{"name": "v1alpha2", "served": True}]}, "status": {}},
    ]
    served = served_resources(docs)
    assert served == {("kubeflow.org/v2beta1", "mpijobs"), ("trainer.kubeflow.org/v1alpha1", "trainjobs")}
    lines.clear()
    on = enabled_kinds(served, log=lines.append)
    # TrainJob runs as a JobSet: off while JobSet is
    assert "MPIJob" in on and "TrainJob" not in on and "JobSet" not in on
    assert any("TrainJob is off: it needs JobSet" in ln for ln in lines)
    served.add(("jobset.x-k8s.io/v1alpha2", "jobsets"))
    assert {"MPIJob", "TrainJob", "JobSet"} <= set(enabled_kinds(served))


def test_webhook_configuration_adds_multi_role_rules_only_when_on() -> None:
    target = webhook_config.WebhookTarget(url="https://127.0.0.1:9443")
    scope = webhook_config.Scope()
    base = webhook_config.mutating(target, scope, b"CA")
    assert [w["name"] for w in base["webhooks"]] == ["pods.mutate.fluxnetes.io", "workloads.mutate.fluxnetes.io"]
    assert webhook_config.mutating(target, scope, b"CA", multi_role=list(KINDS.values())) == base
    full = webhook_config.mutating(target, scope, b"CA", multi_role=list(ALL_KINDS.values()))
    assert full["webhooks"][:2] == base["webhooks"]
    extra = full["webhooks"][2]
    assert extra["name"] == webhook_config.MULTI_ROLE_WEBHOOK
    assert extra["clientConfig"]["url"].endswith(webhook_config.MUTATE_WORKLOADS_PATH)
    assert {(r["apiGroups"][0], r["apiVersions"][0], tuple(r["resources"])) for r in extra["rules"]} == {
        ("jobset.x-k8s.io", "v1alpha2", ("jobsets",)), ("kubeflow.org", "v2beta1", ("mpijobs",)),
        ("leaderworkerset.x-k8s.io", "v1", ("leaderworkersets",)),
        ("trainer.kubeflow.org", "v1alpha1", ("trainjobs",))}
    assert all(r["operations"] == ["CREATE"] for r in extra["rules"])
    assert extra["namespaceSelector"] == base["webhooks"][1]["namespaceSelector"]


@pytest.mark.parametrize("name", ["mpijob", "jobset", "trainjob", "lws"])
def test_examples_are_admitted_and_held(name: str) -> None:
    obj = example(name)
    resp = admission.mutate(review(obj))["response"]
    assert resp["allowed"] and resp.get("patch")
    kind = ALL_KINDS[obj["kind"]]
    held = apply_patch(obj, admission.mutate(review(obj)))
    assert kind.held_by_fluxnetes(held) or kind.resume_patch(held) is None


def test_group_names_and_pod_sets_of_any_workload() -> None:
    lws, tj, js = fx("lws"), fx("trainjob"), fx("trainjob-jobset")
    assert group_bases(lws) == [f"leaderworkerset-serve-{i}" for i in range(3)]
    assert group_bases(fx("mpijob")) == ["mpijob-pi2"]
    assert group_bases({"kind": "Job", "metadata": {"name": "j"}}) == ["job-j"]
    assert route_pod(fx("lws-worker-pod")).group_base in group_bases(lws)  # type: ignore[union-attr]
    assert sets(pod_sets_of(tj, lookup_of(js))) == [("node", 2)]
    two_jobs = copy.deepcopy(js)
    two_jobs["spec"]["replicatedJobs"][0]["replicas"] = 3
    assert sets(pod_sets_of(tj, lookup_of(two_jobs))) == [("node", 6)]
    assert sets(pod_sets_of(fx("jobset"))) == [("driver", 1), ("workers", 8)]
    assert pod_sets_of({"kind": "Unknown"}) == []


def test_conflicting_or_bad_packing_annotations_are_refused_at_admission() -> None:
    obj = example("mpijob")
    obj["metadata"]["annotations"] = {"fluxnetes.io/pack": "node", "fluxnetes.io/exclusive": "node"}
    resp = admission.mutate(review(obj))["response"]
    assert resp["allowed"] is False and "fluxnetes.io/exclusive" in resp["status"]["message"]
    obj["metadata"]["annotations"] = {"fluxnetes.io/pack": "socket"}
    resp = admission.mutate(review(obj))["response"]
    assert resp["allowed"] is False and "must be one of node, rack, zone" in resp["status"]["message"]
    obj["metadata"]["annotations"] = {"fluxnetes.io/pack": "rack", "fluxnetes.io/exclusive": "node"}
    assert admission.mutate(review(obj))["response"]["allowed"] is True
