"""`locality` and `variation` from the index fast paths (match/slotindex.py, match/nodeindex.py): every answer equals
the walk's (stable ties), on random graphs whose ids leave gaps or do not follow the tree,
with perf_class properties set before and during a session, down nodes, hostlist
constraints and cancels."""

from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fluxnetes.graph import from_description
from fluxnetes.graph.model import ResourceGraph
from fluxnetes.jobspec import parse_jobspec
from fluxnetes.match import Matcher
from fluxnetes.match import slotindex as slotindexmod
from fluxnetes.match.scoreruns import ScoreRuns
from fluxnetes.match.scoring import score_runs

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
POLICIES = ["locality", "variation"]


def _spec(rnd: random.Random, names: list[str]) -> Any:
    inner: list[dict[str, Any]] = [{"type": "core", "count": rnd.randint(1, 3)}]
    if rnd.random() < 0.3:
        inner.append({"type": "gpu", "count": 1})
    if rnd.random() < 0.3:
        inner.append({"type": "memory", "count": rnd.randint(1, 8)})
    slot: dict[str, Any] = {"type": "slot", "count": rnd.randint(1, 4), "label": "s", "with": inner}
    if rnd.random() < 0.6:
        res = [slot]
    else:
        slot["count"] = 1
        res = [{"type": "node", "count": rnd.randint(1, 3), "exclusive": True, "with": [slot]}]
    system: dict[str, Any] = {"duration": 0}
    if names and rnd.random() < 0.2:
        system["constraints"] = {"hostlist": rnd.sample(names, rnd.randint(0, len(names)))}
    return parse_jobspec({"version": 9999, "resources": res,
                          "tasks": [{"command": ["a"], "slot": "s", "count": {"per_slot": 1}}],
                          "attributes": {"system": system}})


def _graph(seed: int) -> ResourceGraph:
    """A random graph; ids of nodes, sockets and cores shuffled or spread out (runs with
    gaps, scores not in tree order), sometimes left as built."""
    rnd = random.Random(seed)
    desc = {"node": {"sockets": rnd.randint(0, 2), "cores": rnd.randint(1, 6), "gpus": rnd.randint(0, 2),
                     "memory": rnd.choice([0, 4, 16])},
            "racks": [{"name": f"rack{i}", "nodes": rnd.randint(1, 5)} for i in range(rnd.randint(1, 3))]}
    g = from_description(desc)
    mode = rnd.choice(["keep", "shuffle", "spread"])
    for t in ("node", "socket", "core"):
        vs = g.by_type.get(t, [])
        ids = [v.id for v in vs]
        if mode == "shuffle":
            rnd.shuffle(ids)
        elif mode == "spread":
            ids = [i * rnd.choice([1, 2, 3]) for i in ids]
        for v, i in zip(vs, ids, strict=True):
            v.id = i
    return g


def session(seed: int, policy: str, steps: int = 40) -> int:
    """Run one random session on the index matcher and on the walk; returns how many
    matches the index answered."""
    rnd = random.Random(seed * 7919 + 1)
    fast, walk = Matcher(_graph(seed), policy), Matcher(_graph(seed), policy)
    walk._fast_policy = False
    names = sorted(v.name for v in fast.graph.by_type.get("node", []))
    paths = sorted(fast.graph.by_path)
    live: list[int] = []
    for step in range(steps):
        r = rnd.random()
        if r < 0.25 and live:
            j = live.pop(rnd.randrange(len(live)))
            fast.cancel(j)
            walk.cancel(j)
            continue
        if r < 0.33:
            path, val = rnd.choice(paths), rnd.choice(["0", "1", "2", "3", "x", "-1", "10000"])
            fast.set_property(path, "perf_class", val)
            walk.set_property(path, "perf_class", val)
            continue
        if r < 0.37 and names:
            name, up = rnd.choice(names), rnd.random() < 0.5
            fast.set_status(name, up)
            walk.set_status(name, up)
            continue
        spec = _spec(rnd, names)
        a, b = fast.allocate(spec), walk.allocate(spec)
        got = (a.status, a.jobid, [(v.path, v.size, v.exclusive) for v in a.vertices])
        want = (b.status, b.jobid, [(v.path, v.size, v.exclusive) for v in b.vertices])
        assert got == want, f"seed {seed} step {step}"
        if a.ok:
            live.append(a.jobid)
    fast.check_invariants()
    return fast.stats["fast"]


@SETTINGS
@given(st.integers(0, 10**6), st.sampled_from(POLICIES))
def test_index_answers_equal_the_walks(seed: int, policy: str) -> None:
    session(seed, policy)


@SETTINGS
@given(st.integers(0, 10**6))
def test_locality_runs_wider_than_the_merge_limit_scan_the_hosts(seed: int) -> None:
    """Runs of many distinct scores are read by scanning hosts instead of merging buckets."""
    old = slotindexmod._MERGE_MAX
    slotindexmod._MERGE_MAX = 1
    try:
        session(seed, "locality")
    finally:
        slotindexmod._MERGE_MAX = old


def test_the_index_answers_most_matches() -> None:
    assert sum(session(seed, p) for seed in range(10) for p in POLICIES) > 100


def _nodes(n: int, cores: int = 2) -> ResourceGraph:
    return from_description({"node": {"sockets": 0, "cores": cores, "gpus": 0, "memory": 0},
                             "racks": [{"name": "rack0", "nodes": n}]})


def _js(resources: list[dict[str, Any]]) -> Any:
    return parse_jobspec({"version": 9999, "resources": resources,
                          "tasks": [{"command": ["a"], "slot": "s", "count": {"per_slot": 1}}],
                          "attributes": {"system": {"duration": 0}}})


NODE1 = [{"type": "node", "count": 1, "exclusive": True,
          "with": [{"type": "slot", "count": 1, "label": "s", "with": [{"type": "core", "count": 1}]}]}]


def test_locality_takes_the_highest_run_of_free_nodes_from_the_index() -> None:
    """Nodes 0-2, 4 and 6 free: the run 6 first, then 4, then the first of 0-2 (node0),
    where `high` would take node2 - answered by the index, not the walk."""
    m = Matcher(_nodes(8), "locality")
    busy = {3: None, 5: None, 7: None}
    for i in busy:
        m.set_status(f"node{i}", False)
    got = []
    for _ in range(4):
        res = m.allocate(_js(NODE1))
        got.append({v.name for v in res.vertices if v.type == "node"}.pop())
    assert got == ["node6", "node4", "node0", "node1"]
    assert m.stats["fast"] == 4


def test_variation_follows_set_property_in_the_index() -> None:
    """perf_class set after the index was built moves later answers (the index is rebuilt)."""
    m = Matcher(_nodes(4), "variation")
    first = m.allocate(_js(NODE1))
    assert {v.name for v in first.vertices if v.type == "node"} == {"node0"}
    m.set_property("node3", "perf_class", "1")
    m.set_property("node2", "perf_class", "2")
    got = [{v.name for v in m.allocate(_js(NODE1)).vertices if v.type == "node"}.pop() for _ in range(2)]
    assert got == ["node3", "node2"]
    assert m.stats["fast"] == 3


@pytest.mark.parametrize("seed", range(30))
def test_score_runs_follow_adds_and_removes(seed: int) -> None:
    rnd = random.Random(seed)
    runs = ScoreRuns()
    bag: dict[int, int] = {}
    for _ in range(200):
        s = rnd.randint(0, 30)
        if bag.get(s) and rnd.random() < 0.5:
            runs.remove(s)
            bag[s] -= 1
            if not bag[s]:
                del bag[s]
        else:
            runs.add(s)
            bag[s] = bag.get(s, 0) + 1
        want = score_runs(set(bag))
        starts = sorted(set(want.values()), reverse=True)
        got = list(runs.runs_desc())
        assert [r for r, _e, _w in got] == starts
        for r, e, w in got:
            members = [s for s in bag if want[s] == r]
            assert (e, w) == (max(members), len(members))
