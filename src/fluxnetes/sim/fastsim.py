"""The reference backfilling semantics, fast: counted reservations on identical nodes.

This engine reproduces, decision for decision, the schedules of the reference simulator of
the backfilling literature (pyss, as used by Gaussier et al., SC'15 and the studies built on
it) for ``fcfs``, ``easy`` and ``conservative``, on a machine of identical nodes where a
reservation is a *count* of processors (or of whole nodes) from a time. The semantics, step
by step (src/fluxnetes/sim/README.md has the why):

* **Events.** Submissions, terminations and starts, ordered by (time, kind, creation order)
  with kinds submission < termination < start. Submissions at one instant come in trace
  order; terminations at one instant in the order their jobs started. Every submission and
  every termination is handled on its own: one scheduling pass per event, not per instant.
  A pass decides which jobs start; they start (take their nodes) at their start events,
  after every submission and termination of that instant.
* **The planning profile.** A job holds its processors from its start to ``start +
  estimate`` in the scheduler's view; when it ends earlier (its termination) the rest is
  given back. So at an instant where a job ends exactly at its estimate, its processors
  count as free from the first event of that instant on, before its termination is handled.
* **fcfs.** Every event: start jobs from the head of the queue while the head fits now.
* **easy.** Termination, or a submission whose job fits now: start jobs from the head while
  it fits; then, if two or more wait, the head gets its earliest start (the *shadow* time
  S, where enough running jobs have reached their estimated ends) and the processors free
  at S beyond what it needs (the *extra*); every other waiting job, in queue order, starts
  now if it fits now and either ends (by its estimate) by S or fits in the extra (which it
  then uses up). This is the profile test "fits now for its whole estimate given the head's
  reservation" in closed form.
* **conservative.** A submission gets its earliest fit given everything already planned
  (running jobs and every reservation). A termination that gives processors back re-plans
  the waiting jobs one by one in queue order: each is taken out and put back at its earliest
  fit, which is never later than before. Jobs planned to start at or before now are not
  touched.

Queue order is :func:`queue_key` (priority, then arrival): the one place to change it.
A dynamic order (fair share, ``sim/fairshare.py``) is the ``reorder`` hook instead: before
every fcfs / easy pass the waiting jobs are put in the hook's order, so the head EASY
reserves for is the head of that order; the pass itself is unchanged.

Placement is real: the machine's nodes are handed out by a free list (the most recently
freed first, lowest numbered first at the start), so every outcome names its nodes. Counted
reservations on identical nodes make the count the only thing that decides *when*; *where*
never changes it. The general engine (``engine.py``: the queue's Scheduler and the graph
matcher) handles everything else (pinned reservations, hybrid, unequal nodes).
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, bisect_right, insort
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import accumulate, islice

from fluxnetes.sim.engine import JobOutcome, Sample, SimJob, SimObserver, SimRun
from fluxnetes.sim.profile import CountProfile

FAST_POLICIES = ("fcfs", "easy", "conservative")
_NEVER = 1 << 62  # later than any event

#: ``reorder(now, waiting jobs in the current order) -> their positions in the new order``
Reorder = Callable[[int, list[SimJob]], Sequence[int]]


def queue_key(job: SimJob, arrival: int) -> tuple[int, int, int]:
    """The order jobs wait in: priority (higher first), submit time, then arrival (trace
    order). With equal priorities this is the reference's first-come-first-served order."""
    return (-job.priority, job.submit, arrival)


@dataclass(frozen=True, slots=True)
class Share:
    """The part of one node a job holds (what ``fluxnetes.match`` calls a NodeShare)."""

    name: str
    cores: int


@dataclass(frozen=True, slots=True)
class Placement:
    """What the observer's ``on_start`` gets: a match-result-like allocation."""

    jobid: str
    at: int
    duration: int
    nodes: tuple[Share, ...]
    status: str = "ALLOCATED"
    reason: str = ""


class _Job(JobOutcome):
    """A job's outcome plus its state in the engine (one object per job: this is the hot
    path). ``plan`` is the start the scheduler assigned (-1: none yet); ``pred_end`` is
    ``plan + estimate``; ``held`` the units it holds while running."""

    __slots__ = ("est", "held", "key", "plan", "pred_end", "run", "units")

    def __init__(self, sim: SimJob, units: int, key: tuple[int, int, int]) -> None:
        JobOutcome.__init__(self, sim)
        self.units = units
        self.est = sim.estimate
        est = sim.estimate
        self.run = sim.runtime if sim.runtime < est else est  # never past its limit
        self.key = key
        # plan, pred_end and held are set when the job is planned / started (saves work
        # per job: a trace has hundreds of thousands)
        self.plan: int
        self.pred_end: int
        self.held: list[int]


def fast_path_reason(jobs: Sequence[SimJob], node_cores: Sequence[int], policy: str,
                     reservation_style: str) -> str:
    """Why this run cannot take the fast engine ("" = it can)."""
    if policy not in FAST_POLICIES:
        return f"policy {policy} (the fast engine runs {', '.join(FAST_POLICIES)})"
    if reservation_style != "counted":
        return "pinned reservations"
    if not node_cores or len(set(node_cores)) != 1 or node_cores[0] < 1:
        return "nodes of different sizes"
    for job in jobs:
        if job.estimate < 1:
            return f"job {job.id} has no estimate (unknown requested time)"
        if job.runtime < 0:
            return f"job {job.id} has no run time"
    return ""


def simulate_fast(
    jobs: Sequence[SimJob],
    policy: str,
    *,
    node_names: Sequence[str],
    cores_per_node: int,
    whole_nodes: bool = False,
    observer: SimObserver | None = None,
    progress: Callable[[int], None] | None = None,
    reorder: Reorder | None = None,
) -> SimRun:
    """Replay ``jobs`` under ``policy`` (fcfs, easy, conservative) on ``len(node_names)``
    nodes of ``cores_per_node`` cores. A job of P processors takes P cores anywhere, or with
    ``whole_nodes`` ceil(P / cores) whole nodes. Jobs larger than the machine are rejected
    at submission. Every job needs an estimate >= 1 (see :func:`fast_path_reason`).

    ``reorder(now, waiting)`` (fcfs and easy only): called before every pass with two or
    more jobs waiting (in the current order) of which one at least fits now (otherwise the
    pass starts nothing in any order); returns the positions of those jobs in the order to
    use for this pass (a permutation of ``range(len(waiting))``)."""
    if policy not in FAST_POLICIES:
        raise ValueError(f"simulate_fast: policy {policy!r} is not one of {FAST_POLICIES}")
    if reorder is not None and policy == "conservative":
        raise ValueError("simulate_fast: reorder works with fcfs and easy (conservative plans "
                         "each job when it is submitted)")
    per = cores_per_node
    nodes = len(node_names)
    total = nodes if whole_nodes else nodes * per
    total_cores = nodes * per
    # unit -> node name; units are nodes (whole_nodes) or cores (node = unit // per)
    unit_name = list(node_names) if whole_nodes else [node_names[u // per] for u in range(total)]
    unit_cores = per if whole_nodes else 1
    # the (node, cores) pair of each unit, made once: a job's shares are references to these
    share_of = [(name, unit_cores) for name in unit_name].__getitem__
    spread = unit_cores == 1 and per > 1  # a job's cores may share nodes: count them per node
    free_units = list(range(total - 1, -1, -1))  # a stack: pop from the end (lowest first)

    order = sorted(range(len(jobs)), key=lambda i: jobs[i].submit)  # stable: trace order
    states = [
        _Job(jobs[i], -(-jobs[i].procs // per) if whole_nodes else jobs[i].procs,
             queue_key(jobs[i], arrival))
        for arrival, i in enumerate(order)
    ]
    n = len(states)

    engine = _Engine(policy, total) if reorder is None else _ReorderingEngine(policy, total, reorder)
    submit, terminate = engine.submit, engine.terminate
    push, pop = heapq.heappush, heapq.heappop
    ends: list[tuple[int, int, _Job]] = []  # (time, creation, job): terminations
    starts: list[tuple[int, int, _Job]] = []  # (time, creation, job): start events
    seq = 0
    raw_samples: list[tuple[int, int, int]] = []
    busy = 0
    queued = 0  # submitted, not started, not rejected
    done = 0
    report_every = max(1, n // 200)
    next_report = report_every if progress is not None else n + 1
    last_t = -1
    i = 0
    t_sub = states[0].job.submit if n else _NEVER

    while True:
        t_end = ends[0][0] if ends else _NEVER
        t_start = starts[0][0] if starts else _NEVER
        if t_sub <= t_end and t_sub <= t_start:
            if t_sub == _NEVER:
                break
            kind = 1
            now = t_sub
        elif t_end <= t_start:
            kind = 2
            now = t_end
        else:
            kind = 3
            now = t_start
        if now != last_t:
            if last_t >= 0:
                raw_samples.append((last_t, queued, busy))
            last_t = now

        if kind == 3:
            job = pop(starts)[2]
            if job.plan != now:
                continue  # stale: conservative moved this job earlier
            k = job.units
            cut = len(free_units) - k
            held = free_units[cut:]
            held.reverse()  # lowest first
            del free_units[cut:]
            job.held = held
            queued -= 1
            job.start = now
            cores = job.cores = k * unit_cores
            busy += cores
            if spread:
                counts: dict[str, int] = {}
                for u in held:
                    name = unit_name[u]
                    counts[name] = counts.get(name, 0) + 1
                job.shares = tuple(counts.items())
            else:
                job.shares = tuple(map(share_of, held))
            seq += 1
            push(ends, (now + job.run, seq, job))
            if observer is not None:
                observer.on_start(job.job, now, Placement(
                    job.job.id, now, job.est, tuple(Share(a, b) for a, b in job.shares)))
            continue

        if kind == 1:
            job = states[i]
            i += 1
            t_sub = states[i].job.submit if i < n else _NEVER
            if observer is not None:
                observer.on_submit(job.job, now)
            if job.units > total:
                job.rejected = f"needs {job.units * unit_cores} cores; the whole graph has {total_cores}"
                done += 1
                if observer is not None:
                    observer.on_reject(job.job, now, job.rejected)
                continue
            queued += 1
            started = submit(job, now)
        else:
            job = pop(ends)[2]
            free_units.extend(reversed(job.held))  # reused first, in the same order
            job.held = []
            job.end = now
            busy -= job.cores
            done += 1
            if observer is not None:
                observer.on_end(job.job, now)
            started = terminate(job, now)
        for s in started:
            seq += 1
            push(starts, (s.plan, seq, s))
        if done >= next_report and progress is not None:
            progress(done)
            next_report = done + report_every

    if last_t >= 0:
        raw_samples.append((last_t, queued, busy))
    never: list[JobOutcome] = []
    for job in states:  # cannot happen with jobs no larger than the machine
        if job.start is None and not job.rejected:
            job.rejected = "never started: the queue could not place it"
            never.append(job)
    if progress is not None:
        progress(n)
    outcomes: list[JobOutcome] = list(states)
    return SimRun(
        outcomes=outcomes,
        samples=list(map(Sample._make, raw_samples)),
        total_cores=total_cores,
        cycles=engine.passes,
        full_cycles=engine.passes,
        matcher_calls=0,
        never_started=never,
    )


class _Engine:
    """The scheduler's view: the waiting queue and the planning profile; ``submit`` and
    ``terminate`` run the policy's pass and return the jobs given a start event."""

    def __init__(self, policy: str, total: int) -> None:
        self.policy = policy
        self.total = total
        self.waiting: list[_Job] = []
        self.passes = 0
        # fcfs / easy: what running jobs hold, by estimated end (no future reservations)
        self.used = 0
        self.ending_at: dict[int, int] = {}
        # running jobs sorted by estimated end: the ends and the units, as parallel lists
        # (bisect on the ends, C-level sums and prefix sums on the units)
        self.run_end: list[int] = []
        self.run_units: list[int] = []
        # conservative: running jobs and reservations in one profile
        self.profile = CountProfile(total) if policy == "conservative" else None
        self.dirty = False  # processors came back since the last re-plan that moved nothing

    # ------------------------------------------------------------------ fcfs / easy

    def _free_now(self, now: int) -> int:
        # running jobs at their estimated end at `now` already count as free
        return self.total - self.used + self.ending_at.get(now, 0)

    def _assign_now(self, job: _Job, now: int) -> None:
        job.plan = now
        pe = job.pred_end = now + job.est
        u = job.units
        self.used += u
        self.ending_at[pe] = self.ending_at.get(pe, 0) + u
        k = bisect_right(self.run_end, pe)
        self.run_end.insert(k, pe)
        self.run_units.insert(k, u)

    def _enqueue(self, job: _Job) -> None:
        waiting = self.waiting
        if not waiting or waiting[-1].key < job.key:
            waiting.append(job)
        else:
            insort(waiting, job, key=lambda j: j.key)

    def submit(self, job: _Job, now: int) -> list[_Job]:
        self._enqueue(job)
        if self.policy == "conservative":
            return self._plan(job, now)
        if self.policy == "fcfs":
            return self._head(now)
        if self._free_now(now) >= job.units:
            return self._easy(now)
        return []

    def terminate(self, job: _Job, now: int) -> list[_Job]:
        if self.policy == "conservative":
            return self._replan(job, now)
        u = job.units
        pe = job.pred_end
        self.used -= u
        left = self.ending_at[pe] - u
        if left:
            self.ending_at[pe] = left
        else:
            del self.ending_at[pe]
        run_end = self.run_end
        lo = bisect_left(run_end, pe)
        k = self.run_units.index(u, lo, bisect_right(run_end, pe, lo))  # any equal entry
        del run_end[k]
        del self.run_units[k]
        if self.policy == "fcfs":
            return self._head(now)
        return self._easy(now)

    def _head(self, now: int) -> list[_Job]:
        self.passes += 1
        waiting = self.waiting
        free = self._free_now(now)
        k = 0
        while k < len(waiting) and waiting[k].units <= free:
            job = waiting[k]
            free -= job.units
            self._assign_now(job, now)
            k += 1
        if not k:
            return []
        started = waiting[:k]
        del waiting[:k]
        return started

    def _easy(self, now: int) -> list[_Job]:
        started = self._head(now)
        waiting = self.waiting
        if len(waiting) < 2:
            return started
        free = self._free_now(now)
        if free <= 0:
            return started
        # the head's shadow time and extra processors (running jobs, by estimated end)
        head = waiting[0]
        need = head.units
        run_end = self.run_end
        idx = bisect_right(run_end, now)
        # the shadow: the first estimated end at which enough running jobs have ended
        acc = list(accumulate(islice(self.run_units, idx, None)))
        k = bisect_left(acc, need - free)
        pe = run_end[idx + k]
        last = bisect_right(run_end, pe, idx + k) - 1  # every job ending at that instant
        extra = free + acc[last - idx] - need
        shadow = pe
        kept = [head]
        backfilled: list[_Job] = []
        for pos in range(1, len(waiting)):
            job = waiting[pos]
            u = job.units
            if u <= free and (now + job.est <= shadow or u <= extra):
                free -= u
                if now + job.est > shadow:
                    extra -= u
                backfilled.append(job)
                if free == 0:
                    kept.extend(waiting[pos + 1:])
                    break
            else:
                kept.append(job)
        if backfilled:
            for job in backfilled:
                self._assign_now(job, now)
            self.waiting = kept
            started.extend(backfilled)
        return started

    # ------------------------------------------------------------------ conservative

    def _plan(self, job: _Job, now: int) -> list[_Job]:
        profile = self.profile
        assert profile is not None
        self.passes += 1
        profile.advance(now)
        at = profile.earliest(now, job.est, job.units)
        profile.add(at, at + job.est, -job.units)
        job.plan = at
        job.pred_end = at + job.est
        return [job]

    def _replan(self, ended: _Job, now: int) -> list[_Job]:
        profile = self.profile
        assert profile is not None
        self.waiting.remove(ended)
        profile.advance(now)
        if now < ended.pred_end:
            profile.add(now, ended.pred_end, ended.units)  # the tail it will not use
            self.dirty = True
        if not self.dirty:
            # the last re-plan moved nothing and nothing came back since: every waiting
            # job is already at its earliest fit (the profile only lost room), skip the pass
            return []
        self.passes += 1
        moved: list[_Job] = []
        for job in self.waiting:
            old = job.plan
            if old <= now:
                continue  # planned to start now or earlier: it is running
            est = job.est
            u = job.units
            at = profile.earliest_before(now, est, u, old)
            if at is None:
                continue  # its planned start is still its earliest fit
            profile.add(old, old + est, u)
            profile.add(at, at + est, -u)
            job.plan = at
            job.pred_end = at + est
            moved.append(job)
        self.dirty = bool(moved)
        return moved


class _ReorderingEngine(_Engine):
    """fcfs / easy with a dynamic queue order: the waiting jobs are put in ``reorder``'s
    order at the start of every pass (``_head`` begins both), then the pass runs as is. A
    separate class, so the default engine's hot path carries no check."""

    def __init__(self, policy: str, total: int, reorder: Reorder) -> None:
        super().__init__(policy, total)
        self.reorder = reorder

    def _enqueue(self, job: _Job) -> None:
        self.waiting.append(job)  # the order is set at the next pass

    def _head(self, now: int) -> list[_Job]:
        waiting = self.waiting
        # a pass in which no waiting job fits now starts nothing, in any order (neither the
        # head nor a backfill): skip the reorder (the next pass that can start a job sorts)
        if len(waiting) > 1 and self._free_now(now) >= min(j.units for j in waiting):
            positions = self.reorder(now, [j.job for j in waiting])
            if len(positions) != len(waiting) or set(positions) != set(range(len(waiting))):
                raise ValueError("reorder: must return a permutation of the waiting jobs' positions")
            self.waiting = [waiting[p] for p in positions]
        return super()._head(now)
