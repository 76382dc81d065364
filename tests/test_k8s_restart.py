"""Restart recovery inside the crash windows, on the real control plane.

The operator is stopped deterministically inside a window with FLUXNETES_DEBUG_EXIT_AT
(it exits with status 137, like a SIGKILL, at the named point, for the named group):

- ``allocated``: the store recorded the allocation; no FluxJob status says Running, no pod
  is placed, the Job is not resumed (the store is ahead of the cluster);
- ``placed``: the store has the allocation and the pods are placed, the FluxJob status is not
  written;
- ``fluxjob-running``: the FluxJob status says Running too, still nothing placed/resumed.

After the restart the group starts exactly once, on the nodes recorded before the crash
(or is matched again, with the reason on the FluxJob and an Event, when those nodes are
gone), and nothing is ever bound beyond a node's allocatable (checked continuously).
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from k8s_helpers import (
    Operator,
    OverbookingWatch,
    bound_nodes,
    namespace,
    operator_session,
    store_at,
)
from test_k8s_operator import apply, fluxjob, job, job_complete, phase, pod, pods, slot_nodes, wait

pytestmark = pytest.mark.k8s

EXIT = "FLUXNETES_DEBUG_EXIT_AT"
# a group whose running pods are deleted ends Cancelled (its work was stopped, not finished)
ENDED = ("completed", "cancelled")


@pytest.fixture(scope="module")
def op(k8s_cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Operator]:
    with operator_session(k8s_cluster, tmp_path_factory, "operator-restart", start=False) as o:
        yield o


@pytest.fixture
def ns(k8s_cluster: Any) -> Iterator[str]:
    with namespace(k8s_cluster) as name:
        yield name


def crash_at(op: Operator, point: str, store: str | None, *extra: str) -> None:
    op.kill(signal.SIGTERM)
    op.start_with({EXIT: point}, *(["--store", store] if store else []), *extra)


# the windows around a FluxJob's status write: only reached when the group gets a FluxJob at
# once (--fluxjobs all); the default, waiting, gives none to a Job placed at once. The restart
# after the crash runs in the default mode (the FluxJob it finds is kept).
ALL = ("--fluxjobs", "all")


def wait_crash(op: Operator) -> None:
    rc = op.wait_exit(timeout=90)
    assert rc == 137, op.log.read_text()[-3000:]
    assert "exiting here on purpose" in op.log.read_text()


def store_allocation(url: str, ns: str, name: str) -> tuple[Any, list[str]]:
    store = store_at(url)
    rec = next(r for r in store.jobs() if r.namespace == ns and r.name == name)
    alloc = next(a for a in store.allocations() if a.job_id == rec.id)
    return rec, sorted(n.name for n in alloc.nodes)


def running_count(url: str, job_id: int) -> int:
    return [str(e.to_state) for e in store_at(url).events(job_id)].count("running")


@pytest.mark.parametrize("fluxjob_written", [True, False], ids=["fluxjob-pending", "no-fluxjob"])
def test_store_ahead_pod_group_starts_once_on_recorded_nodes(k8s_cluster: Any, ns: str, op: Operator,
                                                              tmp_path: Path, fluxjob_written: bool) -> None:
    url = f"sqlite:///{tmp_path / 'a.db'}"
    crash_at(op, f"allocated@{ns}/hold", url)
    labels = {"fluxnetes.io/group": "hold", "fluxnetes.io/group-size": "2"}
    apply(k8s_cluster, ns, [pod(f"hold-{i}", "16", labels=labels) for i in range(2)])
    wait_crash(op)
    rec, recorded = store_allocation(url, ns, "hold")
    assert str(rec.state) == "running" and len(set(recorded)) == 2
    # the cluster knows nothing of it: pods gated, the FluxJob (if written) not Running
    assert all(p["spec"].get("schedulingGates") for p in pods(k8s_cluster, ns))
    st = (k8s_cluster.kubectl_json("get", "fluxjobs", "-n", ns)["items"] or [{}])[0].get("status") or {}
    assert st.get("phase") != "Running"
    if not fluxjob_written:  # the crash came before the FluxJob was even created
        k8s_cluster.kubectl("delete", "fluxjob", "-n", ns, "hold", "--ignore-not-found")

    with OverbookingWatch(k8s_cluster) as watch:
        op.start("--store", url)
        wide = {"fluxnetes.io/group": "wide", "fluxnetes.io/group-size": "3"}
        apply(k8s_cluster, ns, [pod(f"wide-{i}", "16", labels=wide) for i in range(3)])
        assert bound_nodes(k8s_cluster, ns, "fluxnetes.io/group=hold", 2) == recorded
        wait("hold Running", lambda: phase(k8s_cluster, ns, "hold") == "Running")
        assert sorted(slot_nodes(k8s_cluster, ns, "hold")) == recorded
        wait("wide queued", lambda: phase(k8s_cluster, ns, "wide") in ("Pending", "Reserved"))
        time.sleep(3)  # only 2 nodes are free: wide must not start beside hold
        assert phase(k8s_cluster, ns, "wide") in ("Pending", "Reserved")
        k8s_cluster.kubectl("delete", "pod", "-n", ns, "hold-0", "hold-1")
        wait("wide runs once hold is gone", lambda: phase(k8s_cluster, ns, "wide") == "Running")
        bound_nodes(k8s_cluster, ns, "fluxnetes.io/group=wide", 3)
    assert watch.violations == []
    wait("store: hold over", lambda: str(store_at(url).get(rec.id).state) in ENDED, timeout=30)
    assert running_count(url, rec.id) == 1


@pytest.mark.parametrize("fluxjob_written", [True, False], ids=["fluxjob-pending", "no-fluxjob"])
def test_store_ahead_job_is_resumed_and_runs_once(k8s_cluster: Any, ns: str, op: Operator,
                                                   tmp_path: Path, fluxjob_written: bool) -> None:
    url = f"sqlite:///{tmp_path / 'b.db'}"
    crash_at(op, f"allocated@{ns}/job-crash", url)
    apply(k8s_cluster, ns, [job("crash", 2, "16")])
    wait_crash(op)
    rec, recorded = store_allocation(url, ns, "job-crash")
    assert k8s_cluster.kubectl_json("get", "job", "-n", ns, "crash")["spec"]["suspend"] is True
    if not fluxjob_written:
        k8s_cluster.kubectl("delete", "fluxjob", "-n", ns, "job-crash", "--ignore-not-found")
    with OverbookingWatch(k8s_cluster) as watch:
        op.start("--store", url)
        wait("job complete", lambda: job_complete(k8s_cluster, ns, "crash"), timeout=90)
    assert watch.violations == []
    ps = pods(k8s_cluster, ns, "job-name=crash")
    assert len(ps) == 2  # each pod ran once
    assert sorted(p["spec"]["nodeName"] for p in ps) == recorded
    wait("FluxJob Completed", lambda: phase(k8s_cluster, ns, "job-crash") == "Completed")
    wait("store: completed", lambda: str(store_at(url).get(rec.id).state) == "completed", timeout=30)
    assert running_count(url, rec.id) == 1


def test_pods_placed_fluxjob_not_written_runs_once(k8s_cluster: Any, ns: str, op: Operator,
                                                    tmp_path: Path) -> None:
    """The store has the allocation and the pods were placed (bound), but the FluxJob status
    was never written: the placed pods are the group's again, nothing is matched twice."""
    url = f"sqlite:///{tmp_path / 'p.db'}"
    crash_at(op, f"placed@{ns}/hold", url)
    labels = {"fluxnetes.io/group": "hold", "fluxnetes.io/group-size": "2"}
    apply(k8s_cluster, ns, [pod(f"hold-{i}", "16", labels=labels) for i in range(2)])
    wait_crash(op)
    rec, recorded = store_allocation(url, ns, "hold")
    placed = bound_nodes(k8s_cluster, ns, "fluxnetes.io/group=hold", 2)
    assert placed == recorded
    st = (k8s_cluster.kubectl_json("get", "fluxjobs", "-n", ns)["items"] or [{}])[0].get("status") or {}
    assert st.get("phase") != "Running"
    with OverbookingWatch(k8s_cluster) as watch:
        op.start("--store", url)
        wait("hold Running", lambda: phase(k8s_cluster, ns, "hold") == "Running")
        assert sorted(slot_nodes(k8s_cluster, ns, "hold")) == recorded
        wide = {"fluxnetes.io/group": "wide", "fluxnetes.io/group-size": "3"}
        apply(k8s_cluster, ns, [pod(f"wide-{i}", "16", labels=wide) for i in range(3)])
        wait("wide queued", lambda: phase(k8s_cluster, ns, "wide") in ("Pending", "Reserved"))
        time.sleep(3)
        assert phase(k8s_cluster, ns, "wide") in ("Pending", "Reserved")
        k8s_cluster.kubectl("delete", "pod", "-n", ns, "hold-0")  # its node's share comes back
        wait("wide runs on the 3 free nodes", lambda: phase(k8s_cluster, ns, "wide") == "Running")
        hold1 = pods(k8s_cluster, ns, "fluxnetes.io/group=hold")[0]["spec"]["nodeName"]
        assert hold1 not in bound_nodes(k8s_cluster, ns, "fluxnetes.io/group=wide", 3)
        k8s_cluster.kubectl("delete", "pod", "-n", ns, "hold-1")
        wait("hold over", lambda: phase(k8s_cluster, ns, "hold") in ("Completed", "Cancelled"))
    assert watch.violations == []
    wait("store: hold over", lambda: str(store_at(url).get(rec.id).state) in ENDED, timeout=30)
    assert running_count(url, rec.id) == 1


def test_fluxjob_running_but_nothing_placed_resumes_on_its_nodes(k8s_cluster: Any, ns: str, op: Operator,
                                                                  tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'c.db'}"
    crash_at(op, f"fluxjob-running@{ns}/job-late", url, *ALL)
    apply(k8s_cluster, ns, [job("late", 3, "16")])
    wait_crash(op)
    st = fluxjob(k8s_cluster, ns, "job-late")["status"]
    assert st["phase"] == "Running"
    recorded = sorted(st["nodes"])
    assert k8s_cluster.kubectl_json("get", "job", "-n", ns, "late")["spec"]["suspend"] is True
    rec, stored = store_allocation(url, ns, "job-late")
    assert stored == recorded
    op.start("--store", url)
    wait("job complete", lambda: job_complete(k8s_cluster, ns, "late"), timeout=90)
    ps = pods(k8s_cluster, ns, "job-name=late")
    assert len(ps) == 3 and sorted(p["spec"]["nodeName"] for p in ps) == recorded
    wait("store: completed", lambda: str(store_at(url).get(rec.id).state) == "completed", timeout=30)
    assert running_count(url, rec.id) == 1


def test_fluxjob_running_store_lost_it(k8s_cluster: Any, ns: str, op: Operator, tmp_path: Path) -> None:
    """The reverse: the FluxJob says Running, the store never heard of the group (a new or
    restored database). The cluster's word counts: it runs once, the store records it."""
    crash_at(op, f"fluxjob-running@{ns}/job-solo", None, *ALL)
    apply(k8s_cluster, ns, [job("solo", 2, "8")])
    wait_crash(op)
    recorded = sorted(fluxjob(k8s_cluster, ns, "job-solo")["status"]["nodes"])
    url = f"sqlite:///{tmp_path / 'd.db'}"
    op.start("--store", url)
    wait("job complete", lambda: job_complete(k8s_cluster, ns, "solo"), timeout=90)
    ps = pods(k8s_cluster, ns, "job-name=solo")
    assert len(ps) == 2 and sorted(p["spec"]["nodeName"] for p in ps) == recorded

    def completed() -> Any:
        rows = [r for r in store_at(url).jobs() if r.namespace == ns and r.name == "job-solo"]
        return rows if rows and str(rows[0].state) == "completed" else None

    rows = wait("store: completed", completed, timeout=30)
    assert len(rows) == 1 and running_count(url, rows[0].id) == 1


def _node(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name,
                         "annotations": {"node.alpha.kubernetes.io/ttl": "0", "kwok.x-k8s.io/node": "fake"},
                         "labels": {"kubernetes.io/hostname": name, "type": "kwok",
                                    "topology.kubernetes.io/zone": "zone-8", "fluxnetes.io/rack": "rack-8"}},
            "status": {"allocatable": {"cpu": "64", "memory": "256Gi", "pods": "110"},
                       "capacity": {"cpu": "64", "memory": "256Gi", "pods": "110"}}}


def test_recorded_node_gone_group_is_matched_again(k8s_cluster: Any, ns: str, op: Operator,
                                                   tmp_path: Path) -> None:
    import json

    extra = ["kwok-restart-a", "kwok-restart-b"]
    for n in extra:
        k8s_cluster.kubectl("apply", "-f", "-", input=json.dumps(_node(n)))
    try:
        for n in extra:
            wait(f"{n} ready", lambda n=n: any(
                c["type"] == "Ready" and c["status"] == "True"
                for c in k8s_cluster.kubectl_json("get", "node", n)["status"].get("conditions", [])))
        url = f"sqlite:///{tmp_path / 'e.db'}"
        crash_at(op, f"allocated@{ns}/pod-big", url)
        apply(k8s_cluster, ns, [pod("big", "40")])  # only the two extra nodes can hold it
        wait_crash(op)
        rec, recorded = store_allocation(url, ns, "pod-big")
        assert len(recorded) == 1 and recorded[0] in extra
        gone = recorded[0]
        k8s_cluster.kubectl("delete", "node", gone)
        op.start("--store", url)
        other = next(n for n in extra if n != gone)
        assert bound_nodes(k8s_cluster, ns, "", 1) == [other]
        wait("big Running", lambda: phase(k8s_cluster, ns, "pod-big") == "Running")
        assert slot_nodes(k8s_cluster, ns, "pod-big") == [other]
        # why, as an Event (placed again at once, it has no FluxJob in the default mode)
        events = k8s_cluster.kubectl_json("get", "events", "-n", ns)["items"]
        requeued = [e["message"] for e in events if e["reason"] == "Requeued"]
        assert any(gone in m and "matched again" in m for m in requeued), requeued
        assert running_count(url, rec.id) == 2  # the lost allocation, then the new one
    finally:
        for n in extra:
            k8s_cluster.kubectl("delete", "node", n, "--ignore-not-found", check=False)
