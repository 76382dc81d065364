"""The operator's engine (``fluxnetes.queue.Scheduler`` + the graph matcher, driven by
``sim/engine.py``) gives the reference's schedules exactly, checked against the plain model
of the reference (tests/sim_oracle.py, the count oracle) on random small traces full of
equal timestamps and jobs ending exactly at their estimate."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fluxnetes.sim.engine import SimJob
from fluxnetes.sim.machine import machine_from_size
from fluxnetes.sim.runner import Workload, policy_for, run_policy
from fluxnetes.sim.swf import SwfHeader, SwfTrace
from fluxnetes.sim.workload import FilterReport
from sim_oracle import OJob
from sim_oracle import simulate as oracle

jobs_strategy = st.lists(
    st.tuples(
        st.integers(0, 12),  # submit
        st.integers(0, 8),  # run time
        st.integers(0, 6),  # estimate - run time (0: ends exactly at its estimate)
        st.integers(1, 9),  # processors
    ),
    min_size=1,
    max_size=25,
)


def _workload(jobs: list[SimJob], nodes: int, per: int, whole: bool) -> Workload:
    machine = machine_from_size(nodes, per, whole_nodes=whole)
    return Workload(SwfTrace(SwfHeader(), [], []), machine, jobs, FilterReport())


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(raw=jobs_strategy, policy=st.sampled_from(["fcfs", "easy", "conservative"]),
       nodes=st.integers(1, 6), per=st.sampled_from([1, 1, 2, 3]), whole=st.booleans(),
       match_policy=st.sampled_from(["first", "lonode", "low"]))
def test_queue_engine_matches_the_reference_model(
    raw: list[tuple[int, int, int, int]], policy: str, nodes: int, per: int, whole: bool,
    match_policy: str,
) -> None:
    jobs = [SimJob(str(i + 1), s, r, max(r + e, 1), p)
            for i, (s, r, e, p) in enumerate(sorted(raw, key=lambda x: x[0]))]
    units = nodes if whole else nodes * per
    need = {j.id: (-(-j.procs // per) if whole else j.procs) for j in jobs}
    model = oracle([OJob(j.id, j.submit, j.effective_runtime, j.estimate, need[j.id])
                    for j in jobs if need[j.id] <= units], units, policy)
    run, summary = run_policy(_workload(jobs, nodes, per, whole), policy_for(policy),
                              engine="queue", match_policy=match_policy)
    assert summary.engine == "queue"
    for o in run.outcomes:
        if need[o.job.id] > units:
            assert o.start is None and o.rejected
        else:
            assert o.start == model[o.job.id], (o.job.id, o.start, model[o.job.id])
            assert o.end == o.start + o.job.effective_runtime
            assert sum(c for _, c in o.shares) == o.cores > 0
