"""``Scheduler.start_from_head``: fcfs with counted reservations in one loop (the
simulator's fcfs pass) decides what ``Scheduler.cycle`` decides, on a real matcher."""

from __future__ import annotations

import copy
import random
from typing import Any

import pytest

from fluxnetes.jobspec.model import parse_jobspec
from fluxnetes.match import Matcher
from fluxnetes.queue import QueuedJob, QueuePolicy, Scheduler
from fluxnetes.sim.engine import SimJob, simulate
from fluxnetes.sim.machine import machine_from_size

FCFS = QueuePolicy.parse("fcfs", queue_depth=None, reservation_style="counted")


def _one_slot(cores: int, duration: int) -> Any:
    """``slot[1] -> core[cores]``: all on one node (never fits nodes with fewer cores)."""
    return parse_jobspec({
        "version": 1,
        "resources": [{"type": "slot", "count": 1, "label": "default",
                       "with": [{"type": "core", "count": cores}]}],
        "tasks": [{"command": ["app"], "slot": "default", "count": {"per_slot": 1}}],
        "attributes": {"system": {"duration": duration}},
    })


def _schedulers(nodes: int, per: int, counters: bool) -> tuple[Scheduler, Scheduler, Any]:
    machine = machine_from_size(nodes, per)
    pair = [Scheduler(Matcher(copy.deepcopy(machine.graph), policy="first", counters=counters),
                      FCFS, capacity_cores=machine.total_cores, incremental=True)
            for _ in range(2)]
    return pair[0], pair[1], machine


@pytest.mark.parametrize("seed", range(12))
def test_start_from_head_decides_what_cycle_decides(seed: int) -> None:
    # two schedulers on two copies of one machine see the same events; A runs `cycle`, B the
    # head pass (with an odd seed now and then a `cycle` too: its core profile must be complete
    # when read).
    # Jobs end at random times (before, at or after their windows; some expired first, as
    # the simulator does), some ask a shape no node holds (rejected), some have no duration
    rng = random.Random(seed)
    mixed = seed % 2 == 1  # B runs `cycle` now and then
    nodes, per = rng.randint(1, 5), rng.choice([1, 2, 3])
    a, b, machine = _schedulers(nodes, per, counters=rng.random() < 0.5)
    capacity = machine.total_cores
    queue: list[QueuedJob] = []
    running: list[str] = []
    now = 0
    rejected_seen = 0
    for step in range(150):
        before = now
        now += rng.choice([0, 0, 1, 2, 5])
        for _ in range(rng.choice([0, 1, 1, 2])):
            if running and rng.random() < 0.6:
                job_id = running.pop(rng.randrange(len(running)))
                assert a.release(job_id) and b.release(job_id)
        for job_id in running:
            # as the simulator does: a window that ended since the last cycle, unreleased,
            # expired before the next cycle (`expire`'s contract: at the planned end)
            res = a.running[job_id].result
            if int(res.duration) > 0 and before < int(res.at) + int(res.duration) <= now \
                    and rng.random() < 0.7:
                assert a.expire(job_id) == b.expire(job_id)
        for k in range(rng.choice([0, 1, 2, 3])):
            duration = rng.choice([0, 1, 3, 10])
            if per > 1 and rng.random() < 0.1:
                spec = _one_slot(per + 1, duration)  # fits the count, never a node
            else:
                spec = machine.jobspec(SimJob("x", now, duration, duration,
                                              rng.randint(1, capacity)))
            queue.append(QueuedJob(id=f"{step}.{k}", jobspec=spec, submit_time=now))
        free = b.free_now(now)
        assert free is not None and free == a.free_now(now)
        expected = a.cycle(queue, now, ordered=True, waiting=True)
        want = ([(job.id, res.core_shares) for job, res in expected.started],
                [(job.id, reason) for job, reason in expected.unsatisfiable])
        if mixed and rng.random() < 0.2:
            other = b.cycle(queue, now, ordered=True, waiting=True)
            got = ([(job.id, res.core_shares) for job, res in other.started],
                   [(job.id, reason) for job, reason in other.unsatisfiable])
        else:
            started, rejected = b.start_from_head(queue, now, free)
            got = ([(job.id, res.core_shares) for job, res in started],
                   [(job.id, reason) for job, reason in rejected])
            # what it decided is the head of the queue, in order
            decided = {job.id for job, _ in started} | {job.id for job, _ in rejected}
            assert {job.id for job in queue[:len(decided)]} == decided
        assert got == want, (step, now)
        for job_id, _ in want[1]:
            a.withdraw(job_id)
            b.withdraw(job_id)
        rejected_seen += len(want[1])
        gone = {job_id for job_id, _ in want[0]} | {job_id for job_id, _ in want[1]}
        running += [job_id for job_id, _ in want[0]]
        queue = [job for job in queue if job.id not in gone]
        assert a.running.keys() == b.running.keys()
        assert a.free_now(now) == b.free_now(now)
    if not mixed:
        # never more questions: a head that stopped the last pass is not asked again until
        # something came back (a release, a window's end), as cycle's incremental walk skips
        # it; cycle also re-walks when a planned end passed of a job already released
        assert b.matcher_calls <= a.matcher_calls
    if per > 1:
        assert rejected_seen > 0  # (the unsatisfiable shape was met and rejected)


def test_start_from_head_keeps_the_profile_for_later_cycles() -> None:
    # started by the head pass, 3 of 4 cores are held until 10: a cycle right after must see
    # them (a job of 2 cores does not fit now), and their release must give them back
    a, _, machine = _schedulers(4, 1, counters=True)
    spec3 = machine.jobspec(SimJob("x", 0, 10, 10, 3))
    spec2 = machine.jobspec(SimJob("x", 0, 10, 10, 2))
    started, rejected = a.start_from_head([QueuedJob("1", spec3, 0)], 0, 4)
    assert [job.id for job, _ in started] == ["1"] and rejected == []
    result = a.cycle([QueuedJob("2", spec2, 1)], 1, ordered=True, waiting=True)
    assert result.started == [] and [job.id for job in result.blocked] == ["2"]
    # its profile ruled job 2 out: no allocate asked, only fcfs's one satisfiability check
    assert result.matcher_calls == 1
    assert a.free_now(1) == 1
    assert a.release("1")
    assert a.free_now(2) == 4
    result = a.cycle([QueuedJob("2", spec2, 2)], 2, ordered=True, waiting=True)
    assert [job.id for job, _ in result.started] == ["2"]


def test_a_later_cycle_sees_the_planned_end_of_a_job_the_head_pass_started() -> None:
    # job 1 (all 4 cores, window [0, 10)) started by the head pass and, as the simulator
    # does at its planned end, expired at 10 before its release: its cores are back in the
    # plan and the matcher, so the waiting job 2 starts. The cycle at 1 walked job 2
    # (blocked); the one at 10 is incremental (job 2 not asked again) unless it knows a
    # planned end passed, which `cycle` reads from its heap of running jobs' ends (a job
    # started by `cycle` itself is in it: the same sequence then starts job 2)
    a, _, machine = _schedulers(4, 1, counters=False)
    spec4 = machine.jobspec(SimJob("x", 0, 10, 10, 4))
    spec2 = machine.jobspec(SimJob("x", 0, 10, 10, 2))
    started, _ = a.start_from_head([QueuedJob("1", spec4, 0)], 0, 4)
    assert [job.id for job, _ in started] == ["1"]
    waiting = [QueuedJob("2", spec2, 1)]
    result = a.cycle(waiting, 1, ordered=True, waiting=True)
    assert result.started == [] and [job.id for job in result.blocked] == ["2"]
    assert a.expire("1")
    result = a.cycle(waiting, 10, ordered=True, waiting=True)
    assert [job.id for job, _ in result.started] == ["2"]


@pytest.mark.parametrize(("name", "style"), [("easy", "counted"), ("conservative", "counted"),
                                             ("fcfs", "pinned")])
def test_start_from_head_is_for_counted_fcfs_only(name: str, style: str) -> None:
    machine = machine_from_size(2, 1)
    sched = Scheduler(Matcher(copy.deepcopy(machine.graph), policy="first"),
                      QueuePolicy.parse(name, reservation_style=style),  # type: ignore[arg-type]
                      capacity_cores=machine.total_cores)
    with pytest.raises(ValueError, match="start_from_head: only for fcfs with counted"):
        sched.start_from_head([], 0, 2)


def test_the_simulators_fcfs_runs_the_head_pass() -> None:
    # static-order fcfs with counted reservations: every pass is `start_from_head`, never
    # `cycle` (sim/README.md says where the two paths meet); the schedule is fcfs's
    machine = machine_from_size(4, 1)

    class NoCycle(Scheduler):
        def cycle(self, *args: Any, **kwargs: Any) -> Any:
            raise AssertionError("the fcfs simulation called Scheduler.cycle")

    sched = NoCycle(Matcher(copy.deepcopy(machine.graph), policy="first", counters=True), FCFS,
                    capacity_cores=machine.total_cores, incremental=True)
    jobs = [SimJob("1", 0, 10, 10, 2), SimJob("2", 1, 5, 5, 4), SimJob("3", 2, 20, 20, 2),
            SimJob("4", 3, 5, 5, 2)]
    run = simulate(jobs, sched, machine.jobspec, total_cores=4, min_cores_for=machine.min_cores)
    assert {o.job.id: (o.start, o.end) for o in run.outcomes} == {
        "1": (0, 10), "2": (10, 15), "3": (15, 35), "4": (15, 20)}
    assert run.cycles == sched.cycles > 0
