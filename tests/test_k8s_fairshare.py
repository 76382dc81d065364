"""Fair share, limits and preemption on the real control plane (issue 16), scaled down for CI.

Its own small dev cluster (2 kwok nodes x 5 cpu = 10 cores; Job pods annotated with
``pod-complete.stage.kwok.x-k8s.io/delay`` run that long) and one operator subprocess with a
SQLite store and ``--preemption``. In order:

1. two accounts with shares 70/30 each submit one-core Jobs (a few seconds each) onto the
   full cluster: once both are backlogged, the cores allocated to each (its Running
   FluxJobs) average within +-10 points of 70/30 (the full 200 + 200 version:
   bench/fairshare_k8s.py);
2. an account with ``maxRunningCores: 3`` never runs more, and its held jobs name the limit;
3. a high-QoS gang of 4 one-core pods preempts exactly two whole lower-QoS groups of 2 (the
   minimal set), starts, nothing is ever double-booked; the victims are requeued and run
   again after it;
4. the accounts' usage survives an operator restart (the store).
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import pytest

from fluxnetes.devcluster.apicalls import create_jobs, fluxjobs_per_namespace
from k8s_helpers import OverbookingWatch, cleanup_webhooks, dev_cluster
from test_k8s_operator import OperatorProc, wait

pytestmark = pytest.mark.k8s

DELAY = "pod-complete.stage.kwok.x-k8s.io/delay"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from fluxnetes.devcluster import NodeShape

    yield from dev_cluster(tmp_path_factory, "fs-cluster", NodeShape(count=2, cpu="5", memory="32Gi"),
                           timed_pods=True)


class Operator(OperatorProc):
    args: tuple[str, ...] = ()


@pytest.fixture(scope="module")
def operator(cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Operator]:
    d = tmp_path_factory.mktemp("fs-operator")
    op = Operator(cluster, d)
    # --fluxjobs all: these tests read each group's FluxJob phase (Running, Preempted, Pending)
    # as what they check; in the default mode a group placed at once has none
    op.args = ("--store", f"sqlite:///{d / 'store.db'}", "--preemption", "--fairshare-save-seconds", "2",
               "--status-interval", "0.3", "--owner-cluster-role", "", "--fluxjobs", "all")
    op.start(*op.args)
    for pc, value in (("fs-low", 10), ("fs-high", 1000)):
        cluster.kubectl("apply", "-f", "-", input=json.dumps(
            {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": pc},
             "value": value}))
    try:
        yield op
    finally:
        op.kill(signal.SIGTERM)
        cleanup_webhooks(cluster)


def namespace(cluster: Any, name: str, account: str | None) -> None:
    cluster.kubectl("create", "namespace", name)
    labels = ["fluxnetes.io/enabled=true"] + ([f"fluxnetes.io/account={account}"] if account else [])
    cluster.kubectl("label", "namespace", name, *labels)


def fluxaccount(name: str, shares: int, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "fluxnetes.io/v1alpha1", "kind": "FluxAccount", "metadata": {"name": name},
            "spec": {"shares": shares, **spec}}


def job(name: str, ns: str, *, size: int = 1, seconds: float = 3, pc: str | None = None) -> dict[str, Any]:
    tspec: dict[str, Any] = {"restartPolicy": "Never",
                             "containers": [{"name": "c", "image": "busybox",
                                             "resources": {"requests": {"cpu": "1"}}}]}
    if pc:
        tspec["priorityClassName"] = pc
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name, "namespace": ns},
            "spec": {"parallelism": size, "completions": size, "completionMode": "Indexed", "backoffLimit": 0,
                     "template": {"metadata": {"annotations": {DELAY: f"{seconds:g}s"}}, "spec": tspec}}}


def apply(cluster: Any, objs: list[dict[str, Any]]) -> None:
    cluster.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": objs}))


def running_pods(cluster: Any) -> list[dict[str, Any]]:
    items = cluster.kubectl_json("get", "pods", "-A", "--field-selector", "status.phase=Running")["items"]
    return [p for p in items if p["spec"].get("nodeName") and not p["metadata"].get("deletionTimestamp")]


def per_namespace(pods: list[dict[str, Any]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for p in pods:
        ns = p["metadata"]["namespace"]
        out[ns] = out.get(ns, 0) + 1
    return out


def fluxjobs(cluster: Any, ns: str) -> list[dict[str, Any]]:
    return list(cluster.kubectl_json("get", "fluxjobs", "-n", ns)["items"])


def phases(cluster: Any, ns: str) -> dict[str, str]:
    return {f["metadata"]["name"]: (f.get("status") or {}).get("phase", "") for f in fluxjobs(cluster, ns)}


def account_status(cluster: Any, name: str) -> dict[str, Any]:
    return dict(cluster.kubectl_json("get", "fluxaccount", name).get("status") or {})


def test_two_accounts_70_30_share_a_full_cluster(cluster: Any, operator: Operator) -> None:
    apply(cluster, [fluxaccount("fs-a", 70), fluxaccount("fs-b", 30)])
    namespace(cluster, "fs-a", "fs-a")
    namespace(cluster, "fs-b", "fs-b")
    # durations 4-7 s, mixed, so that cores come free a few at a time
    jobs = []
    for i in range(80):
        for ns in ("fs-a", "fs-b") if i < 45 else ("fs-a",):
            jobs.append(job(f"j{i}", ns, seconds=4 + (i * 7) % 4))
    create_jobs(cluster.kubeconfig, jobs)
    samples: list[tuple[int, int]] = []
    end = time.monotonic() + 45
    while time.monotonic() < end:
        counts, waiting = fluxjobs_per_namespace(cluster)
        if waiting.get("fs-a") and waiting.get("fs-b"):
            if counts.get("fs-a", 0) + counts.get("fs-b", 0) >= 8:
                samples.append((counts.get("fs-a", 0), counts.get("fs-b", 0)))
        elif samples:
            break  # one of them is not backlogged any more
        time.sleep(0.2)
    assert len(samples) >= 15, samples
    # every sample while both are backlogged: the first fill is a tie (no usage yet, one
    # cycle's order), then every freed core goes to the account furthest below its share,
    # the running jobs counted ahead (--fairshare-running-horizon): the running cores stay
    # within ±10 points of 70/30, not only on average
    share_a = sum(a for a, _ in samples) / sum(a + b for a, b in samples)
    print(f"fs-a's share of the allocated cores: {share_a:.3f} over {len(samples)} samples: {samples}")
    assert abs(share_a - 0.70) <= 0.10, (share_a, samples)
    near = [0.6 <= a / (a + b) <= 0.8 for a, b in samples]
    settled = near[near.index(True):] if True in near else near
    assert sum(settled) >= 0.8 * len(settled), samples
    st = account_status(cluster, "fs-a")
    assert st.get("usage", 0) > 0 and "fairShare" in st, st


def test_an_account_limit_holds(cluster: Any, operator: Operator) -> None:
    apply(cluster, [fluxaccount("fs-c", 10, limits={"maxRunningCores": 3})])
    namespace(cluster, "fs-c", "fs-c")
    cluster.kubectl("delete", "namespace", "fs-a", "fs-b", "--wait=false")  # the cluster frees up
    apply(cluster, [job(f"c{i}", "fs-c", seconds=4) for i in range(8)])
    held_seen = False
    most = 0
    end = time.monotonic() + 60
    while time.monotonic() < end:
        most = max(most, per_namespace(running_pods(cluster)).get("fs-c", 0))
        fjs = fluxjobs(cluster, "fs-c")
        held_seen = held_seen or any("max running cores 3" in (f.get("status") or {}).get("reason", "")
                                     for f in fjs)
        if len(fjs) == 8 and all((f.get("status") or {}).get("phase") == "Completed" for f in fjs):
            break
        time.sleep(0.3)
    assert held_seen
    assert 0 < most <= 3
    assert all(p == "Completed" for p in phases(cluster, "fs-c").values())


def test_a_high_qos_gang_preempts_a_minimal_set_of_whole_groups(cluster: Any, operator: Operator) -> None:
    namespace(cluster, "fs-p", None)  # the default account
    wait("the cluster to be empty", lambda: not running_pods(cluster), timeout=90)
    with OverbookingWatch(cluster) as watch:
        apply(cluster, [job(f"low{i}", "fs-p", size=2, seconds=600, pc="fs-low") for i in range(5)])
        wait("5 low groups running", lambda: sum(1 for p in phases(cluster, "fs-p").values()
                                                 if p == "Running") == 5, timeout=60)
        before = {p["metadata"]["name"]: p["metadata"]["uid"] for p in running_pods(cluster)}
        apply(cluster, [job("urgent", "fs-p", size=4, seconds=6, pc="fs-high")])
        wait("the urgent gang running", lambda: phases(cluster, "fs-p").get("job-urgent") == "Running",
             timeout=60)
        fjs = {f["metadata"]["name"]: f for f in fluxjobs(cluster, "fs-p")}
        victims = sorted(n for n, f in fjs.items() if any(
            c.get("type") == "Preempted" for c in (f.get("status") or {}).get("conditions") or []))
        assert len(victims) == 2, victims  # 4 cores: two groups of 2, no more
        spared = [n for n in fjs if n.startswith("job-low") and n not in victims]
        for n in spared:
            assert (fjs[n]["status"]["phase"]) == "Running"
        # the spared groups' pods were never touched; the victims' are all gone (whole groups)
        now_pods = {p["metadata"]["name"]: p["metadata"]["uid"] for p in running_pods(cluster)}
        for name, uid in before.items():
            owner = "job-" + name.rsplit("-", 2)[0]
            if owner in spared:
                assert now_pods.get(name) == uid, name
        events = cluster.kubectl_json("get", "events", "-n", "fs-p", "--field-selector", "reason=Preempted")
        assert any("preempted by fs-p/job-urgent (QoS fs-high > fs-low)" in e["message"]
                   for e in events["items"]), [e["message"] for e in events["items"]]
        for v in victims:
            assert fjs[v]["status"]["phase"] in ("Pending", "Reserved", "Preempted"), fjs[v]["status"]
        # the urgent gang ends: the victims run again
        wait("the victims running again", lambda: all(phases(cluster, "fs-p").get(v) == "Running" for v in victims),
             timeout=90)
        assert phases(cluster, "fs-p")["job-urgent"] == "Completed"
    assert not watch.violations, watch.violations[:5]
    cluster.kubectl("delete", "namespace", "fs-p", "--wait=false")


def test_usage_survives_an_operator_restart(cluster: Any, operator: Operator) -> None:
    before = wait("fs-a's usage published", lambda: account_status(cluster, "fs-a").get("usage"), timeout=30)
    operator.kill(signal.SIGTERM)
    operator.start(*operator.args)
    t0 = time.time()

    def republished() -> Any:
        st = account_status(cluster, "fs-a")
        updated = st.get("updated", "")
        when = datetime.fromisoformat(updated.replace("Z", "+00:00")).timestamp() if updated else 0
        return st if when >= t0 - 1 else None

    st = wait("fs-a's status published by the restarted operator", republished, timeout=40)
    # half-life 7 days: a minute of decay is ~1e-4 of it; no new work ran for fs-a
    assert abs(float(st["usage"]) - float(before)) <= 0.01 * float(before) + 1, (before, st)

