"""A Job its user created suspended is the user's to resume (real control plane).

fluxnetes suspends Jobs at admission and marks them (annotation fluxnetes.io/suspended-by);
only those are resumed when their group is allocated. A Job created with spec.suspend: true
waits (FluxJob Provisional, reason and Event say why) until its user resumes it, then goes
through the queue like any group: its pods exist gated and start together when allocated.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from k8s_helpers import Operator, namespace, operator_session
from test_k8s_operator import (
    apply,
    fluxjob,
    job,
    job_complete,
    on_chosen_nodes,
    phase,
    pod,
    pods,
    wait,
)

pytestmark = pytest.mark.k8s


@pytest.fixture(scope="module")
def op(k8s_cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Operator]:
    with operator_session(k8s_cluster, tmp_path_factory, "operator-suspend") as o:
        yield o


@pytest.fixture
def ns(k8s_cluster: Any, op: Operator) -> Iterator[str]:
    with namespace(k8s_cluster) as name:
        yield name


def test_user_suspended_job_waits_for_its_user(k8s_cluster: Any, ns: str) -> None:
    apply(k8s_cluster, ns, [pod("blocker", "16")])
    wait("blocker running", lambda: phase(k8s_cluster, ns, "pod-blocker") == "Running")
    paused = job("paused", 4, "16")
    paused["spec"]["suspend"] = True
    apply(k8s_cluster, ns, [paused, job("ours", 1, "1")])
    # fluxnetes held its own Job (suspended and marked at admission: test_k8s_job_hold.py) and
    # let it go once allocated, taking its hold mark off with the hold (a later suspension
    # reads as its user's, also to a leader that saw no change); the user's Job it never marks
    wait("our job complete", lambda: job_complete(k8s_cluster, ns, "ours"))
    ours = k8s_cluster.kubectl_json("get", "job", "-n", ns, "ours")
    assert ours["spec"]["suspend"] is False
    assert "fluxnetes.io/suspended-by" not in (ours["metadata"].get("annotations") or {})
    assert all(p["metadata"]["annotations"]["fluxnetes.io/fluxjob"] == "job-ours"
               for p in pods(k8s_cluster, ns, "job-name=ours"))
    j = k8s_cluster.kubectl_json("get", "job", "-n", ns, "paused")
    assert "fluxnetes.io/suspended-by" not in (j["metadata"].get("annotations") or {})
    wait("paused waits", lambda: phase(k8s_cluster, ns, "job-paused") == "Provisional")
    st = fluxjob(k8s_cluster, ns, "job-paused")["status"]
    assert "suspended by its user" in st["reason"], st
    # the Event names an object that exists, with its uid (``kubectl describe`` finds it by
    # uid): the Job (in the default --fluxjobs waiting, its FluxJob is written after the
    # Event), or the FluxJob once it was
    exists = {("Job", "paused", j["metadata"]["uid"]),
              ("FluxJob", "job-paused", fluxjob(k8s_cluster, ns, "job-paused")["metadata"]["uid"])}
    events = k8s_cluster.kubectl_json("get", "events", "-n", ns)["items"]
    said = [(e["involvedObject"].get("kind"), e["involvedObject"].get("name"), e["involvedObject"].get("uid"))
            for e in events if e["reason"] == "SuspendedByUser"]
    assert said and set(said) <= exists, (said, exists)
    time.sleep(3)  # even with capacity for it (3 free nodes would not fit 4 anyway): never resumed
    assert k8s_cluster.kubectl_json("get", "job", "-n", ns, "paused")["spec"]["suspend"] is True
    assert phase(k8s_cluster, ns, "job-paused") == "Provisional"
    # the user resumes it: it is queued; its pods exist, gated, until the gang fits
    k8s_cluster.kubectl("patch", "job", "paused", "-n", ns, "--type=merge", "-p",
                        json.dumps({"spec": {"suspend": False}}))
    wait("paused queued", lambda: phase(k8s_cluster, ns, "job-paused") in ("Pending", "Reserved"))
    gated = wait("its pods created", lambda: (lambda ps: ps if len(ps) == 4 else None)(
        pods(k8s_cluster, ns, "job-name=paused")))
    assert not any(p["spec"].get("nodeName") for p in gated)
    time.sleep(2)
    assert not any(p["spec"].get("nodeName") for p in pods(k8s_cluster, ns, "job-name=paused"))
    k8s_cluster.kubectl("delete", "pod", "-n", ns, "blocker")
    wait("paused complete", lambda: job_complete(k8s_cluster, ns, "paused"), timeout=90)
    assert len(on_chosen_nodes(k8s_cluster, ns, "job-paused", pods(k8s_cluster, ns, "job-name=paused"))) == 4


def test_user_suspended_job_with_capacity_is_not_resumed(k8s_cluster: Any, ns: str) -> None:
    paused = job("small", 1, "1")
    paused["spec"]["suspend"] = True
    apply(k8s_cluster, ns, [paused])
    wait("small waits", lambda: phase(k8s_cluster, ns, "job-small") == "Provisional")
    time.sleep(3)
    assert k8s_cluster.kubectl_json("get", "job", "-n", ns, "small")["spec"]["suspend"] is True
    assert pods(k8s_cluster, ns, "job-name=small") == []
    k8s_cluster.kubectl("patch", "job", "small", "-n", ns, "--type=merge", "-p",
                        json.dumps({"spec": {"suspend": False}}))
    wait("small complete", lambda: job_complete(k8s_cluster, ns, "small"), timeout=60)
    assert phase(k8s_cluster, ns, "job-small") in ("Running", "Completed")
