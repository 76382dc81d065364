"""The scheduling cycle (qmanager's backfill loop) and the small object that owns its state.

``schedule_cycle`` is a pure function of (pending jobs, matcher state, now, policy): it reads
no clock and does no I/O; the only state it changes is the matcher's (allocations and
reservations), and it hands back everything it did in a :class:`CycleResult`.

``Scheduler`` wraps it for long-running users (the simulator, the operator, the store's
service): it remembers the reservations of the previous cycle, the allocations of running
jobs (to release them), and skips work whose answer is known (see its docstring).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from fluxnetes.queue.job import QueuedJob, queue_order
from fluxnetes.queue.policy import QueuePolicy
from fluxnetes.queue.profile import CoreProfile
from fluxnetes.queue.protocol import MatcherLike, cores_of, shares_of, status_name


@dataclass
class CycleResult:
    """What one cycle decided.

    * ``started``: (job, allocation) for jobs that start now, in walk order.
    * ``reserved``: (job, reservation) with ``reservation.at`` = expected start; includes
      reservations kept from the previous cycle.
    * ``unsatisfiable``: (job, reason): can never run on this graph; take them out of the
      queue (they are reported once).
    * ``blocked``: considered, but neither started nor reserved (they stay pending).
    * ``considered``: jobs looked at (<= queue depth); ``matcher_calls``: calls made;
      ``mode``: ``reset`` (all reservations cancelled first, as qmanager), ``compress``
      (reservations kept unless they can move earlier) or ``incremental`` (only newly
      arrived jobs walked) - see ``Scheduler``.
    """

    now: int
    started: list[tuple[QueuedJob, Any]] = field(default_factory=list)
    reserved: list[tuple[QueuedJob, Any]] = field(default_factory=list)
    unsatisfiable: list[tuple[QueuedJob, str]] = field(default_factory=list)
    blocked: list[QueuedJob] = field(default_factory=list)
    considered: int = 0
    matcher_calls: int = 0
    mode: str = "reset"

    @property
    def changed(self) -> bool:
        """True if the cycle started, reserved or rejected anything."""
        return bool(self.started or self.reserved or self.unsatisfiable)


def job_duration(job: QueuedJob) -> int:
    """The job's duration in seconds (0 = unknown: holds resources until released)."""
    value = getattr(job.jobspec, "duration", 0) or 0
    return int(value)


@dataclass
class _Walk:
    """Counters carried through one walk (and across an incremental continuation)."""

    considered: int = 0
    reservations: int = 0
    stopped: bool = False  # fcfs hit a job that cannot start
    unreservable: bool = False  # some job within the reservation depth got BUSY on reserve
    order: list[str] = field(default_factory=list)  # ids considered and still pending


def _satisfiable(matcher: Any, job: QueuedJob) -> tuple[bool, str]:
    check = getattr(matcher, "satisfiability", None)
    if check is None:
        return True, ""
    answer = check(job.jobspec)
    if isinstance(answer, bool):
        return answer, "" if answer else "the request can never be satisfied on this graph"
    if status_name(answer) == "UNSATISFIABLE":
        return False, str(getattr(answer, "reason", "") or "unsatisfiable")
    return True, ""


def _shape_key(job: QueuedJob) -> str:
    """What satisfiability depends on: the requested resources (not the duration)."""
    resources = getattr(job.jobspec, "resources", None)
    constraint = getattr(job.jobspec, "constraint", None)
    if resources is None:
        return f"job:{job.id}"
    return f"{resources!r}|{constraint!r}"


def _reserved_key(job_id: str) -> tuple[str, str]:
    return ("reserved", job_id)


@dataclass(frozen=True)
class CountedReservation:
    """A ``counted``-style reservation: ``cores`` cores from ``at`` for ``duration``,
    held by the queue's core profile only (nothing recorded in the matcher)."""

    at: int
    duration: int
    cores: int
    status: str = "RESERVED"
    jobid: None = None
    reason: str = ""
    nodes: tuple[Any, ...] = ()


def _walk(
    jobs: Iterable[QueuedJob],
    matcher: MatcherLike,
    now: int,
    policy: QueuePolicy,
    walk: _Walk,
    result: CycleResult,
    profile: CoreProfile | None,
    keep: dict[str, Any] | None = None,
    satisfiable: set[str] | None = None,
) -> None:
    """Walk ``jobs`` in order. ``keep``: reservations still in the matcher from the last
    cycle (compress mode); each is kept if it cannot move earlier, else re-placed."""
    limit = policy.reservations
    counted = policy.reservation_style == "counted"
    jobs_iter: Iterator[QueuedJob] = iter(jobs)
    for job in jobs_iter:
        if walk.stopped:
            return
        if policy.queue_depth is not None and walk.considered >= policy.queue_depth:
            return
        walk.considered += 1
        result.considered += 1
        cores = job.cores
        if profile is not None and cores > profile.capacity:
            result.unsatisfiable.append(
                (job, f"needs {cores} cores; the whole graph has {profile.capacity}")
            )
            continue
        duration = job_duration(job)
        reserve = limit is None or walk.reservations < limit
        old = keep.pop(job.id, None) if keep else None
        if old is not None:
            if reserve and profile is not None and int(old.at) > now:
                low = profile.earliest(now, duration, cores, exclude=_reserved_key(job.id))
                if low is not None and low >= int(old.at):
                    # no placement can start earlier than the one it holds: keep it
                    result.reserved.append((job, old))
                    walk.reservations += 1
                    walk.order.append(job.id)
                    continue
            if old.jobid is not None:
                matcher.cancel(old.jobid)
                result.matcher_calls += 1
            if profile is not None:
                profile.remove(_reserved_key(job.id))
        if (
            not reserve
            and not keep
            and profile is not None
            and policy.name != "fcfs"
            and profile.avail_during(now, 1) <= 0
        ):
            # nothing is free now and no reservation is left to make: every remaining job
            # (up to the depth) would get BUSY from plain allocate; skip the calls
            walk.considered -= 1
            result.considered -= 1
            rest = [job, *jobs_iter]
            if policy.queue_depth is not None:
                rest = rest[: policy.queue_depth - walk.considered]
            walk.considered += len(rest)
            result.considered += len(rest)
            result.blocked.extend(rest)
            walk.order.extend(j.id for j in rest)
            return
        fits_now = profile is None or profile.fits_now(now, duration, cores)
        answer: Any = None
        status = "BUSY"
        if reserve and counted and profile is not None:
            low = profile.earliest(now, duration, cores)
            if low is not None and low > now:
                answer = CountedReservation(low, duration, cores)
                status = "RESERVED"
            else:
                if low is not None:
                    answer = matcher.allocate(job.jobspec, now=now)
                    result.matcher_calls += 1
                    status = status_name(answer)
                if status != "ALLOCATED":
                    # the count fits (or never does) but the shape does not: ask the
                    # matcher when it would fit, and hold that time as a count
                    answer = matcher.allocate_orelse_reserve(job.jobspec, now=now)
                    result.matcher_calls += 1
                    status = status_name(answer)
                    if status == "RESERVED":
                        matcher.cancel(answer.jobid)
                        result.matcher_calls += 1
                        answer = CountedReservation(int(answer.at), duration, cores)
        elif reserve:
            answer = matcher.allocate_orelse_reserve(job.jobspec, now=now)
            result.matcher_calls += 1
            status = status_name(answer)
        elif fits_now:
            answer = matcher.allocate(job.jobspec, now=now)
            result.matcher_calls += 1
            status = status_name(answer)
        if status == "ALLOCATED":
            result.started.append((job, answer))
            if profile is not None:
                profile.add(job.id, now, duration, cores_of(answer), shares_of(answer), running=True)
            continue
        if status == "RESERVED":
            result.reserved.append((job, answer))
            walk.reservations += 1
            walk.order.append(job.id)
            if profile is not None:
                held = answer.cores if isinstance(answer, CountedReservation) else cores_of(answer)
                profile.add(_reserved_key(job.id), int(answer.at), duration, held,
                            shares_of(answer))
            continue
        if status == "UNSATISFIABLE":
            result.unsatisfiable.append((job, str(getattr(answer, "reason", "") or "unsatisfiable")))
            continue
        if policy.name == "fcfs":
            # plain allocate says BUSY even for requests that can never fit: ask once per
            # job, so an impossible head job is rejected instead of blocking the queue
            if satisfiable is None or job.id not in satisfiable:
                shape = _shape_key(job)
                if satisfiable is None or shape not in satisfiable:
                    ok, reason = _satisfiable(matcher, job)
                    result.matcher_calls += 1
                    if not ok:
                        result.unsatisfiable.append((job, reason))
                        continue
                if satisfiable is not None:
                    satisfiable.add(shape)
                    satisfiable.add(job.id)
            result.blocked.append(job)
            walk.order.append(job.id)
            walk.stopped = True
            return
        if reserve:
            walk.unreservable = True
        result.blocked.append(job)
        walk.order.append(job.id)


def schedule_cycle(
    pending: Iterable[QueuedJob],
    matcher: MatcherLike,
    now: int,
    policy: QueuePolicy,
    previous_reservations: Iterable[Any] = (),
) -> CycleResult:
    """One full scheduling cycle (qmanager semantics).

    1. Cancel the reservations made by the previous cycle (``previous_reservations``: the
       match results found in the previous ``CycleResult.reserved``).
    2. Walk the pending jobs in queue order (priority, submit time, id), at most
       ``policy.queue_depth`` of them: ``allocate_orelse_reserve`` while this cycle made
       fewer reservations than the policy allows, plain ``allocate`` after that.
       fcfs makes no reservation and stops at the first job that cannot start.

    Reservations stay in the matcher, so later jobs in the walk only backfill where they
    delay no reserved job. Pass this result's ``reserved`` results to the next call.
    """
    if policy.reservation_style != "pinned":
        raise ValueError("schedule_cycle: counted reservations need a Scheduler (core profile)")
    for res in previous_reservations:
        matcher.cancel(res.jobid)
    result = CycleResult(now=now)
    _walk(queue_order(list(pending)), matcher, now, policy, _Walk(), result, None)
    return result


@dataclass
class _Running:
    result: Any
    cores: int


class Scheduler:
    """Owns a matcher and the queue's bookkeeping between cycles.

    * ``cycle(pending, now)``: run a cycle, remember its reservations and allocations.
    * ``release(job_id)``: a running job ended (or ended early): cancel its allocation now,
      so the next cycle can use it. ``partial_release`` gives back part of it.
    * ``withdraw(job_id)``: a pending job left the queue: drop its reservation.
    * ``invalidate()``: something outside the queue changed the graph (node up/down,
      foreign pods): the next cycle starts from scratch.

    Cycle modes (``CycleResult.mode``):

    * ``reset`` - qmanager: cancel every reservation, walk the queue. Used for the first
      cycle, after ``invalidate()``, a policy change, or when a job arrived ahead of jobs
      already walked (higher priority).
    * ``compress`` (with ``capacity_cores``) - after releases: walk the queue in the same
      order, but a job keeps its reservation when the core profile proves that no
      placement can start earlier; otherwise it is cancelled and matched again (it can
      only move earlier, since its old slot is still free). This is the classic
      conservative-backfilling compression (Mu'alem & Feitelson): no reservation is ever
      delayed. Counted reservations only: pinned ones are recomputed every cycle (qmanager),
      since keeping a placement changes which nodes later jobs may backfill on.
    * ``incremental`` (``incremental=True``, counted reservations) - nothing was released and every new job
      sorts after the jobs already walked: only the new jobs are walked; the old ones would
      get exactly the same answers since nothing they could use was freed. Assumes no
      running job outlives its duration (true in the simulator: jobs end at their limit).

    ``capacity_cores`` (the graph's total cores) turns on the core profile
    (``profile.py``): jobs whose cores exceed what is free over their window are skipped
    without a matcher call; a job asking more cores than the graph has is unsatisfiable.
    ``node_cores`` (cores per node name) makes that check node-aware (reservations pin
    specific nodes). Both only ever skip calls whose answer would be BUSY.
    """

    def __init__(
        self,
        matcher: MatcherLike,
        policy: QueuePolicy,
        *,
        capacity_cores: int | None = None,
        node_cores: Mapping[str, int] | None = None,
        incremental: bool = False,
    ) -> None:
        if policy.reservation_style == "counted" and not capacity_cores:
            raise ValueError("Scheduler: counted reservations need capacity_cores")
        self.matcher = matcher
        self._policy = policy
        self.incremental = incremental
        self.profile = CoreProfile(capacity_cores, node_cores) if capacity_cores else None
        self.running: dict[str, _Running] = {}
        self.reservations: dict[str, Any] = {}
        self._reset = True  # next cycle must cancel everything first
        self._released = False  # resources were freed since the last cycle
        self._walk: _Walk | None = None
        # request shapes (and job ids) already found satisfiable
        self._satisfiable: set[str] = set()
        self.cycles = 0
        self.full_cycles = 0
        self.matcher_calls = 0

    @property
    def policy(self) -> QueuePolicy:
        return self._policy

    @policy.setter
    def policy(self, value: QueuePolicy) -> None:
        self._policy = value
        self._reset = True

    def invalidate(self) -> None:
        """Force the next cycle to start from scratch (and forget satisfiability answers:
        the graph may have changed)."""
        self._reset = True
        self._satisfiable.clear()

    def allocation(self, job_id: str) -> Any:
        """The match result of a running job (KeyError if unknown)."""
        return self.running[job_id].result

    def _cancel_reservation(self, job_id: str) -> None:
        res = self.reservations.pop(job_id)
        if res.jobid is not None:
            self.matcher.cancel(res.jobid)
            self.matcher_calls += 1
        if self.profile is not None:
            self.profile.remove(_reserved_key(job_id))

    def _record(self, result: CycleResult) -> None:
        for job, res in result.started:
            self.running[job.id] = _Running(res, cores_of(res))
        for job, res in result.reserved:
            self.reservations[job.id] = res
        self.matcher_calls += result.matcher_calls

    def _prefix(self, order: Sequence[QueuedJob]) -> int | None:
        """If the jobs walked last time (still pending) lead ``order`` in the same order,
        their number; else None."""
        walk = self._walk
        if walk is None or self._reset:
            return None
        pending_ids = {job.id for job in order}
        still = [job_id for job_id in walk.order if job_id in pending_ids]
        for job, job_id in zip(order, still, strict=False):
            if job.id != job_id:
                return None
        return len(still)

    def cycle(self, pending: Iterable[QueuedJob], now: int, *, ordered: bool = False) -> CycleResult:
        """Run one cycle over ``pending`` (the jobs waiting now) at time ``now``.
        ``ordered=True``: ``pending`` is already in queue order (saves a sort)."""
        jobs = list(pending) if ordered else queue_order(list(pending))
        order = [job for job in jobs if job.id not in self.running]
        self.cycles += 1
        prefix = self._prefix(order)
        walk = self._walk
        if (
            prefix is not None
            and walk is not None
            and self.incremental
            and self._policy.reservation_style == "counted"  # see compress below
            and not self._released
            and all(int(res.at) > now for res in self.reservations.values())
        ):
            if walk.stopped and walk.order and walk.order[-1] not in {j.id for j in order[:prefix]}:
                prefix = None  # the fcfs head that stopped the last walk left: walk again
            else:
                still = order[:prefix]
                walk.order = [job.id for job in still]
                walk.considered = prefix
                walk.reservations = sum(1 for job in still if job.id in self.reservations)
                result = CycleResult(now=now, mode="incremental")
                _walk(order[prefix:], self.matcher, now, self._policy, walk, result, self.profile,
                      None, self._satisfiable)
                self._record(result)
                self._released = False
                return result
        self.full_cycles += 1
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

    def adopt(self, job_id: str, allocation: Any, *, duration: int = 0) -> None:
        """Record a running job whose allocation is already in the matcher (e.g. re-recorded
        with ``update_allocate`` after a restart), so that ``release`` and the core profile
        know it. ``duration`` 0 = until released."""
        self.running[job_id] = _Running(allocation, cores_of(allocation))
        if self.profile is not None:
            self.profile.add(job_id, int(allocation.at), duration or int(allocation.duration),
                             cores_of(allocation), shares_of(allocation), running=True)
        self._reset = True

    def release(self, job_id: str) -> bool:
        """A running job ended: give its resources back now. False if it was not running."""
        self._satisfiable.discard(job_id)
        running = self.running.pop(job_id, None)
        if running is None:
            return False
        self.matcher.cancel(running.result.jobid)
        self.matcher_calls += 1
        if self.profile is not None:
            self.profile.remove(job_id)
        self._released = True
        return True

    def partial_release(self, job_id: str, release: Any) -> bool:
        """Give back part of a running job's allocation (``matcher.partial_cancel``).
        Returns True when nothing is left (the job is then forgotten)."""
        running = self.running[job_id]
        answer = self.matcher.partial_cancel(running.result.jobid, release)  # type: ignore[attr-defined]
        self.matcher_calls += 1
        self._released = True
        # the profile cannot tell which cores went back: drop it, the matcher still knows
        full = bool(getattr(answer, "full_removal", answer))
        if self.profile is not None:
            self.profile.remove(job_id)
        if full:
            self.running.pop(job_id, None)
        return full

    def withdraw(self, job_id: str) -> None:
        """A pending job left the queue (cancelled, deleted): drop its reservation if any."""
        self._satisfiable.discard(job_id)
        if job_id in self.reservations:
            self._cancel_reservation(job_id)
            self._released = True
