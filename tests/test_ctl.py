"""`fluxnetes ctl` / `kubectl fluxnetes`: the pure views, then every command against the real
kube-apiserver with FluxJob objects created by the test."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from fluxnetes.cli.ctl import build
from fluxnetes.cli.ctl.explain import explain_job
from fluxnetes.cli.ctl.nodes import node_rows
from fluxnetes.cli.ctl.queue import queue_rows, unrecorded_rows
from helpers import fluxjob_namespace, patch_fluxjob_status

ctl = build()

ROOT = Path(__file__).resolve().parents[1]
NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
GI = 1024**3


def ts(delta_s: int) -> str:
    return (NOW + timedelta(seconds=delta_s)).strftime("%Y-%m-%dT%H:%M:%SZ")


def fluxjob(
    name: str,
    phase: str,
    *,
    size: int = 1,
    cpu: int = 1000,
    memory: int = GI,
    gpus: int = 0,
    priority: int = 0,
    submit: int = 0,
    nodes: list[str] | None = None,
    expected: int | None = None,
    start: int | None = None,
    duration: int = 0,
    reason: str = "",
    ns: str = "default",
    exclusive: bool = False,
) -> dict[str, Any]:
    status: dict[str, Any] = {"phase": phase, "reason": reason, "submitTime": ts(submit)}
    if nodes:
        status["nodes"] = nodes
        status["nodeList"] = ",".join(sorted(set(nodes)))
    if expected is not None:
        status["expectedStart"] = ts(expected)
    if start is not None:
        status["startTime"] = ts(start)
    request = {"cpu": cpu, "memory": memory}
    if gpus:
        request["nvidia.com/gpu"] = gpus
    return {
        "apiVersion": "fluxnetes.io/v1alpha1",
        "kind": "FluxJob",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "size": size,
            "priority": priority,
            "duration": duration,
            "request": request,
            "exclusive": exclusive,
        },
        "status": status,
    }


def node(
    name: str, cpu: str = "16", memory: str = "64Gi", gpus: int = 4, ready: bool = True
) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {}},
        "spec": {},
        "status": {
            "allocatable": {
                "cpu": cpu,
                "memory": memory,
                "nvidia.com/gpu": str(gpus),
                "pods": "110",
            },
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def pod(
    name: str,
    node_name: str,
    cpu: str,
    memory: str = "1Gi",
    *,
    fluxjob: str | None = None,
    gpus: int = 0,
) -> dict[str, Any]:
    md: dict[str, Any] = {"name": name, "namespace": "default"}
    if fluxjob:
        md["annotations"] = {"fluxnetes.io/fluxjob": fluxjob}
        md["labels"] = {"fluxnetes.io/managed": "true"}
    requests: dict[str, Any] = {"cpu": cpu, "memory": memory}
    if gpus:
        requests["nvidia.com/gpu"] = str(gpus)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": md,
        "spec": {
            "nodeName": node_name,
            "containers": [{"name": "c", "resources": {"requests": requests}}],
        },
        "status": {"phase": "Running"},
    }


# -- pure views ----------------------------------------------------------------------------------


def test_queue_lists_running_then_waiting_in_scheduling_order() -> None:
    jobs = [
        fluxjob("late", "Pending", submit=30),
        fluxjob("done", "Completed", submit=-100),
        fluxjob("urgent", "Pending", submit=50, priority=10),
        fluxjob("early", "Reserved", submit=10, expected=600, reason="reserved: cores busy"),
        fluxjob("run", "Running", submit=-10, start=-5, nodes=["n1", "n1", "n2"], size=3),
    ]
    rows = queue_rows(jobs, NOW)
    assert [r["name"] for r in rows] == ["run", "urgent", "early", "late"]
    assert [r["position"] for r in rows] == [1, 2, 3, 4]
    early = rows[2]
    assert early["state"] == "Reserved" and early["start"] == "in 10m"
    assert early["reason"] == "reserved: cores busy"
    assert rows[0]["nodes"] == "n1,n2" and rows[0]["start"] == "5s ago"
    assert rows[0]["request"] == "1c,1Gi"
    assert [r["name"] for r in queue_rows(jobs, NOW, include_finished=True)][-1] == "done"
    assert rows[0]["podSets"] == ""
    mpi = fluxjob("mpi", "Pending", submit=5, size=9)
    mpi["status"]["podSets"] = [{"name": "launcher", "count": 1}, {"name": "worker", "count": 8}]
    assert queue_rows([mpi], NOW)[0]["podSets"] == "launcher 1, worker 8"


def test_queue_shows_running_groups_without_a_fluxjob_from_their_pods() -> None:
    """``--fluxjobs waiting``: a group placed at once has no FluxJob; its bound pods name it
    (``fluxnetes.io/fluxjob``), so the queue still lists it, marked as such. Pods of a group
    with a FluxJob, finished or unbound pods, foreign pods and other namespaces are not rows."""
    quick = [pod(f"quick-{i}", f"n{i}", "2", "1Gi", fluxjob="job-quick") for i in range(2)]
    known = pod("run-0", "n1", "1", fluxjob="run")
    done = pod("old-0", "n1", "1", fluxjob="job-old")
    done["status"] = {"phase": "Succeeded"}
    other = pod("x-0", "n1", "1", fluxjob="job-x")
    other["metadata"]["namespace"] = "elsewhere"
    pods = [*quick, known, done, other, pod("foreign", "n2", "1")]
    rows = unrecorded_rows(pods, [fluxjob("run", "Running", nodes=["n1"])], "default")
    assert [(r["name"], r["state"], r["fluxJob"], r["size"], r["nodes"]) for r in rows] == [
        ("job-quick", "Running", False, 2, "n0,n1")]
    assert rows[0]["request"] == "2c,1Gi" and "no FluxJob" in rows[0]["reason"]
    assert {r["name"] for r in unrecorded_rows(pods, [], None)} == {"job-quick", "run", "job-x"}
    # the nodes view charges them too, and agrees with their pods
    rows = {r["node"]: r for r in node_rows([node("n0"), node("n1")], pods, [fluxjob("run", "Running", nodes=["n1"])])}
    assert rows["n0"]["coresUsed"] == 2 and rows["n0"]["agrees"] == "yes"
    assert rows["n1"]["coresUsed"] == 2 + 1 + 1 and rows["n1"]["agrees"] == "yes"  # quick-1, run-0, x-0


def test_nodes_view_counts_fluxnetes_and_foreign_use_and_checks_agreement() -> None:
    nodes = [node("n1"), node("n2"), node("n3", ready=False)]
    jobs = [fluxjob("a", "Running", size=2, cpu=2500, memory=2 * GI, gpus=1, nodes=["n1", "n2"])]
    pods = [
        pod("a-0", "n1", "2500m", "2Gi", fluxjob="default/a", gpus=1),
        # n2: the FluxJob places a pod there but none is bound (yet): disagreement shown
        pod("web", "n2", "500m", "512Mi"),
        pod("web2", "n1", "1", "1Gi"),
    ]
    rows = {r["node"]: r for r in node_rows(nodes, pods, jobs)}
    n1 = rows["n1"]
    # 2500m is booked as 3 whole cores by the scheduler
    assert (n1["cores"], n1["coresUsed"], n1["coresForeign"], n1["coresFree"]) == (16, 3, 1, 12)
    assert n1["gpusUsed"] == 1 and n1["gpusFree"] == 3
    assert n1["memoryFree"] == 64 * GI - 2 * GI - GI
    assert n1["agrees"] == "yes" and n1["foreignPods"] == 1 and n1["fluxnetesPods"] == 1
    assert rows["n2"]["agrees"].startswith(
        "no: FluxJobs place 1 pod(s) here (3 cores, 1 gpus), 0 bound"
    )
    assert rows["n2"]["coresForeign"] == 1
    assert rows["n3"]["status"] == "down" and rows["n3"]["agrees"] == "yes"


def test_explain_names_the_short_resource_and_the_reservation_ahead() -> None:
    nodes = [node("n1", gpus=2), node("n2", gpus=2)]
    running = fluxjob("big", "Running", size=2, gpus=2, nodes=["n1", "n2"], start=-60, duration=600)
    ahead = fluxjob("first", "Reserved", size=2, gpus=2, submit=1, expected=540)
    me = fluxjob("me", "Pending", size=1, gpus=1, submit=5, reason="waiting: gpus busy")
    pods = [
        pod("big-0", "n1", "1", fluxjob="default/big"),
        pod("big-1", "n2", "1", fluxjob="default/big"),
    ]
    info = explain_job(me, nodes, pods, [running, ahead, me], NOW)
    assert info["state"] == "Pending" and info["reason"] == "waiting: gpus busy"
    assert (
        "room for 0 of 1 pod(s) now" in info["short"]
        and "short of gpus on 2 node(s)" in info["short"]
    )
    assert info["waitsBehind"] == ["default/first"]
    assert info["ahead"][0]["expectedStart"] == ts(540)
    assert info["runningEnds"] == [{"job": "default/big", "expectedEnd": ts(540)}]


def test_explain_unsatisfiable_and_waiting_for_turn() -> None:
    nodes = [node("n1", gpus=2)]
    huge = fluxjob("huge", "Pending", size=1, gpus=1000)
    assert "too small" in explain_job(huge, nodes, [], [huge], NOW)["short"]
    small = fluxjob("small", "Pending", size=1, gpus=1)
    assert explain_job(small, nodes, [], [small], NOW)["short"].startswith("nothing now")
    running = fluxjob("r", "Running", size=1, nodes=["n1"], start=-1)
    assert "short" not in explain_job(running, nodes, [], [running], NOW)


# -- issue #29 item 6: multi-shape gangs, history, the implicit default account -------------------


def gang(name: str, phase: str, sets: list[tuple[str, int, int]], *, nodes: list[str] | None = None,
         submit: int = 0) -> dict[str, Any]:
    """A multi-role FluxJob as the operator writes it: spec.request is the largest set's,
    status.podSets each set's own (name, pods, cpu millis; 1Gi per pod)."""
    size = sum(n for _, n, _ in sets)
    fj = fluxjob(name, phase, size=size, cpu=max(c for _, _, c in sets), nodes=nodes, submit=submit)
    at, listed = 0, []
    for set_name, n, cpu in sets:
        entry: dict[str, Any] = {"name": set_name, "count": n, "request": {"cpu": cpu, "memory": GI}}
        if nodes:
            entry["nodes"] = nodes[at:at + n]
        at += n
        listed.append(entry)
    fj["status"]["podSets"] = listed
    return fj


def test_nodes_view_charges_each_pod_set_its_own_shape() -> None:
    """examples/lws.yaml: a leader of 2 cpu and 3 workers of 1 cpu on 4-cpu nodes were all
    charged 2 cpu ("6/0/-2 of 4 ... AGREES no")."""
    nodes = [node("n1", cpu="4"), node("n2", cpu="4")]
    lws = gang("lws", "Running", [("leader", 1, 2000), ("worker", 3, 1000)], nodes=["n1", "n1", "n1", "n2"])
    pods = [pod("l", "n1", "2", fluxjob="default/lws"), pod("w1", "n1", "1", fluxjob="default/lws"),
            pod("w2", "n1", "1", fluxjob="default/lws"), pod("w3", "n2", "1", fluxjob="default/lws")]
    rows = {r["node"]: r for r in node_rows(nodes, pods, [lws])}
    assert (rows["n1"]["coresUsed"], rows["n1"]["coresFree"], rows["n1"]["agrees"]) == (4, 0, "yes")
    assert (rows["n2"]["coresUsed"], rows["n2"]["coresFree"], rows["n2"]["agrees"]) == (1, 3, "yes")


def test_queue_and_explain_show_each_pod_set_and_count_its_room() -> None:
    """An MPIJob (a 1-cpu launcher, 8 workers of 4 cpu) on nine 4-cpu nodes, one of them
    with 3 cpu taken, one full: 8 of its 9 pods fit now (7 workers and the launcher), not 7."""
    nodes = [node(f"n{i}", cpu="4") for i in range(1, 10)]
    mpi = gang("mpi", "Pending", [("launcher", 1, 1000), ("worker", 8, 4000)])
    row = queue_rows([mpi], NOW)[0]
    assert row["request"] == "launcher 1c,1Gi; worker 4c,1Gi" and row["podSets"] == "launcher 1, worker 8"
    info = explain_job(mpi, nodes, [pod("other", "n8", "3"), pod("full", "n9", "4")], [mpi], NOW)
    assert info["shape"] == "launcher 1 x (1c,1Gi), worker 8 x (4c,1Gi)"
    assert [(p["name"], p["count"], p["request"]) for p in info["podSets"]] == [
        ("launcher", 1, "1c,1Gi"), ("worker", 8, "4c,1Gi")]
    assert info["short"] == "room for 8 of 9 pod(s) now; short of cores on 9 node(s)", info["short"]
    assert info["roomNow"] == {f"n{i}": 1 for i in range(1, 9)}
    # eight 4-cpu nodes and a 1-cpu one hold the gang: not "too small" (judged at 4 cpu a pod)
    assert explain_job(mpi, [*nodes[:8], node("n9", cpu="1")], [], [mpi], NOW)["short"].startswith("nothing now")
    # a one-template job is one set, as before
    one = fluxjob("one", "Pending", size=2, cpu=4000)
    assert queue_rows([one], NOW)[0]["request"] == "4c,1Gi" and explain_job(one, nodes, [], [one], NOW)["podSets"] == []


def test_explain_history_is_in_time_order_and_keeps_repeated_states() -> None:
    fj = fluxjob("me", "Pending")
    fj["status"]["history"] = [
        {"time": ts(0), "phase": "Pending", "message": "queued"},
        {"time": ts(5), "phase": "Unsatisfiable", "message": "never"},
        {"time": ts(9), "phase": "Pending", "message": "queued again"}]
    fj["status"]["conditions"] = [  # one per phase: what history was made of before
        {"type": "Pending", "status": "True", "message": "queued again", "lastTransitionTime": ts(9)},
        {"type": "Unsatisfiable", "status": "False", "message": "never", "lastTransitionTime": ts(5)}]
    hist = explain_job(fj, [], [], [fj], NOW)["history"]
    assert [(h["state"], h["time"]) for h in hist] == [("Pending", ts(0)), ("Unsatisfiable", ts(5)),
                                                       ("Pending", ts(9))]
    del fj["status"]["history"]  # a status written before the operator kept a history
    hist = explain_job(fj, [], [], [fj], NOW)["history"]
    assert [(h["state"], h["time"]) for h in hist] == [("Unsatisfiable", ts(5)), ("Pending", ts(9))]


def test_accounts_lists_the_implicit_default_account() -> None:
    from fluxnetes.cli.ctl.accounts import account_rows, render

    team = {"apiVersion": "fluxnetes.io/v1alpha1", "kind": "FluxAccount", "metadata": {"name": "team"},
            "spec": {"shares": 3}, "status": {"normalizedShares": 0.75}}
    rows = account_rows([team])
    assert [(r["name"], r["implicit"], r["default"], r["normalizedShares"]) for r in rows] == [
        ("default", True, True, 0.25), ("team", False, False, 0.75)]
    from rich.console import Console

    console = Console(width=200, record=True)
    console.print(render(rows))
    assert "default (default, implicit)" in console.export_text()
    # a FluxAccount that is the default: nothing added
    team["spec"]["default"] = True
    assert [r["name"] for r in account_rows([team])] == ["team"]
    assert account_rows([]) == []


# -- against the real kube-apiserver ---------------------------------------------------------------


@pytest.fixture
def cluster_with_jobs(request: pytest.FixtureRequest) -> Iterator[tuple[Any, str]]:
    cluster, ns = fluxjob_namespace(request, "fx-ctl")
    node_names = sorted(
        n["metadata"]["name"] for n in cluster.kubectl_json("get", "nodes")["items"]
    )
    now = datetime.now(UTC)

    def t(delta: int) -> str:
        return (now + timedelta(seconds=delta)).strftime("%Y-%m-%dT%H:%M:%SZ")

    specs = [
        (
            "running",
            2,
            {
                "phase": "Running",
                "nodes": node_names[:2],
                "nodeList": ",".join(node_names[:2]),
                "startTime": t(-30),
                "submitTime": t(-60),
                "jobid": 1,
                "reason": "scheduled",
            },
        ),
        (
            "blocked",
            4,
            {
                "phase": "Reserved",
                "submitTime": t(-50),
                "jobid": 2,
                "expectedStart": t(3600),
                "reason": "reserved: not enough free nodes",
            },
        ),
        ("small", 1, {"phase": "Pending", "submitTime": t(-40), "jobid": 3, "reason": "waiting"}),
    ]
    try:
        for name, size, status in specs:
            obj = {
                "apiVersion": "fluxnetes.io/v1alpha1",
                "kind": "FluxJob",
                "metadata": {"name": name, "namespace": ns},
                "spec": {
                    "size": size,
                    "duration": 3600,
                    "request": {"cpu": 4000, "memory": 8 * GI},
                },
            }
            if name == "blocked":
                obj["spec"]["workload"] = {"apiVersion": "batch/v1", "kind": "Job", "name": name}
            else:
                obj["spec"]["group"] = name
            cluster.kubectl("create", "-f", "-", input=yaml.safe_dump(obj))
            patch_fluxjob_status(cluster, ns, name, status)
        # the running job's pods, bound where its status says, plus one foreign pod
        for i, n in enumerate(node_names[:2]):
            p = pod(f"running-{i}", n, "4", "8Gi", fluxjob="running")  # (its FluxJob's name, as placed)
            p["metadata"]["namespace"] = ns
            p["spec"]["containers"][0]["image"] = "busybox"
            del p["status"]
            cluster.kubectl("create", "-f", "-", input=yaml.safe_dump(p))
        # a group started at once with no FluxJob (--fluxjobs waiting): shown from its pod
        quick = pod("quick-0", node_names[1], "1", "1Gi", fluxjob="job-quick")
        quick["metadata"]["namespace"] = ns
        quick["spec"]["containers"][0]["image"] = "busybox"
        del quick["status"]
        cluster.kubectl("create", "-f", "-", input=yaml.safe_dump(quick))
        foreign = pod("foreign", node_names[0], "1", "1Gi")
        foreign["metadata"]["namespace"] = ns
        foreign["spec"]["containers"][0]["image"] = "busybox"
        del foreign["status"]
        cluster.kubectl("create", "-f", "-", input=yaml.safe_dump(foreign))
        # what `cancel` deletes: the wrapped Job of "blocked", the labelled pod of "small"
        job = {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": "blocked", "namespace": ns},
            "spec": {
                "suspend": True,
                "template": {
                    "spec": {
                        "restartPolicy": "Never",
                        "containers": [{"name": "c", "image": "busybox"}],
                    }
                },
            },
        }
        cluster.kubectl("create", "-f", "-", input=yaml.safe_dump(job))
        member = pod("small-pod", node_names[0], "1")
        member["metadata"].update(
            namespace=ns, labels={"fluxnetes.io/group": "small", "fluxnetes.io/group-size": "1"}
        )
        member["spec"]["containers"][0]["image"] = "busybox"
        del member["status"], member["spec"]["nodeName"]
        member["spec"]["schedulingGates"] = [{"name": "fluxnetes.io/gate"}]
        cluster.kubectl("create", "-f", "-", input=yaml.safe_dump(member))
        yield cluster, ns
    finally:
        cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)


def run(cluster: Any, *args: str) -> Any:
    result = CliRunner().invoke(ctl, [*args, "--kubeconfig", str(cluster.kubeconfig)])
    assert result.exit_code == 0, result.output
    return result


@pytest.mark.k8s
def test_ctl_commands_against_the_apiserver(cluster_with_jobs: tuple[Any, str]) -> None:
    cluster, ns = cluster_with_jobs
    rows = json.loads(run(cluster, "queue", "-n", ns, "-o", "json").stdout)
    assert [(r["name"], r["state"], r.get("fluxJob", True)) for r in rows] == [
        ("running", "Running", True),
        ("job-quick", "Running", False),
        ("blocked", "Reserved", True),
        ("small", "Pending", True),
    ]
    assert rows[2]["start"].startswith("in ") and rows[2]["reason"].startswith("reserved")
    table = run(cluster, "queue", "-n", ns).stdout
    assert "blocked" in table and "Reserved" in table and "2 running, 2 waiting" in table
    assert "Running (no FluxJob)" in table
    assert (
        yaml.safe_load(run(cluster, "queue", "-n", ns, "-o", "yaml").stdout)[3]["name"] == "small"
    )

    nodes = {r["node"]: r for r in json.loads(run(cluster, "nodes", "-o", "json").stdout)}
    ours = [r for r in nodes.values() if r["fluxnetesPods"]]
    assert len(ours) >= 2
    names = sorted(nodes)
    first = nodes[names[0]]
    assert first["coresUsed"] >= 4 and first["foreignPods"] >= 1 and first["coresForeign"] >= 1
    assert nodes[names[0]]["agrees"] == "yes" and nodes[names[1]]["agrees"] == "yes"

    info = json.loads(run(cluster, "explain", f"{ns}/small", "-o", "json").stdout)
    assert info["state"] == "Pending" and info["waitsBehind"] == [f"{ns}/blocked"]
    assert "short" in info
    assert "waits behind reservation" in run(cluster, "explain", "small", "-n", ns).stdout
    # a group placed at once without a FluxJob (--fluxjobs waiting): explained from its pod
    quick = json.loads(run(cluster, "explain", f"{ns}/job-quick", "-o", "json").stdout)
    assert (quick["state"], quick["fluxJob"], quick["size"], quick["nodes"]) == ("Running", False, 1, [names[1]])
    assert quick["shares"] == [{"node": names[1], "pods": 1, "cores": 1, "memory": 1024, "gpus": 0}]
    assert "Running (no FluxJob)" in run(cluster, "explain", "job-quick", "-n", ns).stdout

    jgf = json.loads(run(cluster, "graph").stdout)
    node_vertices = [v for v in jgf["graph"]["nodes"] if v["metadata"]["type"] == "node"]
    assert sorted(v["metadata"]["name"] for v in node_vertices) == names
    assert yaml.safe_load(run(cluster, "graph", "-o", "yaml").stdout) == jgf
    no_table = CliRunner().invoke(ctl, ["graph", "-o", "table", "--kubeconfig", str(cluster.kubeconfig)])
    assert no_table.exit_code == 1 and "--output must be json or yaml" in no_table.output

    out = run(cluster, "cancel", "small", "-n", ns).stdout
    assert "deleted 1 pod(s) of group small" in out
    assert being_deleted(cluster, "pod", "small-pod", ns)
    done = json.loads(run(cluster, "cancel", f"{ns}/blocked", "-o", "json").stdout)
    assert done == {"job": f"{ns}/blocked", "phase": "Reserved", "deleted": [{"kind": "Job", "name": "blocked"}],
                    "cancelled": True}
    assert being_deleted(cluster, "job", "blocked", ns)
    gone = json.loads(run(cluster, "cancel", f"{ns}/job-quick", "-o", "json").stdout)
    assert gone["fluxJob"] is False and gone["deleted"] == [{"kind": "Pod", "name": "quick-0"}]
    assert being_deleted(cluster, "pod", "quick-0", ns)


def being_deleted(cluster: Any, kind: str, name: str, ns: str) -> bool:
    res = cluster.kubectl("get", kind, name, "-n", ns, "-o", "json", check=False)
    return res.returncode != 0 or "deletionTimestamp" in json.loads(res.stdout)["metadata"]


@pytest.mark.k8s
def test_kubectl_finds_the_plugin(cluster_with_jobs: tuple[Any, str]) -> None:
    """`kubectl fluxnetes ...` through the real kubectl, which finds kubectl-fluxnetes on PATH
    (kubectl refuses its own flags before a plugin name: they go after it)."""
    import os
    import shutil
    import subprocess
    import sys

    cluster, ns = cluster_with_jobs
    plugin = shutil.which("kubectl-fluxnetes", path=str(Path(sys.executable).parent))
    if plugin is None:
        pytest.skip("kubectl-fluxnetes is not installed in this environment (pip install -e .)")
    env = {**os.environ, "PATH": f"{Path(plugin).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    res = subprocess.run(
        [
            str(cluster.tools.binary("kubectl")),
            "fluxnetes",
            "queue",
            "-n",
            ns,
            "-o",
            "json",
            "--kubeconfig",
            str(cluster.kubeconfig),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert res.returncode == 0, res.stderr
    assert [r["name"] for r in json.loads(res.stdout)] == ["running", "job-quick", "blocked", "small"]
    # `kubectl fluxnetes submit --dry-run` is `fluxnetes submit --dry-run` (docs/quickstart.md)
    work = Path(__file__).resolve().parents[1] / "examples/k8s/pod.yaml"
    res = subprocess.run(
        [str(cluster.tools.binary("kubectl")), "fluxnetes", "submit", "--dry-run", str(work), "-o", "json",
         "--kubeconfig", str(cluster.kubeconfig)],
        capture_output=True, text=True, env=env, timeout=120, check=False,
    )
    assert res.returncode == 0, res.stderr
    (verdict,) = json.loads(res.stdout)["verdicts"]
    assert verdict["kind"] == "Pod" and verdict["outcome"] in ("now", "later", "unknown")


@pytest.mark.k8s
def test_ctl_errors_are_clear(cluster_with_jobs: tuple[Any, str]) -> None:
    cluster, ns = cluster_with_jobs
    result = CliRunner().invoke(
        ctl, ["explain", "nope", "-n", ns, "--kubeconfig", str(cluster.kubeconfig)]
    )
    assert result.exit_code == 1
    assert f"FluxJob {ns}/nope not found" in result.output and "blocked" in result.output
    patch_fluxjob_status(cluster, ns, "small", {"phase": "Completed"})
    result = CliRunner().invoke(
        ctl, ["cancel", f"{ns}/small", "--kubeconfig", str(cluster.kubeconfig)]
    )
    assert result.exit_code == 1 and "already Completed" in result.output


def test_ctl_without_a_cluster_says_so(tmp_path: Path) -> None:
    missing = tmp_path / "nope.kubeconfig"
    result = CliRunner().invoke(ctl, ["queue", "--kubeconfig", str(missing)])
    assert result.exit_code == 1
    assert "cannot load the Kubernetes configuration" in result.output


def test_tables_are_not_cut_at_80_columns_when_piped(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from fluxnetes.cli.ctl.common import console, table

    monkeypatch.delenv("COLUMNS", raising=False)
    reason = "waiting for resources: " + "x" * 150
    console().print(table("t", ["JOB", "REASON"], [["job-1", reason]]))
    lines = [ln for ln in capsys.readouterr().out.splitlines() if "job-1" in ln]
    assert len(lines) == 1 and reason in lines[0]
    monkeypatch.setenv("COLUMNS", "60")  # an explicit width still wins
    console().print(table("t", ["JOB", "REASON"], [["job-1", reason]]))
    assert reason not in capsys.readouterr().out


def test_explain_counts_an_extended_resource_by_its_full_name() -> None:
    """Issue #29.1: `example.com/fpga` is not `other.com/fpga`, in explain too."""
    other, mine = node("other"), node("mine")
    other["status"]["allocatable"]["other.com/fpga"] = "2"
    mine["status"]["allocatable"]["example.com/fpga"] = "1"
    me = fluxjob("me", "Pending", size=2)
    me["spec"]["request"]["example.com/fpga"] = 1
    user = pod("user", "mine", "1")
    user["spec"]["containers"][0]["resources"]["requests"]["example.com/fpga"] = "1"
    info = explain_job(me, [other, mine], [user], [me], NOW)
    assert "1 example.com/fpga" in info["perPod"], info["perPod"]
    assert info["short"].startswith("the cluster as a whole is too small"), info["short"]  # one fpga in all
    one = fluxjob("one", "Pending", size=1)
    one["spec"]["request"]["example.com/fpga"] = 1
    info = explain_job(one, [other, mine], [user], [one], NOW)
    assert "room for 0 of 1 pod(s) now" in info["short"] and "short of example.com/fpga on 2 node(s)" in info["short"], info["short"]
    assert explain_job(one, [other, mine], [], [one], NOW)["roomNow"] == {"mine": 1}
