"""The count questions of satisfiability (fluxnetes.queue.satisfy): totals, a shape that fits
no node, more slots than the nodes hold; each answer agrees with the matcher's own walk."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from fluxnetes.graph import from_k8s_nodes
from fluxnetes.jobspec import PodRequest, jobspec_from_pods, parse_jobspec
from fluxnetes.match.matcher import Matcher
from fluxnetes.queue.satisfy import Capacity

NAMES = {"core": "cpu", "memory": "MiB memory", "gpu": "nvidia.com/gpu", "slot": "pod"}
GIB = 1024**3


def node(name: str, cpu: int, mem_gib: int = 64, gpus: int = 0, labels: dict[str, str] | None = None) -> dict[str, Any]:
    alloc = {"cpu": str(cpu), "memory": f"{mem_gib}Gi", "pods": "110"}
    if gpus:
        alloc["nvidia.com/gpu"] = str(gpus)
    return {"metadata": {"name": name, "labels": labels or {}}, "status": {"allocatable": alloc}}


def cap_of(*nodes: dict[str, Any]) -> Capacity:
    return Capacity.of(from_k8s_nodes(list(nodes)))


def short(cap: Capacity, js: Any) -> str | None:
    s = cap.check(js)
    return None if s is None else s.text(NAMES)


def test_more_than_the_whole_cluster_names_the_total() -> None:
    cap = cap_of(node("a", 16), node("b", 16))
    assert short(cap, jobspec_from_pods(1, PodRequest(1000 * 1000))) == "needs 1000 cpu in all; the cluster has 32"


def test_a_pod_no_node_can_hold_names_the_largest_node() -> None:
    cap = cap_of(node("a", 16), node("b", 8))
    assert short(cap, jobspec_from_pods(1, PodRequest(20 * 1000))) == "no node has 20 cpu; the largest has 16"
    assert short(cap, jobspec_from_pods(1, PodRequest(1000, 100 * GIB))) == \
        "no node has 102400 MiB memory; the largest has 65536"
    assert short(cap, jobspec_from_pods(1, PodRequest(16 * 1000))) is None


def test_resources_on_different_nodes_do_not_make_one_pod() -> None:
    cap = cap_of(node("cpu", 16), node("gpu", 2, gpus=4))
    s = short(cap, jobspec_from_pods(1, PodRequest(8000, 0, 2)))
    assert s == "no node has 8 cpu, 2 nvidia.com/gpu together"


def test_more_pods_than_the_nodes_hold() -> None:
    cap = cap_of(*(node(f"n{i}", 16) for i in range(3)))
    assert short(cap, jobspec_from_pods(3, PodRequest(10_000))) is None
    assert short(cap, jobspec_from_pods(4, PodRequest(10_000))) == \
        "needs 4 pods of 10 cpu each; the nodes hold at most 3 of them"
    assert short(cap, jobspec_from_pods(4, PodRequest(1000), exclusive_nodes=True)) == \
        "needs 4 nodes in all; the cluster has 3"


def test_constraints_limit_the_nodes_looked_at() -> None:
    cap = cap_of(node("big", 64), node("small-0", 8), node("small-1", 8))
    js = jobspec_from_pods(1, PodRequest(16_000))
    spec = js.to_dict()
    spec["attributes"]["system"]["constraints"] = {"hostlist": ["small-[0-1]"]}
    assert short(cap, parse_jobspec(spec)) == "no eligible node has 16 cpu; the largest has 8"
    spec["attributes"]["system"]["constraints"] = {"hostlist": ["nowhere"]}
    assert short(cap, parse_jobspec(spec)) == "no node matches the request's constraints"


def test_a_graph_change_needs_a_new_capacity() -> None:
    small = cap_of(node("a", 16))
    grown = cap_of(node("a", 16), node("b", 16))
    js = jobspec_from_pods(2, PodRequest(16_000))
    assert small.check(js) is not None and grown.check(js) is None


@settings(max_examples=60, deadline=None)
@given(cpus=st.lists(st.integers(1, 24), min_size=1, max_size=4),
       count=st.integers(1, 6), cpu=st.integers(1, 30), mem=st.integers(0, 80),
       exclusive=st.booleans())
def test_a_shortfall_is_never_wrong(cpus: list[int], count: int, cpu: int, mem: int, exclusive: bool) -> None:
    """Whenever the count questions say "never", the matcher's full walk agrees."""
    graph = from_k8s_nodes([node(f"n{i}", c) for i, c in enumerate(cpus)])
    js = jobspec_from_pods(count, PodRequest(cpu * 1000, mem * GIB), exclusive_nodes=exclusive)
    s = Capacity.of(graph).check(js)
    if s is not None:
        answer = Matcher(graph).satisfiability(js)
        assert str(answer.status).rsplit(".", 1)[-1] == "UNSATISFIABLE", (s, answer)


def test_the_matchers_satisfiability_ignores_down_nodes() -> None:
    """The operator asks the walk while nodes are cordoned (k8s/scheduling/satisfiable.py relies on it)."""
    nodes = [node(f"n{i}", 16) for i in range(3)]
    nodes[2]["spec"] = {"unschedulable": True}
    js = jobspec_from_pods(3, PodRequest(12_000))
    answer = Matcher(from_k8s_nodes(nodes)).satisfiability(js)
    assert str(answer.status).rsplit(".", 1)[-1] == "ALLOCATED"
