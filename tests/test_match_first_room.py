"""`first`-style walks look only at the children with a free core (Engine.explore, ``room``)
when every recorded span holds now; the update pass visits only marked children
(Engine.update). Both must give exactly the plain walk's answers.

Random sessions run on two matchers over the same graph: the default one and one that never
uses ``room`` (its ``_all_active`` always says no). Jobs mostly hold until cancelled (so
``room`` is used), some have durations and time advances (so it is not); every answer
(status, job id, start, duration, vertices) must be the same, and after every step each
vertex's ``room`` must be exactly its ordered children that have a core no span holds.
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fluxnetes.graph import from_description, from_k8s_nodes
from fluxnetes.match import Matcher
from fluxnetes.match.vstate import VState, _has_room
from fluxnetes.sim.machine import machine_from_size
from test_match_failing_fast import answer, descriptions, k8s_nodes, step_both
from test_match_reserve_fast import _slots

SETTINGS = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def specs(draw: Any) -> Any:
    duration = draw(st.sampled_from([0, 0, 0, 10, 1000]))
    return _slots(draw(st.integers(1, 5)), draw(st.integers(1, 3)), draw(st.sampled_from([0, 0, 8])),
                  draw(st.integers(0, 1)), duration)


steps = st.lists(st.tuples(st.sampled_from(["allocate", "allocate", "reserve", "cancel", "cancel",
                                            "advance", "down", "up"]),
                           st.integers(0, 10 ** 6)), min_size=2, max_size=30)


def check_room(m: Matcher) -> None:
    stack: list[VState] = [m.engine.root]
    while stack:
        u = stack.pop()
        if u.children:
            want = [c for c in u.order if _has_room(c)]
            assert u.room == want, u.v.path
            assert u.rkeys == [(-c.weight, -c.v.uniq_id) for c in want]
            assert all(c.inroom == (c in want) for c in u.children)
            stack.extend(u.children)


def session(graph_of: Any, policy: str, jobspecs: list[Any], ops: list[tuple[str, int]]) -> None:
    fast = Matcher(graph_of(), policy)
    ref = Matcher(graph_of(), policy)
    ref._all_active = lambda now, duration: False  # type: ignore[method-assign]
    nodes = sorted(v.name for v in fast.graph.by_type.get("node", []))
    now = 0
    for op, pick in ops:
        spec = jobspecs[pick % len(jobspecs)]
        if step_both(fast, ref, op, pick, spec, nodes, now):
            pass
        elif op == "advance":
            now += pick % 120
        check_room(fast)
    fast.check_invariants()


@SETTINGS
@given(k8s_nodes(), st.sampled_from(["first", "firstnodex"]), st.lists(specs(), min_size=1, max_size=4),
       steps)
def test_room_walks_equal_plain_walks_on_kubernetes_graphs(
        nodes: list[dict[str, Any]], policy: str, jobspecs: list[Any], ops: list[tuple[str, int]]) -> None:
    session(lambda: from_k8s_nodes(nodes), policy, jobspecs, ops)


@SETTINGS
@given(descriptions(), st.sampled_from(["first", "firstnodex"]), st.lists(specs(), min_size=1, max_size=4),
       steps)
def test_room_walks_equal_plain_walks_on_described_graphs(
        desc: dict[str, Any], policy: str, jobspecs: list[Any], ops: list[tuple[str, int]]) -> None:
    """Racks, sockets (slot hosts below the node level), gpus."""
    session(lambda: from_description(desc), policy, jobspecs, ops)


def test_room_skips_full_nodes_on_a_flat_machine() -> None:
    """The simulator's shape (one-core nodes, slot[P]->core[1], jobs holding until
    cancelled): the walk looks at the free nodes only, and places as the plain walk does."""
    machine = machine_from_size(64, 1)
    fast, ref = Matcher(machine.graph, "first"), Matcher(machine_from_size(64, 1).graph, "first")
    ref._all_active = lambda now, duration: False  # type: ignore[method-assign]
    seen: list[int] = []
    orig = type(fast.engine).explore

    def counting(self: Any, u: VState, *args: Any) -> bool:
        if self is fast.engine and u is self.root:
            seen.append(len(u.room) if self.meta.room else len(u.order))
        return orig(self, u, *args)

    type(fast.engine).explore = counting  # type: ignore[method-assign]
    try:
        held = []
        for i in range(40):
            spec = _slots(1 + i % 3, 1, 0, 0, 0)
            a, b = fast.allocate(spec), ref.allocate(spec)
            assert answer(a) == answer(b)
            if a.ok:
                held.append(a.jobid)
            if i % 4 == 3:
                fast.cancel(held[0])
                ref.cancel(held.pop(0))
            check_room(fast)
    finally:
        type(fast.engine).explore = orig  # type: ignore[method-assign]
    assert min(seen) < 64  # full nodes were not looked at
    assert len(fast.engine.root.room) == 64 - sum(len(fast.jobs[j].nodes) for j in held)
