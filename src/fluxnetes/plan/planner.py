"""Single-resource planner: a calendar of one resource quantity over integer time.

Fluxion's planner (``resource/planner``) keeps *scheduled points* (times where the scheduled
amount changes) in two red-black trees. Here the points live in three parallel Python lists
sorted by time (times, scheduled amounts, reference counts) searched with ``bisect``: the
lists stay short for the planners the matcher uses (a few points per running or reserved
job touching the vertex) and list operations run at C speed, which beats a tree written in
Python for every size we care about.

Semantics (kept from Fluxion):

* Spans occupy half-open windows ``[start, start + duration)``.
* The state in force at time ``t`` is the one of the last point at or before ``t``.
* There is always a point at ``base``; every span adds (or reuses) a point at its start and
  one at its end; a point disappears when no span starts or ends there any more.
* Candidate start times of the earliest-fit search are existing scheduled points only
  (never arbitrary instants), at or after ``on_or_after``, and the window must end within
  the horizon.
* A request larger than the total can never fit (ERANGE).

Complexity, with P = number of points:

* ``avail_at`` O(log P); ``avail_during`` / ``avail_resources_during`` O(log P + w) where w
  is the number of points inside the window (O(1) when the planner has no span at all, and
  O(log P) when no span changes the state inside the window, the common "nothing planned in
  the future" case).
* ``add_span`` / ``rem_span`` / ``reduce_span`` O(log P + w) plus list insert/delete (a
  memmove of P pointers).
* ``avail_time_first`` O(log P + s) where s is the number of points scanned: the search slides
  a window over the points and, when a point inside the window is too busy, jumps past it
  (no start time before that busy point can work), so every point is looked at O(1) times.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Iterator
from dataclasses import dataclass

from fluxnetes.plan.errors import (
    PlannerInvalidError,
    PlannerNoFitError,
    PlannerRangeError,
    PlannerSpanNotFoundError,
)

#: Default horizon length (seconds): 2**62, like Fluxion's vertex planners whose duration is
#: INT64_MAX, but leaving room so that ``base + horizon`` and ``t + duration`` stay inside a
#: signed 64-bit integer for tools that store them (SQL BIGINT, JSON readers in C).
HORIZON: int = 2**62


@dataclass(frozen=True, slots=True)
class Span:
    """A planned amount over ``[start, start + duration)``."""

    span_id: int
    start: int
    duration: int
    amount: int

    @property
    def end(self) -> int:
        """First instant after the span (exclusive end)."""
        return self.start + self.duration


@dataclass(frozen=True, slots=True)
class Point:
    """A scheduled point, for debugging views."""

    at: int
    scheduled: int
    remaining: int
    refs: int


class Planner:
    """Calendar of one resource quantity of capacity ``total`` over ``[base, base+horizon)``."""

    __slots__ = ("_base", "_end", "_next_id", "_refs", "_sched", "_spans", "_times", "_total")

    def __init__(self, total: int, base: int = 0, horizon: int = HORIZON) -> None:
        if total < 0:
            raise PlannerInvalidError(f"total must be >= 0, got {total}")
        if horizon < 1:
            raise PlannerInvalidError(f"horizon must be >= 1, got {horizon}")
        self._total = total
        self._base = base
        self._end = base + horizon
        # Parallel lists sorted by time. The base point holds one permanent reference so it
        # is never deleted.
        self._times: list[int] = [base]
        self._sched: list[int] = [0]
        self._refs: list[int] = [1]
        # span id -> [start, end, amount]; mutable so reduce_span can update in place
        self._spans: dict[int, list[int]] = {}
        self._next_id = 1

    # ------------------------------------------------------------------ properties
    @property
    def total(self) -> int:
        return self._total

    @property
    def base(self) -> int:
        return self._base

    @property
    def horizon(self) -> int:
        return self._end - self._base

    @property
    def end(self) -> int:
        """Exclusive end of the horizon (``base + horizon``)."""
        return self._end

    def __len__(self) -> int:
        """Number of live spans."""
        return len(self._spans)

    def __contains__(self, span_id: object) -> bool:
        return span_id in self._spans

    def is_idle(self) -> bool:
        """True when no span is planned at all (every query is then O(1))."""
        return not self._spans

    # ------------------------------------------------------------------ validation helpers
    def _check_window(self, t: int, duration: int) -> int:
        if duration < 1:
            raise PlannerInvalidError(f"duration must be >= 1, got {duration}")
        end = t + duration
        if t < self._base or end > self._end:
            raise PlannerInvalidError(
                f"window [{t}, {end}) is outside the planner horizon [{self._base}, {self._end})"
            )
        return end

    # ------------------------------------------------------------------ queries
    def avail_at(self, t: int) -> int:
        """Free amount in force at ``t`` (never negative)."""
        if t < self._base or t >= self._end:
            raise PlannerInvalidError(
                f"time {t} is outside the planner horizon [{self._base}, {self._end})"
            )
        rem = self._total - self._sched[bisect_right(self._times, t) - 1]
        return rem if rem > 0 else 0

    def avail_during(self, t: int, duration: int, amount: int) -> bool:
        """True if ``amount`` units are free over the whole window ``[t, t + duration)``.

        A request larger than the total returns False (it never fits; Fluxion reports ERANGE
        and its traverser treats that as "not available"): this is the matcher's prune check,
        so it answers rather than raises.
        """
        end = self._check_window(t, duration)
        if amount < 0:
            raise PlannerInvalidError(f"amount must be >= 0, got {amount}")
        return self._fits(t, end, amount)

    def _fits(self, t: int, end: int, amount: int) -> bool:
        """avail_during without argument checks (callers validated the window)."""
        limit = self._total - amount
        if limit < 0:
            return False
        sched = self._sched
        if len(sched) == 1:
            return sched[0] <= limit
        times = self._times
        i = bisect_right(times, t) - 1
        n = len(times)
        while i < n and times[i] < end:
            if sched[i] > limit:
                return False
            i += 1
        return True

    def avail_resources_during(self, t: int, duration: int) -> int:
        """Minimum free amount over ``[t, t + duration)`` (never negative)."""
        end = self._check_window(t, duration)
        times = self._times
        i = bisect_right(times, t) - 1
        j = bisect_left(times, end, i + 1)
        rem = self._total - max(self._sched[i:j])
        return rem if rem > 0 else 0

    def avail_time_first(
        self, on_or_after: int, duration: int, amount: int, *, include_start: bool = False
    ) -> int | None:
        """Earliest scheduled point ``t >= on_or_after`` such that ``amount`` units are free
        over ``[t, t + duration)`` and the window ends within the horizon; None if none.

        Only existing points are candidates (as in Fluxion). With ``include_start=True``,
        ``on_or_after`` itself is also a candidate even when no point sits there.
        Raises PlannerRangeError when ``amount`` exceeds the total.
        """
        self._check_search(on_or_after, duration, amount)
        return self._first_fit(on_or_after, duration, self._total - amount, include_start)

    def avail_times(
        self, on_or_after: int, duration: int, amount: int, *, include_start: bool = False
    ) -> Iterator[int]:
        """Successive candidate start times (increasing), as avail_time_first then Fluxion's
        avail_time_next. Each step reads the current state, so the planner may change between
        steps: the next answer is the first fit after the previous one in the new state.
        """
        self._check_search(on_or_after, duration, amount)
        t: int | None = self._first_fit(on_or_after, duration, self._total - amount, include_start)
        while t is not None:
            yield t
            if t + 1 >= self._end:
                return
            t = self._first_fit(t + 1, duration, self._total - amount, False)

    def _check_search(self, on_or_after: int, duration: int, amount: int) -> None:
        if duration < 1:
            raise PlannerInvalidError(f"duration must be >= 1, got {duration}")
        if amount < 0:
            raise PlannerInvalidError(f"amount must be >= 0, got {amount}")
        if amount > self._total:
            raise PlannerRangeError(
                f"request of {amount} exceeds the planner total {self._total}: it never fits"
            )
        if on_or_after < self._base:
            raise PlannerInvalidError(
                f"on_or_after {on_or_after} is before the planner base {self._base}"
            )

    def _first_fit(self, t: int, duration: int, limit: int, t_is_candidate: bool) -> int | None:
        """Earliest candidate ``>= t`` where scheduled <= limit over the whole window.

        Candidates are the points at or after ``t`` (plus ``t`` itself if ``t_is_candidate``).
        Sliding window: if a point ``j`` inside the window of candidate ``k`` is too busy, no
        candidate in ``(k, j]`` can succeed either (their windows contain ``j`` or start at
        it), so the search resumes at ``j + 1``.
        """
        times = self._times
        sched = self._sched
        n = len(times)
        horizon_end = self._end
        if t_is_candidate:
            if t + duration > horizon_end:
                return None
            i = bisect_right(times, t) - 1
            wend = t + duration
            j = i
            while j < n and times[j] < wend:
                if sched[j] > limit:
                    break
                j += 1
            else:
                return t
            k = j + 1
        else:
            k = bisect_left(times, t)
        while k < n:
            cand = times[k]
            wend = cand + duration
            if wend > horizon_end:
                return None
            if sched[k] > limit:
                k += 1
                continue
            j = k + 1
            while j < n and times[j] < wend:
                if sched[j] > limit:
                    break
                j += 1
            else:
                return cand
            k = j + 1
        return None

    def earliest_any(self, t: int, duration: int, amount: int) -> int | None:
        """Earliest instant ``>= t`` (``t`` itself or a later point) where the request fits;
        None if it never does within the horizon. Used by PlannerMulti's joint search."""
        self._check_search(t, duration, amount)
        return self._first_fit(t, duration, self._total - amount, True)

    def next_point_after(self, t: int) -> int | None:
        """First scheduled point strictly after ``t`` (None if none)."""
        times = self._times
        k = bisect_right(times, t)
        return times[k] if k < len(times) else None

    # ------------------------------------------------------------------ spans
    def span(self, span_id: int) -> Span:
        """The span with that id (raises PlannerSpanNotFoundError)."""
        rec = self._spans.get(span_id)
        if rec is None:
            raise PlannerSpanNotFoundError(f"no span with id {span_id}")
        return Span(span_id, rec[0], rec[1] - rec[0], rec[2])

    def spans(self) -> list[Span]:
        """All live spans, by id."""
        return [Span(sid, r[0], r[1] - r[0], r[2]) for sid, r in sorted(self._spans.items())]

    def _point_index(self, t: int) -> int:
        """Index of the point at ``t``, creating it (copying the state in force) if needed."""
        times = self._times
        k = bisect_left(times, t)
        if k < len(times) and times[k] == t:
            return k
        # k >= 1 because t >= base and the base point is at index 0
        times.insert(k, t)
        self._sched.insert(k, self._sched[k - 1])
        self._refs.insert(k, 0)
        return k

    def add_span(self, start: int, duration: int, amount: int) -> int:
        """Plan ``amount`` units over ``[start, start + duration)``; returns the span id.

        Raises PlannerRangeError if amount > total, PlannerNoFitError if the units are not
        free over the window, PlannerInvalidError for bad arguments.
        """
        end = self._check_window(start, duration)
        if amount < 1:
            raise PlannerInvalidError(f"span amount must be >= 1, got {amount}")
        if amount > self._total:
            raise PlannerRangeError(
                f"span of {amount} exceeds the planner total {self._total}: it never fits"
            )
        if not self.avail_during(start, duration, amount):
            raise PlannerNoFitError(
                f"{amount} units are not free over [{start}, {end}) "
                f"(only {self.avail_resources_during(start, duration)} of {self._total})"
            )
        i = self._point_index(start)
        j = self._point_index(end)
        sched = self._sched
        if j - i == 1:
            sched[i] += amount
        else:
            sched[i:j] = [s + amount for s in sched[i:j]]
        self._refs[i] += 1
        self._refs[j] += 1
        sid = self._next_id
        self._next_id = sid + 1
        self._spans[sid] = [start, end, amount]
        return sid

    def _unschedule(self, start: int, end: int, amount: int) -> None:
        times = self._times
        i = bisect_left(times, start)
        j = bisect_left(times, end, i)
        sched = self._sched
        if j - i == 1:
            sched[i] -= amount
        else:
            sched[i:j] = [s - amount for s in sched[i:j]]

    def _release_point(self, t: int) -> None:
        times = self._times
        k = bisect_left(times, t)
        refs = self._refs
        refs[k] -= 1
        if refs[k] == 0:
            # nothing starts or ends here any more: the state equals the previous point's
            del times[k]
            del self._sched[k]
            del refs[k]

    def rem_span(self, span_id: int) -> None:
        """Remove a span, restoring exactly what it took."""
        rec = self._spans.pop(span_id, None)
        if rec is None:
            raise PlannerSpanNotFoundError(f"no span with id {span_id}")
        start, end, amount = rec
        self._unschedule(start, end, amount)
        self._release_point(end)
        self._release_point(start)

    def reduce_span(self, span_id: int, amount: int) -> int:
        """Release ``amount`` units of a span (partial release); returns what the span still
        holds. Releasing everything removes the span (then 0 is returned). 0 is a no-op."""
        rec = self._spans.get(span_id)
        if rec is None:
            raise PlannerSpanNotFoundError(f"no span with id {span_id}")
        if amount < 0 or amount > rec[2]:
            raise PlannerInvalidError(
                f"cannot release {amount} units from span {span_id} holding {rec[2]}"
            )
        if amount == rec[2]:
            self.rem_span(span_id)
            return 0
        if amount:
            self._unschedule(rec[0], rec[1], amount)
            rec[2] -= amount
        return rec[2]

    # ------------------------------------------------------------------ elasticity
    def update_total(self, new_total: int, *, allow_overcommit: bool = False) -> None:
        """Change the capacity (a node resized, a device added or lost).

        Shrinking below what is already scheduled at some time raises PlannerNoFitError,
        unless ``allow_overcommit``: then the planner records the overcommit (those times
        report 0 free until enough spans end) instead of refusing the change.
        """
        if new_total < 0:
            raise PlannerInvalidError(f"total must be >= 0, got {new_total}")
        if not allow_overcommit:
            peak = max(self._sched)
            if peak > new_total:
                raise PlannerNoFitError(
                    f"cannot set total to {new_total}: {peak} units are already scheduled"
                )
        self._total = new_total

    # ------------------------------------------------------------------ debugging
    def points(self) -> list[Point]:
        """Scheduled points in time order (remaining may be negative only after an
        overcommitting update_total)."""
        total = self._total
        return [
            Point(t, s, total - s, r)
            for t, s, r in zip(self._times, self._sched, self._refs, strict=True)
        ]

    def __repr__(self) -> str:
        return (
            f"Planner(total={self._total}, base={self._base}, horizon={self.horizon}, "
            f"spans={len(self._spans)}, points={len(self._times)})"
        )
