"""A multi-pod group placed in part when the leader died: some of its pods placed, the others
still gated, no record of the allocation written (FluxJob status every ``--status-interval``,
or none with ``--fluxjobs waiting``; no store). Crash window ``placed:<k>`` (tests/crashhook).

The next leader must take the whole allocation back (every slot's node and share: the
allocation note each placed pod carries, k8s/scheduling/allocation_note.py) and place the
remaining pods on the slots left for them: every pod of the group ends on the node its slot
names in ONE allocation, no node overbooked, the accounting exact, the FluxJob (if any) says
the pods' nodes. (Before: the group came back at the size its placed pods' slots said, so a
Job's remaining pods waited for a group that never formed, and a ReplicaSet's got a second
allocation.)

kwok (tests/conftest.py: 4 nodes of 16 cpu) completes a Job's pods at once and runs other
pods until they are deleted.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from k8s_helpers import Operator, OverbookingWatch, bound_nodes, namespace, operator_session
from test_k8s_operator import apply, fluxjob, job, job_complete, pod, pods, wait
from test_k8s_recovery_exact import (
    crash_at,
    exact_at_rest,
    replicaset,
    restart,
    wait_crash,
    whole_cluster_runs,
)

pytestmark = pytest.mark.k8s

MODES = {"all": ("--status-interval", "10", "--fluxjobs", "all"), "waiting": ("--status-interval", "10", "--fluxjobs", "waiting")}


@pytest.fixture(scope="module")
def op(k8s_cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Operator]:
    with operator_session(k8s_cluster, tmp_path_factory, "operator-partial", start=False) as o:
        yield o


@pytest.fixture
def ns(k8s_cluster: Any) -> Iterator[str]:
    with namespace(k8s_cluster) as name:
        yield name


def placed_count(cluster: Any, ns: str, selector: str) -> int:
    return sum(1 for p in pods(cluster, ns, selector) if not p["spec"].get("schedulingGates"))


def one_allocation(cluster: Any, ns: str, selector: str, size: int) -> list[str]:
    """Every pod of the group placed on the node its slot names, in one allocation of
    ``size`` slots that every pod's note agrees on; the pods' nodes (sorted)."""
    ps = pods(cluster, ns, selector)
    assert len(ps) == size, [p["metadata"]["name"] for p in ps]
    slots: dict[int, str] = {}
    layouts = set()
    for p in ps:
        ann = p["metadata"].get("annotations") or {}
        slot, node = int(ann["fluxnetes.io/slot"]), p["spec"]["nodeName"]
        assert slot not in slots, f"slot {slot} placed twice"
        index = ann.get("batch.kubernetes.io/job-completion-index")
        assert index is None or int(index) == slot, (p["metadata"]["name"], index, slot)  # a Job's pod: its index's slot
        slots[slot] = node
        note = json.loads(ann["fluxnetes.io/allocation"])
        layout = tuple(n for row in note["n"] for n in [row[0]] * row[4])
        assert layout[slot] == node, (p["metadata"]["name"], slot, node, layout)
        layouts.add(layout)
    assert sorted(slots) == list(range(size))
    assert len(layouts) == 1, f"more than one allocation: {layouts}"
    return sorted(slots.values())


def agrees(cluster: Any, ns: str, name: str, nodes: list[str], phase: str) -> None:
    """The group's FluxJob, if it has one, says the pods' nodes; and no scale group exists."""
    fjs = {f["metadata"]["name"]: f for f in cluster.kubectl_json("get", "fluxjobs", "-n", ns)["items"]}
    assert [n for n in fjs if n.startswith(f"{name}-scale-")] == [], sorted(fjs)
    if name in fjs:
        st = wait(f"FluxJob {name} {phase}",
                  lambda: (fluxjob(cluster, ns, name).get("status") or {}).get("phase") == phase
                  and fluxjob(cluster, ns, name)["status"], timeout=60)
        assert sorted(st["nodes"]) == nodes


@pytest.mark.parametrize("mode", sorted(MODES))
def test_job_placed_in_part_then_restart(k8s_cluster: Any, ns: str, op: Operator, mode: str) -> None:
    """A Job of 4 pods of 16 cpu (the whole cluster): the leader dies once 2 are placed
    (they complete at once on kwok); meanwhile a pod of the default scheduler takes the node
    one of them ran on. The restart places the other 2 on the 2 slots left (the 2 nodes the
    allocation gave them); the Job completes; nothing leaked. (Before the fix the Job's
    group was matched again for 4 whole nodes, of which 3 were free: it never ran.)"""
    crash_at(op, f"placed:2@{ns}/job-gang", *MODES[mode])
    other = f"{ns}-other"  # not opted in: the default scheduler's pods
    k8s_cluster.kubectl("create", "namespace", other)
    try:
        with OverbookingWatch(k8s_cluster) as watch:
            apply(k8s_cluster, ns, [job("gang", 4, "16")])
            wait_crash(op)
            placed = [p for p in pods(k8s_cluster, ns, "job-name=gang") if not p["spec"].get("schedulingGates")]
            assert len(placed) == 2
            ran_on = bound_nodes(k8s_cluster, ns, "batch.kubernetes.io/job-completion-index="
                                 + placed[0]["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"], 1)
            apply(k8s_cluster, other, [pod("foreign", "16", node=ran_on[0], ns=other)])
            restart(op, *MODES[mode])
            wait("gang complete", lambda: job_complete(k8s_cluster, ns, "gang"), timeout=120)
            nodes = one_allocation(k8s_cluster, ns, "job-name=gang", 4)
            assert len(set(nodes)) == 4  # one 16-cpu pod a node
            agrees(k8s_cluster, ns, "job-gang", nodes, "Completed")
            exact_at_rest(op)
            k8s_cluster.kubectl("delete", "pod", "-n", other, "foreign", "--wait=true")
            whole_cluster_runs(k8s_cluster, ns, "whole")
        assert watch.violations == []
    finally:
        k8s_cluster.kubectl("delete", "namespace", other, "--wait=false", check=False)


@pytest.mark.parametrize("mode", sorted(MODES))
def test_replicaset_placed_in_part_then_restart(k8s_cluster: Any, ns: str, op: Operator, mode: str) -> None:
    """A ReplicaSet of 4 pods of 16 cpu (they run until deleted): the leader dies once 2 are
    placed. The restart keeps ONE allocation of 4 (no second allocation, no scale group for
    the 2 not placed yet); deleting the ReplicaSet gives everything back."""
    crash_at(op, f"placed:2@{ns}/replicaset-web", *MODES[mode])
    with OverbookingWatch(k8s_cluster) as watch:
        apply(k8s_cluster, ns, [replicaset("web", 4, "16")])
        wait_crash(op)
        assert placed_count(k8s_cluster, ns, "app=web") == 2
        restart(op, *MODES[mode])
        bound_nodes(k8s_cluster, ns, "app=web", 4)
        nodes = one_allocation(k8s_cluster, ns, "app=web", 4)
        assert len(set(nodes)) == 4
        agrees(k8s_cluster, ns, "replicaset-web", nodes, "Running")
        exact_at_rest(op)
        k8s_cluster.kubectl("delete", "replicaset", "-n", ns, "web")
        wait("web's pods gone", lambda: pods(k8s_cluster, ns, "app=web") == [], timeout=60)
        exact_at_rest(op)
        whole_cluster_runs(k8s_cluster, ns, "whole")
    assert watch.violations == []
