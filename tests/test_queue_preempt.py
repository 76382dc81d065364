"""Gang-aware preemption (queue/preempt.py): victims are whole lower-QoS groups, the set is
minimal and sufficient by the matcher's own answer, and the matcher is left exactly as it was."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fluxnetes.graph import from_description, from_k8s_nodes
from fluxnetes.jobspec import PodRequest, jobspec_from_pods, parse_jobspec
from fluxnetes.match import Matcher, MatchStatus, NodeShare
from fluxnetes.queue import QueuedJob, QueuePolicy, Scheduler
from fluxnetes.queue.accounts import ROOT, AccountTree, Node
from fluxnetes.queue.fairshare import factors
from fluxnetes.queue.preempt import (
    TRIAL_JOBID,
    Preemptor,
    RunningGroup,
    held_job,
    may_preempt,
    over_share,
    plan_preemption,
    restore,
)

LOW, HIGH = 100, 1000


def js(resources: list[dict[str, Any]], duration: int = 0, **system: Any) -> Any:
    return parse_jobspec({"version": 9999, "resources": resources,
                          "tasks": [{"command": ["a"], "slot": "s", "count": {"per_slot": 1}}],
                          "attributes": {"system": {"duration": duration, **system}}})


def slot(n: int, **types: int) -> dict[str, Any]:
    return {"type": "slot", "count": n, "label": "s", "with": [{"type": t, "count": c} for t, c in types.items()]}


def cores_on_one_node(n: int) -> Any:
    return js([{"type": "node", "count": 1, "with": [slot(1, core=n)]}])


def cluster(nodes: int, cores: int, policy: str = "low", **node: Any) -> Matcher:
    return Matcher(from_description({"node": {"sockets": 0, "cores": cores, "memory": 0, **node},
                                     "nodes": nodes}), policy)


def put(m: Matcher, shares: dict[str, int], *, at: int = 0) -> int:
    """Record a running job holding ``cores`` on each named node; returns its matcher id."""
    jid = m.next_jobid
    m.update_allocate(jid, [NodeShare(n, cores=c) for n, c in shares.items()], at=at)
    return jid


def group(gid: str, jobids: int | tuple[int, ...], *, qos: int = LOW, start: int = 0, **kw: Any) -> RunningGroup:
    ids = jobids if isinstance(jobids, tuple) else (jobids,)
    return RunningGroup(gid, ids, qos, start, qos_name="low" if qos == LOW else str(qos), **kw)


def hi(spec: Any, qos: int = HIGH) -> Preemptor:
    return Preemptor("team-a/urgent", spec, qos, "high")


def engine_state(m: Matcher) -> dict[str, Any]:
    """Everything the matcher keeps per vertex (planners, tags, pruning filters)."""
    out = {}
    for u in m.engine.vs.values():
        out[u.v.path] = (dict(u.ps or {}), u.pused, u.alloc_n, dict(u.xs or {}), dict(u.fspans or {}),
                         list(u.fused), list(u.ftot))
    return out


def job_table(m: Matcher) -> dict[int, Any]:
    return {jid: (r.at, r.duration, r.reserved,
                  sorted((e.vs.v.path, e.plan) for e in r.entries if e.plan > 0),
                  sorted((n.name, n.cores, n.gpus, n.memory) for n in r.nodes))
            for jid, r in m.jobs.items()}


def state(m: Matcher) -> tuple[Any, ...]:
    return engine_state(m), job_table(m), m.next_jobid, dict(m.stats), m.free_now(0)


def fits_without(m: Matcher, spec: Any, jobids: list[int], now: int) -> bool:
    """Ground truth by brute force: cancel ``jobids``, ask, restore."""
    held = [held_job(m, j) for j in jobids]
    assert all(h is not None for h in held)
    stats = dict(m.stats)
    for j in jobids:
        m.cancel(j)
    r = m.allocate(spec, now=now, jobid=TRIAL_JOBID)
    if r.ok:
        m.cancel(TRIAL_JOBID)
    restore(m, [h for h in held if h is not None])
    m.stats.update(stats)
    return r.status is MatchStatus.ALLOCATED


# ----------------------------------------------------------------------------- behaviour


def test_a_job_that_already_fits_preempts_nothing() -> None:
    m = cluster(2, 4)
    a = put(m, {"node0": 4})
    before = state(m)
    plan = plan_preemption(m, hi(cores_on_one_node(4)), [group("a", a)], now=10)
    assert plan.victims == () and plan.possible and not plan.events
    assert plan.placement is not None and [n.name for n in plan.placement.nodes] == ["node1"]
    assert state(m) == before


def test_smallest_sufficient_set_by_preference_then_minimized() -> None:
    # node0: a(2) b(2); node1: c(4, long-running); node2: d(1) e(3, long-running)
    m = cluster(3, 4)
    a, b = put(m, {"node0": 2}), put(m, {"node0": 2})
    c = put(m, {"node1": 4})
    d, e = put(m, {"node2": 1}), put(m, {"node2": 3})
    now = 1000
    groups = [group("a", a, start=900), group("b", b, start=900), group("c", c, start=0),
              group("d", d, start=900), group("e", e, start=0)]
    before = state(m)
    plan = plan_preemption(m, hi(cores_on_one_node(4)), groups, now=now)
    # greedy takes d (least work lost), a, b -> fits on node0; minimization spares d
    assert plan.victims == ("a", "b")
    assert plan.work_lost == 2 * 100 + 2 * 100
    assert plan.events == {"a": "preempted by team-a/urgent (QoS high > low)",
                           "b": "preempted by team-a/urgent (QoS high > low)"}
    assert plan.placement is not None and plan.placement.status is MatchStatus.ALLOCATED
    assert [(n.name, n.cores) for n in plan.placement.nodes] == [("node0", 4)]
    assert state(m) == before
    # the answer is sufficient and minimal (ground truth by brute force)
    assert fits_without(m, cores_on_one_node(4), [a, b], now)
    assert not fits_without(m, cores_on_one_node(4), [a], now)
    assert not fits_without(m, cores_on_one_node(4), [b], now)
    # and the cheapest of all sufficient sets (every subset checked)
    ids = {"a": a, "b": b, "c": c, "d": d, "e": e}
    lost = {g.id: (now - g.start) * {"a": 2, "b": 2, "c": 4, "d": 1, "e": 3}[g.id] for g in groups}
    best = min((sum(lost[x] for x in s), len(s)) for k in range(1, 6) for s in itertools.combinations(ids, k)
               if fits_without(m, cores_on_one_node(4), [ids[x] for x in s], now))
    assert (plan.work_lost, len(plan.victims)) == best


def test_one_big_victim_beats_several_small_ones_when_it_loses_less() -> None:
    m = cluster(2, 4)
    small = [put(m, {"node0": 1}) for _ in range(4)]
    big = put(m, {"node1": 4})
    groups = [group(f"s{i}", j, start=0) for i, j in enumerate(small)] + [group("big", big, start=90)]
    plan = plan_preemption(m, hi(cores_on_one_node(4)), groups, now=100)
    assert plan.victims == ("big",) and plan.work_lost == 40


def test_gangs_are_never_split() -> None:
    # group g runs as two matcher jobs (one per node); only its node1 piece would be needed,
    # but preempting g means preempting all of it
    m = cluster(3, 4)
    g0, g1 = put(m, {"node0": 4}), put(m, {"node1": 4})
    k = put(m, {"node2": 4})
    groups = [group("g", (g0, g1), start=95), group("k", k, start=0)]
    before = state(m)
    plan = plan_preemption(m, hi(cores_on_one_node(4)), groups, now=100)
    assert plan.victims == ("g",)
    assert plan.work_lost == 8 * 5  # both pieces count
    assert state(m) == before
    assert {g0, g1} <= set(m.jobs)


def test_a_podset_gang_is_one_victim_across_nodes() -> None:
    m = cluster(2, 4)
    gang = js([{"type": "slot", "count": 2, "label": "w", "with": [{"type": "core", "count": 3}]},
               {"type": "slot", "count": 2, "label": "p", "with": [{"type": "core", "count": 1}]}])
    r = m.allocate(gang)
    assert r.ok and sorted(n.name for n in r.nodes) == ["node0", "node1"]
    before = state(m)
    plan = plan_preemption(m, hi(js([slot(1, core=4)])), [group("gang", r.jobid, start=0)], now=10)
    assert plan.victims == ("gang",) and plan.work_lost == 8 * 10
    assert state(m) == before


def test_accounts_over_their_share_are_preferred() -> None:
    m = cluster(2, 4)
    x, y = put(m, {"node0": 4}), put(m, {"node1": 4})
    groups = [group("x", x, start=0, account="a", over_share=True),  # lost more, but over its share
              group("y", y, start=90, account="b")]
    assert plan_preemption(m, hi(cores_on_one_node(4)), groups, now=100).victims == ("x",)
    fair = [group("x", x, start=0, account="a"), group("y", y, start=90, account="b")]
    assert plan_preemption(m, hi(cores_on_one_node(4)), fair, now=100).victims == ("y",)


def test_over_share_from_a_fairshare_row() -> None:
    tree = AccountTree([Node("a", ROOT, 1), Node("b", ROOT, 3)])
    rows = factors("classic", tree, tree.aggregate({"a": 50.0, "b": 50.0}))
    assert rows["a"].factor < 0.5 < rows["b"].factor  # classic: U > S iff F < 0.5
    assert over_share(factors("fair_tree", tree, tree.aggregate({"a": 50.0, "b": 50.0}))["a"])
    assert over_share(rows["a"]) and not over_share(rows["b"])


def test_protected_and_unmanaged_work_is_never_chosen() -> None:
    m = cluster(3, 4)
    p, u, low = put(m, {"node0": 4}), put(m, {"node1": 4}), put(m, {"node2": 4})
    groups = [group("p", p, start=99, protected=True), group("u", u, start=99, managed=False),
              group("low", low, start=0)]
    plan = plan_preemption(m, hi(cores_on_one_node(4)), groups, now=100)
    assert plan.victims == ("low",)
    none = plan_preemption(m, hi(cores_on_one_node(4)), groups[:2], now=100)
    assert none.victims is None and "protected" in none.reason and not none.possible
    assert not may_preempt(HIGH, groups[:2]) and may_preempt(HIGH, groups)


def test_equal_or_higher_qos_is_never_preempted() -> None:
    m = cluster(1, 4)
    same = put(m, {"node0": 4})
    before = state(m)
    for qos in (HIGH, HIGH + 1):
        plan = plan_preemption(m, hi(cores_on_one_node(4)), [group("same", same, qos=qos)], now=100)
        assert plan.victims is None and "no running work of lower QoS than high" in plan.reason
    assert not may_preempt(HIGH, [group("same", same, qos=HIGH)])
    assert state(m) == before


def test_none_with_a_reason_when_preemption_cannot_help() -> None:
    m = cluster(2, 4)
    mine = put(m, {"node0": 4})  # high-QoS work holds node0
    low = put(m, {"node1": 2})
    groups = [group("mine", mine, qos=HIGH), group("low", low)]
    before = state(m)
    plan = plan_preemption(m, hi(js([{"type": "node", "count": 2, "with": [slot(1, core=4)]}])), groups, now=5)
    assert plan.victims is None
    assert plan.reason == "no lower-QoS running work frees enough on the nodes the job can use"
    never = plan_preemption(m, hi(cores_on_one_node(8)), groups, now=5)
    assert never.victims is None and never.reason.startswith("can never run on this cluster")
    assert state(m) == before


def test_groups_on_nodes_the_job_cannot_use_are_not_candidates() -> None:
    m = Matcher(from_description({"node": {"sockets": 0, "cores": 4, "memory": 0},
                                  "nodes": [{"name": "plain"}, {"name": "fast", "properties": {"ssd": ""}}]}),
                "low")
    a = put(m, {"plain": 4})
    b = put(m, {"fast": 4})
    spec = js([slot(1, core=4)], constraints={"properties": ["ssd"]})
    plan = plan_preemption(m, hi(spec), [group("a", a, start=99), group("b", b, start=0)], now=100)
    assert plan.victims == ("b",)  # a loses less but frees nothing the job may use
    only_a = plan_preemption(m, hi(spec), [group("a", a)], now=100)
    assert only_a.victims is None and "nodes the job can use" in only_a.reason


def test_the_trial_budget_is_bounded() -> None:
    # node0: a(2) + high-QoS x(2); node1: b(2) c(2). Only {b, c} frees 4 cores on one node.
    m = cluster(2, 4)
    a, x = put(m, {"node0": 2}), put(m, {"node0": 2})
    b, c = put(m, {"node1": 2}), put(m, {"node1": 2})
    groups = [group("a", a, start=90), group("x", x, qos=HIGH), group("b", b, start=80), group("c", c, start=70)]
    before = state(m)
    spec = cores_on_one_node(4)
    short = plan_preemption(m, hi(spec), groups, now=100, max_trials=2)
    assert short.victims is None and short.reason == "no victim set found within 2 matcher questions"
    assert short.trials == 2
    assert state(m) == before
    with pytest.raises(ValueError, match="max_trials"):
        plan_preemption(m, hi(spec), groups, now=100, max_trials=1)
    plan = plan_preemption(m, hi(spec), groups, now=100)
    # 1 first ask; {a}: counts short, no ask; {a,b}: ask; {a,b,c}: ask (fits on node1);
    # a is on no node of that placement: spared with 1 ask; sparing c or b: counts short
    assert plan.victims == ("b", "c") and plan.trials == 4 and plan.work_lost == 40 + 60
    assert state(m) == before


def test_kubernetes_graph_with_memory_pools() -> None:
    nodes = [{"metadata": {"name": f"w{i}", "labels": {}},
              "status": {"allocatable": {"cpu": "4", "memory": "8Gi"},
                         "conditions": [{"type": "Ready", "status": "True"}]}} for i in range(2)]
    m = Matcher(from_k8s_nodes(nodes), "lonode")
    small = m.allocate(jobspec_from_pods(2, PodRequest(cpu_millis=1000, memory_bytes=2 * 2**30)))
    other = m.allocate(jobspec_from_pods(1, PodRequest(cpu_millis=2000, memory_bytes=5 * 2**30)))
    assert small.ok and other.ok
    before = state(m)
    want = jobspec_from_pods(1, PodRequest(cpu_millis=3000, memory_bytes=6 * 2**30))
    plan = plan_preemption(m, hi(want), [group("small", small.jobid, start=0),
                                         group("other", other.jobid, start=5)], now=10)
    assert plan.possible and plan.victims and len(plan.victims) == 1
    assert state(m) == before
    m.check_invariants()


# ----------------------------------------------------------------------------- properties

_SHAPES = [
    [slot(1, core=1)], [slot(1, core=2)], [slot(2, core=1)], [slot(1, core=3)],
    [{"type": "node", "count": 1, "exclusive": True, "with": [slot(1, core=1)]}],
    [slot(1, core=1, gpu=1)],
]


@st.composite
def scenes(draw: st.DrawFn) -> tuple[Matcher, list[int], list[RunningGroup]]:
    policy = draw(st.sampled_from(["low", "first", "high", "lonode", "hinodex"]))
    n = draw(st.integers(1, 4))
    sockets = draw(st.sampled_from([0, 2]))
    m = Matcher(from_description({"node": {"sockets": sockets, "cores": 2, "gpus": 1, "memory": 0},
                                  "nodes": n}), policy)
    jobids: list[int] = []
    for _ in range(draw(st.integers(0, 10))):
        r = m.allocate(js(draw(st.sampled_from(_SHAPES)), duration=draw(st.sampled_from([0, 50, 500]))),
                       now=draw(st.integers(0, 20)))
        if r.ok:
            jobids.append(r.jobid)
    groups = [RunningGroup(f"g{j}", (j,), draw(st.sampled_from([LOW, LOW + 1, HIGH])), draw(st.integers(0, 20)),
                           over_share=draw(st.booleans()), protected=draw(st.booleans()) and draw(st.booleans()))
              for j in jobids]
    return m, jobids, groups


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenes(), st.data())
def test_restore_leaves_the_matcher_exactly_as_before(scene: Any, data: st.DataObject) -> None:
    m, jobids, _ = scene
    chosen = data.draw(st.lists(st.sampled_from(jobids), unique=True) if jobids else st.just([]))
    before = state(m)
    held = [held_job(m, j) for j in chosen]
    assert all(h is not None for h in held)
    for j in chosen:
        m.cancel(j)
    restore(m, reversed([h for h in held if h is not None]))
    assert state(m) == before
    m.check_invariants()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenes(), st.sampled_from([*_SHAPES, [slot(2, core=2)], [slot(3, core=1, gpu=1)]]))
def test_plans_are_sufficient_minimal_and_leave_no_trace(scene: Any, shape: list[dict[str, Any]]) -> None:
    m, _, groups = scene
    now = 30
    spec = js(shape, duration=100)
    before = state(m)
    plan = plan_preemption(m, hi(spec), groups, now=now)
    assert state(m) == before  # tentative cancels, trials and counters all undone
    m.check_invariants()
    by_id = {g.id: g for g in groups}
    eligible = [g for g in groups if g.qos < HIGH and not g.protected]
    if plan.victims is None:
        if not plan.reason.startswith("can never"):
            # preempting every eligible group would not help either
            assert not fits_without(m, spec, [g.jobids[0] for g in eligible], now)
        return
    assert all(by_id[v].qos < HIGH and not by_id[v].protected for v in plan.victims)
    ids = [by_id[v].jobids[0] for v in plan.victims]
    assert fits_without(m, spec, ids, now)
    for i in range(len(ids)):  # minimal: no victim can be spared
        assert not fits_without(m, spec, ids[:i] + ids[i + 1:], now)

    def cost(gs: list[RunningGroup]) -> tuple[int, int, int]:
        lost = {g.id: sum(n.cores for n in m.jobs[g.jobids[0]].nodes) * max(0, now - g.start) for g in gs}
        return (sum(lost[g.id] for g in gs if not g.over_share), sum(lost.values()), len(gs))

    mine = cost([by_id[v] for v in plan.victims])
    assert mine[1] == plan.work_lost
    for g in eligible:  # no single group that suffices alone is a better choice
        if plan.victims and fits_without(m, spec, [g.jobids[0]], now):
            assert mine <= cost([g])
    assert state(m) == before


def _k8s_node(name: str, cpu: int, gib: int) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {}},
            "status": {"allocatable": {"cpu": str(cpu), "memory": f"{gib}Gi"},
                       "conditions": [{"type": "Ready", "status": "True"}]}}


_PODS = st.builds(lambda n, cpu, mib, x: jobspec_from_pods(n, PodRequest(cpu_millis=cpu, memory_bytes=mib * 2**20),
                                                             exclusive_nodes=x),
                  st.integers(1, 3), st.sampled_from([500, 1000, 2000]), st.sampled_from([256, 1024, 3072]),
                  st.booleans())


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.integers(2, 4), st.integers(2, 8)), min_size=1, max_size=3),
       st.lists(st.tuples(_PODS, st.sampled_from([LOW, HIGH]), st.integers(0, 20)), max_size=8), _PODS)
def test_kubernetes_graphs_plans_are_sufficient_and_restore_exactly(
        shapes: list[tuple[int, int]], running: list[tuple[Any, int, int]], want: Any) -> None:
    m = Matcher(from_k8s_nodes([_k8s_node(f"w{i}", c, g) for i, (c, g) in enumerate(shapes)]), "lonode")
    groups = []
    for spec, qos, start in running:
        r = m.allocate(spec, now=start)
        if r.ok:
            groups.append(RunningGroup(f"g{r.jobid}", (r.jobid,), qos, start))
    before = state(m)
    plan = plan_preemption(m, hi(want), groups, now=30)
    assert state(m) == before
    m.check_invariants()
    if plan.victims:
        by_id = {g.id: g for g in groups}
        ids = [by_id[v].jobids[0] for v in plan.victims]
        assert all(by_id[v].qos == LOW for v in plan.victims)
        assert fits_without(m, want, ids, 30)
        for i in range(len(ids)):
            assert not fits_without(m, want, ids[:i] + ids[i + 1:], 30)
        assert state(m) == before


def test_one_group_that_suffices_alone_beats_an_equally_costly_pair() -> None:
    # a + b (node0) and big (node1) lose the same work; fewer groups wins the tie
    m = cluster(2, 4)
    a, b = put(m, {"node0": 2}), put(m, {"node0": 2})
    big = put(m, {"node1": 4})
    groups = [group("a", a, start=50), group("b", b, start=50), group("big", big, start=75)]
    before = state(m)
    plan = plan_preemption(m, hi(cores_on_one_node(4)), groups, now=100)
    assert plan.victims == ("big",) and plan.work_lost == 100
    assert plan.placement is not None and [n.name for n in plan.placement.nodes] == ["node1"]
    assert state(m) == before


def test_whole_nodes_are_cleared_when_groups_one_by_one_do_not_free_one() -> None:
    # 4 nodes x 4 one-core groups; the cheapest groups are spread over all nodes, so taking
    # them one by one frees no whole node for a long time: the node-wise pass clears the
    # cheapest node (node0: 1 + 10 + 19 + 28)
    m = cluster(4, 4)
    lost = {f"node{n}": [n + 1 + 9 * k for k in range(4)] for n in range(4)}
    groups, ids = [], {}
    for node, losses in lost.items():
        for k, lo in enumerate(losses):
            jid = put(m, {node: 1})
            gid = f"{node}-{k}"
            ids[gid] = jid
            groups.append(group(gid, jid, start=100 - lo))
    whole = js([{"type": "node", "count": 1, "exclusive": True, "with": [slot(1, core=1)]}])
    before = state(m)
    plan = plan_preemption(m, hi(whole), groups, now=100)
    assert plan.victims is not None and sorted(plan.victims) == [f"node0-{k}" for k in range(4)]
    assert plan.work_lost == 1 + 10 + 19 + 28
    assert plan.placement is not None and [n.name for n in plan.placement.nodes] == ["node0"]
    assert state(m) == before
    assert plan.trials <= 64
    # a bound too small to clear a node: None, and the reason names the bound
    few = plan_preemption(m, hi(whole), groups, now=100, max_candidates=3)
    assert few.victims is None
    assert few.reason == "no victim set found among the 3 lower-QoS groups tried (of 16; max_candidates=3)"
    assert state(m) == before


def test_in_the_easy_cycle_the_head_preempts_and_starts_next_cycle() -> None:
    """The intended use with the real Scheduler: the head (EASY's reserved job) preempts;
    the victim is released and requeued; the next cycle starts the head where the plan said,
    and nothing is double-booked."""
    m = cluster(2, 4)
    sched = Scheduler(m, QueuePolicy("easy"))
    low = {name: QueuedJob(name, js([slot(1, core=4)], duration=1000), 0, priority=0) for name in ("l1", "l2")}
    first = sched.cycle(list(low.values()), 0)
    assert sorted(j.id for j, _ in first.started) == ["l1", "l2"]
    head = QueuedJob("h", cores_on_one_node(4), 10, priority=10)
    small = QueuedJob("s", js([slot(1, core=1)], duration=50), 10)
    res = sched.cycle([head, small], 10)
    assert [j.id for j, _ in res.reserved] == ["h"] and [j.id for j in res.blocked] == ["s"]

    groups = [RunningGroup(jid, (sched.allocation(jid).jobid,), 0, 0, "batch") for jid in sched.running]
    assert may_preempt(10, groups)
    sched.withdraw("h")  # its own reservation would collide with the trial
    plan = plan_preemption(m, Preemptor("ns/h", head.jobspec, 10, "urgent"), groups, now=10)
    assert plan.victims == ("l1",)  # equal work lost: ids decide
    assert plan.events == {"l1": "preempted by ns/h (QoS urgent > batch)"}
    assert plan.placement is not None
    where = [n.name for n in plan.placement.nodes]
    # ... victims get their grace period; once gone:
    assert sched.release("l1")
    requeued = QueuedJob("l1", low["l1"].jobspec, 0, priority=0)
    nxt = sched.cycle([head, small, requeued], 20)
    started = {j.id: r for j, r in nxt.started}
    assert list(started) == ["h"] and [n.name for n in started["h"].nodes] == where
    m.check_invariants()
    assert "l1" in {j.id for j, _ in nxt.reserved} | {j.id for j in nxt.blocked}
