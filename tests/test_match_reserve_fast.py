"""The reservation search's count bound (match/reserve.py) gives exactly the walk's answers.

Random sessions run on two matchers over the same graph: the default one and one with
``fast_fail = False`` and no index fast paths (a walk at every candidate start time), with
running jobs of various durations, reservations, cancels and time advancing; every answer of
``allocate_orelse_reserve`` (status, job id, start, duration, vertices) must be the same.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fluxnetes.graph import from_description, from_k8s_nodes
from fluxnetes.jobspec import parse_jobspec
from fluxnetes.match import Matcher
from fluxnetes.match.engine import Engine
from fluxnetes.plan import Planner
from test_match_failing_fast import answer, descriptions, k8s_nodes, step_both

SETTINGS = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
POLICIES = ["low", "high", "lonode", "hinode", "first", "locality", "variation"]


def _slots(count: Any, cores: Any, mib: int, gpus: int, duration: int) -> Any:
    inner: list[dict[str, Any]] = [{"type": "core", "count": cores}]
    if mib:
        inner.append({"type": "memory", "count": mib})
    if gpus:
        inner.append({"type": "gpu", "count": gpus})
    return parse_jobspec({"version": 9999, "resources": [{"type": "slot", "count": count, "label": "s",
                                                         "with": inner}],
                          "tasks": [{"command": ["a"], "slot": "s", "count": {"per_slot": 1}}],
                          "attributes": {"system": {"duration": duration}}})


@st.composite
def slot_specs(draw: Any) -> Any:
    count: Any = draw(st.integers(1, 4))
    if draw(st.integers(0, 4)) == 0:
        count = {"min": count, "max": count + draw(st.integers(0, 3)), "operator": "+", "operand": 1}
    cores: Any = draw(st.integers(1, 6))
    if draw(st.integers(0, 4)) == 0:
        cores = {"min": cores, "max": cores + 2, "operator": "+", "operand": 1}
    return _slots(count, cores, draw(st.sampled_from([0, 0, 8, 64, 512])), draw(st.integers(0, 1)),
                  draw(st.sampled_from([0, 5, 10, 30, 100, 1000])))


steps = st.lists(st.tuples(st.sampled_from(["allocate", "reserve", "reserve", "reserve", "cancel", "advance",
                                            "down", "up"]),
                           st.integers(0, 10 ** 6)), min_size=2, max_size=24)


def session(graph_of: Any, policy: str, specs: list[Any], ops: list[tuple[str, int]]) -> None:
    fast = Matcher(graph_of(), policy)
    ref = Matcher(graph_of(), policy)
    ref.fast_fail = False
    ref._fast_policy = False
    nodes = sorted(v.name for v in fast.graph.by_type.get("node", []))
    now = 0
    for op, pick in ops:
        spec = specs[pick % len(specs)]
        if step_both(fast, ref, op, pick, spec, nodes, now):
            pass
        elif op == "advance":
            now += pick % 120
    fast.check_invariants()


@SETTINGS
@given(k8s_nodes(), st.sampled_from(POLICIES), st.lists(slot_specs(), min_size=1, max_size=5), steps)
def test_reservations_equal_the_walks_on_kubernetes_graphs(
        nodes: list[dict[str, Any]], policy: str, specs: list[Any], ops: list[tuple[str, int]]) -> None:
    session(lambda: from_k8s_nodes(nodes), policy, specs, ops)


@SETTINGS
@given(descriptions(), st.sampled_from(POLICIES), st.lists(slot_specs(), min_size=1, max_size=5), steps)
def test_reservations_equal_the_walks_on_described_graphs(
        desc: dict[str, Any], policy: str, specs: list[Any], ops: list[tuple[str, int]]) -> None:
    """Sockets (slot hosts below the node level), gpus, pools of other sizes."""
    session(lambda: from_description(desc), policy, specs, ops)


def _k8s(name: str, cpu: str) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {},
            "status": {"allocatable": {"cpu": cpu, "memory": "4Gi", "pods": "110"},
                       "conditions": [{"type": "Ready", "status": "True"}]}}


@pytest.mark.parametrize("policy", ["lonode", "first"])
def test_busy_cluster_reserves_without_failing_walks(monkeypatch: Any, policy: str) -> None:
    """Every node mostly used by 1-core jobs ending one by one: the root has room at every end
    time, but one node has room only when several of its jobs ended. The answer is the
    walk-at-every-candidate answer; no candidate that fails is walked, and under `lonode`
    (slot index) not even the successful one."""
    def build() -> Matcher:
        m = Matcher(from_k8s_nodes([_k8s(f"n{i}", "8") for i in range(6)]), policy)
        for i in range(6 * 8 - 2):  # lonode packs node by node: 2 cores free on the last
            assert m.allocate(_slots(1, 1, 0, 0, 10 + (i * 37) % 97)).ok
        return m

    big = _slots(1, 6, 64, 0, 50)
    ref = build()
    ref.fast_fail = False
    want = ref.allocate_orelse_reserve(big)
    fast = build()
    walks: list[int] = []
    orig = Engine.select

    def counting(self: Engine, *args: Any) -> bool:
        walks.append(args[1].at)
        return orig(self, *args)

    monkeypatch.setattr(Engine, "select", counting)
    got = fast.allocate_orelse_reserve(big)
    assert answer(got) == answer(want)
    assert got.status.value == "RESERVED" and got.at > 0
    assert [t for t in walks if t > 0] == ([] if policy == "lonode" else [got.at])


def test_earliest_capped_matches_brute_force() -> None:
    """Earliest instant whose window, cut at ``cap``, has the amount free (every instant)."""
    spans = [(0, 10, 3), (5, 20, 1), (15, 30, 4), (40, 50, 2)]
    p = Planner(4)
    for k, (s, e, a) in enumerate(spans):
        p.put(k, s, e, a)

    def free_over(s: int, end: int) -> int:
        return min(4 - sum(a for (s0, e0, a) in spans if s0 <= x < e0) for x in range(s, end))

    for cap in (35, 45, 60):
        for dur in (1, 5, 12, 100):
            for amount in range(0, 6):
                for t in range(1, 50):
                    want = next((s for s in range(t, cap) if free_over(s, min(s + dur, cap)) >= amount), None)
                    assert p.earliest_capped(t, dur, amount, cap) == want, (cap, dur, amount, t)
