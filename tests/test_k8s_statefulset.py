"""A StatefulSet with the default podManagementPolicy (OrderedReady) is placed pod by pod: the
controller creates pod N+1 only once pod N is Ready, so each pod forms a group of its own as it
appears (the first is the set's group, the others its "-scale-N" groups).

Unit level: the Controller driven by watch events (the recording fake of test_k8s_prune).
Cluster level: 3 replicas of 1 cpu on the real control plane reach Ready.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from fluxnetes.k8s import names
from fluxnetes.k8s.workloads.statefulset import KIND
from test_k8s_operator import apply, phase, wait
from test_k8s_prune import bound, make_controller, pod, settle


def sts(replicas: int, *, made: int = 0, ready: int = 0, policy: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"replicas": replicas, "serviceName": "db",
                            "selector": {"matchLabels": {"app": "db"}},
                            "template": {"metadata": {"labels": {"app": "db", names.LABEL_MANAGED: "true"}},
                                         "spec": {"containers": [{"name": "c", "image": "busybox",
                                                                  "resources": {"requests": {"cpu": "1"}}}]}}}
    if policy:
        spec["podManagementPolicy"] = policy
    return {"apiVersion": "apps/v1", "kind": "StatefulSet",
            "metadata": {"name": "db", "namespace": "ns", "uid": "sts-db"},
            "spec": spec, "status": {"replicas": made, "readyReplicas": ready}}


def test_an_ordered_set_counts_the_pods_its_controller_creates_now() -> None:
    assert KIND.size(sts(3)) == 1  # only pod 0 exists at first
    assert KIND.size(sts(3, made=1)) == 1
    assert KIND.size(sts(3, made=1, ready=1)) == 2  # pod 0 Ready: pod 1 comes
    assert KIND.size(sts(3, made=3, ready=3)) == 3
    assert KIND.size(sts(3, made=3, ready=0)) == 3  # all made: a restart keeps the whole set
    assert KIND.size(sts(1, made=3, ready=3)) == 1  # scaled down
    assert KIND.size(sts(3, policy="Parallel")) == 3


def test_ordered_pods_are_placed_one_by_one() -> None:
    async def main() -> None:
        c, kube = make_controller()
        c.handle(("StatefulSet", "ADDED", sts(3)))
        for i in range(3):
            p = pod(f"db-{i}", owner=sts(3))
            c.handle(("Pod", "ADDED", p))
            await settle(c)
            assert kube.placed[-1] == f"db-{i}"  # placed alone, before the next one exists
            key = ("ns", "statefulset-db" if i == 0 else f"statefulset-db-scale-{i}")
            g = c.groups[key]
            assert str(g.phase) == "Running" and g.spec.size == 1
            c.handle(("Pod", "MODIFIED", bound(p, g.slots[0])))
            # pod i is Ready: the controller will create pod i+1
            c.handle(("StatefulSet", "MODIFIED", sts(3, made=i + 1, ready=i + 1)))
            await settle(c)
        assert kube.placed == ["db-0", "db-1", "db-2"]
        assert not any(str(g.phase) in ("Provisional", "Pending") for g in c.groups.values())

    asyncio.run(main())


def test_an_ordered_set_scaled_down_gives_back_the_removed_pods_shares() -> None:
    async def main() -> None:
        c, kube = make_controller()
        c.handle(("StatefulSet", "ADDED", sts(3)))
        placed = []
        for i in range(3):
            p = pod(f"db-{i}", owner=sts(3))
            c.handle(("Pod", "ADDED", p))
            await settle(c)
            key = ("ns", "statefulset-db" if i == 0 else f"statefulset-db-scale-{i}")
            placed.append((p, key, c.groups[key].slots[0]))
            c.handle(("Pod", "MODIFIED", bound(p, c.groups[key].slots[0])))
            c.handle(("StatefulSet", "MODIFIED", sts(3, made=i + 1, ready=i + 1)))
            await settle(c)
        # scaled to 1: the controller deletes db-2, then db-1
        c.handle(("StatefulSet", "MODIFIED", sts(1, made=3, ready=3)))
        for p, key, n in reversed(placed[1:]):
            c.handle(("Pod", "DELETED", bound(p, n)))
            await settle(c)
            assert str(c.groups[key].phase) == "Completed" and not c.groups[key].held
        assert str(c.groups[("ns", "statefulset-db")].phase) == "Running"
        held = [j for j in c.cluster.matcher.jobs.values() if not j.reserved]
        assert len(held) == 1  # only db-0's share is left
        assert kube.placed == ["db-0", "db-1", "db-2"]

    asyncio.run(main())


def test_a_pod_seen_before_the_ready_count_joins_its_own_group() -> None:
    async def main() -> None:
        c, kube = make_controller()
        c.handle(("StatefulSet", "ADDED", sts(2)))
        p0 = pod("db-0", owner=sts(2))
        c.handle(("Pod", "ADDED", p0))
        await settle(c)
        c.handle(("Pod", "MODIFIED", bound(p0, c.groups[("ns", "statefulset-db")].slots[0])))
        p1 = pod("db-1", owner=sts(2))
        c.handle(("Pod", "ADDED", p1))  # the controller made it before its status said so
        await settle(c)
        c.handle(("StatefulSet", "MODIFIED", sts(2, made=2, ready=1)))
        await settle(c)
        assert kube.placed == ["db-0", "db-1"]
        assert str(c.groups[("ns", "statefulset-db-scale-1")].phase) == "Running"

    asyncio.run(main())


# ---------------------------------------------------------------- cluster level

@pytest.fixture
def ns(k8s_cluster: Any, operator: Any) -> Iterator[str]:
    from k8s_helpers import namespace

    with namespace(k8s_cluster) as name:
        yield name


@pytest.fixture(scope="module")
def operator(k8s_cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from k8s_helpers import operator_session

    with operator_session(k8s_cluster, tmp_path_factory, "operator-sts") as o:
        yield o


@pytest.mark.k8s
def test_an_ordered_ready_statefulset_reaches_ready(k8s_cluster: Any, ns: str) -> None:
    manifest = sts(3)
    del manifest["status"], manifest["metadata"]["uid"], manifest["metadata"]["namespace"]
    manifest["spec"]["template"]["metadata"]["labels"] = {"app": "db"}
    apply(k8s_cluster, ns, [manifest])
    wait("3 replicas Ready", lambda: (k8s_cluster.kubectl_json("get", "statefulset", "-n", ns, "db")
                                      .get("status") or {}).get("readyReplicas") == 3, timeout=120)
    names = ("statefulset-db", "statefulset-db-scale-1", "statefulset-db-scale-2")

    def phases() -> dict[str, str]:
        # as the API server has them: FluxJob writes are asynchronous (coalesced per
        # --status-interval), and a group placed at once has none in the default mode (its
        # placed pods say Running: ``phase``)
        return {n: phase(k8s_cluster, ns, n) for n in names}

    wait("the set's three groups Running", lambda: set(phases().values()) == {"Running"}, timeout=60)
