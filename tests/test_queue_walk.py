"""The backfill walk's shortcuts (queue/walk.py): a run of waiting jobs too big for the
cores free now is passed in one step, and the count of free cores is kept in step with the
walk's own starts. Both must give the decisions of the plain per-job loop (fake matcher:
single-core nodes, exact earliest fit; schedules worked out by hand)."""

from __future__ import annotations

from typing import Any

import pytest

from _fake_matcher import FakeMatcher, Spec
from fluxnetes.queue import QueuedJob, QueuePolicy, Scheduler
from fluxnetes.queue.walk import too_big_run


def job(job_id: str, cores: int, duration: int, submit: int = 1) -> QueuedJob:
    return QueuedJob(job_id, Spec(cores, duration), submit, min_cores=cores)


def easy(depth: int | None = None) -> Scheduler:
    """4 cores, EASY with counted reservations; job A holds 3 of them over [0, 100)."""
    sched = Scheduler(FakeMatcher(4), QueuePolicy("easy", queue_depth=depth,
                                                 reservation_style="counted"),
                      capacity_cores=4)
    first = sched.cycle([job("A", 3, 100, submit=0)], now=0)
    assert [j.id for j, _ in first.started] == ["A"]
    return sched


# At t=1 one core is free. H (4 cores) is the head: reserved at 100. B1..B3 need more than
# one core, C more than the machine, S one core for 10 s (ends before 100: it backfills),
# then nothing is free: B4 and D are BUSY without a question.
QUEUE = [job("H", 4, 50), job("B1", 2, 10), job("B2", 3, 10), job("C", 5, 10),
         job("B3", 2, 10), job("S", 1, 10), job("B4", 2, 10), job("D", 5, 10)]


def test_a_too_big_run_is_blocked_and_a_larger_than_machine_job_rejected() -> None:
    sched = easy()
    calls = sched.matcher.calls  # type: ignore[attr-defined]
    result = sched.cycle(list(QUEUE), now=1, ordered=True)
    assert [(j.id, r.at) for j, r in result.reserved] == [("H", 100)]
    assert [j.id for j, _ in result.started] == ["S"]
    assert [j.id for j, _ in result.unsatisfiable] == ["C"]
    # D comes after the point where nothing is free: blocked with the rest, as before
    assert [j.id for j in result.blocked] == ["B1", "B2", "B3", "B4", "D"]
    assert result.considered == len(QUEUE)
    assert sched._walk is not None
    assert sched._walk.order == ["H", "B1", "B2", "B3", "B4", "D"]
    # one matcher question: S's allocate (the head's reservation is a count)
    assert sched.matcher.calls - calls == 1  # type: ignore[attr-defined]


@pytest.mark.parametrize(("depth", "blocked", "rejected"), [
    (2, ["B1"], []),
    (3, ["B1", "B2"], []),
    (4, ["B1", "B2"], ["C"]),
    (5, ["B1", "B2", "B3"], ["C"]),
])
def test_a_too_big_run_stops_at_the_queue_depth(depth: int, blocked: list[str],
                                                rejected: list[str]) -> None:
    sched = easy(depth)
    result = sched.cycle(list(QUEUE), now=1, ordered=True)
    assert result.considered == depth
    assert [j.id for j in result.blocked] == blocked
    assert [j.id for j, _ in result.unsatisfiable] == rejected
    assert result.started == []


def test_a_walk_asks_the_cores_free_now_once_however_many_jobs_start() -> None:
    """Each start at `now` takes exactly its cores from what is free now, so the walk keeps
    the count instead of asking the profile again after every start."""
    sched = Scheduler(FakeMatcher(8), QueuePolicy("easy", queue_depth=None,
                                                 reservation_style="counted"),
                      capacity_cores=8)
    profile = sched.profile
    assert profile is not None
    asked: list[int] = []
    plain = profile.avail_during

    def counting(now: int, duration: int) -> int:
        if duration == 1:
            asked.append(now)
        return plain(now, duration)

    profile.avail_during = counting  # type: ignore[method-assign]
    # the head H2 (8 cores) cannot start while the 1-core jobs run: reserved at 10; then
    # 1-core jobs ending by 10 backfill until the cores run out
    jobs = [job("1", 2, 10), job("2", 3, 10), job("H2", 8, 10),
            *(job(f"s{k}", 1, 5) for k in range(5)), job("big", 2, 5)]
    result = sched.cycle(jobs, now=0, ordered=True)
    assert [j.id for j, _ in result.started] == ["1", "2", "s0", "s1", "s2"]
    assert [(j.id, r.at) for j, r in result.reserved] == [("H2", 10)]
    assert [j.id for j in result.blocked] == ["s3", "s4", "big"]
    assert asked == [0]


def test_the_kept_count_equals_the_profiles_answer() -> None:
    """After the walk, what it counted as free now is what the profile says."""
    sched = easy()
    sched.cycle(list(QUEUE), now=1, ordered=True)
    assert sched.free_now(1) == 0
    fresh = Scheduler(FakeMatcher(6), QueuePolicy("easy", queue_depth=None,
                                                  reservation_style="counted"),
                      capacity_cores=6)
    result = fresh.cycle([job("x", 2, 10), job("y", 3, 0), job("z", 2, 10), job("w", 1, 4)],
                         now=7, ordered=True)
    assert [j.id for j, _ in result.started] == ["x", "y", "w"]
    assert fresh.free_now(7) == 0


def test_candidates_past_the_reservation_needing_more_than_its_extra_are_not_asked() -> None:
    """A backfill candidate whose window reaches the head's reserved start and that needs
    more cores than are free there cannot fit: one question about that instant answers it
    for every such candidate, without asking the profile about its whole window."""
    sched = Scheduler(FakeMatcher(8), QueuePolicy("easy", queue_depth=None,
                                                 reservation_style="counted"),
                      capacity_cores=8)
    sched.cycle([job("A", 4, 100, submit=0), job("B", 2, 300, submit=0)], now=0, ordered=True)
    profile = sched.profile
    assert profile is not None
    windows: list[int] = []
    instants: list[int] = []
    plain_fits, plain_avail = profile.fits_now, profile.avail_during

    def fits_now(now: int, duration: int, cores: int) -> bool:
        windows.append(duration)
        return plain_fits(now, duration, cores)

    def avail_during(now: int, duration: int) -> int:
        if duration == 1:
            instants.append(now)
        return plain_avail(now, duration)

    profile.fits_now = fits_now  # type: ignore[method-assign]
    profile.avail_during = avail_during  # type: ignore[method-assign]
    # 2 cores free at t=1. H (5 cores) is reserved at 100, when 6 are free: 1 extra.
    # L1, L2 (2 cores) would still run at 100: they cannot fit. S1 (1 core, 500 s) fits in the
    # extra, L3 no longer fits now, S2 ends before 100
    queue = [job("H", 5, 50), job("L1", 2, 200), job("L2", 2, 150), job("S1", 1, 500),
             job("L3", 2, 50), job("S2", 1, 50)]
    result = sched.cycle(queue, now=1, ordered=True)
    assert [(j.id, r.at) for j, r in result.reserved] == [("H", 100)]
    assert [j.id for j, _ in result.started] == ["S1", "S2"]
    assert [j.id for j in result.blocked] == ["L1", "L2", "L3"]
    assert windows == [500, 50]  # S1 and S2 only
    assert instants == [1, 100]  # free now (once), free at the reserved start (once)


@pytest.mark.parametrize(("start", "stop", "free", "capacity", "expected"), [
    (0, 6, 1, 4, 3),  # [3, 2, 4 | 1, ...]: the first job that fits
    (0, 6, 2, 4, 1),  # 2 fits
    (0, 1, 1, 4, 1),  # stop first
    (3, 6, 1, 4, 3),  # starts on a fitting job: nothing to pass
    (4, 6, 1, 4, 5),  # 5 > capacity: the walk rejects it, the run ends before it
    (5, 6, 2, 9, 6),  # all too big up to stop
])
def test_too_big_run(start: int, stop: int, free: int, capacity: int, expected: int) -> None:
    sizes = [3, 2, 4, 1, 3, 5]
    queue: list[Any] = [job(str(k), c, 1) for k, c in enumerate(sizes)]
    assert too_big_run(queue, start, stop, free, capacity) == expected


def test_queued_job_is_a_value_as_the_dataclass_was() -> None:
    # positional or keyword; equal (and hashed alike) when every field but the jobspec is
    a, b = QueuedJob("7", Spec(1, 10), 5), QueuedJob(id="7", jobspec=Spec(2, 20), submit_time=5)
    assert a == b and hash(a) == hash(b) and len({a, b}) == 1
    assert a != QueuedJob("7", Spec(1, 10), 5, priority=1)
    assert a != QueuedJob("7", Spec(1, 10), 5, account="x") and a != "7"
    assert (a.priority, a.queue, a.min_cores, a.account) == (0, "default", 0, "")
    from fluxnetes.jobspec.batch import batch_jobspec

    spec = batch_jobspec(3, 10)
    assert QueuedJob("8", spec, 0).cores == 3 and QueuedJob("8", spec, 0, min_cores=2).cores == 2
    assert QueuedJob("8", spec, 0).duration == 10 and QueuedJob("9", None, 0).duration == 0
    assert repr(a).startswith("QueuedJob(id='7', ")
    moved = QueuedJob("8", spec, 0, min_cores=2).replace(priority=4, min_cores=0)
    assert (moved.id, moved.priority, moved.min_cores, moved.cores, moved.jobspec) == ("8", 4, 0, 3, spec)
    with pytest.raises(TypeError, match="no field prio"):
        a.replace(prio=1)


def test_shape_key_is_made_once_per_resource_tree() -> None:
    # jobspecs that differ only by duration share their resource tree, and its key: the
    # repr of the tree is made once, not per jobspec
    from fluxnetes.jobspec.batch import batch_jobspec, with_duration
    from fluxnetes.queue.walk import _shape_key

    base = batch_jobspec(4, 60)
    other = with_duration(base, 120)
    first = _shape_key(QueuedJob("1", base, 0))
    assert _shape_key(QueuedJob("2", other, 0)) is first
    assert _shape_key(QueuedJob("3", batch_jobspec(4, 60), 0)) == first  # (another tree)
    assert _shape_key(QueuedJob("4", batch_jobspec(5, 60), 0)) != first


def test_status_name_remembers_statuses_by_identity_without_hashing_them() -> None:
    # hashing an Enum member runs enum's interpreted __hash__ on every match: status_name
    # keys its memo by identity instead (and still names any status it is given)
    from fluxnetes.match import MatchStatus
    from fluxnetes.queue.protocol import status_name

    class NoHash:
        name = "busy"

        def __hash__(self) -> int:
            raise AssertionError("status_name hashed the status")

    class Result:
        def __init__(self, status: object) -> None:
            self.status = status

    status = NoHash()
    assert status_name(Result(status)) == "BUSY" and status_name(Result(status)) == "BUSY"
    assert status_name(Result(MatchStatus.ALLOCATED)) == "ALLOCATED"
    assert status_name(Result("reserved")) == "RESERVED"
