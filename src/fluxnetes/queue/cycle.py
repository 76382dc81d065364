"""The scheduling cycles of a long-running queue: ``Scheduler``.

It wraps the walk (``walk.py``: ``_walk``, ``schedule_cycle``, ``CycleResult``) for
long-running users (the simulator, the operator, the store's service): what it remembers
between cycles (the reservations of the previous cycle, the allocations of running jobs, to
release them) and the calls that change that between cycles are ``book.py``'s
``SchedulerBook``; here are the cycles, which skip work whose answer is known (see its
docstring; parking hints: ``hints.py``).
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable, Iterable, Sequence
from itertools import islice
from typing import Any

from mypy_extensions import mypyc_attr

from fluxnetes.queue.book import SchedulerBook, _Last, _Running
from fluxnetes.queue.hints import (
    UNTIL_RELEASED,
    _Hints,
    _resources_key,
    _signature,
    _slot_cores,
    _until_released,
)
from fluxnetes.queue.job import QueuedJob, queue_order
from fluxnetes.queue.protocol import cores_of, shares_of, status_name
from fluxnetes.queue.walk import (
    CountedReservation,
    CycleResult,
    _reserved_key,
    _Walk,
    _walk,
    job_duration,
    schedule_cycle,
    too_big_reason,
    unsatisfiable_head,
)

__all__ = [
    "UNTIL_RELEASED",
    "CountedReservation",
    "CycleResult",
    "Scheduler",
    "job_duration",
    "schedule_cycle",
]

# matcher policies whose child order depends on the order of past updates (match/engine.py:
# stop_on_1, "availability-weighted by_outedges")
DYNAMIC_ORDER_POLICIES = frozenset({"first", "firstnodex"})


@mypyc_attr(allow_interpreted_subclasses=True)  # tests subclass it to observe its calls
class Scheduler(SchedulerBook):
    """Owns a matcher and the queue's bookkeeping between cycles.

    * ``cycle(pending, now)``: run a cycle, remember its reservations and allocations.
    * ``release(job_id)``: a running job ended (or ended early): cancel its allocation now,
      so the next cycle can use it. ``partial_release`` gives back part of it.
    * ``freed(nodes)``: the caller itself gave resources back in the matcher (cancel,
      partial_cancel, a foreign allocation re-recorded smaller) on these nodes (None:
      somewhere).
    * ``withdraw(job_id)``: a pending job left the queue: drop its reservation.
    * ``invalidate()``: something outside the queue changed the graph (node up/down/added,
      resized): the next cycle starts from scratch.

    Cycle modes (``CycleResult.mode``):

    * ``reset`` - qmanager: cancel every reservation, walk the queue. Used for the first
      cycle, after ``invalidate()``, a policy change, or when a job arrived ahead of jobs
      already walked (higher priority). With pinned reservations and ``parking`` (default)
      every cycle that is not ``idle`` or ``incremental`` is a reset walk in which parked
      jobs are answered without the matcher (below).
    * ``idle`` (pinned, ``parking``) - nothing was freed, the previous cycle started
      nothing, no time boundary was passed and the queue's head is the jobs walked last
      time, in the same order: a reset walk would ask the matcher the same questions of
      the same state and get the same answers, so the previous answers are returned
      (reservations stay in the matcher) and no matcher call is made.
    * ``incremental`` (pinned with ``parking``: as ``idle`` but new jobs were appended
      behind a walk that had reached the end of the queue: only they are walked; counted
      with ``incremental=True``: nothing was released and every new job sorts after the
      jobs already walked; assumes no running job outlives its duration).
    * ``compress`` (counted reservations, with ``capacity_cores``) - after releases: walk
      the queue in the same order, but a job keeps its reservation when the core profile
      proves that no placement can start earlier; otherwise it is cancelled and matched
      again (it can only move earlier, since its old slot is still free). This is the
      classic conservative-backfilling compression (Mu'alem & Feitelson): no reservation
      is ever delayed. Pinned reservations are recomputed in every non-idle cycle
      (qmanager), since keeping a placement changes which nodes later jobs may backfill on.

    Parking (pinned reservations, ``parking=True``; Fluxion's qmanager blocks jobs the same
    way). A job the previous cycle found unable to start now (BUSY or reserved) is
    *parked*: when this cycle would ask it a plain ``allocate`` (not a reservation), the
    answer is BUSY without a call unless it is *woken*. The argument: its answer was BUSY
    in the state it saw then; the state it sees now differs only by what was freed (the
    nodes in ``freed``) and by allocations and reservations added (which cannot make a
    BUSY job fit). A placement that avoids every freed node would have fitted then, so it
    can only fit now if one slot of it fits on a freed node. It is woken when:

    * something was freed on a node that has room for one of its slots now (the node's
      cores minus those held by this scheduler's running jobs >= the job's smallest slot's
      cores): a ``release``/``partial_release``/``freed(nodes)``, a withdrawn job's
      reservation, a running job the caller dropped from ``running`` itself;
    * a reservation ahead of it (made by the previous cycle) is not held again exactly
      (same start, same vertices) in this walk: the old reservation's nodes count as freed;
    * anywhere (every parked job): ``invalidate()``, a policy change, ``adopt``,
      ``freed(None)``, a node the scheduler does not know the cores of
      (``node_cores``), ``now`` reaching the planned end of a running job or the start of
      a reservation, or the surviving jobs changing their relative order (a priority
      change): the jobs ahead of it are then not the ones it saw.

    A job asked for a reservation (``allocate_orelse_reserve``: EASY's head, every
    conservative job) is asked the matcher in every cycle that is not ``idle``, except
    when nothing in the matcher ends by itself (``_Hints.forever``, the Kubernetes default
    of unknown durations): then "reserve" has the answer of "start now", and a parked job
    is BUSY as above. Within a walk, once a request shape could not start, a later plain
    ``allocate`` of the same shape (resources, constraint, duration) is BUSY too (the walk
    only adds). None of this changes a decision (tests/test_queue_parking.py);
    ``parking=False`` is the old full re-evaluation (benchmarks).

    ``capacity_cores`` (the graph's total cores) turns on the core profile
    (``profile.py``): jobs whose cores exceed what is free over their window are skipped
    without a matcher call; a job asking more cores than the graph has is unsatisfiable.
    ``node_cores`` (cores per node name) makes that check node-aware (reservations pin
    specific nodes) and lets parking wake jobs per node. Both only ever skip calls whose
    answer would be BUSY.
    """
    def _prefix(self, order: Sequence[QueuedJob]) -> int | None:
        """If the jobs walked last time (still pending) lead ``order`` in the same order,
        their number; else None."""
        walk = self._walk
        if walk is None or self._reset:
            return None
        # one pass over both lists, with no set of the whole queue: a job walked last time
        # either is next in ``order`` or left the queue (started, rejected, withdrawn). A
        # pending one skipped (the order changed) is in ``order`` past every match, so only
        # the part behind the matches is searched for the skipped ones (commonly the jobs
        # that arrived since the last walk)
        n = len(order)
        p = 0
        left: set[str] | None = None
        for job_id in walk.order:
            if p < n and order[p].id == job_id:
                p += 1
            elif left is None:
                left = {job_id}
            else:
                left.add(job_id)
        if left is not None:
            for k in range(p, n):
                if order[k].id in left:
                    return None
        return p

    def cycle(self, pending: Iterable[QueuedJob], now: int, *, ordered: bool = False,
              waiting: bool = False) -> CycleResult:
        """Run one cycle over ``pending`` (the jobs waiting now) at time ``now``.
        ``ordered=True``: ``pending`` is already in queue order (saves a sort);
        ``waiting=True``: it holds no running job (saves a pass over the queue)."""
        if ordered and waiting and isinstance(pending, list):
            jobs = pending  # (read only here: no copy of the whole queue per cycle)
        else:
            jobs = list(pending) if ordered else queue_order(list(pending))
        order = jobs if waiting else [job for job in jobs if job.id not in self.running]
        self.cycles += 1
        if self._unplanned:
            self._plan_started()
        if self.parking and self._policy.reservation_style == "pinned":
            return self._pinned_cycle(order, now)
        prefix = self._prefix(order)
        walk = self._walk
        counted = self._policy.reservation_style == "counted"
        passed = counted and self._end_passed(now)
        reservations = self.reservations
        due: list[str] = []
        if reservations and self._due_from <= now:
            due = [job.id for job in order[:prefix or 0]
                   if job.id in reservations and int(reservations[job.id].at) <= now]
            # (exact again: the earliest start held now)
            self._due_from = min(int(res.at) for res in reservations.values())
        if (
            prefix is not None
            and walk is not None
            and self.incremental
            and counted  # see compress below
            and not self._released
            # every waiting job holds its own reservation (conservative): a new job is
            # planned alone and a reservation whose time came is started alone; with a
            # limited number of reservations (easy, hybrid) the next job would take the
            # started one's place, and with none (fcfs) a running job reaching its planned
            # end frees room for jobs walked before: both need the whole walk
            and (self._policy.reservations is None or not (due or passed))
        ):
            # (order[:prefix] is walk.order without the jobs that left, in the same order,
            # so the last job walked is still there iff it ends that prefix)
            if walk.stopped and walk.order and (not prefix or order[prefix - 1].id != walk.order[-1]):
                prefix = None  # the fcfs head that stopped the last walk left: walk again
            else:
                result = CycleResult(now=now, mode="incremental")
                if due:
                    came = {job_id: self.reservations.pop(job_id) for job_id in due}
                    _walk([job for job in order[:prefix] if job.id in came], self.matcher, now,
                          self._policy, _Walk(), result, self.profile, came, self._satisfiable)
                if prefix != len(walk.order):  # (else order[:prefix] is walk.order already)
                    walk.order = [job.id for job in order[:prefix]]
                walk.considered = prefix
                held = self.reservations
                if not held:
                    walk.reservations = 0
                elif len(held) <= 4:
                    walk.reservations = sum(1 for job_id in held if job_id in walk.order)
                else:
                    walk.reservations = len(held.keys() & set(walk.order))
                _walk(islice(order, prefix, None), self.matcher, now, self._policy, walk, result,
                      self.profile, None, self._satisfiable)
                self._record(result)
                self._released = False
                return result
        self.full_cycles += 1
        # reservations of jobs no longer pending are dropped. When every job walked last
        # time is still pending (prefix == its number) and each reservation's job is one of
        # them, none is to drop: checked against that list (a reservation or a few: easy's
        # head) instead of building a set of the whole queue in every cycle
        walked = walk.order if walk is not None and prefix is not None \
            and prefix == len(walk.order) else None
        if self.reservations and (walked is None
                                  or not all(job_id in walked for job_id in self.reservations)):
            pending_ids = {job.id for job in order}
            for job_id in [j for j in self.reservations if j not in pending_ids]:
                self._cancel_reservation(job_id)
        # Compression (and the incremental walk above) only for counted reservations (a
        # number of cores from a time, held in the profile). A pinned reservation also fixes
        # *which* nodes are held, and the matcher's choice depends on `now` (e.g. `first`
        # orders by availability): keeping it while a reset would re-place it elsewhere
        # changes what later jobs can backfill, so pinned reservations are recomputed every
        # cycle, exactly as qmanager does.
        compress = (
            prefix is not None
            and self.profile is not None
            and walk is not None
            and not walk.unreservable
            and self._policy.reservation_style == "counted"
        )
        keep: dict[str, Any] | None = None
        if compress:
            keep = dict(self.reservations)
            self.reservations.clear()
        else:
            for job_id in list(self.reservations):
                self._cancel_reservation(job_id)
        result = CycleResult(now=now, mode="compress" if compress else "reset")
        walk = _Walk()
        _walk(order, self.matcher, now, self._policy, walk, result, self.profile, keep,
              self._satisfiable)
        for job_id, res in (keep or {}).items():  # reserved jobs the walk did not reach
            if res.jobid is not None:
                self.matcher.cancel(res.jobid)
                result.matcher_calls += 1
            if self.profile is not None:
                self.profile.remove(_reserved_key(job_id))
        self._walk = walk
        self._reset = False
        self._released = False
        self._record(result)
        return result

    def starts_nothing(self, queue: Sequence[QueuedJob], now: int) -> bool:
        """(simulator) Would a ``cycle`` over ``queue`` at ``now`` start and reject nothing,
        for certain? True with counted reservations, none held starting by ``now``, and
        every waiting job needing more cores than the core profile has free at ``now``:
        then no job fits now by count, so the walk asks the matcher nothing (a head that
        cannot start gets its counted reservation from the profile alone) and only places
        the head's reservation. The caller may skip such a cycle right after a ``release``:
        the next cycle then walks in full (something was released since the last one), and
        places that reservation from the state it sees. O(len(queue)), no matcher call."""
        if self._policy.reservation_style != "counted" or self.profile is None:
            return False
        if self.reservations and self._due_from <= now:
            return False  # (a lower bound: maybe one is due; then the cycle starts it)
        free = self.free_now(now)
        if free is None:
            return False
        return all(job.cores > free for job in queue)

    def start_from_head(
        self, queue: Sequence[QueuedJob], now: int, free: int
    ) -> tuple[list[tuple[QueuedJob, Any]], list[tuple[QueuedJob, str]]]:
        """fcfs, counted reservations, a static queue order: the decisions of
        ``cycle(queue, now, ordered=True, waiting=True)`` in one loop, without the walk's
        layers (``_walk``, ``CycleResult``, the incremental bookkeeping). The simulator's
        fcfs path; the operator calls ``cycle``.

        ``queue``: the waiting jobs in queue order; ``free``: the cores free at ``now`` in the
        core profile, as the caller keeps them (``free_now`` tells it once; starts take,
        expired windows and releases give back). fcfs holds no reservation, so every span in
        the profile starts at or before ``now``, and a job fits over its whole window iff
        it fits at ``now``: ``free`` answers ``fits_now`` without the profile.

        Jobs from the head start while the matcher places them; the first that cannot start
        stops the pass, after the satisfiability check ``cycle`` makes (once per job and
        request shape: a job that can never run is rejected and the pass goes on). Returns
        (started with their allocations, rejected with the reason): together the first
        jobs of ``queue``, in order. Rejected jobs stay known to the scheduler until
        ``withdraw``, as after ``cycle``."""
        profile = self.profile
        policy = self._policy
        if policy.name != "fcfs" or policy.reservation_style != "counted" or profile is None \
                or self.reservations:
            raise ValueError("Scheduler.start_from_head: only for fcfs with counted "
                             f"reservations and none held (policy {policy.name}, "
                             f"{policy.reservation_style}, {len(self.reservations)} held)")
        started: list[tuple[QueuedJob, Any]] = []
        rejected: list[tuple[QueuedJob, str]] = []
        self.cycles += 1
        stuck = self._stuck
        if stuck is not None and queue and stuck[0] == queue[0].id and free <= stuck[1] \
                and not self._released and not self._reset:
            # the head stopped the last pass, and since then nothing came back (no release,
            # no window ended: the count did not rise; the graph is the same): the matcher
            # would answer BUSY again (`cycle` skips it the same way: its incremental walk)
            return started, rejected
        matcher = self.matcher
        running = self.running
        capacity = profile.capacity
        depth = policy.queue_depth
        sat = self._satisfiable
        unplanned = self._unplanned
        calls = 0
        self._stuck = None
        for job in queue if depth is None else islice(queue, depth):
            cores = job.cores
            if cores > capacity:
                rejected.append((job, too_big_reason(cores, capacity)))
                continue
            answer: Any = None
            status = "BUSY"
            if cores <= free:
                answer = matcher.allocate(job.jobspec, now=now)
                calls += 1
                status = status_name(answer)
            if status == "ALLOCATED":
                held = cores_of(answer)
                running[job.id] = _Running(answer, held)
                unplanned[job.id] = (now, job.duration, held)  # (see _unplanned)
                free -= held
                started.append((job, answer))
                continue
            if status == "UNSATISFIABLE":
                rejected.append((job, str(getattr(answer, "reason", "") or "unsatisfiable")))
                continue
            # BUSY: is it satisfiable at all (as the walk asks) before it blocks the queue?
            reason, asked = unsatisfiable_head(matcher, job, sat)
            calls += asked
            if reason:
                rejected.append((job, reason))
                continue
            self._stuck = (job.id, free)
            break
        self.matcher_calls += calls
        self._released = False
        self._reset = False
        # no walk is remembered: a later `cycle` walks the whole queue (and its planned-end
        # heap, which this pass does not feed, is only read for an incremental one)
        self._walk = None
        return started, rejected

    # ------------------------------------------------------------------ parking (pinned)
    def _shape(self, job: QueuedJob) -> tuple[Hashable, int]:
        """(what a match of the job depends on, cores of its smallest slot), cached while
        the job keeps the same jobspec object."""
        known = self._shapes.get(job.id)
        if known is not None and known[0] is job.jobspec:
            return known[1], known[2]
        js = job.jobspec
        resources = getattr(js, "resources", None)
        key: Hashable
        if resources is None:
            key = ("job", job.id)  # unknown request type: never shared
            need = 0
        else:
            key = (_resources_key(resources), repr(getattr(js, "constraint", None)),
                   job.duration)
            need = min(_slot_cores(resources), default=0)
        self._shapes[job.id] = (js, key, need)
        return key, need

    def _woken(self, job: QueuedJob, freed: set[str]) -> bool:
        """Could one of the ``freed`` nodes hold one slot of ``job`` now? Its cores minus
        those held by our running jobs is an over-estimate of what is free there (foreign
        use and reservations are not counted), so a False is certain."""
        if not freed:
            return False
        need = self._shape(job)[1]
        if need <= 0:
            return True
        used = self._used
        for name in freed:
            cap = self._node_cap.get(name)
            if cap is None or cap - used.get(name, 0) >= need:
                return True
        return False

    def _forever(self) -> bool:
        """Does nothing in the matcher end by itself? No reservation, none of our running
        jobs has a planned end, and (when the matcher lists its jobs, as
        ``fluxnetes.match.Matcher`` does) no job recorded by someone else has one either
        (e.g. groups the operator re-recorded with ``update_allocate`` after a restart)."""
        if self._finite or self.reservations:
            return False
        earliest = getattr(self.matcher, "earliest_end", None)
        count = getattr(self.matcher, "reservation_count", None)
        if callable(earliest) and callable(count):  # answered from its indexes, not a walk
            end = earliest()
            return bool(count() == 0 and (end is None or end >= UNTIL_RELEASED))
        jobs = getattr(self.matcher, "jobs", None)
        if jobs is None:
            return True
        try:
            records = list(jobs.values())
        except (AttributeError, TypeError):
            return False
        for rec in records:
            if getattr(rec, "reserved", False) or not _until_released(rec):
                return False
        return True

    def _dynamic_order(self) -> bool:
        """Does the matcher order candidates by their availability as last updated (the
        ``first`` policies)? Then cancelling and re-placing a reservation at the same time
        may put it elsewhere, so reservations are never carried over."""
        return getattr(self.matcher, "policy", None) in DYNAMIC_ORDER_POLICIES

    def _end_passed(self, now: int) -> bool:
        """(counted) Did ``now`` reach a running job's planned end since the last cycle? Its
        cores are free in the plan from then on, before the job is released."""
        last = self._last_now
        self._last_now = now
        if last is None or now < last:
            return True
        ends = self._ends
        while ends and ends[0] <= last:
            heapq.heappop(ends)
        return bool(ends and ends[0] <= now)

    def _crossed(self, now: int) -> bool:
        """Did time pass a point where the matcher's state changes by itself (a running
        job's planned end, a reservation's start) since the last cycle? Ends at or before
        that cycle were already seen by it."""
        last = self._last_now
        if last is None or now < last:
            return True
        ends = self._ends
        while ends and ends[0] <= last:
            heapq.heappop(ends)
        if ends and ends[0] <= now:
            return True
        return any(int(res.at) <= now for res in self.reservations.values())

    def _pinned_cycle(self, order: list[QueuedJob], now: int) -> CycleResult:
        # running jobs the caller dropped from `running` itself: their nodes were freed
        # (running jobs come in through cycles and adopt() only, so counts tell)
        if len(self._counted) != len(self.running):
            for job_id in self._counted.keys() - self.running.keys():
                self.freed(self._uncount(job_id) or None)
        ids = [job.id for job in order]
        last = self._last
        freed = self._freed
        everything = self._reset or freed is None or self._crossed(now)
        self._last_now = now
        if not everything and not freed and last is not None and not last.started \
                and not last.rejected and not (last.result.reserved and self._dynamic_order()):
            k = len(last.considered)
            if ids[:k] == last.considered and \
                    [self._shape(job)[0] for job in order[:k]] == last.shapes:
                return self._quiet(order, now, last)
        self.full_cycles += 1
        # the relative order of jobs seen last time must hold, else they see other jobs ahead
        if not everything and last is not None:
            pending_ids = set(ids)
            before = [i for i in last.considered if i in pending_ids]
            seen = set(before)
            if [i for i in ids if i in seen] != before:
                everything = True
        hints = _Hints(
            parked={} if everything else self._parked,
            freed=None if everything or freed is None else set(freed),
            woken=self._woken,
            shape=lambda job: self._shape(job)[0],
            forever_now=self._forever,  # (asked in the walk: reservations are cancelled first)
            sat=self._sat_shapes,
        )
        pending_ids = set(ids)
        for job_id in list(self.reservations):
            res = self.reservations[job_id]
            if job_id not in pending_ids and hints.freed is not None:
                hints.freed.update(name for name, _ in shares_of(res))
            elif job_id in pending_ids:
                hints.old[job_id] = (_signature(res), [name for name, _ in shares_of(res)])
            self._cancel_reservation(job_id)
        result = CycleResult(now=now, mode="reset")
        walk = _Walk()
        _walk(order, self.matcher, now, self._policy, walk, result, self.profile, None,
              self._satisfiable, hints)
        self._remember(order, walk, result, hints)
        return result

    def _quiet(self, order: list[QueuedJob], now: int, last: _Last) -> CycleResult:
        """Nothing the last walk saw changed: its answers stand; walk only new jobs behind
        it, if that walk reached the end of the queue."""
        prev = last.result
        result = CycleResult(now=now, mode="idle", considered=prev.considered)
        result.reserved = list(prev.reserved)
        result.blocked = list(prev.blocked)
        rest = order[len(last.considered):]
        if rest and last.complete:
            result.mode = "incremental"
            walk = _Walk(considered=last.walk.considered, reservations=last.walk.reservations,
                         stopped=last.walk.stopped, unreservable=last.walk.unreservable,
                         order=list(last.walk.order))
            hints = _Hints(parked={}, freed=set(), woken=self._woken,
                           shape=lambda job: self._shape(job)[0],
                           forever_now=self._forever,
                           sat=self._sat_shapes)
            _walk(rest, self.matcher, now, self._policy, walk, result, self.profile, None,
                  self._satisfiable, hints)
            self._remember(order, walk, result, hints)
            return result
        last.result = result
        return result

    def _remember(self, order: list[QueuedJob], walk: _Walk, result: CycleResult,
                  hints: _Hints) -> None:
        started = {job.id for job, _ in result.started}
        rejected = {job.id for job, _ in result.unsatisfiable}
        considered = [job.id for job in order[: result.considered]]
        shapes = [self._shape(job)[0] for job in order[: result.considered]]
        complete = not walk.stopped and result.considered >= len(order)
        self._last = _Last(considered=considered, shapes=shapes, started=bool(started),
                           rejected=bool(rejected),
                           complete=complete, walk=walk, result=result)
        unable = [*result.blocked, *(job for job, _ in result.reserved)]
        self._parked = {job.id: self._shape(job)[0] for job in unable}
        self._freed = set()
        self._reset = False
        self._released = False
        self._walk = walk
        live = {job.id for job in order}
        for job_id in [j for j in self._shapes if j not in live]:
            del self._shapes[job_id]
        self._record(result)
