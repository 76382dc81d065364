"""Queue policies on hand-built workloads, schedules worked out by hand (fake matcher:
single-core nodes, exact earliest fit). Real-matcher versions live in test_sim.py."""

from __future__ import annotations

import pytest

from _fake_matcher import FakeMatcher, Spec
from fluxnetes.queue import PolicyError, QueuedJob, QueuePolicy, Scheduler, schedule_cycle
from fluxnetes.sim.engine import SimJob, simulate


def run(
    policy: str, jobs: list[SimJob], nodes: int = 4, **kw: object
) -> dict[str, tuple[int | None, int | None]]:
    sched = Scheduler(FakeMatcher(nodes), QueuePolicy.parse(policy, queue_depth=None), **kw)  # type: ignore[arg-type]
    out = simulate(
        jobs,
        sched,
        lambda j: Spec(j.procs, j.estimate),
        total_cores=nodes,
        min_cores_for=lambda j: j.procs,
    )
    return {o.job.id: (o.start, o.end) for o in out.outcomes}


# 4 cores. J1 holds 2 until 10. J2 (4 cores) is the head from t=1: its reservation is t=10.
# J3 (2 cores for 20 s) fits now but would overlap that reservation: EASY must not start it.
# J4 (2 cores for 5 s) ends before 10: it backfills (EASY, conservative), not under FCFS.
HEAD = [
    SimJob("1", 0, 10, 10, 2),
    SimJob("2", 1, 5, 5, 4),
    SimJob("3", 2, 20, 20, 2),
    SimJob("4", 3, 5, 5, 2),
]

# 4 cores. J2 (3 cores) reserved at 10 leaves one core spare during [10, 20).
# J3 (4 cores) cannot start before J2 ends. J4 (1 core for 100 s) never hurts J2 (head):
# EASY backfills it at 3 and so delays J3 to 103; conservative has reserved J3 at 20 and
# must not delay it, so J4 waits until J3 is done.
SECOND = [
    SimJob("1", 0, 10, 10, 2),
    SimJob("2", 1, 10, 10, 3),
    SimJob("3", 2, 10, 10, 4),
    SimJob("4", 3, 100, 100, 1),
]


@pytest.mark.parametrize("incremental", [False, True])
def test_head_reservation_is_never_delayed(incremental: bool) -> None:
    assert run("fcfs", HEAD, incremental=incremental) == {
        "1": (0, 10),
        "2": (10, 15),
        "3": (15, 35),
        "4": (15, 20),
    }
    expected = {"1": (0, 10), "2": (10, 15), "3": (15, 35), "4": (3, 8)}
    assert run("easy", HEAD, incremental=incremental) == expected
    assert run("conservative", HEAD, incremental=incremental) == expected
    assert run("hybrid:1", HEAD, incremental=incremental) == expected


@pytest.mark.parametrize("incremental", [False, True])
def test_easy_may_delay_the_second_job_conservative_may_not(incremental: bool) -> None:
    assert run("easy", SECOND, incremental=incremental) == {
        "1": (0, 10),
        "2": (10, 20),
        "3": (103, 113),
        "4": (3, 103),
    }
    conservative = {"1": (0, 10), "2": (10, 20), "3": (20, 30), "4": (30, 130)}
    assert run("conservative", SECOND, incremental=incremental) == conservative
    assert run("hybrid:2", SECOND, incremental=incremental) == conservative
    assert run("fcfs", SECOND, incremental=incremental) == conservative


def test_early_end_frees_resources_for_the_next_cycle() -> None:
    # J1 asked for 100 s but ends after 10: J2 (needs all 4) starts at 10, not 100.
    jobs = [SimJob("1", 0, 10, 100, 4), SimJob("2", 1, 10, 10, 4)]
    for policy in ("fcfs", "easy", "conservative"):
        assert run(policy, jobs)["2"] == (10, 20)


def test_conservative_compresses_reservations_after_an_early_end() -> None:
    # J1 ends at 10 instead of 50: J2 (reserved at 50) starts at 10; J3 moves up behind it.
    jobs = [SimJob("1", 0, 10, 50, 4), SimJob("2", 1, 10, 10, 4), SimJob("3", 2, 10, 10, 4)]
    assert run("conservative", jobs) == {"1": (0, 10), "2": (10, 20), "3": (20, 30)}


def test_priority_beats_submit_time() -> None:
    sched = Scheduler(FakeMatcher(2), QueuePolicy("fcfs"))
    low = QueuedJob("a", Spec(2, 10), submit_time=0)
    high = QueuedJob("b", Spec(2, 10), submit_time=5, priority=10)
    result = sched.cycle([low, high], now=5)
    assert [j.id for j, _ in result.started] == ["b"]
    assert [j.id for j in result.blocked] == ["a"]


def test_unsatisfiable_job_is_reported_and_does_not_block_fcfs() -> None:
    for profile in (None, 4):
        sched = Scheduler(FakeMatcher(4), QueuePolicy("fcfs"), capacity_cores=profile)
        big = QueuedJob("1", Spec(9, 10), submit_time=0, min_cores=9)
        small = QueuedJob("2", Spec(1, 10), submit_time=1, min_cores=1)
        result = sched.cycle([big, small], now=1)
        assert [(j.id, "9" in reason) for j, reason in result.unsatisfiable] == [("1", True)]
        assert [j.id for j, _ in result.started] == ["2"]


def test_impossible_job_in_simulation_is_reported() -> None:
    jobs = [SimJob("1", 0, 10, 10, 9), SimJob("2", 0, 10, 10, 1)]
    sched = Scheduler(FakeMatcher(4), QueuePolicy("easy"), capacity_cores=4)
    out = simulate(jobs, sched, lambda j: Spec(j.procs, j.estimate), total_cores=4)
    by = {o.job.id: o for o in out.outcomes}
    assert by["1"].start is None and "9" in by["1"].rejected
    assert by["2"].start == 0


def test_pure_cycle_cancels_previous_reservations() -> None:
    m = FakeMatcher(2)
    policy = QueuePolicy("easy")
    running = schedule_cycle([QueuedJob("1", Spec(2, 10), 0)], m, 0, policy)
    assert [j.id for j, _ in running.started] == ["1"]
    waiting = [QueuedJob("2", Spec(2, 10), 1)]
    first = schedule_cycle(waiting, m, 1, policy)
    assert [(j.id, r.at) for j, r in first.reserved] == [("2", 10)]
    second = schedule_cycle(waiting, m, 2, policy, [r for _, r in first.reserved])
    assert [(j.id, r.at) for j, r in second.reserved] == [("2", 10)]
    assert len(m.spans) == 2  # the first reservation was cancelled, not doubled


def test_queue_depth_limits_considered_jobs() -> None:
    sched = Scheduler(FakeMatcher(1), QueuePolicy("conservative", queue_depth=2))
    jobs = [QueuedJob(str(i), Spec(1, 10), i) for i in range(5)]
    result = sched.cycle(jobs, now=5)
    assert result.considered == 2
    assert [j.id for j, _ in result.started] == ["0"]
    assert [(j.id, r.at) for j, r in result.reserved] == [("1", 15)]


def test_withdraw_cancels_reservation_and_release_frees() -> None:
    m = FakeMatcher(1)
    sched = Scheduler(m, QueuePolicy("easy"), incremental=True)
    a, b = QueuedJob("a", Spec(1, 10), 0), QueuedJob("b", Spec(1, 10), 0)
    sched.cycle([a, b], 0)
    assert set(sched.reservations) == {"b"}
    sched.withdraw("b")
    assert not sched.reservations and len(m.spans) == 1
    assert sched.release("a") and not m.spans
    assert not sched.release("a")


@pytest.mark.parametrize(
    ("text", "field"),
    [("lifo", "policy"), ("easy:3", "only hybrid"), ("hybrid:x", "not an integer")],
)
def test_bad_policy_names_the_rule(text: str, field: str) -> None:
    with pytest.raises(PolicyError, match=field):
        QueuePolicy.parse(text)


def test_policy_fields_validated() -> None:
    with pytest.raises(PolicyError, match="queue_depth"):
        QueuePolicy("easy", queue_depth=0)
    with pytest.raises(PolicyError, match="reservation_depth"):
        QueuePolicy("easy", reservation_depth=3)
    assert QueuePolicy.parse("hybrid:5").reservations == 5
    assert QueuePolicy("conservative").reservations is None


def test_bad_reservation_style_named() -> None:
    with pytest.raises(PolicyError, match="reservation_style"):
        QueuePolicy("easy", reservation_style="floating")  # type: ignore[arg-type]


@pytest.mark.parametrize("policy", ["easy", "conservative"])
def test_counted_reservations_match_the_pool_model(policy: str) -> None:
    # with counted reservations the queue's own profile decides backfilling: on a pool of
    # one-core nodes that is the classic schedule (same as the exact fake matcher's)
    for jobs in (HEAD, SECOND):
        pinned = run(policy, jobs)
        sched = Scheduler(FakeMatcher(4), QueuePolicy.parse(policy, None, "counted"),
                          capacity_cores=4)
        out = simulate(jobs, sched, lambda j: Spec(j.procs, j.estimate), total_cores=4,
                       min_cores_for=lambda j: j.procs)
        assert {o.job.id: (o.start, o.end) for o in out.outcomes} == pinned


def test_adopted_allocation_is_released_and_counted() -> None:
    m = FakeMatcher(2)
    existing = m.allocate(Spec(2, 100), now=0)  # e.g. re-recorded after a restart
    sched = Scheduler(m, QueuePolicy("easy"), capacity_cores=2, incremental=True)
    sched.adopt("old", existing)
    result = sched.cycle([QueuedJob("new", Spec(1, 10), 5, min_cores=1)], now=5)
    assert [(j.id, r.at) for j, r in result.reserved] == [("new", 100)]
    assert sched.release("old") and "old" not in sched.running
    assert [j.id for j, _ in sched.cycle([QueuedJob("new", Spec(1, 10), 5)], now=6).started] == ["new"]


def test_counted_reservation_of_a_job_gone_from_the_queue_is_dropped() -> None:
    # a caller that drops a reserved job from the pending list without withdraw (the full
    # cycle's check, which skips building a set of the queue when every job walked last
    # time is still there): its reservation goes before the walk, so its room is free to
    # the jobs walked in that very cycle
    sched = Scheduler(FakeMatcher(2), QueuePolicy.parse("easy", None, "counted"),
                      capacity_cores=2, incremental=True)
    assert [j.id for j, _ in sched.cycle([QueuedJob("run", Spec(2, 100), 0, min_cores=2)],
                                         now=0).started] == ["run"]
    head = QueuedJob("head", Spec(2, 50), 1, min_cores=2)
    assert [(j.id, r.at) for j, r in sched.cycle([head], now=1).reserved] == [("head", 100)]
    other = QueuedJob("other", Spec(2, 200), 2, min_cores=2)  # (would overlap head's)
    assert sched.cycle([head, other], now=2).blocked == [other]
    assert set(sched.reservations) == {"head"}
    assert sched.release("run")  # (ends early: the next cycle is a full walk)
    result = sched.cycle([other], now=3)
    assert [j.id for j, _ in result.started] == ["other"]
    assert sched.reservations == {}
