"""One scheduling walk over the queue (qmanager's backfill loop) and what it decided.

``schedule_cycle`` is a pure function of (pending jobs, matcher state, now, policy): it reads
no clock and does no I/O; the only state it changes is the matcher's (allocations and
reservations), and it hands back everything it did in a :class:`CycleResult`. ``_walk`` is
the loop itself, shared with ``Scheduler`` (``cycle.py``), which adds what it remembers
between cycles (kept reservations, parking hints: ``hints.py``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from fluxnetes.queue.job import QueuedJob, queue_order
from fluxnetes.queue.policy import QueuePolicy
from fluxnetes.queue.profile import CoreProfile
from fluxnetes.queue.protocol import MatcherLike, cores_of, shares_of, status_name

if TYPE_CHECKING:
    from fluxnetes.queue.hints import _Hints


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
      arrived jobs walked) or ``idle`` (nothing could have changed: the previous answers,
      no matcher call) - see ``Scheduler``. ``parked`` / ``memo``: questions answered
      without the matcher (see ``Scheduler``, "Parking").

    (A plain class, not a dataclass: one is made per cycle, and a dataclass's generated
    ``__init__`` stays interpreted Python in the native build.)
    """

    __slots__ = ("blocked", "considered", "matcher_calls", "memo", "mode", "now", "parked",
                 "reserved", "started", "unsatisfiable")

    def __init__(self, now: int, *, mode: str = "reset", considered: int = 0) -> None:
        self.now = now
        self.started: list[tuple[QueuedJob, Any]] = []
        self.reserved: list[tuple[QueuedJob, Any]] = []
        self.unsatisfiable: list[tuple[QueuedJob, str]] = []
        self.blocked: list[QueuedJob] = []
        self.considered = considered
        self.matcher_calls = 0
        self.mode = mode
        # plain-allocate questions answered BUSY from the park (no matcher call)
        self.parked = 0
        self.memo = 0  # answered BUSY because the same shape already failed in this walk

    def __repr__(self) -> str:
        return (f"CycleResult(now={self.now}, mode={self.mode!r}, "
                f"started={[job.id for job, _ in self.started]}, "
                f"reserved={[job.id for job, _ in self.reserved]}, "
                f"unsatisfiable={[job.id for job, _ in self.unsatisfiable]}, "
                f"blocked={[job.id for job in self.blocked]}, considered={self.considered}, "
                f"matcher_calls={self.matcher_calls}, parked={self.parked}, memo={self.memo})")

    @property
    def changed(self) -> bool:
        """True if the cycle started, reserved or rejected anything."""
        return bool(self.started or self.reserved or self.unsatisfiable)


def job_duration(job: QueuedJob) -> int:
    """The job's duration in seconds (0 = unknown: holds resources until released):
    ``job.duration``, which the queue reads directly; kept for callers of the package API
    (``fluxnetes submit --dry-run``)."""
    return job.duration


class _Walk:
    """Counters carried through one walk (and across an incremental continuation). (A
    plain class, as ``CycleResult``: one per cycle.)"""

    __slots__ = ("considered", "order", "reservations", "stopped", "unreservable")

    def __init__(self, considered: int = 0, reservations: int = 0, stopped: bool = False,
                 unreservable: bool = False, order: list[str] | None = None) -> None:
        self.considered = considered
        self.reservations = reservations
        self.stopped = stopped  # fcfs hit a job that cannot start
        self.unreservable = unreservable  # a job within the reservation depth got BUSY on reserve
        self.order: list[str] = [] if order is None else order  # ids considered, still pending


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


# id(resources) -> (resources, constraint, key): see _shape_key
_SHAPE_KEYS: dict[int, tuple[Any, Any, str]] = {}


def _shape_key(job: QueuedJob) -> str:
    """What satisfiability depends on: the requested resources and constraint (not the
    duration). Remembered per resource tree object (jobspecs that differ only by duration
    share one: ``jobspec.batch.with_duration``; the cache holds the objects, so their ids
    are not reused while cached): the repr of the resources is dear."""
    js = job.jobspec
    resources = getattr(js, "resources", None)
    if resources is None:
        return f"job:{job.id}"
    constraint = getattr(js, "constraint", None)
    known = _SHAPE_KEYS.get(id(resources))
    if known is not None and known[0] is resources and known[1] is constraint:
        return known[2]
    key = f"{resources!r}|{constraint!r}"
    if len(_SHAPE_KEYS) >= 4096:
        _SHAPE_KEYS.clear()
    _SHAPE_KEYS[id(resources)] = (resources, constraint, key)
    return key


def unsatisfiable_head(matcher: Any, job: QueuedJob, known: set[str] | None) -> tuple[str, int]:
    """fcfs: ``job`` got BUSY from plain ``allocate`` and would block the queue; plain
    allocate says BUSY even for a request that can never fit, so ask ``satisfiability``
    (qmanager rejects on ENODEV). Asked once per job and request shape: ``known`` holds
    the job ids and shapes already found satisfiable (until ``Scheduler.invalidate``; None:
    always ask). Returns (why it can never run, "" if it can; matcher calls made). The one
    home of this check for ``_walk`` and ``Scheduler.start_from_head``."""
    if known is not None and job.id in known:
        return "", 0
    shape = _shape_key(job)
    calls = 0
    if known is None or shape not in known:
        ok, reason = _satisfiable(matcher, job)
        calls = 1
        if not ok:
            return reason, calls
    if known is not None:
        known.add(shape)
        known.add(job.id)
    return "", calls


def _reserved_key(job_id: str) -> tuple[str, str]:
    return ("reserved", job_id)


class CountedReservation:
    """A ``counted``-style reservation: ``cores`` cores from ``at`` for ``duration``,
    held by the queue's core profile only (nothing recorded in the matcher); read like a
    match result (``status`` RESERVED, no ``jobid``, no ``nodes``). A value: treat it as
    immutable. (A plain class: easy makes one per pass.)"""

    __slots__ = ("at", "cores", "duration", "jobid", "nodes", "reason", "status")

    def __init__(self, at: int, duration: int, cores: int) -> None:
        # Final, as QueuedJob's: hashed by (at, duration, cores), so never assigned after
        self.at: Final = at
        self.duration: Final = duration
        self.cores: Final = cores
        self.status: Final = "RESERVED"
        self.jobid: Final[None] = None
        self.reason: Final = ""
        self.nodes: Final[tuple[Any, ...]] = ()

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, CountedReservation):
            return NotImplemented
        return (self.at, self.duration, self.cores) == (other.at, other.duration, other.cores)

    def __hash__(self) -> int:
        return hash((self.at, self.duration, self.cores))

    def __repr__(self) -> str:
        return f"CountedReservation(at={self.at}, duration={self.duration}, cores={self.cores})"


def _reserve_forever(
    matcher: MatcherLike, job: QueuedJob, now: int, hints: _Hints, result: CycleResult
) -> tuple[Any, str]:
    """``allocate_orelse_reserve`` when nothing in the matcher ever ends by itself
    (``_Hints.forever``): no later start exists for a job that cannot start now, so the
    answer is a plain ``allocate``, and if that is BUSY, the request's satisfiability (asked
    once per request shape until ``invalidate()``). Same decision, without the matcher's
    search over candidate times and its satisfiability walk of the whole graph on every
    failure (about a second at 1,000 nodes: bench/cycle_backlog.py)."""
    answer = matcher.allocate(job.jobspec, now=now)
    result.matcher_calls += 1
    status = status_name(answer)
    if status != "BUSY" or hints.shape(job) in hints.sat:
        return answer, status
    ok, reason = _satisfiable(matcher, job)
    result.matcher_calls += 1
    if not ok:
        return _Unsatisfiable(reason), "UNSATISFIABLE"
    hints.sat.add(hints.shape(job))
    return answer, status


@dataclass(frozen=True)
class _Unsatisfiable:
    reason: str


def too_big_reason(cores: int, capacity: int) -> str:
    """Why a job needing ``cores`` is rejected on a graph of ``capacity`` cores (the walk,
    ``Scheduler.start_from_head`` and the simulator at submission say it alike)."""
    return f"needs {cores} cores; the whole graph has {capacity}"


def too_big_run(queue: Sequence[QueuedJob], i: int, stop: int, free: int, capacity: int) -> int:
    """The first position from ``i`` (before ``stop``) of a job that needs at most ``free``
    cores, or more than ``capacity`` (the walk rejects those); ``stop`` if none."""
    while i < stop:
        cores = queue[i].cores
        if cores <= free or cores > capacity:
            return i
        i += 1
    return stop


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
    hints: _Hints | None = None,
) -> None:
    """Walk ``jobs`` in order. ``keep``: reservations still in the matcher from the last
    cycle (compress mode); each is kept if it cannot move earlier, else re-placed.
    ``hints``: answers known without the matcher (parked jobs, shapes already BUSY)."""
    limit = policy.reservations
    counted = policy.reservation_style == "counted"
    # cores free at `now` in the profile: asked once per walk, then kept in step with what
    # the walk adds (a start at `now` takes its cores, a later reservation none) and asked
    # again only after a removal. A job needing more cannot fit now (the profile's fits_now
    # is never more generous than this root count)
    free_now: int | None = None
    # the start of the last reservation this walk holds (after `now`) and, once asked, the
    # cores free at that instant: a backfill candidate whose window reaches that instant
    # and that needs more cannot fit (EASY's "ends after the shadow time and needs more
    # than the extra cores"), without asking the profile about its whole window. The
    # walk's starts and reservations only lower what is free there, so the count stays an
    # upper bound until a span is removed
    shadow: int | None = None
    extra: int | None = None
    backfill = profile is not None and policy.name != "fcfs"  # (fcfs stops at a BUSY job)
    # indexed, so that a run of jobs too big for what is free now is passed in one step
    queue = jobs if isinstance(jobs, list) else list(jobs)
    n = len(queue)
    i = 0
    # (read once: the loop below runs for every waiting job of every cycle)
    depth = policy.queue_depth
    capacity = profile.capacity if profile is not None else None
    blocked = result.blocked
    while i < n:
        job = queue[i]
        i += 1
        if walk.stopped:
            return
        if depth is not None and walk.considered >= depth:
            return
        walk.considered += 1
        result.considered += 1
        cores = job.cores
        if capacity is not None and cores > capacity:
            result.unsatisfiable.append((job, too_big_reason(cores, capacity)))
            continue
        reserve = limit is None or walk.reservations < limit
        if not reserve and not keep and hints is None and backfill and free_now is not None \
                and capacity is not None and 0 < free_now < cores:
            # a backfill candidate that needs more cores than are free now: BUSY without
            # a matcher call (what the rest of this loop decides for it, in short). So are
            # the jobs right behind it that need more too: nothing this loop reads for them
            # changes in between (no reservation, no profile change), so they are passed
            # together (most waiting jobs take this exit: bench/results/sim_walk_s39.json)
            stop = n if depth is None else min(n, i + depth - walk.considered)
            j = too_big_run(queue, i, stop, free_now, capacity)
            run = queue[i - 1:j]
            blocked.extend(run)
            walk.order.extend([jb.id for jb in run])
            walk.considered += j - i
            result.considered += j - i
            i = j
            continue
        duration = job.duration
        old = keep.pop(job.id, None) if keep else None
        if old is not None:
            if reserve and profile is not None and int(old.at) > now \
                    and not profile.moves_earlier(now, duration, cores, int(old.at),
                                                  _reserved_key(job.id)):
                # no placement can start earlier than the one it holds: keep it
                result.reserved.append((job, old))
                shadow, extra = int(old.at), None
                walk.reservations += 1
                walk.order.append(job.id)
                continue
            if old.jobid is not None:
                matcher.cancel(old.jobid)
                result.matcher_calls += 1
            if profile is not None:
                profile.remove(_reserved_key(job.id))
                free_now = extra = None
        if backfill and free_now is None:  # (fcfs asks fits_now of its head only)
            assert profile is not None
            free_now = profile.avail_during(now, 1)
        if (
            not reserve
            and not keep
            and profile is not None
            and policy.name != "fcfs"
            and free_now is not None
            and free_now <= 0
        ):
            # nothing is free now and no reservation is left to make: every remaining job
            # (up to the depth) would get BUSY from plain allocate; skip the calls
            walk.considered -= 1
            result.considered -= 1
            rest = queue[i - 1:]
            if policy.queue_depth is not None:
                rest = rest[: policy.queue_depth - walk.considered]
            walk.considered += len(rest)
            result.considered += len(rest)
            result.blocked.extend(rest)
            walk.order.extend(j.id for j in rest)
            return
        beyond = False  # (a backfill candidate needing more than is free at `shadow`)
        if not reserve and shadow is not None and profile is not None and cores > 0 \
                and (duration <= 0 or now + duration > shadow):
            if extra is None:
                extra = profile.avail_during(shadow, 1)
            beyond = cores > extra
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
            if hints is not None and hints.known_busy(job, result, reserve=True):
                pass  # BUSY (and satisfiable): see _Hints.forever
            elif hints is not None and duration == 0 and hints.forever:
                answer, status = _reserve_forever(matcher, job, now, hints, result)
            else:
                answer = matcher.allocate_orelse_reserve(job.jobspec, now=now)
                result.matcher_calls += 1
                status = status_name(answer)
        elif (
            profile is None
            or (
                (cores <= 0 or free_now is None or cores <= free_now)
                and not beyond
                and profile.fits_now(now, duration, cores)
            )
        ) and not (hints is not None and hints.known_busy(job, result)):
            answer = matcher.allocate(job.jobspec, now=now)
            result.matcher_calls += 1
            status = status_name(answer)
        if hints is not None:
            # (a skipped question is not an answer about satisfiability)
            hints.answered(job, status, answer, reserve=reserve and answer is not None)
        if status == "ALLOCATED":
            result.started.append((job, answer))
            if profile is not None:
                held = cores_of(answer)
                # a new span from `now` on (at least one second, or until removed): the
                # cores free at `now` drop by exactly what it holds
                if free_now is not None and job.id not in profile:
                    free_now -= held
                else:
                    free_now = extra = None  # (a span of that key removed first)
                # (shares only for per-node calendars: a copy of every node held otherwise)
                profile.add(job.id, now, duration, held,
                            shares_of(answer) if profile.per_node else (), running=True)
            continue
        if status == "RESERVED":
            result.reserved.append((job, answer))
            walk.reservations += 1
            walk.order.append(job.id)
            if profile is not None:
                held = answer.cores if isinstance(answer, CountedReservation) else cores_of(answer)
                key = _reserved_key(job.id)
                if int(answer.at) <= now or key in profile:
                    free_now = None  # (one from a later time leaves `now` as it was)
                profile.add(key, int(answer.at), duration, held, shares_of(answer))
                extra = None
                if int(answer.at) > now:
                    shadow = int(answer.at)
            continue
        if status == "UNSATISFIABLE":
            result.unsatisfiable.append((job, str(getattr(answer, "reason", "") or "unsatisfiable")))
            continue
        if policy.name == "fcfs":
            # an impossible head job is rejected instead of blocking the queue
            reason, calls = unsatisfiable_head(matcher, job, satisfiable)
            result.matcher_calls += calls
            if reason:
                result.unsatisfiable.append((job, reason))
                continue
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


