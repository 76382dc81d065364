"""The failing path's shortcuts (match/pristine.py, the satisfiability cache, incremental
"every job active") give exactly the unoptimised matcher's answers.

Each property runs the same random session on two matchers over the same graph: the default
one and one with ``fast_fail = False`` and no index fast paths (every answer from the walk),
and compares every answer field by field (status, job id, start, duration, reason, vertices).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fluxnetes.graph import from_description, from_k8s_nodes
from fluxnetes.graph.model import Vertex
from fluxnetes.jobspec import parse_jobspec
from fluxnetes.jobspec.constraints import parse_constraint
from fluxnetes.match import Matcher, MatchResult, MatchStatus
from fluxnetes.match.pristine import PristineSlots

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
STATIC = ["low", "high", "lonode", "hinode"]
ALL_POLICIES = [*STATIC, "first", "lonodex", "locality", "variation"]


@st.composite
def node_shapes(draw: Any) -> dict[str, Any]:
    return {"count": draw(st.integers(1, 2)), "sockets": draw(st.integers(0, 2)),
            "cores": draw(st.integers(1, 6)), "gpus": draw(st.integers(0, 2)),
            "memory": draw(st.sampled_from([0, 4, 16]))}


@st.composite
def descriptions(draw: Any) -> dict[str, Any]:
    """Racks of nodes of mixed shapes (sockets: slot hosts below the node level)."""
    racks = [{"name": f"rack{i}", "nodes": draw(st.lists(node_shapes(), min_size=1, max_size=3))}
             for i in range(draw(st.integers(1, 3)))]
    return {"node": {"sockets": 0, "cores": 2}, "racks": racks}


@st.composite
def k8s_nodes(draw: Any) -> list[dict[str, Any]]:
    """Kubernetes nodes of mixed sizes (shared memory pools), some down, some labelled."""
    out = []
    for i in range(draw(st.integers(1, 6))):
        alloc = {"cpu": draw(st.sampled_from(["1", "2", "3500m", "4", "8"])),
                 "memory": draw(st.sampled_from(["256Mi", "1Gi", "3Gi"])), "pods": "110"}
        gpus = draw(st.integers(0, 2))
        if gpus:
            alloc["nvidia.com/gpu"] = str(gpus)
        labels = {"fluxnetes.io/rack": f"r{draw(st.integers(0, 1))}"} if draw(st.booleans()) else {}
        ready = "False" if draw(st.integers(0, 5)) == 0 else "True"
        out.append({"metadata": {"name": f"n{i}", "labels": labels},
                    "spec": {"unschedulable": draw(st.integers(0, 7)) == 0},
                    "status": {"allocatable": alloc, "conditions": [{"type": "Ready", "status": ready}]}})
    return out


def _count(draw: Any, lo: int, hi: int) -> Any:
    n = draw(st.integers(lo, hi))
    if draw(st.integers(0, 3)) == 0:  # a range: calc_count decides how many
        op, operand = draw(st.sampled_from([("+", 1), ("+", 2), ("*", 2)]))
        return {"min": n, "max": n + draw(st.integers(0, 4)), "operator": op, "operand": operand}
    return n


@st.composite
def jobspecs(draw: Any, big_memory: bool = False) -> Any:
    inner: list[dict[str, Any]] = [{"type": "core", "count": _count(draw, 1, 7)}]
    if draw(st.booleans()):
        inner.append({"type": "gpu", "count": _count(draw, 1, 2)})
    if draw(st.booleans()):
        mem = draw(st.sampled_from([64, 512, 1024, 2048])) if big_memory else draw(st.integers(1, 16))
        inner.append({"type": "memory", "count": mem})
    slot: dict[str, Any] = {"type": "slot", "count": _count(draw, 1, 8), "label": "s", "with": inner}
    shape = draw(st.sampled_from(["slot", "slot", "slot", "node", "nodex"]))
    if shape == "slot":
        res = [slot]
    else:
        slot["count"] = 1
        res = [{"type": "node", "count": draw(st.integers(1, 3)), "with": [slot]}]
        if shape == "nodex":
            res[0]["exclusive"] = True
    return parse_jobspec({"version": 9999, "resources": res,
                          "tasks": [{"command": ["a"], "slot": "s", "count": {"per_slot": 1}}],
                          "attributes": {"system": {"duration": draw(st.sampled_from([0, 0, 10, 100]))}}})


def answer(r: MatchResult) -> tuple[Any, ...]:
    return (r.status, r.jobid, r.at, r.duration, r.reason,
            [(v.path, v.size, v.exclusive) for v in r.vertices])


steps = st.lists(st.tuples(st.sampled_from(["allocate", "reserve", "reserve", "sat", "cancel", "down",
                                            "up", "advance", "label"]),
                           st.integers(0, 10 ** 6), st.booleans()), min_size=1, max_size=16)


MATCH_OPS = {"allocate": "allocate", "reserve": "allocate_orelse_reserve", "sat": "satisfiability"}


def step_both(fast: Matcher, ref: Matcher, op: str, pick: int, spec: Any, nodes: list[str], now: int) -> bool:
    """One step of a differential session on two matchers (match, cancel, node down/up), the
    answers compared; False when ``op`` is not one of those (the caller's own ops)."""
    if op in MATCH_OPS:
        a, b = fast.match(MATCH_OPS[op], spec, now=now), ref.match(MATCH_OPS[op], spec, now=now)
        assert answer(a) == answer(b), (op, now, spec)
    elif op == "cancel":
        jobs = sorted(fast.jobs)
        assert jobs == sorted(ref.jobs)
        if jobs:
            jid = jobs[pick % len(jobs)]
            fast.cancel(jid)
            ref.cancel(jid)
    elif op in ("down", "up") and nodes:
        name = nodes[pick % len(nodes)]
        fast.set_status(name, op == "up")
        ref.set_status(name, op == "up")
    else:
        return False
    return True


def same_session(graph_of: Any, policy: str, specs: list[Any], ops: list[tuple[str, int, bool]],
                 hostlists: bool) -> tuple[Matcher, Matcher]:
    fast = Matcher(graph_of(), policy)
    ref = Matcher(graph_of(), policy)
    ref.fast_fail = False
    ref._fast_policy = False
    nodes = sorted(v.name for v in fast.graph.by_type.get("node", []))
    now = 0
    for op, pick, flag in ops:
        spec = specs[pick % len(specs)]
        if hostlists and flag and nodes:
            allowed = [n for i, n in enumerate(nodes) if (pick >> i) & 1]
            spec = replace(spec, constraint=parse_constraint({"hostlist": allowed}, "c"))
        if step_both(fast, ref, op, pick, spec, nodes, now):
            pass
        elif op == "label" and nodes:
            # properties feed constraints: answers remembered before must not survive this
            name = nodes[pick % len(nodes)]
            fast.set_property(name, "perf_class", str(pick % 3))
            ref.set_property(name, "perf_class", str(pick % 3))
        elif op == "advance":
            now += pick % 60
    fast.check_invariants()
    return fast, ref


@SETTINGS
@given(descriptions(), st.sampled_from(ALL_POLICIES), st.lists(jobspecs(), min_size=1, max_size=5), steps)
def test_failing_path_answers_equal_the_walks_on_described_graphs(
        desc: dict[str, Any], policy: str, specs: list[Any], ops: list[tuple[str, int, bool]]) -> None:
    same_session(lambda: from_description(desc), policy, specs, ops, hostlists=False)


@SETTINGS
@given(k8s_nodes(), st.sampled_from(STATIC), st.lists(jobspecs(big_memory=True), min_size=1, max_size=5), steps)
def test_failing_path_answers_equal_the_walks_on_kubernetes_graphs(
        nodes: list[dict[str, Any]], policy: str, specs: list[Any], ops: list[tuple[str, int, bool]]) -> None:
    """Shared memory pools, mixed node sizes, down nodes and hostlist constraints."""
    same_session(lambda: from_k8s_nodes(nodes), policy, specs, ops, hostlists=True)


graphs = st.one_of(descriptions().map(lambda d: (from_description, d)),
                   k8s_nodes().map(lambda n: (from_k8s_nodes, n)))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graphs, st.sampled_from([*STATIC, "locality", "variation"]),
       st.lists(st.tuples(st.one_of(jobspecs(), jobspecs(big_memory=True)),
                                                            st.integers(0, 255)), min_size=1, max_size=6))
def test_counted_satisfiability_equals_the_walk(graph: Any, policy: str, specs: list[Any]) -> None:
    """Every slot request the counts decide (no cache involved) gets the walk's answer, with
    and without a hostlist constraint, on an empty graph and after allocations."""
    from fluxnetes.jobspec.model import exclusive_types as _exclusive_types

    build, arg = graph
    fast = Matcher(build(arg), policy)
    ref = Matcher(build(arg), policy)
    ref.fast_fail = False
    nodes = sorted(v.name for v in fast.graph.by_type.get("node", []))
    for spec, mask in specs:
        for js in (spec, replace(spec, constraint=parse_constraint(
                {"hostlist": [n for i, n in enumerate(nodes) if (mask >> i) & 1]}, "c"))):
            counted = fast._pristine_sat(js, _exclusive_types(js.resources))
            walked = ref.satisfiability(js).ok
            if counted is not None:
                assert counted == walked
        fast.allocate(spec)  # state must not matter to either


def _k8s(name: str, cpu: str, memory: str = "4Gi") -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {},
            "status": {"allocatable": {"cpu": cpu, "memory": memory, "pods": "110"},
                       "conditions": [{"type": "Ready", "status": "True"}]}}


def _pods(count: int, cores: int, mib: int = 64) -> Any:
    return parse_jobspec({"version": 9999, "resources": [{"type": "slot", "count": count, "label": "s", "with": [
        {"type": "core", "count": cores}, {"type": "memory", "count": mib}]}],
        "tasks": [{"command": ["a"], "slot": "s", "count": {"per_slot": 1}}]})


def test_backlog_head_busy_without_a_walk() -> None:
    """The issue-17 case: every node mostly used, a big pod BUSY (satisfiable, no
    reservation: nothing ends), decided by counts; a pod larger than any node UNSATISFIABLE."""
    m = Matcher(from_k8s_nodes([_k8s(f"n{i}", "8") for i in range(4)]), "lonode")
    for _ in range(4):
        assert m.allocate(_pods(1, 7)).ok
    walks = 0
    select = m.engine.select

    def counting(*a: Any, **k: Any) -> bool:
        nonlocal walks
        walks += 1
        return select(*a, **k)

    m.engine.select = counting  # type: ignore[method-assign]
    busy = m.allocate_orelse_reserve(_pods(1, 4))
    assert busy.status == MatchStatus.BUSY and walks == 0
    never = m.allocate_orelse_reserve(_pods(1, 9))
    assert never.status == MatchStatus.UNSATISFIABLE and "9 core" in never.reason and walks == 0
    assert m.satisfiability(_pods(2, 8)).ok and not m.satisfiability(_pods(5, 8)).ok and walks == 0


def test_remembered_answers_follow_graph_changes() -> None:
    """A satisfiability answer is forgotten when the graph grows or shrinks."""
    m = Matcher(from_k8s_nodes([_k8s("n0", "8")]), "lonode")
    assert m.allocate_orelse_reserve(_pods(1, 16)).status == MatchStatus.UNSATISFIABLE
    m.add_subgraph(from_k8s_nodes([_k8s("n1", "16")], cluster_name=m.graph.root.name))  # type: ignore[union-attr]
    assert m.allocate_orelse_reserve(_pods(1, 16)).status == MatchStatus.ALLOCATED
    m2 = Matcher(from_k8s_nodes([_k8s("n0", "8"), _k8s("n1", "16")]), "lonode")
    assert m2.allocate(_pods(1, 9)).ok
    assert m2.allocate_orelse_reserve(_pods(1, 9)).status == MatchStatus.BUSY
    m2.remove_subgraph("n1")
    assert m2.allocate_orelse_reserve(_pods(1, 9)).status == MatchStatus.UNSATISFIABLE


def test_counts_decline_when_packing_depends_on_order() -> None:
    """Candidates of one type with different sizes (not shared pools): the greedy packing
    depends on the walk's order, so the counts give no answer and the walk decides."""
    g = from_description({"node": {"sockets": 0, "cores": 2, "memory": 4}, "racks": [{"name": "r", "nodes": 1}]})
    node = g.by_type["node"][0]
    # a second pool of another size
    g.add_vertex(Vertex("memory", id=1, size=8, path=f"{node.path}/memory1"), node)
    m = Matcher(g, "lonode")
    ps = PristineSlots(m.engine, frozenset({"core", "memory"}))
    assert not ps.known and ps.total(_pods(1, 1).resources[0].with_) is None


def test_all_active_is_tracked_incrementally() -> None:
    m = Matcher(from_k8s_nodes([_k8s("n0", "8")]), "lonode")
    a = m.allocate(_pods(1, 2), now=5)
    b = m.allocate(_pods(1, 2), now=7)
    assert m._all_active(7, 0) and not m._all_active(6, 0)
    m.cancel(b.jobid)
    assert m._all_active(6, 0) and not m._all_active(4, 0)
    m.cancel(a.jobid)
    assert m._all_active(0, 0)


def _counted_and_walked(m: Matcher, js: Any) -> tuple[bool | None, bool]:
    from fluxnetes.jobspec.model import exclusive_types as _exclusive_types

    ref = Matcher(m.graph, m.policy)
    ref.fast_fail = False
    return m._pristine_sat(js, _exclusive_types(js.resources)), ref.satisfiability(js).ok


def test_shared_pools_pack_by_their_sum() -> None:
    """A node's memory pool shared by amount: 1 GiB holds two 512 MiB slots, not three."""
    m = Matcher(from_k8s_nodes([_k8s("n0", "8", "1Gi")]), "lonode")
    assert _counted_and_walked(m, _pods(2, 1, 512)) == (True, True)
    assert _counted_and_walked(m, _pods(3, 1, 512)) == (False, False)
    assert _counted_and_walked(m, _pods(8, 1, 128)) == (True, True)
    assert _counted_and_walked(m, _pods(9, 1, 100)) == (False, False)


def test_vertices_of_size_zero_hold_no_slot() -> None:
    """The walk prunes a vertex of size 0 with its subtree (and never takes a size-0 leaf)."""
    g = from_description({"node": {"sockets": 0, "cores": 2}, "racks": [{"name": "r", "nodes": 2}]})
    n0, n1 = g.by_type["node"]
    g.add_vertex(Vertex("core", id=2, size=0, path=f"{n0.path}/core2"), n0)
    n1.size = 0
    m = Matcher(g, "low")
    one = parse_jobspec({"version": 9999, "resources": [{"type": "slot", "count": 1, "label": "s", "with": [
        {"type": "core", "count": 3}]}], "tasks": [{"command": ["a"], "slot": "s", "count": {"per_slot": 1}}]})
    two = parse_jobspec({"version": 9999, "resources": [{"type": "slot", "count": 2, "label": "s", "with": [
        {"type": "core", "count": 1}]}], "tasks": [{"command": ["a"], "slot": "s", "count": {"per_slot": 1}}]})
    three = replace(two, resources=[replace(two.resources[0], count=replace(two.resources[0].count, min=3, max=3))])
    assert _counted_and_walked(m, one) == (False, False)
    assert _counted_and_walked(m, two) == (True, True)
    assert _counted_and_walked(m, three) == (False, False)


@st.composite
def gangs(draw: Any) -> Any:
    """Gangs of two or three pod sets (match/gang.py), packed anywhere or within one rack."""
    from fluxnetes.jobspec import PodRequest
    from fluxnetes.jobspec.packing import Packing
    from fluxnetes.jobspec.podsets import PodSet, jobspec_from_podsets

    sets = [PodSet(f"s{i}", draw(st.integers(1, 4)),
                   PodRequest(draw(st.sampled_from([500, 1000, 2000, 4000])), draw(st.sampled_from([0, 2 ** 28]))))
            for i in range(draw(st.integers(2, 3)))]
    packing = Packing(draw(st.sampled_from([None, "rack"])), draw(st.booleans()))
    return jobspec_from_podsets(sets, duration=draw(st.sampled_from([0, 30])), packing=packing)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(k8s_nodes(), st.sampled_from(["lonode", "first", "locality", "variation"]), st.lists(gangs(), min_size=1, max_size=4),
       st.lists(st.tuples(st.sampled_from(["allocate", "reserve", "sat", "cancel"]), st.integers(0, 99)),
                min_size=1, max_size=10))
def test_gang_answers_equal_the_walks(nodes: list[dict[str, Any]], policy: str, specs: list[Any],
                                      ops: list[tuple[str, int]]) -> None:
    fast = Matcher(from_k8s_nodes(nodes), policy)
    ref = Matcher(from_k8s_nodes(nodes), policy)
    ref.fast_fail = False
    ref._fast_policy = False
    for op, pick in ops:
        spec = specs[pick % len(specs)]
        if op == "cancel":
            jobs = sorted(fast.jobs)
            if jobs:
                fast.cancel(jobs[pick % len(jobs)])
                ref.cancel(jobs[pick % len(jobs)])
            continue
        name = {"allocate": "allocate", "reserve": "allocate_orelse_reserve", "sat": "satisfiability"}[op]
        a, b = fast.match(name, spec, now=pick), ref.match(name, spec, now=pick)
        assert answer(a) == answer(b) and a.podsets == b.podsets, op


def test_remembered_answers_are_per_constraint() -> None:
    """The same request with another constraint is another question."""
    m = Matcher(from_k8s_nodes([_k8s("n0", "8"), _k8s("n1", "2")]), "lonode")
    only_n1 = parse_constraint({"hostlist": ["n1"]}, "c")
    assert m.satisfiability(_pods(1, 4)).ok
    assert not m.satisfiability(replace(_pods(1, 4), constraint=only_n1)).ok
    assert m.allocate(_pods(1, 8)).ok
    assert m.allocate_orelse_reserve(_pods(1, 4)).status == MatchStatus.BUSY
    assert m.allocate_orelse_reserve(replace(_pods(1, 4), constraint=only_n1)).status == MatchStatus.UNSATISFIABLE


def test_a_gang_no_single_rack_holds_is_unsatisfiable() -> None:
    """Pack "rack": the big pod fits only rack r1, the gpu pod only rack r0 - each set alone
    can run (remembered), but within one rack they never can (asked per rack)."""
    from fluxnetes.jobspec import PodRequest
    from fluxnetes.jobspec.packing import Packing
    from fluxnetes.jobspec.podsets import PodSet, jobspec_from_podsets

    # r0: two nodes of 5 cpu (10 in all, enough cores for the gang), one with a gpu;
    # r1: one node of 16 cpu, no gpu
    small = [_k8s(name, "5") for name in ("a0", "a1")]
    for n in small:
        n["metadata"]["labels"] = {"fluxnetes.io/rack": "r0"}
    small[0]["status"]["allocatable"]["nvidia.com/gpu"] = "1"
    big = _k8s("b", "16")
    big["metadata"]["labels"] = {"fluxnetes.io/rack": "r1"}
    m = Matcher(from_k8s_nodes([*small, big]), "lonode")
    sets = [PodSet("big", 1, PodRequest(8000)), PodSet("gpu", 1, PodRequest(1000, gpus=1))]
    anywhere = jobspec_from_podsets(sets)
    assert m.satisfiability(anywhere).ok
    res = m.allocate_orelse_reserve(jobspec_from_podsets(sets, packing=Packing("rack")))
    assert res.status == MatchStatus.UNSATISFIABLE and "no single rack" in res.reason
