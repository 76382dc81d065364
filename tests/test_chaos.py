"""The chaos soak (bench/chaos.py): its invariant checker on hand-made cluster states, its fault
plan, and the short soak itself on a cluster of its own (it restarts the API server), which
must end with 0 violations, 0 lost and 0 duplicated workloads."""

from __future__ import annotations

import itertools
import json
import os
import random
import socket
import threading
from pathlib import Path
from typing import Any

import pytest

from fluxnetes.devcluster.chaos import FAULT_KINDS, fluxjobs_mode, plan_faults
from fluxnetes.devcluster.invariants import (
    ANN_FLUXJOB,
    JOB_INDEX_ANN,
    JOB_UID_LABEL,
    Checker,
    Snapshot,
)
from fluxnetes.devcluster.soak_processes import WebhookProxy

BENCH = Path(__file__).resolve().parents[1] / "bench" / "chaos.py"


def node(name: str, cpu: int = 4) -> dict[str, Any]:
    alloc = {"cpu": str(cpu), "memory": "16Gi", "pods": "110"}
    return {"metadata": {"name": name}, "status": {"allocatable": alloc, "capacity": alloc}}


def pod(name: str, cpu: int, node: str | None = None, *, ns: str = "a", phase: str = "Running",
        labels: dict[str, str] | None = None, annotations: dict[str, str] | None = None,
        uid: str | None = None, gated: bool = False, conditions: list[dict[str, Any]] | None = None,
        ) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "c", "resources": {"requests": {
        "cpu": str(cpu), "memory": "1Gi"}}}]}
    if node:
        spec["nodeName"] = node
    if gated:
        spec["schedulingGates"] = [{"name": "fluxnetes.io/gate"}]
    return {"metadata": {"name": name, "namespace": ns, "uid": uid or f"uid-{name}",
                         "labels": labels or {}, "annotations": annotations or {}},
            "spec": spec, "status": {"phase": phase if node else "Pending",
                                     "conditions": conditions or []}}


def placed(fluxjob: str) -> dict[str, str]:
    return {ANN_FLUXJOB: fluxjob}


def running_fluxjob(name: str, shares: list[dict[str, Any]], ns: str = "a") -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": ns}, "spec": {},
            "status": {"phase": "Running", "shares": shares}}


def observe_over(checker: Checker, seconds: int, **lists: Any) -> list[Any]:
    """The same cluster state polled once a second for `seconds`."""
    found = []
    for t in range(seconds + 1):
        found += checker.observe(Snapshot(at=1000.0 + t, **lists))
    return found


def test_bound_pods_over_a_nodes_allocatable_are_overbooking() -> None:
    c = Checker()
    ok = c.observe(Snapshot(1.0, [node("n1", 4)], [pod("p1", 3, "n1", annotations=placed("f")),
                                                    pod("p2", 3, "n1", phase="Succeeded")]))
    assert ok == []
    bad = c.observe(Snapshot(2.0, [node("n1", 4)], [pod("p1", 3, "n1"), pod("p2", 3, "n1")]))
    assert [v.kind for v in bad] == ["overbooked"]
    assert "6000m cpu" in bad[0].detail and bad[0].evidence["pods"] == ["a/p1", "a/p2"]


def test_a_group_partially_bound_past_its_grace_is_a_violation_but_not_before() -> None:
    c = Checker(group_grace=10)
    g = {"fluxnetes.io/group": "g1"}
    pods = [pod("g1-0", 1, "n1", labels=g), pod("g1-1", 1, labels=g, gated=True)]
    assert observe_over(c, 9, nodes=[node("n1")], pods=pods) == []
    found = observe_over(Checker(group_grace=10), 12, nodes=[node("n1")], pods=pods)
    assert [v.kind for v in found] == ["partial-group"]
    assert found[0].evidence["waiting"] == ["a/g1-1 (gated)"]


def test_time_without_answers_from_the_api_server_does_not_count() -> None:
    c = Checker(group_grace=10, max_step=2)
    g = {"fluxnetes.io/group": "g1"}
    pods = [pod("g1-0", 1, "n1", labels=g), pod("g1-1", 1, labels=g)]
    assert c.observe(Snapshot(0.0, [node("n1")], pods)) == []
    assert c.observe(Snapshot(60.0, [node("n1")], pods)) == []  # a 60 s outage adds 2 s


def test_a_group_that_lost_a_pod_to_a_deleted_node_may_wait_for_its_replacement() -> None:
    c = Checker(group_grace=2)
    labels = {JOB_UID_LABEL: "j1"}
    pods = [pod("j-0", 1, "n1", labels=labels), pod("j-1", 1, "gone", labels=labels),
            pod("j-1b", 1, labels=labels)]
    assert observe_over(c, 6, nodes=[node("n1")], pods=pods) == []


def test_fluxjob_shares_must_match_its_bound_pods() -> None:
    share = [{"node": "n1", "cores": 2, "gpus": 0, "memory": 1024}]
    good = {"nodes": [node("n1")], "pods": [pod("p", 2, "n1", annotations=placed("f"))],
            "fluxjobs": [running_fluxjob("f", share)]}
    assert observe_over(Checker(share_grace=5), 10, **good) == []
    leak = {"nodes": [node("n1")], "pods": [pod("p", 2, "n1", phase="Succeeded", annotations=placed("f"))],
            "fluxjobs": [running_fluxjob("f", share)]}
    found = observe_over(Checker(share_grace=5), 10, **leak)
    assert [v.kind for v in found] == ["shares"]
    assert found[0].evidence["held"] == [2, 0, 1024] and found[0].evidence["bound"] == [0, 0, 0]
    # pods bound for a FluxJob that holds nothing: the graph under-counts the node
    under = {"nodes": [node("n1")], "pods": [pod("p", 2, "n1", annotations=placed("f"))], "fluxjobs": []}
    assert [v.kind for v in observe_over(Checker(share_grace=5), 10, **under)] == ["shares"]
    # ... unless the operator gives a group placed at once no FluxJob (--fluxjobs waiting)
    assert observe_over(Checker(share_grace=5, fluxjobs_waiting=True), 10, **under) == []
    # survivors of a group failed by node loss: held by the operator, the FluxJob says Failed
    failed = {"metadata": {"name": "f", "namespace": "a"}, "spec": {}, "status": {"phase": "Failed"}}
    assert observe_over(Checker(share_grace=5), 10, nodes=[node("n1")],
                        pods=[pod("p", 2, "n1", annotations=placed("f"))], fluxjobs=[failed]) == []
    # a resumed Job whose pods the Job controller has not made yet: the share waits for them
    job_fj = running_fluxjob("f", [{"node": "n1", "cores": 4, "gpus": 0, "memory": 2048}])
    job_fj["spec"] = {"size": 2, "workload": {"kind": "Job", "uid": "j1"}}
    one = pod("p", 2, "n1", labels={JOB_UID_LABEL: "j1"}, annotations=placed("f"))
    assert observe_over(Checker(share_grace=5), 10, nodes=[node("n1")], pods=[one], fluxjobs=[job_fj]) == []
    done = {"metadata": {"uid": "j1"}, "status": {"conditions": [{"type": "Complete", "status": "True"}]}}
    found = observe_over(Checker(share_grace=5), 10, nodes=[node("n1")], pods=[one], fluxjobs=[job_fj],
                         jobs=[done])
    assert [v.kind for v in found] == ["shares"]
    # a pod left behind on a deleted node holds nothing: the graph rightly has no share there
    gone = {"nodes": [node("n1")], "pods": [pod("p", 2, "n9", annotations=placed("f"))], "fluxjobs": []}
    assert observe_over(Checker(share_grace=5), 10, **gone) == []


def test_the_soak_judges_shares_as_the_operator_writes_fluxjobs() -> None:
    """The soak's operator runs in its default mode (``--fluxjobs waiting``) unless its
    arguments say otherwise; the last ``--fluxjobs`` given wins, as on the command line. (It
    used to assume ``all`` without the flag, and would then have called every group placed at
    once without a FluxJob a shares violation.)"""
    assert fluxjobs_mode(()) == "waiting"
    assert fluxjobs_mode(("--store", "x", "--fluxjobs=all")) == "all"
    assert fluxjobs_mode(("--fluxjobs", "all", "--fluxjobs", "waiting")) == "waiting"


def test_a_placed_pod_kube_scheduler_refuses_is_reported() -> None:
    cond = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
             "message": "0/1 nodes are available: 1 Insufficient cpu."}]
    pods = [pod("p", 2, annotations=placed("f"), conditions=cond)]
    found = observe_over(Checker(group_grace=3), 6, nodes=[node("n1")], pods=pods)
    assert [v.kind for v in found] == ["refused-placement"]
    assert "Insufficient cpu" in found[0].detail


def test_a_completion_index_run_again_after_it_succeeded_is_a_duplicate() -> None:
    c = Checker()
    labels = {JOB_UID_LABEL: "j1"}
    idx = {JOB_INDEX_ANN: "0", ANN_FLUXJOB: "f"}
    first = pod("j-0-a", 1, "n1", labels=labels, annotations=idx, phase="Succeeded")
    assert c.observe(Snapshot(1.0, [node("n1")], [first])) == []
    again = pod("j-0-b", 1, "n1", labels=labels, annotations=idx)
    found = c.observe(Snapshot(2.0, [node("n1")], [first, again]))
    assert [v.kind for v in found] == ["duplicate-run"]
    assert found[0].evidence["succeeded_pod"] == "uid-j-0-a"
    assert c.observe(Snapshot(3.0, [node("n1")], [first, again])) == []  # reported once


def test_a_finished_jobs_fluxjob_allocated_again_is_a_duplicate() -> None:
    job = {"metadata": {"uid": "j1", "name": "j", "namespace": "a"},
           "status": {"completionTime": "2026-01-01T10:00:00Z"}}
    fj = {"metadata": {"name": "j", "namespace": "a"}, "spec": {"workload": {"uid": "j1"}},
          "status": {"phase": "Running", "startTime": "2026-01-01T10:00:20Z", "shares": []}}
    found = Checker().observe(Snapshot(1.0, [node("n1")], [], [fj], [job]))
    assert [v.kind for v in found] == ["duplicate-run"]


def test_a_pod_bound_in_a_managed_namespace_without_fluxnetes_bypassed_the_queue() -> None:
    c = Checker(managed_namespaces=lambda: ["a"])
    found = c.observe(Snapshot(1.0, [node("n1")], [pod("p", 1, "n1"), pod("q", 1, "n1", ns="other"),
                                                   pod("r", 1, "n1", annotations=placed("r"))]))
    assert [(v.kind, v.subject) for v in found] == [("bypassed-queue", "a/p")]


def test_binds_are_taken_from_the_pod_scheduled_transition() -> None:
    c = Checker()
    cond = [{"type": "PodScheduled", "status": "True", "lastTransitionTime": "2026-01-01T10:00:05Z"}]
    c.record_binds(Snapshot(1.0, [node("n1")], [pod("p", 1, "n1", annotations=placed("f"), conditions=cond),
                                                pod("q", 1, "n1", conditions=cond)]))
    assert len(c.binds) == 1


def test_fault_plan_is_seeded_spaced_and_has_every_kind() -> None:
    a = plan_faults(random.Random(7), FAULT_KINDS, 3, 10, 610, 8.0)
    b = plan_faults(random.Random(7), FAULT_KINDS, 3, 10, 610, 8.0)
    assert [(f.kind, f.planned) for f in a] == [(f.kind, f.planned) for f in b]
    assert sorted(f.kind for f in a) == sorted(FAULT_KINDS * 3)
    times = [f.planned for f in a]
    assert times == sorted(times) and all(10 <= t < 610 for t in times)
    assert min(y - x for x, y in itertools.pairwise(times)) >= 8.0


def test_webhook_proxy_forwards_to_a_live_backend_and_skips_dead_ones() -> None:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    live = server.getsockname()[1]
    dead_sock = socket.socket()
    dead_sock.bind(("127.0.0.1", 0))
    dead = dead_sock.getsockname()[1]
    dead_sock.close()

    def echo() -> None:
        conn, _ = server.accept()
        conn.sendall(conn.recv(100).upper())
        conn.close()

    t = threading.Thread(target=echo, daemon=True)
    t.start()
    proxy = WebhookProxy(lambda: [dead, live]).start()
    try:
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as s:
            s.sendall(b"hello")
            assert s.recv(100) == b"HELLO"
    finally:
        proxy.stop()
        server.close()


# -- the short soak on a cluster of its own ---------------------------------------------------


@pytest.fixture(scope="module")
def short_soak(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """bench/chaos.py --short, run once for the tests below: ~2 minutes of mixed work on 20
    kwok nodes with one fault of each kind (leader SIGKILL, node replaced, PostgreSQL restart,
    API server restart)."""
    from conftest import k8s_missing_reason
    from fluxnetes.devcluster.soak_processes import pg_bindir

    reason = k8s_missing_reason()
    if reason:
        if os.environ.get("FLUXNETES_REQUIRE_K8S") == "1":
            pytest.fail(reason)
        pytest.skip(reason)
    if pg_bindir() is None:
        pytest.skip("PostgreSQL (initdb) is not installed")
    import importlib.util

    spec = importlib.util.spec_from_file_location("chaos_bench", BENCH)
    assert spec is not None and spec.loader is not None
    chaos_bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(chaos_bench)
    tmp = tmp_path_factory.mktemp("chaos")
    out = tmp / "chaos_short.json"
    status = chaos_bench.main(["--short", "--work-dir", str(tmp / "work"), "--out", str(out)])
    result: dict[str, Any] = json.loads(out.read_text())
    result["exit_status"] = status
    return result


def soak_summary(result: dict[str, Any]) -> dict[str, Any]:
    return {"violations": result["violations"], "lost": result["lost"],
            "duplicated": result["duplicated"], "errors": result["errors"],
            "faults_failed": result["faults_failed"], "probe": result["probe"]}


@pytest.mark.k8s
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_short_chaos_soak_never_double_books_nor_runs_twice(short_soak: dict[str, Any]) -> None:
    """Safety under every fault: no invariant violated (overbooking, partial gangs, shares
    that disagree with bound pods, queue bypass), no workload run twice, and no capacity
    leaked (a gang asking for every core of every node starts at the end)."""
    result, summary = short_soak, soak_summary(short_soak)
    assert result["faults_injected"] == {k: 1 for k in FAULT_KINDS}, summary
    assert result["workloads"]["submitted"] > 20
    assert result["violations"] == [], summary
    assert result["workloads"]["duplicated"] == 0, summary
    assert result["probe"].get("ok"), summary


@pytest.mark.k8s
@pytest.mark.slow
def test_short_chaos_soak_finishes_every_workload(short_soak: dict[str, Any]) -> None:
    """Liveness under every fault: every workload submitted finishes, none is lost."""
    assert short_soak["workloads"]["lost"] == 0, soak_summary(short_soak)
    assert short_soak["exit_status"] == 0, soak_summary(short_soak)
