"""`fluxnetes submit --dry-run`: offline against a graph file, in memory with held resources and
queued work, and against the real kube-apiserver with FluxJobs created by the test."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml
from typer.testing import CliRunner

from fluxnetes.cli import submit_cmd
from fluxnetes.cli.ctl.dryrun import (
    Held,
    SubmitError,
    Waiting,
    candidates_from_docs,
    cluster_state,
    dry_run,
)
from fluxnetes.graph import from_description
from fluxnetes.jobspec import PodRequest, jobspec_from_pods
from fluxnetes.k8s.scheduling.shares import Share
from helpers import cli_app, fluxjob_namespace, patch_fluxjob_status

ROOT = Path(__file__).resolve().parents[1]
NOW = datetime(2026, 1, 1, tzinfo=UTC)
CLUSTER = {
    "node": {"sockets": 0, "cores": 16, "gpus": 4, "memory": 65536, "memory_unit": "MiB"},
    "nodes": 4,
}


def app() -> typer.Typer:
    return cli_app(submit_cmd)


def job(
    name: str, pods: int, cpu: str, *, gpus: int = 0, deadline: int | None = None
) -> dict[str, Any]:
    requests: dict[str, Any] = {"cpu": cpu, "memory": "1Gi"}
    if gpus:
        requests["nvidia.com/gpu"] = gpus
    spec: dict[str, Any] = {
        "parallelism": pods,
        "template": {
            "spec": {
                "containers": [{"name": "c", "image": "x", "resources": {"requests": requests}}]
            }
        },
    }
    if deadline:
        spec["activeDeadlineSeconds"] = deadline
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name}, "spec": spec}


def whole_nodes(n: int, duration: int) -> Any:
    return jobspec_from_pods(n, PodRequest(16000, 2**30, 0), duration=duration, name="w")


def graph() -> Any:
    return from_description(CLUSTER)


# -- reading workloads ---------------------------------------------------------------------------


def test_workloads_become_candidates_with_size_request_and_duration() -> None:
    deploy = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web", "annotations": {"fluxnetes.io/duration": "5m"}},
        "spec": {
            "replicas": 3,
            "template": {"spec": {"containers": [{"name": "c", "image": "x"}]}},
        },
    }
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "p",
            "labels": {"fluxnetes.io/group": "g", "fluxnetes.io/group-size": "2"},
        },
        "spec": {
            "containers": [{"name": "c", "image": "x", "resources": {"requests": {"cpu": "2500m"}}}]
        },
    }
    cands = candidates_from_docs([job("train", 4, "8", gpus=2, deadline=3600), deploy, pod])
    assert [(c.kind, c.name, c.size, c.duration) for c in cands] == [
        ("Job", "train", 4, 3600),
        ("Deployment", "web", 3, 300),
        ("Pod", "p", 2, 0),
    ]
    assert cands[0].per_pod == "8c,1024Mi,2gpu" and cands[2].per_pod == "3c"


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        (
            {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"}},
            "kind 'Service' is not one of",
        ),
        ("just text", "must be a mapping"),
        (
            {
                "kind": "Pod",
                "metadata": {
                    "name": "p",
                    "labels": {"fluxnetes.io/group": "g", "fluxnetes.io/group-size": "0"},
                },
                "spec": {"containers": [{"name": "c"}]},
            },
            "group-size",
        ),
        ({"version": 1, "resources": [{"type": "slot"}]}, "document 1"),
        ({**job("j", 0, "1")}, "0 pods to schedule"),
    ],
)
def test_bad_documents_are_refused_naming_the_document(doc: Any, message: str) -> None:
    with pytest.raises(SubmitError, match="document 1") as err:
        candidates_from_docs([doc])
    assert message in str(err.value)


# -- the forward replay ----------------------------------------------------------------------------


def test_fits_now_on_an_empty_cluster_and_never_when_too_big() -> None:
    cands = candidates_from_docs(
        [job("train", 4, "8", gpus=2, deadline=3600), job("huge", 1, "1", gpus=1000)]
    )
    verdicts, _ = dry_run(graph(), cands, now=NOW)
    train, huge = verdicts
    assert train.outcome == "now" and train.start_in == 0 and len(set(train.nodes)) == 4
    assert huge.outcome == "never" and "gpu" in huge.reason


def test_waits_for_held_resources_with_a_known_end() -> None:
    held = [Held("running", [Share(f"node{i}", cores=16) for i in range(4)], end=600)]
    cands = candidates_from_docs([job("next", 2, "16", deadline=60)])
    (v,) = dry_run(graph(), cands, held=held, now=NOW)[0]
    assert v.outcome == "later" and v.start_in == 600
    assert v.start == (NOW + timedelta(seconds=600)).strftime("%Y-%m-%dT%H:%M:%SZ")


def test_unknown_when_held_resources_have_no_end() -> None:
    held = [Held("foreign", [Share(f"node{i}", cores=16) for i in range(4)], end=None)]
    (v,) = dry_run(graph(), candidates_from_docs([job("next", 1, "1")]), held=held, now=NOW)[0]
    assert v.outcome == "unknown" and "unknown duration" in v.reason


def test_queued_work_ahead_goes_first_and_backfill_fits_in_front() -> None:
    # node0-1 busy for 100 s; a queued 4-node job (priority 5) must wait for them; the new 2-node
    # job with a 50 s limit backfills on node2-3 without delaying it, a 2-node 500 s one cannot
    held = [Held("running", [Share(f"node{i}", cores=16) for i in range(2)], end=100)]
    waiting = [Waiting("ns/big", whole_nodes(4, 1000), submit=-10, priority=5)]
    cands = candidates_from_docs(
        [job("short", 2, "16", deadline=50), job("long", 2, "16", deadline=500)]
    )
    short, long = dry_run(graph(), cands, held=held, waiting=waiting, policy="easy", now=NOW)[0]
    assert short.outcome == "now"
    assert long.outcome == "later" and long.start_in == 1100  # after big (100 + 1000)
    # fcfs: nothing passes the blocked head
    short_fcfs, _ = dry_run(graph(), cands, held=held, waiting=waiting, policy="fcfs", now=NOW)[0]
    assert short_fcfs.outcome == "later" and short_fcfs.start_in == 1100


def test_overcommitted_nodes_are_capped_not_dropped() -> None:
    held = [
        Held("foreign: web", [Share("node0", cores=8)], end=None),
        Held("a/big", [Share("node0", cores=12), Share("node1", cores=16)], end=300),
        Held("a/stale", [Share("node0", cores=8)], end=300),
    ]
    cands = candidates_from_docs([job("one", 1, "16", deadline=10)])
    (v,), notes = dry_run(graph(), cands, held=held, now=NOW)
    # FluxJobs are recorded first: big takes 12 of node0, stale gets the 4 left, the
    # foreign pods find nothing; node2-3 are free, so the job starts now
    assert any("a/stale: node0 is overcommitted; recorded 4 of 8 cores" in n for n in notes), notes
    assert any("foreign: web: nothing free on node0" in n for n in notes), notes
    assert v.outcome == "now" and set(v.nodes) <= {"node2", "node3"}
    # with node2-3 taken for good, it waits for big and stale (300 s)
    held.append(
        Held("foreign: rest", [Share("node2", cores=16), Share("node3", cores=16)], end=None)
    )
    (v,), _ = dry_run(graph(), cands, held=held, now=NOW)
    assert v.outcome == "later" and v.start_in == 300


def test_cluster_state_from_api_objects() -> None:
    nodes = [
        {"metadata": {"name": f"n{i}"}, "status": {"allocatable": {"cpu": "16", "memory": "64Gi"}}}
        for i in range(2)
    ]
    pods = [
        {  # foreign
            "metadata": {"name": "web", "namespace": "a"},
            "spec": {
                "nodeName": "n0",
                "containers": [{"name": "c", "resources": {"requests": {"cpu": "1500m"}}}],
            },
            "status": {"phase": "Running"},
        },
        {  # placed by fluxnetes: counted through its FluxJob, not twice
            "metadata": {
                "name": "r-0",
                "namespace": "a",
                "annotations": {"fluxnetes.io/fluxjob": "r"},
            },
            "spec": {"nodeName": "n1", "containers": [{"name": "c"}]},
            "status": {"phase": "Running"},
        },
        {  # placed at once, no FluxJob (the operator's default, --fluxjobs waiting): its pod holds
            # what it asks, for an unknown time (it used to be skipped as if its FluxJob counted it)
            "metadata": {
                "name": "quick-0",
                "namespace": "a",
                "annotations": {"fluxnetes.io/fluxjob": "job-quick"},
            },
            "spec": {"nodeName": "n0", "containers": [{"name": "c", "resources": {"requests": {"cpu": "3"}}}]},
            "status": {"phase": "Running"},
        },
    ]

    def ts(d: int) -> str:
        return (NOW + timedelta(seconds=d)).strftime("%Y-%m-%dT%H:%M:%SZ")

    fjs = [
        {
            "metadata": {"name": "r", "namespace": "a"},
            "spec": {"size": 2, "duration": 300, "request": {"cpu": 4000, "memory": 2**30}},
            "status": {"phase": "Running", "nodes": ["n1", "n1"], "startTime": ts(-100)},
        },
        {
            "metadata": {"name": "q", "namespace": "a"},
            "spec": {"size": 1, "priority": 3, "request": {"cpu": 1000}},
            "status": {"phase": "Pending", "submitTime": ts(-5)},
        },
        {
            "metadata": {"name": "done", "namespace": "a"},
            "spec": {"size": 1},
            "status": {"phase": "Completed"},
        },
    ]
    held, waiting, notes = cluster_state(nodes, pods, fjs, NOW)
    by_name = {h.name: h for h in held}
    assert by_name["a/r"].end == 200 and by_name["a/r"].shares[0].cores == 8
    assert by_name["a/r"].shares[0].memory == 2048
    foreign = next(h for h in held if h.name.startswith("foreign: 1 other pod"))
    assert foreign.end is None and foreign.shares[0].cores == 2
    quick = by_name["a/job-quick (no FluxJob)"]
    assert quick.end is None and [(s.node, s.cores) for s in quick.shares] == [("n0", 3)]
    assert [(w.id, w.submit, w.priority) for w in waiting] == [("a/q", -5, 3)]
    assert notes == []


# -- the command -----------------------------------------------------------------------------------


def test_offline_command_with_a_graph_file(tmp_path: Path) -> None:
    g = tmp_path / "cluster.yaml"
    g.write_text(yaml.safe_dump(CLUSTER))
    work = tmp_path / "work.yaml"
    work.write_text(
        yaml.safe_dump_all([job("train", 4, "8", deadline=60), job("huge", 1, "1", gpus=99)])
    )
    result = CliRunner().invoke(
        app(), ["submit", "--dry-run", str(work), "--graph", str(g), "-o", "json"]
    )
    assert result.exit_code == 3, result.output  # 3: something would never start
    out = json.loads(result.stdout)
    assert [v["outcome"] for v in out["verdicts"]] == ["now", "never"]
    table = CliRunner().invoke(
        app(), ["submit", "--dry-run", str(work), "--graph", str(g)], env={"COLUMNS": "200"}
    )
    assert "would start now" in table.stdout and "would never start" in table.stdout
    missing = CliRunner().invoke(
        app(), ["submit", "--dry-run", str(tmp_path / "nope.yaml"), "--graph", str(g)]
    )
    assert missing.exit_code == 1 and "cannot read" in missing.output
    no_flag = CliRunner().invoke(app(), ["submit", str(work), "--graph", str(g)])
    assert no_flag.exit_code == 2 and "only --dry-run" in no_flag.output
    bad_policy = CliRunner().invoke(
        app(), ["submit", "--dry-run", str(work), "--graph", str(g), "--policy", "lifo"]
    )
    assert bad_policy.exit_code == 1 and "policy" in bad_policy.output


def test_offline_with_the_repository_examples(tmp_path: Path) -> None:
    example = ROOT / "examples/k8s/job.yaml"
    if not example.exists():
        pytest.skip("examples/k8s/job.yaml not in this checkout")
    g = tmp_path / "cluster.yaml"
    g.write_text(yaml.safe_dump(CLUSTER))
    result = CliRunner().invoke(
        app(), ["submit", "--dry-run", str(example), "--graph", str(g), "-o", "yaml"]
    )
    assert result.exit_code == 0, result.output
    assert yaml.safe_load(result.stdout)["verdicts"][0]["outcome"] == "now"


# -- against the real kube-apiserver -----------------------------------------------------------------


@pytest.fixture
def busy_cluster(request: pytest.FixtureRequest) -> Iterator[tuple[Any, str]]:
    cluster, ns = fluxjob_namespace(request, "fx-submit")
    nodes = sorted(n["metadata"]["name"] for n in cluster.kubectl_json("get", "nodes")["items"])
    start = (datetime.now(UTC) - timedelta(seconds=10)).strftime("%Y-%m-%dT%H:%M:%SZ")
    try:
        obj = {
            "apiVersion": "fluxnetes.io/v1alpha1",
            "kind": "FluxJob",
            "metadata": {"name": "hog", "namespace": ns},
            # every core of every node, for 600 s
            "spec": {
                "size": len(nodes),
                "duration": 600,
                "request": {"cpu": 16000, "memory": 2**30},
            },
        }
        cluster.kubectl("create", "-f", "-", input=yaml.safe_dump(obj))
        status = {"phase": "Running", "nodes": nodes, "startTime": start, "submitTime": start}
        patch_fluxjob_status(cluster, ns, "hog", status)
        yield cluster, ns
    finally:
        cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)


@pytest.mark.k8s
def test_dry_run_against_the_cluster_waits_for_the_running_job(
    busy_cluster: tuple[Any, str], tmp_path: Path
) -> None:
    cluster, _ns = busy_cluster
    work = tmp_path / "work.yaml"
    work.write_text(yaml.safe_dump(job("next", 2, "2", deadline=60)))
    every_job = ("get", "jobs", "-A", "-o", "jsonpath={range .items[*]}{.metadata.namespace}/{.metadata.name} {end}")
    before = cluster.kubectl(*every_job).stdout
    result = CliRunner().invoke(
        app(),
        ["submit", "--dry-run", str(work), "--kubeconfig", str(cluster.kubeconfig), "-o", "json"],
    )
    assert result.exit_code == 0, result.output
    (v,) = json.loads(result.stdout)["verdicts"]
    # the FluxJob holds all cores for 600 s from 10 s ago; FluxJobs of other tests (their
    # namespaces are deleted without waiting) may only make it later, never earlier
    assert v["outcome"] == "later", v
    assert v["startIn"] >= 580
    others = [
        item for item in cluster.kubectl_json("get", "fluxjobs", "-A")["items"]
        if item["metadata"]["namespace"] != _ns
    ]
    if not others:
        assert v["startIn"] <= 600
    # nothing was created (other tests' Jobs may vanish meanwhile: their namespaces are
    # deleted without waiting, so only a Job that was not there before counts)
    after = cluster.kubectl(*every_job).stdout.split()
    assert set(after) <= set(before.split()), sorted(set(after) - set(before.split()))
