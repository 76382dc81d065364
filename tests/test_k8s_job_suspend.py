"""A user suspends a Job, then resumes it, on the real control plane (``kubectl patch job J -p
'{"spec":{"suspend":true}}'``, later ``false``: Kueue's way, the Job controller's documented one;
the unit tests, with both watch orders: tests/test_k8s_job_suspend_unit.py).

Its own small dev cluster: 2 kwok nodes of 4 cpu; Job pods annotated with
``pod-complete.stage.kwok.x-k8s.io/delay`` run that long.

1. A running Job of 2 pods (a node each) is suspended: its pods go and its share is given back
   (another Job filling the cluster runs meanwhile). Resumed while that one runs, its new pods
   wait, gated, none placed (all-or-nothing); once the other is gone they are placed, on two
   nodes, and the Job completes. No node is ever overbooked. (Before: the group ended Cancelled,
   its resumed pods joined it and stayed gated for good.)
2. A queued Job (held by fluxnetes: the tests pin ``--job-mode suspend``) resumed by its user,
   then suspended again, holds nothing and is not resumed by fluxnetes: when the cluster frees,
   another Job takes it; resumed, it is placed once that one is gone, and completes.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from k8s_helpers import Operator, OverbookingWatch, dev_cluster, namespace, operator_session
from test_k8s_operator import apply, job_complete, pods, wait

pytestmark = pytest.mark.k8s

DELAY = "pod-complete.stage.kwok.x-k8s.io/delay"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from fluxnetes.devcluster import NodeShape

    yield from dev_cluster(tmp_path_factory, "suspend-cluster", NodeShape(count=2, cpu="4", memory="16Gi"),
                           timed_pods=True)


@pytest.fixture(scope="module")
def operator(cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Operator]:
    with operator_session(cluster, tmp_path_factory, "suspend-operator", "--status-interval", "0.3") as op:
        yield op


@pytest.fixture
def ns(cluster: Any, operator: Operator) -> Iterator[str]:
    with namespace(cluster) as name:
        yield name


def gang(name: str, run: str) -> dict[str, Any]:
    """A Job of 2 pods of 4 cpu (a whole node each), each running ``run``."""
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
            "spec": {"parallelism": 2, "completions": 2, "completionMode": "Indexed",
                     "template": {"metadata": {"annotations": {DELAY: run}},
                                  "spec": {"restartPolicy": "Never",
                                           "containers": [{"name": "c", "image": "busybox",
                                                           "resources": {"requests": {"cpu": "4"}}}]}}}}


def live(cluster: Any, ns: str, job: str) -> list[dict[str, Any]]:
    return [p for p in pods(cluster, ns, f"job-name={job}") if not p["metadata"].get("deletionTimestamp")]


def running(cluster: Any, ns: str, job: str) -> list[dict[str, Any]] | None:
    r = [p for p in live(cluster, ns, job)
         if p["spec"].get("nodeName") and (p.get("status") or {}).get("phase") == "Running"]
    return r if len(r) == 2 else None


def suspend(cluster: Any, ns: str, job: str, value: bool) -> None:
    cluster.kubectl("patch", "job", job, "-n", ns, "--type=merge", "-p", json.dumps({"spec": {"suspend": value}}))


def test_a_running_job_suspended_then_resumed_runs_again(cluster: Any, ns: str) -> None:
    with OverbookingWatch(cluster) as watch:
        apply(cluster, ns, [gang("paused", "600s")])
        first = wait("paused running", lambda: running(cluster, ns, "paused"), timeout=120)
        suspend(cluster, ns, "paused", True)
        wait("its pods gone", lambda: not pods(cluster, ns, "job-name=paused"), timeout=120)
        # its share went back: another Job of the whole cluster runs
        apply(cluster, ns, [gang("other", "600s")])
        wait("other running", lambda: running(cluster, ns, "other"), timeout=120)
        suspend(cluster, ns, "paused", False)
        again = wait("its new pods", lambda: (lambda ps: ps if len(ps) == 2 else None)(live(cluster, ns, "paused")),
                     timeout=120)
        assert {p["metadata"]["uid"] for p in again}.isdisjoint(p["metadata"]["uid"] for p in first)
        wait("other still runs", lambda: running(cluster, ns, "other"), timeout=30)
        # all-or-nothing: none of them is placed while the other Job holds the cluster
        assert not any(p["spec"].get("nodeName") for p in live(cluster, ns, "paused")), live(cluster, ns, "paused")
        cluster.kubectl("delete", "job", "other", "-n", ns, "--cascade=foreground", "--wait=false")
        placed = wait("paused running again", lambda: running(cluster, ns, "paused"), timeout=180)
        assert len({p["spec"]["nodeName"] for p in placed}) == 2
        assert {p["metadata"]["uid"] for p in placed}.isdisjoint(p["metadata"]["uid"] for p in first)
    assert watch.violations == [], watch.violations


def test_a_queued_job_suspended_by_its_user_holds_nothing_and_runs_when_resumed(cluster: Any, ns: str) -> None:
    """A queued Job (the tests' ``--job-mode suspend``: suspended and marked by fluxnetes, no
    pod) that its user resumes (its pods are born gated and wait with the group) then
    suspends again: when the cluster frees, fluxnetes does not resume it (another Job takes the
    nodes); resumed by its user, it is placed once that one is gone, and completes."""
    with OverbookingWatch(cluster) as watch:
        apply(cluster, ns, [gang("blocker", "600s")])
        wait("blocker running", lambda: running(cluster, ns, "blocker"), timeout=120)
        apply(cluster, ns, [gang("queued", "5s")])
        suspend(cluster, ns, "queued", False)  # resumed by its user while queued
        wait("queued's pods exist, gated", lambda: len(live(cluster, ns, "queued")) == 2, timeout=120)
        assert not any(p["spec"].get("nodeName") for p in live(cluster, ns, "queued"))
        suspend(cluster, ns, "queued", True)
        wait("its pods gone", lambda: not pods(cluster, ns, "job-name=queued"), timeout=120)
        cluster.kubectl("delete", "job", "blocker", "-n", ns, "--cascade=foreground", "--wait=false")
        # what the blocker gave back goes to the next Job, not to the suspended one
        apply(cluster, ns, [gang("next", "600s")])
        wait("next running", lambda: running(cluster, ns, "next"), timeout=180)
        assert cluster.kubectl_json("get", "job", "-n", ns, "queued")["spec"]["suspend"] is True
        suspend(cluster, ns, "queued", False)
        wait("queued's new pods", lambda: len(live(cluster, ns, "queued")) == 2, timeout=120)
        assert not any(p["spec"].get("nodeName") for p in live(cluster, ns, "queued"))
        cluster.kubectl("delete", "job", "next", "-n", ns, "--cascade=foreground", "--wait=false")
        wait("queued complete", lambda: job_complete(cluster, ns, "queued"), timeout=240)
    assert watch.violations == [], watch.violations
