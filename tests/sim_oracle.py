"""A deliberately plain model of the reference backfilling simulator's semantics (pyss, as
used by Gaussier et al., SC'15), written for the tests: slow, obvious, no shortcuts.

It is the yardstick ``fluxnetes.sim.fastsim`` is checked against (tests/test_sim_fastsim.py)
and what the semantics in src/fluxnetes/sim/README.md say, step by step:

* events are ordered by (time, kind, creation counter) with kinds submission < termination
  < start; every submission and every termination is handled on its own (one scheduling
  pass per event, not per timestamp);
* the machine is a profile of free processors over time where a running job holds its
  processors until ``start + estimate``; a termination before that gives the tail back;
* fcfs starts jobs from the head of the queue while the head fits now;
* easy does the same, then reserves the head at its earliest fit, tries every other waiting
  job in queue order (a job starts now if it fits now for its whole estimate, given the
  head's reservation and the jobs started before it in this pass), and drops the head's
  reservation; a submission triggers a pass only if the new job fits now;
* conservative gives every job, at submission, the earliest fit given everything planned;
  a termination re-plans the waiting jobs one by one in submission order (each removed and
  placed at its earliest fit again, never later than before); a job is started by its start
  event, and a start event that no longer matches the job's planned start is stale.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field

SUBMIT, END, START = 1, 2, 3


@dataclass(eq=False)
class OJob:
    id: str
    submit: int
    run: int
    estimate: int
    procs: int
    start: int = -1


@dataclass
class Profile:
    """Free processors as a step function: ``free[i]`` holds from ``times[i]`` to
    ``times[i+1]`` (the last step lasts forever)."""

    total: int
    times: list[int] = field(default_factory=list)
    free: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.times = [0]
        self.free = [self.total]

    def _split(self, t: int) -> int:
        for i, s in enumerate(self.times):
            if s == t:
                return i
            if s > t:
                self.times.insert(i, t)
                self.free.insert(i, self.free[i - 1])
                return i
        self.times.append(t)
        self.free.append(self.free[-1])
        return len(self.times) - 1

    def change(self, start: int, end: int, delta: int) -> None:
        if end <= start:
            return
        i = self._split(start)
        j = self._split(end)
        for k in range(i, j):
            self.free[k] += delta
            assert 0 <= self.free[k] <= self.total

    def free_at(self, t: int) -> int:
        value = self.free[0]
        for s, f in zip(self.times, self.free, strict=True):
            if s > t:
                break
            value = f
        return value

    def fits(self, t: int, duration: int, procs: int) -> bool:
        end = t + duration
        if self.free_at(t) < procs:
            return False
        return all(f >= procs for s, f in zip(self.times, self.free, strict=True) if t < s < end)

    def earliest(self, t: int, duration: int, procs: int) -> int:
        for c in [t] + [s for s in self.times if s > t]:
            if self.fits(c, duration, procs):
                return c
        raise AssertionError("a job no larger than the machine always fits eventually")


def simulate(jobs: list[OJob], total: int, policy: str) -> dict[str, int]:
    """Start time of every job (job id -> start)."""
    counter = itertools.count()
    events: list[tuple[int, int, int, OJob]] = []
    for job in jobs:  # submissions are created in trace order
        heapq.heappush(events, (job.submit, SUBMIT, next(counter), job))
    profile = Profile(total)
    waiting: list[OJob] = []
    started: dict[str, int] = {}

    def assign(job: OJob, at: int) -> None:
        job.start = at
        profile.change(at, at + job.estimate, -job.procs)

    def unassign(job: OJob) -> None:
        profile.change(job.start, job.start + job.estimate, job.procs)

    def head_loop(now: int) -> list[OJob]:
        out = []
        while waiting and profile.free_at(now) >= waiting[0].procs:
            job = waiting.pop(0)
            assign(job, now)
            out.append(job)
        return out

    def easy_pass(now: int) -> list[OJob]:
        out = head_loop(now)
        if len(waiting) > 1:
            head = waiting[0]
            assign(head, profile.earliest(now, head.estimate, head.procs))
            for job in list(waiting[1:]):
                if profile.free_at(now) < job.procs:
                    continue
                if profile.earliest(now, job.estimate, job.procs) == now:
                    waiting.remove(job)
                    assign(job, now)
                    out.append(job)
            unassign(head)
        return out

    while events:
        now, kind, _, job = heapq.heappop(events)
        new: list[OJob] = []
        if kind == START:
            if job.start != now:
                continue  # stale (conservative moved the job earlier)
            started[job.id] = now
            heapq.heappush(events, (now + job.run, END, next(counter), job))
            continue
        if kind == SUBMIT:
            if policy == "conservative":
                waiting.append(job)
                assign(job, profile.earliest(now, job.estimate, job.procs))
                heapq.heappush(events, (job.start, START, next(counter), job))
                continue
            waiting.append(job)
            if policy == "fcfs":
                new = head_loop(now)
            elif profile.free_at(now) >= job.procs:
                new = easy_pass(now)
        else:  # END
            profile.change(job.start + job.run, job.start + job.estimate, job.procs)
            if policy == "conservative":
                waiting.remove(job)
                for other in list(waiting):
                    if other.start <= now:
                        continue  # planned to start now or earlier: it is running
                    before = other.start
                    unassign(other)
                    assign(other, profile.earliest(now, other.estimate, other.procs))
                    assert other.start <= before
                    if other.start != before:
                        heapq.heappush(events, (other.start, START, next(counter), other))
                continue
            new = head_loop(now) if policy == "fcfs" else easy_pass(now)
        for s in new:
            heapq.heappush(events, (now, START, next(counter), s))
    return started
