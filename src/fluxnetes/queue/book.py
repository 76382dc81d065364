"""What a ``Scheduler`` remembers between cycles, and the calls that change it between them.

``SchedulerBook`` holds the state (the matcher, the running jobs and their allocations, the
reservations, the nodes freed since the last cycle, the core profile, the parking memory)
and the bookkeeping calls a caller makes between cycles: ``release``, ``expire``,
``partial_release``, ``withdraw``, ``adopt``, ``freed``, ``invalidate``... ``Scheduler``
(``cycle.py``) adds the cycles themselves, which decide.
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from mypy_extensions import mypyc_attr

from fluxnetes.queue.hints import UNTIL_RELEASED, _until_released
from fluxnetes.queue.policy import QueuePolicy
from fluxnetes.queue.profile import CoreProfile
from fluxnetes.queue.protocol import MatcherLike, cores_of, shares_of
from fluxnetes.queue.walk import CycleResult, _reserved_key, _Walk


class _Running:
    """A running job: its match result and cores; ``expired``: its window is over and
    already given back in the matcher (``Scheduler.expire``). (A plain class: one per job,
    and a dataclass's ``__init__`` stays interpreted in the native build.)"""

    __slots__ = ("cores", "expired", "result")

    def __init__(self, result: Any, cores: int, expired: bool = False) -> None:
        self.result = result
        self.cores = cores
        self.expired = expired


@dataclass
class _Last:
    """The previous pinned cycle, as parking needs it."""

    considered: list[str]  # ids in walk order (started and rejected ones included)
    shapes: list[Hashable]  # their request shapes
    started: bool  # it started something (the matcher state grew)
    rejected: bool  # it rejected something (fewer jobs now count towards the depth)
    complete: bool  # it walked every pending job (no depth cut, no fcfs stop)
    walk: _Walk
    result: CycleResult


@mypyc_attr(allow_interpreted_subclasses=True)  # (so may Scheduler's: mypyc requires it)
class SchedulerBook:
    """The state a ``Scheduler`` keeps between cycles and the calls that change it between
    them (see ``Scheduler`` for what each means to a cycle; the constructor is its)."""

    def __init__(
        self,
        matcher: MatcherLike,
        policy: QueuePolicy,
        *,
        capacity_cores: int | None = None,
        node_cores: Mapping[str, int] | None = None,
        incremental: bool = False,
        parking: bool = True,
    ) -> None:
        if policy.reservation_style == "counted" and not capacity_cores:
            raise ValueError("Scheduler: counted reservations need capacity_cores")
        self.matcher = matcher
        self._policy = policy
        self.incremental = incremental
        self.parking = parking
        self.profile = CoreProfile(capacity_cores, node_cores) if capacity_cores else None
        # running jobs `start_from_head` started whose windows are not in the profile yet:
        # job id -> (start, duration, cores). fcfs reads nothing of the profile but the count
        # at `now`, which its caller keeps, so the windows are written when something reads
        # the profile (`_plan_started`: a cycle, free_now, expire) or dropped unread
        self._unplanned: dict[str, tuple[int, int, int]] = {}
        # (job id, cores free) where the last `start_from_head` stopped (None: it reached the
        # end of the queue)
        self._stuck: tuple[str, int] | None = None
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
        # parking (pinned): see the class docstring
        self._node_cap: dict[str, int] = dict(node_cores or {})
        self._counted: dict[str, list[tuple[str, int]]] = {}  # running job -> its node shares
        self._finite: set[str] = set()  # running jobs with a planned end
        self._sat_shapes: set[Hashable] = set()  # request shapes the matcher found satisfiable
        self._used: dict[str, int] = {}  # cores held per node by running jobs we know
        # `_counted` and `_used` are kept for pinned reservations only (parking reads them;
        # a counted cycle never does, and would pay a loop over every job's nodes twice)
        self._per_node = policy.reservation_style == "pinned"
        self._freed: set[str] | None = set()  # nodes freed since the last cycle; None = anywhere
        self._parked: dict[str, Hashable] = {}  # jobs the last cycle found unable to start now
        self._last: _Last | None = None
        self._shapes: dict[str, tuple[Any, Hashable, int]] = {}  # job id -> (jobspec, key, need)
        # planned ends of running jobs (a heap; entries of jobs released since stay until
        # passed) and the time of the last pinned cycle
        self._ends: list[int] = []
        self._last_now: int | None = None
        # no reservation held starts before this (a lower bound: lowered as reservations are
        # recorded, made exact when reached; a cancelled one only leaves it low), so a cycle
        # finds the reservations due now without looking at every one of them
        self._due_from = UNTIL_RELEASED

    @property
    def policy(self) -> QueuePolicy:
        return self._policy

    @policy.setter
    def policy(self, value: QueuePolicy) -> None:
        self._policy = value
        self._reset = True
        if value.reservation_style == "pinned" and not self._per_node:
            # parking needs the running jobs' cores per node: count them now
            self._per_node = True
            for job_id, running in self.running.items():
                self._count(job_id, running.result)

    def invalidate(self) -> None:
        """Force the next cycle to start from scratch (and forget satisfiability answers:
        the graph may have changed)."""
        self._reset = True
        self._satisfiable.clear()
        self._sat_shapes.clear()

    def set_node_cores(self, node_cores: Mapping[str, int]) -> None:
        """The graph's nodes changed (added, removed, resized): their cores, for parking.
        Call ``invalidate()`` too."""
        self._node_cap = dict(node_cores)

    def freed(self, nodes: Iterable[str] | None = None) -> None:
        """The caller gave resources back in the matcher itself (``cancel``,
        ``partial_cancel``, a smaller foreign allocation...) on ``nodes`` (None: somewhere
        or unknown): parked jobs that could use them are asked again next cycle."""
        self._released = True
        if nodes is None or self._freed is None:
            self._freed = None
        else:
            self._freed.update(nodes)

    def released_part(self, job_id: str, node: str, cores: int) -> None:
        """``cores`` of running job ``job_id``'s share on ``node`` went back in the matcher
        (``partial_release``; or by the caller itself: the operator cancels parts of groups it
        re-recorded after a restart, which this queue never started, and a lost node's
        vertices are gone with it).
        The job's counted cores there shrink with it, so a parked job that needs the node
        whole is woken (``_woken`` reads these counts), and ``node`` counts as freed."""
        placed = self._counted.get(job_id)
        if placed is not None and cores > 0:
            left = cores
            kept: list[tuple[str, int]] = []
            for name, held in placed:
                if name == node and left > 0:
                    take = min(held, left)
                    left -= take
                    held -= take
                    self._used[name] = self._used.get(name, 0) - take
                if held > 0:
                    kept.append((name, held))
            self._counted[job_id] = kept
        self.freed([node])

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

    def _count(self, job_id: str, result: Any) -> None:
        if job_id in self._counted or job_id in self._finite:  # (a job counted before)
            self._uncount(job_id)
        if not _until_released(result):
            self._finite.add(job_id)
            heapq.heappush(self._ends, int(result.at) + int(result.duration))
        if not self._per_node:
            return
        placed = shares_of(result)
        self._counted[job_id] = placed
        for name, cores in placed:
            self._used[name] = self._used.get(name, 0) + cores

    def _uncount(self, job_id: str) -> list[str]:
        placed = self._counted.pop(job_id, None) or []
        self._finite.discard(job_id)
        for name, cores in placed:
            self._used[name] = self._used.get(name, 0) - cores
        return [name for name, _ in placed]

    def _record(self, result: CycleResult) -> None:
        for job, res in result.started:
            self.running[job.id] = _Running(res, cores_of(res))
            self._count(job.id, res)
        at_least = self._due_from
        for job, res in result.reserved:
            self.reservations[job.id] = res
            at = int(res.at)
            if at < at_least:
                at_least = at
        self._due_from = at_least
        self.matcher_calls += result.matcher_calls

    def free_now(self, now: int) -> int | None:
        """Cores free at ``now`` in the core profile (running jobs at their planned end count
        as free; None: no profile)."""
        if self.profile is None:
            return None
        if self._unplanned:
            self._plan_started()
        return self.profile.avail_during(now, 1)

    def _plan_started(self) -> None:
        """Write the windows of the jobs ``start_from_head`` started into the core profile
        (as the walk writes a start's: ``running``, no shares without per-node calendars),
        and their planned ends into the heap ``_end_passed`` reads: a cycle after this one
        may be incremental, and must walk again when such a job's window ends unreleased."""
        profile = self.profile
        assert profile is not None
        for job_id, (start, duration, cores) in self._unplanned.items():
            result = self.running[job_id].result
            shares = shares_of(result) if profile.per_node else ()
            profile.add(job_id, start, duration, cores, shares, running=True)
            self._count(job_id, result)
        self._unplanned.clear()

    def adopt(self, job_id: str, allocation: Any, *, duration: int = 0) -> None:
        """Record a running job whose allocation is already in the matcher (e.g. re-recorded
        with ``update_allocate`` after a restart), so that ``release`` and the core profile
        know it. ``duration`` 0 = until released."""
        self.running[job_id] = _Running(allocation, cores_of(allocation))
        self._count(job_id, allocation)
        self._unplanned.pop(job_id, None)  # (its window is the one given here)
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
        if not running.expired:
            self.matcher.cancel(running.result.jobid)
            self.matcher_calls += 1
        if self.profile is not None and (not self._unplanned
                                         or self._unplanned.pop(job_id, None) is None):
            self.profile.remove(job_id)
        if job_id in self._counted:  # (pinned: its nodes are freed, parked jobs may wake)
            self.freed(self._uncount(job_id) or None)
        else:  # (not pinned: nothing counted per node, so no node list to build)
            self._finite.discard(job_id)
            self.freed()
        return True

    def expire(self, job_id: str) -> bool:
        """A running job reached its planned end and the caller knows it ends at this
        instant (a job never runs past its duration: the simulator), but its end is handled
        later in the instant. Its cores are already free in the plan (a window is
        ``[at, at + duration)``); give them back in the matcher now too, so that a cycle
        before its ``release`` can place jobs there (the matcher still counts a window ending
        at ``now`` as held by some fast paths). ``release`` later does the rest. False if it
        is not running."""
        running = self.running.get(job_id)
        if running is None or running.expired:
            return False
        running.expired = True
        self.matcher.cancel(running.result.jobid)
        self.matcher_calls += 1
        profile = self.profile
        if profile is not None and profile.per_node and self._unplanned:
            self._plan_started()
        # with per-node calendars: keep its window there, but no longer count its cores as
        # held now on its nodes (re-added without `running`). Without them the profile holds
        # the root span only, and re-adding the same span would change nothing
        span = profile.span(job_id) if profile is not None and profile.per_node else None
        if profile is not None and span is not None:
            start, end, cores = span
            profile.add(job_id, start, end - start, cores, shares_of(running.result))
        if self._freed is not None:  # parked jobs (pinned) may use these nodes now
            self._freed.update(name for name, _ in shares_of(running.result))
        return True

    def partial_release(self, job_id: str, release: Any) -> bool:
        """Give back part of a running job's allocation (``matcher.partial_cancel``).
        Returns True when nothing is left (the job is then forgotten)."""
        running = self.running[job_id]
        answer = self.matcher.partial_cancel(running.result.jobid, release)  # type: ignore[attr-defined]
        self.matcher_calls += 1
        for share in release:  # NodeShares: the job's counts shrink by what went back
            self.released_part(job_id, str(share.name), int(share.cores))
        full = bool(getattr(answer, "full_removal", answer))
        if self.profile is not None and self._unplanned.pop(job_id, None) is None:
            self.profile.remove(job_id)
        if full:
            self.running.pop(job_id, None)
        return full

    def withdraw(self, job_id: str) -> None:
        """A pending job left the queue (cancelled, deleted): drop its reservation if any."""
        self._satisfiable.discard(job_id)
        self._parked.pop(job_id, None)
        if job_id in self.reservations:
            nodes = [name for name, _ in shares_of(self.reservations[job_id])]
            self._cancel_reservation(job_id)
            self.freed(nodes or None)
