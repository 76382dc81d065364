"""`first` on per-node counters (match/firstfit.py) against the walk it stands for.

Random sessions of the simulator's two request shapes (``slot[P] -> core[1]`` and
``node[N] exclusive -> slot[1] -> core[1]``) on flat and rack graphs of identical nodes:
one matcher answers from the counters, the other walks; every answer (status, job id, the
emitted vertices, the per-node shares, the BUSY reason) and every release must agree, and
after the counters hand over to the engine (an operation they do not cover) both must go
on agreeing and pass the invariant checker.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import pytest

from fluxnetes.graph import from_description
from fluxnetes.jobspec.batch import batch_jobspec
from fluxnetes.match import Matcher
from fluxnetes.match.firstfit import FirstFit, request_shape

LONG = 10**6


def _graph(nodes: int, cores: int, racks: int):  # type: ignore[no-untyped-def]
    desc: dict[str, object] = {"cluster": "t", "node": {"sockets": 0, "cores": cores}}
    if racks:
        base, extra = divmod(nodes, racks)
        desc["racks"] = [{"name": f"rack{r}", "nodes": base + (1 if r < extra else 0)}
                         for r in range(racks)]
    else:
        desc["nodes"] = nodes
    return from_description(desc)


def _spec(procs: int, whole: bool, cores: int, duration: int = LONG):  # type: ignore[no-untyped-def]
    return batch_jobspec(procs, duration, exclusive_nodes=whole, nodes=-(-procs // cores))


def _same(a, b) -> None:  # type: ignore[no-untyped-def]
    assert a.status == b.status
    assert a.jobid == b.jobid
    if a.ok:
        assert (a.at, a.duration) == (b.at, b.duration)
        assert a.core_shares == b.core_shares
        assert a.vertices == b.vertices
    else:
        assert a.reason == b.reason


def _session(seed: int, steps: int = 120) -> tuple[int, int]:
    rng = random.Random(seed)
    cores = rng.choice([1, 1, 2, 3, 4])
    racks = rng.choice([0, 0, 2, 3])
    nodes = rng.randint(max(1, racks), 12)
    whole = rng.random() < 0.3
    fast = Matcher(_graph(nodes, cores, racks), "first", counters=True)
    walk = Matcher(_graph(nodes, cores, racks), "first")
    assert fast.counting
    allocated, live, _now = _random_steps(rng, fast, walk, steps, nodes * cores, whole, cores)
    assert fast.counting, "the session left the counters"
    return allocated, len(live)


def _random_steps(rng: random.Random, fast: Matcher, walk: Matcher, steps: int, total: int, whole: bool,
                  cores: int) -> tuple[int, list[int], int]:
    """``steps`` random steps on both matchers, comparing every answer: time moves 0-3 s, then
    a live job is cancelled, or a request of up to ``total`` cores (now and then one more) is
    asked for its satisfiability or allocated. (allocations, the live jobs, the time at the end)"""
    live: list[int] = []
    now = 0
    allocated = 0
    for _ in range(steps):
        now += rng.randint(0, 3)
        if live and rng.random() < 0.4:
            jid = live.pop(rng.randrange(len(live)))
            fast.cancel(jid)
            walk.cancel(jid)
            continue
        procs = rng.randint(1, total + (1 if rng.random() < 0.1 else 0))
        js = _spec(procs, whole, cores)
        if rng.random() < 0.1:
            _same(fast.satisfiability(js, now=now), walk.satisfiability(js, now=now))
            continue
        a = fast.allocate(js, now=now)
        b = walk.allocate(js, now=now)
        _same(a, b)
        if a.ok:
            live.append(a.jobid)
            allocated += 1
        assert fast.earliest_end() == walk.earliest_end()
    return allocated, live, now


def _cancel_or_allocate(rng: random.Random, fast: Matcher, walk: Matcher, live: list[int], now: int,
                        p_cancel: float, spec: Callable[[], Any]) -> None:
    """One random step on both matchers: cancel a live job (probability ``p_cancel``) or
    allocate ``spec()`` on both and compare the answers."""
    if live and rng.random() < p_cancel:
        jid = live.pop(rng.randrange(len(live)))
        fast.cancel(jid)
        walk.cancel(jid)
        return
    js = spec()
    a, b = fast.allocate(js, now=now), walk.allocate(js, now=now)
    _same(a, b)
    if a.ok:
        live.append(a.jobid)


@pytest.mark.parametrize("seed", range(60))
def test_counters_answer_as_the_walk(seed: int) -> None:
    allocated, _live = _session(seed)
    assert allocated > 0


def test_sessions_reach_busy_and_reorder() -> None:
    """(The sessions are not vacuous: many allocations, a busy machine, and jobs released
    while others hold nodes, so `first`'s child order has moved.)"""
    allocated = sum(_session(seed)[0] for seed in range(10))
    assert allocated > 300


@pytest.mark.parametrize("seed", range(20))
def test_handover_to_the_walk(seed: int) -> None:
    """An operation the counters do not cover (a reservation search, a constraint, a job
    that has ended) writes the live jobs into the engine: the engine state must then be
    the walk's own, answer for answer, and pass the invariant checker."""
    rng = random.Random(1000 + seed)
    cores = rng.choice([1, 2, 3])
    racks = rng.choice([0, 2])
    nodes = rng.randint(max(2, racks), 10)
    whole = rng.random() < 0.3
    fast = Matcher(_graph(nodes, cores, racks), "first", counters=True)
    walk = Matcher(_graph(nodes, cores, racks), "first")
    total = nodes * cores
    live: list[int] = []
    now = 0
    for _ in range(rng.randint(5, 40)):
        now += 1
        _cancel_or_allocate(rng, fast, walk, live, now, 0.35, lambda: _spec(rng.randint(1, total), whole, cores))
    assert fast.counting
    # a reservation: not the counters' (a request that cannot start now)
    js = _spec(total, whole, cores, duration=50)
    a = fast.allocate_orelse_reserve(js, now=now)
    b = walk.allocate_orelse_reserve(js, now=now)
    _same(a, b)
    if live:
        assert not fast.counting
    fast.check_invariants()
    for _ in range(30):
        now += 1
        _cancel_or_allocate(rng, fast, walk, live, now, 0.4,
                            lambda: _spec(rng.randint(1, total), whole, cores, duration=rng.choice([5, LONG])))
    fast.check_invariants()
    assert {j: (r.at, r.duration) for j, r in fast.jobs.items()} == \
        {j: (r.at, r.duration) for j, r in walk.jobs.items()}


def test_other_shapes_and_graphs_walk() -> None:
    g = _graph(4, 2, 0)
    m = Matcher(g, "first", counters=True)
    assert m.counting
    # a constraint or another shape: the walk answers, and the counters are left for good
    js = {"version": 1, "resources": [{"type": "slot", "count": 1, "label": "default",
                                        "with": [{"type": "core", "count": 2}]}],
          "tasks": [{"command": ["x"], "slot": "default", "count": {"per_slot": 1}}],
          "attributes": {"system": {"duration": 10}}}
    assert request_shape(_spec(3, False, 2)) is not None
    res = m.allocate(js, now=0)
    assert not m.counting
    assert res.ok
    # a static policy on nodes of more than one core or in racks, a node-exclusive policy,
    # or a graph with sockets: no counters
    assert not Matcher(_graph(4, 2, 0), "lonode", counters=True).counting
    assert not Matcher(_graph(4, 1, 2), "low", counters=True).counting
    assert not Matcher(_graph(4, 1, 0), "lonodex", counters=True).counting
    assert not Matcher(_graph(4, 1, 0), "locality", counters=True).counting
    sock = from_description({"cluster": "t", "nodes": 2, "node": {"sockets": 2, "cores": 2}})
    assert FirstFit.build(Matcher(sock, "first").engine) is None


def test_ended_job_leaves_counters() -> None:
    """A job whose window ended by ``now`` is not 'every span holds now': the walk answers."""
    fast = Matcher(_graph(3, 1, 0), "first", counters=True)
    walk = Matcher(_graph(3, 1, 0), "first")
    for m in (fast, walk):
        assert m.allocate(_spec(2, False, 1, duration=5), now=0).ok
    _same(fast.allocate(_spec(3, False, 1), now=5), walk.allocate(_spec(3, False, 1), now=5))
    assert not fast.counting


def test_one_core_select_without_commit_takes_nothing() -> None:
    """On one-core nodes under the root ``allocate`` takes its nodes off the free lists (a
    job costs what it takes, not the machine's size); ``select``, the same question without
    the allocation, must leave the next answer, and the order after releases, as the
    walk's."""
    fast = Matcher(_graph(8, 1, 0), "first", counters=True)
    walk = Matcher(_graph(8, 1, 0), "first")
    assert fast._counted is not None
    ff = fast._counted.ff
    assert ff.unit
    live: list[int] = []
    for procs in (3, 2):
        a, b = fast.allocate(_spec(procs, False, 1), now=0), walk.allocate(_spec(procs, False, 1), now=0)
        _same(a, b)
        live.append(a.jobid)
    fast.cancel(live[0])
    walk.cancel(live[0])
    # asked and not taken: a taken-before node and a never-taken one, twice over
    first = ff.select(0, 5)
    assert ff.select(0, 5) == first
    assert ff.select(0, 7) is None  # (more than is free: still nothing taken)
    for procs in (4, 2):
        _same(fast.allocate(_spec(procs, False, 1), now=0), walk.allocate(_spec(procs, False, 1), now=0))
    assert fast.counting
    fast.check_invariants()


def test_time_going_back() -> None:
    """The counters answer only while every live job has started by ``now`` and not ended
    (the walk's precondition for `first`'s room lists). Their bound on the latest start is
    raised by allocations only: when ``now`` is below it, it is made exact from the live
    jobs, so a later job that was released no longer counts, and one that lives does."""
    fast = Matcher(_graph(6, 1, 0), "first", counters=True)
    walk = Matcher(_graph(6, 1, 0), "first")
    for m in (fast, walk):
        assert m.allocate(_spec(2, False, 1), now=10).ok
        late = m.allocate(_spec(1, False, 1), now=12)
        assert late.ok
        m.cancel(late.jobid)
    _same(fast.allocate(_spec(1, False, 1), now=11), walk.allocate(_spec(1, False, 1), now=11))
    assert fast.counting  # (job 2, started at 12, is gone: every live job started by 11)
    _same(fast.allocate(_spec(1, False, 1), now=5), walk.allocate(_spec(1, False, 1), now=5))
    assert not fast.counting  # (jobs started at 10 and 11 live: not all active at 5)
    fast.check_invariants()


def test_released_windows_do_not_pile_up() -> None:
    """Jobs released long before their window ends leave their end in the counters' heap
    until it reaches the top; the heap is rebuilt when such entries outnumber the live
    jobs, and the earliest end stays the walk's."""
    fast = Matcher(_graph(4, 1, 0), "first", counters=True)
    walk = Matcher(_graph(4, 1, 0), "first")
    assert fast._counted is not None
    ff = fast._counted.ff
    for m in (fast, walk):
        assert m.allocate(_spec(1, False, 1, duration=LONG), now=0).ok  # (the earliest end)
    for step in range(300):
        js = _spec(1, False, 1, duration=LONG + 1 + (step * 7919) % 1000)
        a, b = fast.allocate(js, now=0), walk.allocate(js, now=0)
        _same(a, b)
        fast.cancel(a.jobid)
        walk.cancel(b.jobid)
        assert fast.earliest_end() == walk.earliest_end() == LONG
        assert len(ff.ends) <= 2 * len(ff.jobs) + 65
    assert fast.counting
    fast.check_invariants()


STATIC = ("low", "high", "lonode", "hinode")


@pytest.mark.parametrize("policy", STATIC)
@pytest.mark.parametrize("seed", range(12))
def test_static_policies_on_one_core_nodes(policy: str, seed: int) -> None:
    """The static policies on one-core nodes under the root (every SWF machine of
    one-processor nodes): counters answer ``slot[P] -> core[1]`` as the walk (and the index
    fast path) would, through releases in any order, then hand over to the walk at a
    reservation and go on agreeing."""
    rng = random.Random(2000 + seed)
    nodes = rng.randint(1, 14)
    fast = Matcher(_graph(nodes, 1, 0), policy, counters=True)
    walk = Matcher(_graph(nodes, 1, 0), policy)
    assert fast.counting
    allocated, live, now = _random_steps(rng, fast, walk, 80, nodes, False, 1)
    assert fast.counting and allocated > 0
    js = _spec(nodes, False, 1, duration=50)
    _same(fast.allocate_orelse_reserve(js, now=now), walk.allocate_orelse_reserve(js, now=now))
    if live:
        assert not fast.counting
    fast.check_invariants()
    for _ in range(20):
        now += 1
        _cancel_or_allocate(rng, fast, walk, live, now, 0.4,
                            lambda: _spec(rng.randint(1, nodes), False, 1, duration=rng.choice([5, LONG])))
    fast.check_invariants()


@pytest.mark.parametrize("policy", STATIC)
def test_static_policies_whole_nodes_walk(policy: str) -> None:
    """Whole-node requests are not the static counters' (they rank slots): the matcher
    leaves the counters and answers as the walk."""
    fast = Matcher(_graph(6, 1, 0), policy, counters=True)
    walk = Matcher(_graph(6, 1, 0), policy)
    for m in (fast, walk):
        assert m.allocate(_spec(2, False, 1), now=0).ok
    assert fast.counting
    _same(fast.allocate(_spec(3, True, 1), now=0), walk.allocate(_spec(3, True, 1), now=0))
    assert not fast.counting
    fast.check_invariants()
