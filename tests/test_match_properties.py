"""Property tests on random graphs and jobspecs: never over-allocate, never use a down vertex,
cancel / partial cancel restore exactly, same input -> same answer, JGF round trip."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fluxnetes.graph import from_description, read_jgf, write_jgf
from fluxnetes.jobspec import parse_jobspec
from fluxnetes.match import POLICIES, Matcher, MatchStatus, NodeShare

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def descriptions(draw: Any) -> dict[str, Any]:
    node = {"sockets": draw(st.integers(0, 2)), "cores": draw(st.integers(1, 4)), "gpus": draw(st.integers(0, 2)),
            "memory": draw(st.sampled_from([0, 4, 16]))}
    racks = [{"name": f"rack{i}", "nodes": draw(st.integers(1, 3))} for i in range(draw(st.integers(1, 3)))]
    return {"node": node, "racks": racks}


@st.composite
def jobspecs(draw: Any) -> Any:
    inner = [{"type": "core", "count": draw(st.integers(1, 3))}]
    if draw(st.booleans()):
        inner.append({"type": "gpu", "count": 1})
    if draw(st.booleans()):
        inner.append({"type": "memory", "count": draw(st.integers(1, 8))})
    slot = {"type": "slot", "count": draw(st.integers(1, 3)), "label": "s", "with": inner}
    shape = draw(st.sampled_from(["slot", "node", "nodex"]))
    if shape == "slot":
        res = [slot]
    else:
        slot["count"] = 1
        res = [{"type": "node", "count": draw(st.integers(1, 2)), "with": [slot]}]
        if shape == "nodex":
            res[0]["exclusive"] = True
    return parse_jobspec({"version": 9999, "resources": res,
                          "tasks": [{"command": ["a"], "slot": "s", "count": {"per_slot": 1}}],
                          "attributes": {"system": {"duration": draw(st.sampled_from([0, 10, 100]))}}})


def state(m: Matcher) -> dict[str, Any]:
    return {u.v.path: (dict(u.ps or {}), u.pused, u.alloc_n, dict(u.xs or {}), dict(u.fspans or {}), list(u.fused))
            for u in m.engine.vs.values()}


ops = st.lists(st.tuples(st.sampled_from(["allocate", "reserve", "cancel", "partial"]), jobspecs(),
                         st.integers(0, 50)), min_size=1, max_size=12)


@SETTINGS
@given(descriptions(), st.sampled_from(sorted(POLICIES)), ops, st.integers(0, 3))
def test_random_sessions_keep_invariants(desc: dict[str, Any], policy: str, steps: list[Any], down: int) -> None:
    g = from_description(desc)
    m = Matcher(g, policy)
    nodes = [v.name for v in g.by_type["node"]]
    down_name = nodes[down % len(nodes)]
    m.set_status(down_name, False)
    now = 0
    for op, spec, k in steps:
        now += k
        live = list(m.jobs)
        if op == "cancel" and live:
            m.cancel(live[k % len(live)])
        elif op == "partial" and live:
            jid = live[k % len(live)]
            rec = m.jobs[jid]
            if rec.nodes:
                m.partial_cancel(jid, [NodeShare(rec.nodes[0].name)])
        else:
            r = m.allocate_orelse_reserve(spec, now=now) if op == "reserve" else m.allocate(spec, now=now)
            if r.ok:
                assert all(n.name != down_name for n in r.nodes), "a down node was used"
                assert r.at >= now
        m.check_invariants()


@SETTINGS
@given(descriptions(), st.sampled_from(sorted(POLICIES)), st.lists(jobspecs(), min_size=1, max_size=6))
def test_cancel_restores_exactly_and_answers_are_deterministic(desc: dict[str, Any], policy: str,
                                                               specs: list[Any]) -> None:
    m1 = Matcher(from_description(desc), policy)
    m2 = Matcher(from_description(desc), policy)
    base = state(m1)
    ids = []
    for s in specs:
        r1 = m1.allocate_orelse_reserve(s)
        r2 = m2.allocate_orelse_reserve(s)
        assert (r1.status, r1.jobid, r1.at, [(v.path, v.size, v.exclusive) for v in r1.vertices]) == (
            r2.status, r2.jobid, r2.at, [(v.path, v.size, v.exclusive) for v in r2.vertices])
        if r1.ok:
            ids.append(r1.jobid)
            assert r1.status in (MatchStatus.ALLOCATED, MatchStatus.RESERVED)
    for j in reversed(ids):
        m1.cancel(j)
    assert state(m1) == base
    m1.check_invariants()


@SETTINGS
@given(descriptions(), st.lists(jobspecs(), min_size=1, max_size=4))
def test_partial_cancel_of_everything_equals_cancel(desc: dict[str, Any], specs: list[Any]) -> None:
    m = Matcher(from_description(desc), "low")
    base = state(m)
    for s in specs:
        r = m.allocate(s)
        if not r.ok:
            continue
        names = [n.name for n in r.nodes]
        done = False
        for i, n in enumerate(names):
            done = m.partial_cancel(r.jobid, [NodeShare(n)])
            assert done == (i == len(names) - 1)
        assert done and r.jobid not in m.jobs
        assert state(m) == base


@SETTINGS
@given(descriptions())
def test_jgf_round_trip(desc: dict[str, Any]) -> None:
    g = from_description(desc)
    j = write_jgf(g)
    assert write_jgf(read_jgf(j)) == j


@SETTINGS
@given(descriptions(), st.sampled_from(["low", "high", "lonode", "hinode"]),
       st.lists(st.tuples(jobspecs(), st.booleans()), min_size=1, max_size=10))
def test_index_fast_paths_give_the_walks_answers(desc: dict[str, Any], policy: str,
                                                 steps: list[tuple[Any, bool]]) -> None:
    same_as_walk(desc, policy, steps)


def same_as_walk(desc: dict[str, Any], policy: str, steps: list[tuple[Any, bool]],
                 constraint: Any = None) -> None:
    """The matcher with its index fast paths answers every step exactly as the walk does."""
    from dataclasses import replace

    fast = Matcher(from_description(desc), policy)
    walk = Matcher(from_description(desc), policy)
    walk._fast_policy = False
    for spec, cancel in steps:
        if constraint is not None:
            spec = replace(spec, constraint=constraint(fast))
        a, b = fast.allocate(spec), walk.allocate(spec)
        assert (a.status, a.jobid, [(v.path, v.size, v.exclusive) for v in a.vertices]) == (
            b.status, b.jobid, [(v.path, v.size, v.exclusive) for v in b.vertices])
        if cancel and a.ok:
            fast.cancel(a.jobid)
            walk.cancel(b.jobid)
    fast.check_invariants()


@SETTINGS
@given(descriptions(), st.sampled_from(["low", "high", "lonode", "hinode"]), st.data(),
       st.lists(st.tuples(jobspecs(), st.booleans()), min_size=1, max_size=10))
def test_index_fast_paths_follow_hostlist_constraints_like_the_walk(
        desc: dict[str, Any], policy: str, data: Any, steps: list[tuple[Any, bool]]) -> None:
    """A hostlist constraint (what the operator adds for pods' nodeSelector / taints) keeps the
    index fast paths: hosts under excluded nodes are skipped, as the walk prunes them."""
    from fluxnetes.jobspec.constraints import parse_constraint

    names = sorted(v.name for v in from_description(desc).by_type.get("node", []))
    allowed = data.draw(st.lists(st.sampled_from(names), unique=True) if names else st.just([]))
    constraint = parse_constraint({"hostlist": allowed}, "c")
    same_as_walk(desc, policy, steps, lambda _m: constraint)


def test_a_hostlist_constraint_keeps_the_fast_path() -> None:
    from fluxnetes.jobspec.constraints import parse_constraint

    m = Matcher(from_description({"node": {"sockets": 0, "cores": 4, "gpus": 0, "memory": 0},
                                  "racks": [{"name": "rack0", "nodes": 4}]}), "lonode")
    names = sorted(v.name for v in m.graph.by_type["node"])
    spec = parse_jobspec({"version": 9999, "resources": [{"type": "slot", "count": 6, "label": "s", "with": [
        {"type": "core", "count": 1}]}], "tasks": [{"command": ["a"], "slot": "s", "count": {"per_slot": 1}}],
        "attributes": {"system": {"duration": 0, "constraints": {"hostlist": names[1:3]}}}})
    assert spec.constraint == parse_constraint({"hostlist": names[1:3]}, "c")
    res = m.allocate(spec)
    assert res.ok and m.stats["fast"] == 1
    assert {p for v in res.vertices if v.type == "core" for p in [v.path.split("/")[-2]]} <= set(names[1:3])
