"""A pod of a running multi-pod group DELETED (not ended) on the real control plane
(groups/groupbook.py ``member_gone``; the unit tests: tests/test_k8s_member_gone_unit.py).

Its own small dev cluster: 2 kwok nodes of 4 cpu, Job pods annotated with
``pod-complete.stage.kwok.x-k8s.io/delay`` run that long (other pods run until deleted), and
kwok deletes a pod at once, without a terminal phase (its DELETED event says Running: what
`kubectl delete --force`, a lost node's pods or a slow kubelet look like).

1. A Job of 3 completions, 3 at a time: a running pod is deleted; the Job controller counts it
   failed and makes another, which must be placed on the slot kept for it (the same node) and
   the Job completes. (Before the fix the share went back and the new pod stayed gated: the
   Job never completed.)
2. A label group of bare pods filling the cluster: a pod deleted gives its share back at once
   (nothing re-creates it): a waiting pod of 2 cpu starts on it; a late pod of the group's
   label stays gated, even after another pod of the group gave its slot back; no node is ever
   overbooked.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from k8s_helpers import Operator, OverbookingWatch, dev_cluster, namespace, operator_session
from test_k8s_operator import apply, job_complete, pod, pods, wait

pytestmark = pytest.mark.k8s

DELAY = "pod-complete.stage.kwok.x-k8s.io/delay"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from fluxnetes.devcluster import NodeShape

    yield from dev_cluster(tmp_path_factory, "deleted-cluster", NodeShape(count=2, cpu="4", memory="16Gi"),
                           timed_pods=True)


@pytest.fixture(scope="module")
def operator(cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Operator]:
    # a group's FluxJob (its podsSeen) tells below what the operator saw: every group gets one
    # (--fluxjobs all; the default, waiting, gives the label group placed at once none)
    with operator_session(cluster, tmp_path_factory, "deleted-operator", "--status-interval", "0.3",
                          "--fluxjobs", "all") as op:
        yield op


@pytest.fixture
def ns(cluster: Any, operator: Operator) -> Iterator[str]:
    with namespace(cluster) as name:
        yield name


def running(cluster: Any, ns: str, selector: str) -> list[dict[str, Any]]:
    return [p for p in pods(cluster, ns, selector)
            if p["spec"].get("nodeName") and (p.get("status") or {}).get("phase") == "Running"
            and not p["metadata"].get("deletionTimestamp")]


def gated(p: dict[str, Any]) -> bool:
    return bool(p["spec"].get("schedulingGates"))


def test_a_running_job_pod_deleted_is_retried_on_its_kept_slot(cluster: Any, ns: str) -> None:
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "gang"},
           "spec": {"parallelism": 3, "completions": 3, "completionMode": "Indexed", "backoffLimit": 2,
                    # long enough that index 0 still runs when it is deleted, even on a slow,
                    # busy machine (the test waits for states; this only bounds the run)
                    "template": {"metadata": {"annotations": {DELAY: "60s"}},
                                 "spec": {"restartPolicy": "Never",
                                          "containers": [{"name": "c", "image": "busybox",
                                                          "resources": {"requests": {"cpu": "2"}}}]}}}}
    with OverbookingWatch(cluster) as watch:
        apply(cluster, ns, [job])
        first = wait("3 pods running", lambda: (lambda r: r if len(r) == 3 else None)(running(cluster, ns, "job-name=gang")),
                     timeout=90)
        victim = next(p for p in first if p["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"] == "0")
        slot, node = victim["metadata"]["annotations"]["fluxnetes.io/slot"], victim["spec"]["nodeName"]
        cluster.kubectl("delete", "pod", "-n", ns, victim["metadata"]["name"], "--wait=true")

        def retried() -> dict[str, Any] | None:
            for p in pods(cluster, ns, "job-name=gang,batch.kubernetes.io/job-completion-index=0"):
                if p["metadata"]["uid"] != victim["metadata"]["uid"] and not gated(p) and p["spec"].get("nodeName"):
                    return p
            return None

        again = wait("index 0 made again and placed", retried, timeout=90)
        assert again["metadata"]["annotations"]["fluxnetes.io/slot"] == slot
        assert again["spec"]["nodeName"] == node  # the slot kept for it: the same node
        wait("gang complete", lambda: job_complete(cluster, ns, "gang"), timeout=300)
    assert watch.violations == []


def test_a_deleted_label_group_pod_gives_its_share_back_at_once(cluster: Any, ns: str) -> None:
    group = {"fluxnetes.io/group": "g", "fluxnetes.io/group-size": "4"}
    with OverbookingWatch(cluster) as watch:
        apply(cluster, ns, [pod(f"g-{i}", "2", labels={**group, "app": "g"}) for i in range(4)])
        wait("4 pods running", lambda: len(running(cluster, ns, "app=g")) == 4, timeout=90)
        apply(cluster, ns, [pod("waiting", "2", labels={"app": "w"})])  # the cluster is full
        # a state, not a time: the waiting pod's FluxJob says it waits in the queue
        wait("the single pod queued", lambda: (cluster.kubectl_json("get", "fluxjob", "-n", ns, "pod-waiting")
                                               .get("status") or {}).get("phase") in ("Pending", "Reserved"),
             timeout=60)
        assert running(cluster, ns, "app=w") == []
        cluster.kubectl("delete", "pod", "-n", ns, "g-1", "--wait=true")
        wait("the waiting pod runs on the share given back", lambda: len(running(cluster, ns, "app=w")) == 1,
             timeout=60)
        apply(cluster, ns, [pod("g-late", "2", labels={**group, "app": "g"})])
        # another pod of the group goes after it (one watch stream: seen in that order); its
        # release writes the FluxJob, whose podsSeen then counts the late pod: g-2, g-3, g-late
        cluster.kubectl("delete", "pod", "-n", ns, "g-0", "--wait=true")
        wait("the operator saw the late pod, then g-0 go",
             lambda: (cluster.kubectl_json("get", "fluxjob", "-n", ns, "g").get("status") or {}).get("podsSeen") == 3,
             timeout=60)
        late = next(p for p in pods(cluster, ns, "app=g") if p["metadata"]["name"] == "g-late")
        assert gated(late) and not late["spec"].get("nodeName")  # no share for it: it waits
    assert watch.violations == []
