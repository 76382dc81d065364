"""The count oracle (``fluxnetes.sim.fastsim``, ``--engine count``) against a plain model of the same
semantics (tests/sim_oracle.py) on random small traces full of equal timestamps, plus the
placements it hands out and the seams it shares with the queue engine."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fluxnetes.sim.engine import SimJob, SimRun
from fluxnetes.sim.fastsim import fast_path_reason, simulate_fast
from fluxnetes.sim.profile import CountProfile
from sim_oracle import OJob
from sim_oracle import simulate as oracle

# few distinct submit times, run times and estimates: many events share an instant, many
# jobs end exactly at their estimate (the cases where event order decides)
jobs_strategy = st.lists(
    st.tuples(
        st.integers(0, 12),  # submit
        st.integers(0, 8),  # run time (0 happens in unfiltered traces)
        st.integers(0, 6),  # estimate - run time (0: ends exactly at its estimate)
        st.integers(1, 9),  # processors
        st.integers(0, 1),  # priority
    ),
    min_size=1,
    max_size=30,
)


def _sim_jobs(raw: list[tuple[int, int, int, int, int]], priorities: bool) -> list[SimJob]:
    return [SimJob(str(i + 1), s, r, max(r + e, 1), p, priority=q if priorities else 0)
            for i, (s, r, e, p, q) in enumerate(sorted(raw, key=lambda x: x[0]))]


def _check_placements(run: SimRun, caps: dict[str, int]) -> None:
    events: list[tuple[int, int, str, int]] = []
    for o in run.outcomes:
        if o.start is None or o.end is None:
            continue
        assert sum(c for _, c in o.shares) == o.cores
        if o.end == o.start:
            continue  # ran for no time: holds nothing over any interval
        for name, cores in o.shares:
            events.append((o.start, 1, name, cores))
            events.append((o.end, 0, name, -cores))  # ends before starts at one instant
    used = dict.fromkeys(caps, 0)
    for _, _, name, delta in sorted(events):
        used[name] += delta
        assert 0 <= used[name] <= caps[name], f"node {name} over capacity"


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(raw=jobs_strategy, policy=st.sampled_from(["fcfs", "easy", "conservative"]),
       nodes=st.integers(1, 8), per=st.sampled_from([1, 1, 2, 3]),
       whole=st.booleans())
def test_fast_engine_matches_the_plain_model(raw: list[tuple[int, int, int, int, int]],
                                             policy: str, nodes: int, per: int,
                                             whole: bool) -> None:
    jobs = _sim_jobs(raw, priorities=False)
    names = [f"n{i}" for i in range(nodes)]
    run = simulate_fast(jobs, policy, node_names=names, cores_per_node=per, whole_nodes=whole)
    units = nodes if whole else nodes * per
    need = {j.id: (-(-j.procs // per) if whole else j.procs) for j in jobs}
    model = oracle([OJob(j.id, j.submit, j.effective_runtime, j.estimate, need[j.id])
                    for j in jobs if need[j.id] <= units], units, policy)
    for o in run.outcomes:
        if need[o.job.id] > units:
            assert o.start is None and "cores" in o.rejected
        else:
            assert o.start == model[o.job.id], (o.job.id, o.start, model[o.job.id])
            assert o.end == o.start + o.job.effective_runtime
    _check_placements(run, dict.fromkeys(names, per))
    if whole:  # whole nodes: a job never shares a node
        for o in run.outcomes:
            if o.start is not None:
                assert all(c == per for _, c in o.shares)
                assert len(o.shares) == need[o.job.id]
    # same input, same schedule and placements
    again = simulate_fast(jobs, policy, node_names=names, cores_per_node=per, whole_nodes=whole)
    assert [(o.start, o.shares) for o in again.outcomes] == [(o.start, o.shares) for o in run.outcomes]


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(raw=jobs_strategy, policy=st.sampled_from(["fcfs", "easy", "conservative"]))
def test_priorities_reorder_the_queue_and_keep_the_guarantees(
        raw: list[tuple[int, int, int, int, int]], policy: str) -> None:
    # the queue order is one sort key (priority, submit, arrival): with priorities the engine
    # must still never overfill the machine, and fcfs must start jobs in that order
    jobs = _sim_jobs(raw, priorities=True)
    names = [f"n{i}" for i in range(9)]
    run = simulate_fast(jobs, policy, node_names=names, cores_per_node=1)
    _check_placements(run, dict.fromkeys(names, 1))
    assert all(o.start is not None and o.start >= o.job.submit for o in run.outcomes)
    if policy == "fcfs":
        # strict order under the key: a job ahead of b in the queue (higher priority, or
        # same priority and earlier) that was waiting when b started had started by then
        key = {o.job.id: (-o.job.priority, o.job.submit, int(o.job.id)) for o in run.outcomes}
        for a in run.outcomes:
            for b in run.outcomes:
                assert a.start is not None and b.start is not None
                if key[a.job.id] < key[b.job.id] and a.job.submit < b.start:
                    assert a.start <= b.start, (a.job, b.job)


def test_ends_at_the_estimate_free_processors_before_the_termination_event() -> None:
    # J1 holds the whole machine [0, 10) and ends exactly at its estimate. At t=10 J3 is
    # submitted; in the reference, J1's processors are already free in the planning profile
    # (it ends at its estimate) although its termination is handled after the submission.
    # J2 (submitted at 1, 4 procs) is the head; under EASY the submission of J3 (1 proc)
    # fits now, so the pass starts J2 and J3 at 10, in queue order.
    jobs = [SimJob("1", 0, 10, 10, 4), SimJob("2", 1, 5, 5, 4), SimJob("3", 10, 5, 5, 1)]
    run = simulate_fast(jobs, "easy", node_names=["a", "b", "c", "d"], cores_per_node=1)
    assert {o.job.id: o.start for o in run.outcomes} == {"1": 0, "2": 10, "3": 15}
    model = oracle([OJob(j.id, j.submit, j.runtime, j.estimate, j.procs) for j in jobs], 4, "easy")
    assert model == {"1": 0, "2": 10, "3": 15}


def test_easy_backfills_only_what_the_head_can_spare() -> None:
    # 4 procs. J1 (2 procs, est 10) runs; head J2 needs 4 -> shadow 10, extra 0.
    # J3 (1 proc, est 20) would run past the shadow with no extra: waits.
    # J4 (2 procs, est 5) ends before the shadow: backfills now.
    jobs = [SimJob("1", 0, 10, 10, 2), SimJob("2", 1, 5, 5, 4), SimJob("3", 2, 20, 20, 1),
            SimJob("4", 3, 5, 5, 2)]
    run = simulate_fast(jobs, "easy", node_names=["a", "b", "c", "d"], cores_per_node=1)
    assert {o.job.id: o.start for o in run.outcomes} == {"1": 0, "2": 10, "3": 15, "4": 3}
    assert {o.job.id: o.nodes for o in run.outcomes}["1"] == ("a", "b")


def test_fast_path_reasons() -> None:
    job = SimJob("1", 0, 5, 5, 1)
    assert fast_path_reason([job], [1, 1], "easy", "counted") == ""
    assert "pinned" in fast_path_reason([job], [1, 1], "easy", "pinned")
    assert "hybrid" in fast_path_reason([job], [1, 1], "hybrid", "counted")
    assert "sizes" in fast_path_reason([job], [1, 2], "easy", "counted")
    assert "estimate" in fast_path_reason([SimJob("9", 0, 5, 0, 1)], [1], "easy", "counted")
    with pytest.raises(ValueError, match="policy"):
        simulate_fast([job], "hybrid", node_names=["a"], cores_per_node=1)


@settings(max_examples=200, deadline=None)
@given(spans=st.lists(st.tuples(st.integers(0, 30), st.integers(1, 15), st.integers(1, 4)),
                      max_size=12),
       now=st.integers(0, 30), duration=st.integers(1, 20), units=st.integers(1, 6))
def test_count_profile_against_a_table(spans: list[tuple[int, int, int]], now: int,
                                       duration: int, units: int) -> None:
    total = 6
    profile = CountProfile(total)
    table = [total] * 100
    for start, length, u in spans:
        if all(table[t] >= u for t in range(start, start + length)):
            profile.add(start, start + length, -u)
            for t in range(start, start + length):
                table[t] -= u
    for t in range(60):
        assert profile.free_at(t) == table[t]
    want = next(t for t in range(now, 100) if all(table[x] >= units
                                                  for x in range(t, t + duration)))
    assert profile.earliest(now, duration, units) == want
    limit = now + duration
    early = next((t for t in range(now, limit) if all(table[x] >= units
                                                      for x in range(t, min(t + duration, limit)))), None)
    assert profile.earliest_before(now, duration, units, limit) == early
    profile.advance(now)
    assert profile.free_at(now) == table[now]


def test_observer_and_samples() -> None:
    class Recorder:
        def __init__(self) -> None:
            self.events: list[tuple[str, str, int, Any]] = []

        def on_submit(self, job: SimJob, now: int) -> None:
            self.events.append(("submit", job.id, now, None))

        def on_start(self, job: SimJob, now: int, allocation: Any) -> None:
            self.events.append(("start", job.id, now, [(s.name, s.cores) for s in allocation.nodes]))

        def on_end(self, job: SimJob, now: int) -> None:
            self.events.append(("end", job.id, now, None))

        def on_reject(self, job: SimJob, now: int, reason: str) -> None:
            self.events.append(("reject", job.id, now, reason))

    rec = Recorder()
    jobs = [SimJob("1", 0, 10, 10, 3), SimJob("2", 1, 5, 5, 9), SimJob("3", 2, 5, 5, 2)]
    run = simulate_fast(jobs, "easy", node_names=["a", "b"], cores_per_node=2, observer=rec)
    assert rec.events == [
        ("submit", "1", 0, None), ("start", "1", 0, [("a", 2), ("b", 1)]),
        ("submit", "2", 1, None), ("reject", "2", 1, "needs 9 cores; the whole graph has 4"),
        ("submit", "3", 2, None), ("end", "1", 10, None), ("start", "3", 10, [("a", 2)]),
        ("end", "3", 15, None)]
    assert [(s.time, s.queued, s.busy_cores) for s in run.samples] == [
        (0, 0, 3), (1, 0, 3), (2, 1, 3), (10, 0, 2), (15, 0, 0)]
    assert run.outcomes[1].rejected and run.never_started == []


def test_a_machine_by_size_names_its_nodes_as_its_graph_does() -> None:
    from fluxnetes.sim.machine import machine_from_size

    machine = machine_from_size(5, 3)
    names = machine.node_cores()  # known without building the graph
    assert machine._graph is None
    graph_names = {node.name: sum(1 for v in machine.graph.walk(node) if v.type == "core")
                   for node in machine.graph.by_type["node"]}
    assert list(names.items()) == list(graph_names.items())
    assert machine.total_cores == 15


def test_cli_engine_choice(tmp_path: Any) -> None:
    import json

    from typer.testing import CliRunner

    from fluxnetes.cli.main import app

    path = tmp_path / "t.swf"
    path.write_text("; MaxNodes: 4\n; MaxProcs: 4\n"
                    "1 0 -1 10 2 -1 -1 2 10 -1 1 1 1 -1 1 -1 -1 -1\n"
                    "2 1 -1 10 3 -1 -1 3 10 -1 1 1 1 -1 1 -1 -1 -1\n")
    cli = CliRunner()
    result = cli.invoke(app, ["simulate", str(path), "--json", "--compare", "easy,hybrid:1"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    # the operator's engine by default, every policy; the count oracle only when asked
    assert data["easy"]["engine"] == "queue" and data["hybrid:1"]["engine"] == "queue"
    assert data["easy"]["matcher_calls"] > 0
    result = cli.invoke(app, ["simulate", str(path), "--engine", "count", "--json"])
    assert result.exit_code == 0 and json.loads(result.stdout)["engine"] == "count"
    result = cli.invoke(app, ["simulate", str(path), "--engine", "count",
                              "--reservations", "pinned"])
    assert result.exit_code == 2 and "pinned reservations" in result.stderr
    result = cli.invoke(app, ["simulate", str(path), "--engine", "fastest"])
    assert result.exit_code == 2 and "--engine" in result.stderr
    result = cli.invoke(app, ["simulate", str(path)])
    assert "engine   easy: queue (the operator's Scheduler, graph matcher 'first')" in result.stdout
