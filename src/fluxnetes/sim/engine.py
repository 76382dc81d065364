"""Discrete-event simulation: the queue's Scheduler and a matcher, driven by a job list.

Events are job submissions and job ends, in the reference's order at one instant: jobs at
their planned end are expired first (free in the plan from the instant's first event on),
then the submissions (trace order), then the terminations (the order their jobs started),
then a conservative reservation that came due. Each submission and each termination runs
its own scheduling cycle (one pass per event, not per instant; passes that would decide
nothing are skipped: sim/README.md) through the very same ``fluxnetes.queue.Scheduler``
the operator uses. Jobs end at ``start + run time``; a job never runs past its estimate
(batch systems kill a job at its time limit), so running jobs never outlive what the
matcher planned.
"""

from __future__ import annotations

import gc
import heapq
from bisect import bisect_left
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from mypy_extensions import mypyc_attr

from fluxnetes.queue.job import QueuedJob
from fluxnetes.queue.protocol import cores_of, share_tuple
from fluxnetes.queue.walk import too_big_reason

if TYPE_CHECKING:
    from fluxnetes.queue import Scheduler


@dataclass(frozen=True, slots=True)
class SimJob:
    """A job to simulate. ``estimate`` is the duration the scheduler is told (0 = unknown)."""

    id: str
    submit: int
    runtime: int
    estimate: int
    procs: int
    priority: int = 0

    @property
    def effective_runtime(self) -> int:
        """How long it really runs: its run time, cut at its time limit when it has one."""
        if self.estimate > 0:
            return min(self.runtime, self.estimate)
        return self.runtime


@mypyc_attr(allow_interpreted_subclasses=True)
class JobOutcome:
    """What happened to one job. ``start``/``end`` are None if it never ran; ``shares``:
    (node name, cores) held. One object per job, compared by identity. (A plain class with
    slots, not a dataclass: a dataclass's generated ``__init__`` stays interpreted Python in
    the native build.) The count oracle (``fastsim.py``, never compiled) subclasses it: a
    compiled class accepts interpreted subclasses only when it says so (``mypyc_attr``; a
    no-op in pure Python)."""

    __slots__ = ("cores", "end", "job", "rejected", "shares", "start")

    def __init__(self, job: SimJob, start: int | None = None, end: int | None = None,
                 cores: int = 0, shares: tuple[tuple[str, int], ...] = (),
                 rejected: str = "") -> None:
        self.job = job
        self.start = start
        self.end = end
        self.cores = cores
        self.shares = shares
        self.rejected = rejected

    def __repr__(self) -> str:
        return (f"JobOutcome(job={self.job!r}, start={self.start!r}, end={self.end!r}, "
                f"cores={self.cores!r}, shares={self.shares!r}, rejected={self.rejected!r})")

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.shares)

    @property
    def wait(self) -> int | None:
        return None if self.start is None else self.start - self.job.submit


class SimObserver(Protocol):
    """Receives the simulation's events (e.g. to persist them in the store). All optional
    in spirit: implement what you need, the engine calls every method."""

    def on_submit(self, job: SimJob, now: int) -> None: ...

    def on_start(self, job: SimJob, now: int, allocation: Any) -> None: ...

    def on_end(self, job: SimJob, now: int) -> None: ...

    def on_reject(self, job: SimJob, now: int, reason: str) -> None: ...


class Sample(NamedTuple):
    """State after the events of one instant (a named tuple: a long run makes one per
    instant, hundreds of thousands)."""

    time: int
    queued: int
    busy_cores: int


@dataclass
class SimRun:
    """Everything a run produced."""

    outcomes: list[JobOutcome]
    samples: list[Sample]
    total_cores: int
    cycles: int = 0
    full_cycles: int = 0
    matcher_calls: int = 0
    never_started: list[JobOutcome] = field(default_factory=list)


def simulate(
    jobs: Sequence[SimJob],
    scheduler: Scheduler,
    jobspec_for: Callable[[SimJob], Any],
    *,
    total_cores: int,
    min_cores_for: Callable[[SimJob], int] | None = None,
    observer: SimObserver | None = None,
    progress: Callable[[int], None] | None = None,
    reorder: Callable[[int, list[SimJob]], Sequence[int]] | None = None,
) -> SimRun:
    """Run ``jobs`` (any order; equal submit times keep their order) through ``scheduler``;
    ``jobspec_for`` builds the request.

    Events in the reference's order (``sim/README.md``, "Semantics"): at an instant, every
    submission (in trace order), then every termination (in the order the jobs started),
    each followed by its own scheduling cycle; under ``easy`` a submission whose job does
    not fit now runs none (the reference's rule). A reservation whose time has come and
    that no cycle of its instant started gets a cycle of its own (conservative's start
    event).

    ``reorder(now, waiting)``: a dynamic queue order (fair share): the positions of the
    waiting jobs (given in priority / submit order) in the order of this cycle.

    ``progress(n)`` is called with the number of jobs finished or rejected so far, now and
    then (for a progress bar). Jobs that can never start (the queue cannot even reserve them)
    are reported in ``SimRun.never_started`` instead of looping forever.
    """
    # The run keeps every job's records alive to the end (outcomes, heaps, samples) and makes
    # almost no reference cycles (full KTH-SP2: 5,210 objects in cycles under fcfs, 23 under
    # easy, 31 under conservative), so the cyclic collector's passes over the growing live
    # set find next to nothing and cost 15-20 % of a compiled run: it is paused for the run
    # (reference counting still frees everything else at once) and resumed as it was.
    collecting = gc.isenabled()
    gc.disable()
    try:
        driver = _Driver(jobs, scheduler, observer, reorder)
        return driver.run(jobspec_for, total_cores, min_cores_for, progress)
    finally:
        if collecting:
            _promote()
            gc.enable()


def _promote() -> None:
    """Move every object the collector tracks to its oldest generation, without a pass.

    With the collector paused, everything the run made is still in the youngest
    generation, so the first collection after the run (in the caller's next few
    allocations: the summary) would walk all of it, and a middle-generation one again
    later: about a tenth of a compiled full-KTH fcfs ``run_policy`` (``summarize`` took
    0.133 s of 0.6 s, 0.069 s with this move; a48bd94's build, one run each).
    Those objects are the run's records, kept by the caller; full collections still visit
    them (and free any cycle among them) as they visit every long-lived object.
    ``gc.freeze()`` + ``gc.unfreeze()`` does exactly the move (the permanent generation
    goes back into the oldest one); skipped if the process froze objects itself, which it
    may want kept frozen."""
    if gc.get_freeze_count() == 0:
        gc.freeze()
        gc.unfreeze()


class _Driver:
    """``simulate``'s state and its event handlers (the collector paused around ``run``).

    A class, not a function with nested ones: compiled, a method call is a direct C call
    with unboxed ints and an attribute a struct field, where a nested function is called
    through the Python protocol (its arguments boxed) on every start and every pass."""

    def __init__(self, jobs: Sequence[SimJob], scheduler: Scheduler,
                 observer: SimObserver | None,
                 reorder: Callable[[int, list[SimJob]], Sequence[int]] | None) -> None:
        self.scheduler = scheduler
        self.observer = observer
        self.reorder = reorder
        self.ordered = sorted(jobs, key=lambda j: j.submit)  # stable: trace order at one instant
        self.outcomes = {job.id: JobOutcome(job) for job in self.ordered}
        self.by_id = {job.id: job for job in self.ordered}
        name = scheduler.policy.name
        counted = scheduler.policy.reservation_style == "counted"
        self.easy = name == "easy"
        # fcfs in a static order: a pass starts jobs from the head while it fits now, so a
        # pass whose head does not fit now starts nothing (skipping it saves a walk of the
        # queue)
        self.head_gate = name == "fcfs" and reorder is None
        # ... and with counted reservations its pass is the scheduler's `start_from_head`:
        # the decisions of `Scheduler.cycle` in one loop (the operator calls `cycle`;
        # sim/README.md)
        self.head_pass = self.head_gate and counted
        # easy, counted reservations, a static order: a termination after which no waiting
        # job fits in the cores free now starts nothing; its pass is not run (the next one
        # walks the whole queue and places the head's reservation from what it sees:
        # sim/README.md)
        self.idle_gate = self.easy and reorder is None and counted
        # conservative's reservations are start events: a job keeps the rank of the
        # decision that set its planned start (ends at one instant come in the order jobs
        # started)
        self.planned = scheduler.policy.reservations is None
        self.ends: list[tuple[int, int, int, str]] = []  # heap of (end, start, decision, job id)
        # heap of (planned end, job id) of started jobs that run until their planned end
        self.windows: list[tuple[int, str]] = []
        self.due: list[tuple[int, str]] = []  # heap of (reserved start, job id); stale ones skipped
        self.plan: dict[str, tuple[int, int]] = {}  # job id -> (reserved start, decision)
        self.pending: dict[str, QueuedJob] = {}
        # pending jobs kept in queue order (keys and jobs side by side; a job leaves by
        # bisect, so a cycle does not rebuild the queue)
        self.keys: list[tuple[int, int, int]] = []
        self.queue: list[QueuedJob] = []
        self.key_of: dict[str, tuple[int, int, int]] = {}
        self.busy = 0  # cores held by running jobs
        self.done = 0  # jobs finished or rejected
        self.decision = 0  # rank of the last decision that set a start (see `ends`)
        # fcfs's gate, the cores free now in the core profile, kept in step with what
        # changes it (starts, expired windows, releases) instead of asked at every event;
        # -1: unknown (ask the profile). With no reservations (fcfs) the profile holds the
        # running jobs' windows only, and these are the only events that move the count at
        # `now`
        self.free = -1

    def start(self, queued: QueuedJob, allocation: Any, now: int) -> None:
        job = self.by_id[queued.id]
        outcome = self.outcomes[queued.id]
        outcome.start = now
        outcome.cores = cores = cores_of(allocation)
        outcome.shares = share_tuple(allocation)
        self.busy += cores
        if self.free >= 0:
            self.free -= cores
        plan = self.plan
        held = plan.pop(queued.id, None) if plan else None
        if held is not None and held[0] == now and self.planned:
            decision = held[1]
        else:
            self.decision += 1
            decision = self.decision
        runtime = job.effective_runtime
        heapq.heappush(self.ends, (now + runtime, now, decision, queued.id))
        if 0 < job.estimate <= runtime:
            # it runs to its planned end (killed at its limit): expired at that instant. A
            # job that ends earlier is released before then, and its expiry would do nothing
            heapq.heappush(self.windows, (now + job.estimate, queued.id))
        if self.observer is not None:
            self.observer.on_start(job, now, allocation)

    def reject(self, queued: QueuedJob, reason: str, now: int) -> None:
        self.outcomes[queued.id].rejected = reason
        self.scheduler.withdraw(queued.id)
        self.plan.pop(queued.id, None)
        self.done += 1
        if self.observer is not None:
            self.observer.on_reject(self.by_id[queued.id], now, reason)

    def run_cycle(self, now: int) -> None:
        queue = self.queue
        if not queue:
            # a pass over an empty queue decides nothing (no pass is counted). The scheduler
            # sees fewer cycles: a later one may walk in full where it would have been
            # incremental, which changes no decision (tests/test_sim.py)
            return
        scheduler = self.scheduler
        pending = self.pending
        key_of = self.key_of
        keys = self.keys
        if self.head_gate:
            free = self.free
            if free < 0:
                known = scheduler.free_now(now)
                free = self.free = -1 if known is None else known
            if 0 <= free < queue[0].cores:
                return
            if self.head_pass and free >= 0:
                # the scheduler's fcfs pass: the jobs it decided are the head of the queue
                started, rejected = scheduler.start_from_head(queue, now, free)
                for queued, allocation in started:
                    self.start(queued, allocation, now)
                for queued, reason in rejected:
                    self.reject(queued, reason, now)
                k = len(started) + len(rejected)
                for queued in queue[:k]:
                    del pending[queued.id]
                    del key_of[queued.id]
                del queue[:k]
                del keys[:k]
                return
        walk = queue
        reorder = self.reorder
        if reorder is not None and len(walk) > 1:
            by_id = self.by_id
            walk = [walk[p] for p in reorder(now, [by_id[q.id] for q in walk])]
        result = scheduler.cycle(walk, now, ordered=True, waiting=True)
        removed: set[str] = set()
        for queued, allocation in result.started:
            self.start(queued, allocation, now)
            removed.add(queued.id)
        plan = self.plan
        for queued, reservation in result.reserved:
            at = int(reservation.at)
            held = plan.get(queued.id)
            if held is None or held[0] != at:
                self.decision += 1
                plan[queued.id] = (at, self.decision)
                heapq.heappush(self.due, (at, queued.id))
        for queued, reason in result.unsatisfiable:
            self.reject(queued, reason, now)
            removed.add(queued.id)
        for job_id in removed:
            del pending[job_id]
            key = key_of.pop(job_id)
            j = bisect_left(keys, key)
            del keys[j]
            del queue[j]

    def next_due(self) -> int | None:
        due = self.due
        pending = self.pending
        plan = self.plan
        while due:
            at, job_id = due[0]
            if job_id in pending:
                held = plan.get(job_id)
                if held is not None and held[0] == at:
                    return at
            heapq.heappop(due)
        return None

    def run(
        self,
        jobspec_for: Callable[[SimJob], Any],
        total_cores: int,
        min_cores_for: Callable[[SimJob], int] | None,
        progress: Callable[[int], None] | None,
    ) -> SimRun:
        scheduler = self.scheduler
        observer = self.observer
        ordered = self.ordered
        outcomes = self.outcomes
        by_id = self.by_id
        easy = self.easy
        idle_gate = self.idle_gate
        ends = self.ends
        windows = self.windows
        pending = self.pending
        keys = self.keys
        queue = self.queue
        key_of = self.key_of
        samples: list[Sample] = []
        expired: set[str] = set()  # jobs whose window ended while running (cores already free)
        n = len(ordered)
        report_every = max(1, n // 200)
        next_report = report_every
        i = 0
        # the next reservation due, as found at the end of the last instant (nothing changes
        # between two instants, and the queue can only fill up within one: while it is not
        # empty this is next_due(), without asking again)
        at: int | None = None
        while i < n or ends or (pending and at is not None):
            # the next instant: the next submission, end or reservation due (explicit, not a
            # generator: this runs once per instant)
            nxt = ordered[i].submit if i < n else None
            if ends and (nxt is None or ends[0][0] < nxt):
                nxt = ends[0][0]
            if pending and at is not None and (nxt is None or at < nxt):
                nxt = at
            assert nxt is not None  # (the loop runs while one of the three exists)
            now = nxt
            while windows and windows[0][0] <= now:
                # jobs at their planned end end at this instant (never past their estimate):
                # free in the plan from its first event on, so free in the matcher too
                job_id = heapq.heappop(windows)[1]
                if scheduler.expire(job_id):
                    expired.add(job_id)
                    if self.free >= 0:
                        self.free += outcomes[job_id].cores
            while i < n and ordered[i].submit == now:
                job = ordered[i]
                i += 1
                if observer is not None:
                    observer.on_submit(job, now)
                least = min_cores_for(job) if min_cores_for else 0
                cores = least if min_cores_for else job.procs
                if cores > total_cores:
                    reason = too_big_reason(cores, total_cores)
                    outcomes[job.id].rejected = reason
                    self.done += 1
                    if observer is not None:
                        observer.on_reject(job, now, reason)
                    continue
                queued = QueuedJob(id=job.id, jobspec=jobspec_for(job), submit_time=job.submit,
                                   priority=job.priority,
                                   min_cores=least)
                pending[job.id] = queued
                key = (-job.priority, job.submit, i)
                key_of[job.id] = key
                if not keys or keys[-1] < key:
                    keys.append(key)
                    queue.append(queued)
                else:
                    j = bisect_left(keys, key)
                    keys.insert(j, key)
                    queue.insert(j, queued)
                if easy:
                    free = scheduler.free_now(now)
                    if free is not None and free < queued.cores:
                        continue  # easy: a submission that cannot start now runs no pass
                self.run_cycle(now)
            while ends and ends[0][0] == now:
                job_id = heapq.heappop(ends)[3]
                scheduler.release(job_id)
                outcome = outcomes[job_id]
                if job_id in expired:
                    expired.discard(job_id)
                elif self.free >= 0:
                    self.free += outcome.cores
                outcome.end = now
                self.busy -= outcome.cores
                self.done += 1
                if observer is not None:
                    observer.on_end(by_id[job_id], now)
                if idle_gate and queue and scheduler.starts_nothing(queue, now):
                    continue
                self.run_cycle(now)
            at = self.next_due() if pending and self.due else None
            if at is not None and at <= now:
                self.run_cycle(now)  # a reservation's time came and no cycle of this instant started it
                while pending and (at := self.next_due()) is not None and at <= now:
                    heapq.heappop(self.due)  # it could not start (the shape does not fit yet)
            # (what Sample(...) does, without its interpreted __new__: one per instant)
            samples.append(tuple.__new__(Sample, (now, len(pending), self.busy)))
            if progress is not None and self.done >= next_report:
                progress(self.done)
                next_report = self.done + report_every

        never = [outcomes[job_id] for job_id in pending]
        for outcome in never:
            outcome.rejected = outcome.rejected or "never started: the queue could not place it"
        if progress is not None:
            progress(n)
        return SimRun(
            outcomes=list(outcomes.values()),
            samples=samples,
            total_cores=total_cores,
            cycles=scheduler.cycles,
            full_cycles=scheduler.full_cycles,
            matcher_calls=scheduler.matcher_calls,
            never_started=never,
        )
