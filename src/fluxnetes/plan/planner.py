"""Single-resource planner: a calendar of one resource quantity over integer time.

This is the one implementation of "availability over time" in fluxnetes: the matcher's
per-vertex planners (own amount, x_checker tags, and through :class:`PlannerMulti` the
subtree pruning filters), the root's reservation search and the queue's core profile all
use it.

Semantics (kept from Fluxion's ``resource/planner``, fluxion-spec §5.8):

* Spans occupy half-open windows ``[start, end)``.
* The state in force at time ``t`` is the one of the last point at or before ``t``.
* There is always a point at ``base``; every span adds (or reuses) a point at its start and
  one at its end; a point disappears when no span starts or ends there any more.
* Candidate start times of the earliest-fit search are existing scheduled points only
  (never arbitrary instants), at or after ``on_or_after``, and the window must end within
  the horizon.
* A request larger than the total can never fit (ERANGE).

Representation, shaped by the matcher's needs (most planners hold 0-3 spans, and most
questions are "is there plenty free?"):

* spans live in a dict ``key -> [start, end, amount]``; the key is a span id handed out by
  :meth:`add_span` or the caller's own key (a job id) given to :meth:`put`;
* ``used`` = sum of every span's amount: when ``total - used`` already covers a request, it
  fits at any time, O(1);
* ``bounds`` = (latest start, earliest end): when every span covers the whole window the
  usage there is ``used``, O(1);
* the *scheduled points* (three parallel lists sorted by time: times, scheduled amount,
  reference counts, searched with ``bisect``) are built only when a question needs them and
  the planner holds more than a handful of spans; once built they are kept up to date by
  every change (O(log P + w) plus a list insert/delete, a memmove of P pointers). Small
  planners answer by scanning their few spans.

Complexity, with P = number of points, w = points inside the window:

* ``fits`` / ``free`` / ``avail_during``: O(1) on the fast paths, else O(log P + w) (w at C
  speed) or O(s^2) for s <= SMALL spans.
* ``put`` / ``pop``: O(1) without points, O(log P + w) with them.
* ``avail_time_first``: O(log P + s) where s is the number of points scanned: the search
  slides a window over the points and, when a point inside the window is too busy, jumps
  past it (no start time before that busy point can work).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Hashable, Iterable, Iterator

from fluxnetes.plan.errors import (
    PlannerInvalidError,
    PlannerNoFitError,
    PlannerRangeError,
    PlannerSpanNotFoundError,
)
from fluxnetes.plan.spantable import Point, Span, max_overlap

#: Default horizon length (seconds): 2**62, like Fluxion's vertex planners whose duration is
#: INT64_MAX, but leaving room so that ``base + horizon`` and ``t + duration`` stay inside a
#: signed 64-bit integer for tools that store them (SQL BIGINT, JSON readers in C).
HORIZON: int = 2**62

#: Planners with at most this many spans answer time questions by scanning the spans; above
#: it they build (and then maintain) their scheduled points.
SMALL: int = 8

_NONE: list[int] = []  # placeholder of the point lists before they are built (never mutated)


def _add(sched: list[int], i: int, j: int, delta: int) -> None:
    """Add ``delta`` to ``sched[i:j]`` in place. A loop, not a slice of a new list: a
    compiled (mypyc) build then allocates no list per span added or removed (the core
    profile does both for every job), and pure Python is no slower for the few points a
    span usually covers."""
    for k in range(i, j):
        sched[k] += delta



def _max(sched: list[int], i: int, j: int) -> int:
    """``max(sched[i:j])`` (``i < j``) without the slice (a list per query, compiled)."""
    best = sched[i]
    for k in range(i + 1, j):
        x = sched[k]
        if x > best:
            best = x
    return best


class Planner:
    """Calendar of one resource quantity of capacity ``total`` over ``[base, base+horizon)``.

    Two ways to use it: the checked API (:meth:`add_span` returns an id, refuses what does
    not fit, validates every argument), or the keyed, trusted API the matcher's hot paths use
    (:meth:`put` / :meth:`pop` / :meth:`fits` / :meth:`free`, end-based windows, no checks
    beyond the key). Read-only, it is a mapping ``key -> (start, end, amount)``.
    """

    __slots__ = (
        "_base",
        "_bounds",
        "_end",
        "_next_id",
        "_refs",
        "_sched",
        "_spans",
        "_times",
        "_total",
        "used",
    )

    def __init__(self, total: int, base: int = 0, horizon: int = HORIZON) -> None:
        if total < 0:
            raise PlannerInvalidError(f"total must be >= 0, got {total}")
        if horizon < 1:
            raise PlannerInvalidError(f"horizon must be >= 1, got {horizon}")
        self._total = total
        self._base = base
        self._end = base + horizon
        self._spans: dict[Hashable, tuple[int, int, int]] = {}
        #: sum of the amounts of every span (any time)
        self.used = 0
        # (latest start, earliest end) of the spans; None = recompute when needed
        self._bounds: tuple[int, int] | None = None
        # scheduled points (None until needed); the base point holds one permanent reference
        # (lists are only allocated when built: most planners never need them, and fewer
        # container objects per planner keep the cyclic GC cheap on large graphs)
        self._times: list[int] | None = None
        self._sched: list[int] = _NONE
        self._refs: list[int] = _NONE
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

    def __contains__(self, key: object) -> bool:
        return key in self._spans

    def __getitem__(self, key: Hashable) -> tuple[int, int, int]:
        return self._spans[key]

    def __iter__(self) -> Iterator[Hashable]:
        return iter(self._spans)

    def get(self, key: Hashable) -> tuple[int, int, int] | None:
        """(start, end, amount) of the span ``key``, None if absent."""
        return self._spans.get(key)

    def keys(self) -> Iterable[Hashable]:
        """Span keys (so that ``dict(planner)`` gives ``key -> (start, end, amount)``)."""
        return self._spans.keys()

    def is_idle(self) -> bool:
        """True when no span is planned at all (every query is then O(1))."""
        return not self._spans

    # ------------------------------------------------------------------ scheduled points
    def _points(self) -> list[int]:
        """The point times, building the point lists from the spans if needed."""
        times = self._times
        if times is not None:
            return times
        delta: dict[int, int] = {self._base: 0}
        refs: dict[int, int] = {self._base: 1}
        for s, e, a in self._spans.values():
            delta[s] = delta.get(s, 0) + a
            delta[e] = delta.get(e, 0) - a
            refs[s] = refs.get(s, 0) + 1
            refs[e] = refs.get(e, 0) + 1
        times = sorted(delta)
        sched = []
        cur = 0
        for t in times:
            cur += delta[t]
            sched.append(cur)
        self._times = times
        self._sched = sched
        self._refs = [refs[t] for t in times]
        return times

    def _schedule(self, start: int, end: int, amount: int) -> None:
        """Add a span to the built points (creating its start/end points if needed; a new
        point copies the state in force there)."""
        times = self._times
        assert times is not None
        sched = self._sched
        refs = self._refs
        i = bisect_left(times, start)
        if i == len(times) or times[i] != start:
            # i >= 1 because start >= base and the base point is at index 0
            times.insert(i, start)
            sched.insert(i, sched[i - 1])
            refs.insert(i, 0)
        j = bisect_left(times, end, i + 1)
        if j == len(times) or times[j] != end:
            times.insert(j, end)
            sched.insert(j, sched[j - 1])
            refs.insert(j, 0)
        _add(sched, i, j, amount)
        refs[i] += 1
        refs[j] += 1

    def _unschedule(self, start: int, end: int, amount: int) -> None:
        """Take a span off the built points; points nobody references any more go (the
        state there equals the previous point's)."""
        times = self._times
        assert times is not None
        sched = self._sched
        refs = self._refs
        i = bisect_left(times, start)
        j = bisect_left(times, end, i + 1)
        _add(sched, i, j, -amount)
        refs[j] -= 1
        if not refs[j]:
            del times[j], sched[j], refs[j]
        refs[i] -= 1
        if not refs[i]:
            del times[i], sched[i], refs[i]

    def _shift(self, start: int, end: int, delta: int) -> None:
        """Add ``delta`` to the scheduled amount of the built points in [start, end)."""
        times = self._points()
        i = bisect_left(times, start)
        j = bisect_left(times, end, i)
        _add(self._sched, i, j, delta)

    # ------------------------------------------------------------------ trusted, keyed API
    def put(self, key: Hashable, start: int, end: int, amount: int) -> None:
        """Record ``amount`` (>= 0) over ``[start, end)`` under ``key`` without checking that
        it fits (the caller knows it does). The key must be new."""
        if key in self._spans:
            raise PlannerInvalidError(f"span {key!r} already exists")
        self._put(key, start, end, amount)

    def _put(self, key: Hashable, start: int, end: int, amount: int) -> None:
        """put() for a key known to be new (PlannerMulti checked it)."""
        spans = self._spans
        if spans:
            b = self._bounds
            if b is not None:
                self._bounds = (b[0] if b[0] > start else start, b[1] if b[1] < end else end)
        else:
            self._bounds = (start, end)
        spans[key] = (start, end, amount)
        self.used += amount
        if self._times is not None:
            self._schedule(start, end, amount)

    def pop(self, key: Hashable) -> tuple[int, int, int] | None:
        """Remove the span ``key``, restoring exactly what it took; returns it (None if the
        planner has no such span)."""
        rec = self._spans.pop(key, None)
        if rec is None:
            return None
        start, end, amount = rec
        self.used -= amount
        self._bounds = None
        if self._times is not None:
            if self._spans:
                self._unschedule(start, end, amount)
            else:
                # empty again: drop the points (rebuilt if ever needed)
                self._times = None
                self._sched = self._refs = _NONE
        return rec

    def free(self, at: int, end: int) -> int:
        """Fewest units free at any instant of ``[at, end)`` (negative only after an
        overcommitting :meth:`update_total`)."""
        total = self._total
        spans = self._spans
        if not spans or not self.used:
            return total
        times = self._times
        if times is None:
            b = self._bounds
            if b is None:
                b = self._bounds = (
                    max(s[0] for s in spans.values()),
                    min(s[1] for s in spans.values()),
                )
            if b[0] <= at and b[1] >= end:
                return total - self.used  # every span covers the whole window
            if len(spans) <= SMALL:
                return total - max_overlap(spans.values(), at, end)
            times = self._points()
        i = bisect_right(times, at) - 1
        j = bisect_left(times, end, i + 1)
        return total - (self._sched[i] if j == i + 1 else _max(self._sched, i, j))

    def fits(self, at: int, end: int, amount: int) -> bool:
        """Are ``amount`` units free over the whole window ``[at, end)``?"""
        total = self._total
        if total - self.used >= amount:
            return amount <= total
        return self._fits_busy(at, end, amount)

    def _fits_busy(self, at: int, end: int, amount: int) -> bool:
        """fits() once the O(1) "plenty free" check failed."""
        if amount == self._total and self._times is None:
            # all of it: nothing at all may be planned in the window (unit resources:
            # nodes, cores), cheaper than the largest overlap
            for s in self._spans.values():  # noqa: SIM110 - a plain loop beats any() here
                if s[0] < end and s[1] > at and s[2]:
                    return False
            return True
        return self.free(at, end) >= amount

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

    # ------------------------------------------------------------------ checked queries
    def avail_at(self, t: int) -> int:
        """Free amount in force at ``t`` (never negative)."""
        if t < self._base or t >= self._end:
            raise PlannerInvalidError(
                f"time {t} is outside the planner horizon [{self._base}, {self._end})"
            )
        rem = self.free(t, t + 1)
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
        return self.fits(t, end, amount)

    def avail_resources_during(self, t: int, duration: int) -> int:
        """Minimum free amount over ``[t, t + duration)`` (never negative)."""
        end = self._check_window(t, duration)
        rem = self.free(t, end)
        return rem if rem > 0 else 0

    def first_fit(
        self, on_or_after: int, duration: int, amount: int, *, exclude: Hashable = None
    ) -> int | None:
        """Trusted avail_time_first(include_start=True, exclude=...) for hot callers (the
        queue's profile): no argument checks; None when ``amount`` exceeds the total."""
        if amount > self._total:
            return None
        rec = self._spans.get(exclude) if exclude is not None else None
        limit = self._total - amount
        if rec is None or not rec[2]:
            return self._first_fit(on_or_after, duration, limit, True)
        c = rec[2]
        if self._total - self.used + c >= amount:
            return on_or_after if on_or_after + duration <= self._end else None
        times = self._points()
        sched = self._sched
        i = bisect_left(times, rec[0])
        j = bisect_left(times, rec[1], i)
        _add(sched, i, j, -c)
        self.used -= c
        try:
            return self._first_fit(on_or_after, duration, limit, True)
        finally:
            self.used += c
            _add(sched, i, j, c)

    def fits_before(
        self, on_or_after: int, duration: int, amount: int, before: int, *, exclude: Hashable = None
    ) -> bool | None:
        """Is ``first_fit(on_or_after, duration, amount, exclude=exclude) < before``? None
        where first_fit may answer None (the request or a window past the horizon: ask it).
        Without searching past ``before``: the queue's question
        "could this reservation start earlier than it does?" (asked of every kept
        reservation in every compress cycle). The excluded span is subtracted as the scan
        reads the points instead of being taken out of the points and put back (two passes
        over its window per question)."""
        total = self._total
        if amount > total or on_or_after + duration > self._end:
            return None
        if on_or_after >= before:
            return False
        limit = total - amount
        rec = self._spans.get(exclude) if exclude is not None else None
        c = rec[2] if rec is not None else 0
        t = on_or_after
        if total - self.used + c >= amount:
            return True  # fits whatever the time, so at on_or_after itself
        times = self._points()
        sched = self._sched
        n = len(times)
        if rec is not None and rec[0] == before and before + duration <= rec[1] <= self._end:
            # the span asking starts at ``before`` (a reservation asking whether it can move
            # earlier): a window starting before it holds none of the span's points before
            # ``before`` and only the span's points after (it ends inside the span), so the
            # scan compares with two limits instead of finding the span's points and
            # subtracting per point
            high = limit + c
            k = bisect_right(times, t) - 1
            cand = t
            while True:
                if sched[k] > limit:  # (times[k] <= cand < before)
                    k += 1
                else:
                    wend = cand + duration
                    mid = wend if wend < before else before
                    j = k + 1
                    while j < n and times[j] < mid:
                        if sched[j] > limit:
                            break
                        j += 1
                    else:
                        while j < n and times[j] < wend:
                            if sched[j] > high:
                                break
                            j += 1
                        else:
                            return True
                    k = j + 1
                if k >= n:
                    return False
                cand = times[k]
                if cand >= before:
                    return False
        # the excluded span's points: sched[lo:hi] count it (first_fit shifts exactly these)
        lo = hi = 0
        if c:
            assert rec is not None
            lo = bisect_left(times, rec[0])
            hi = bisect_left(times, rec[1], lo)
        # candidates: on_or_after itself (the window from the point in force there), then
        # each later point before ``before``; a window is clear while no point in it is over
        horizon_end = self._end
        k = bisect_right(times, t) - 1
        cand = t
        while True:
            if sched[k] - (c if lo <= k < hi else 0) > limit:
                k += 1
            else:
                wend = cand + duration
                j = k + 1
                while j < n and times[j] < wend:
                    if sched[j] - (c if lo <= j < hi else 0) > limit:
                        break
                    j += 1
                else:
                    return True
                k = j + 1
            if k >= n:
                return False
            cand = times[k]
            if cand >= before:
                return False
            if cand + duration > horizon_end:
                return None

    def avail_time_first(
        self,
        on_or_after: int,
        duration: int,
        amount: int,
        *,
        include_start: bool = False,
        exclude: Hashable = None,
    ) -> int | None:
        """Earliest scheduled point ``t >= on_or_after`` such that ``amount`` units are free
        over ``[t, t + duration)`` and the window ends within the horizon; None if none.

        Only existing points are candidates (as in Fluxion). With ``include_start=True``,
        ``on_or_after`` itself is also a candidate even when no point sits there.
        ``exclude``: answer as if that span were not planned (e.g. "could this reservation
        move earlier?"); its points stay candidates, which cannot change the answer (the
        state does not change there, so an earlier candidate fits as well).
        Raises PlannerRangeError when ``amount`` exceeds the total.
        """
        self._check_search(on_or_after, duration, amount)
        rec = self._spans.get(exclude) if exclude is not None else None
        if rec is None or not rec[2]:
            return self._first_fit(on_or_after, duration, self._total - amount, include_start)
        self._points()
        self._shift(rec[0], rec[1], -rec[2])
        self.used -= rec[2]
        try:
            return self._first_fit(on_or_after, duration, self._total - amount, include_start)
        finally:
            self.used += rec[2]
            self._shift(rec[0], rec[1], rec[2])

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
        times = self._points()
        sched = self._sched
        n = len(times)
        horizon_end = self._end
        if t_is_candidate:
            if t + duration > horizon_end:
                return None
            if self._total - self.used >= self._total - limit:
                return t  # fits whatever the time
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

    def earliest_capped(self, t: int, duration: int, amount: int, cap: int) -> int | None:
        """Earliest instant ``s >= t`` (``t`` or a later point) where ``amount`` units are free
        over ``[s, min(s + duration, cap))``, for ``s < cap``; None if there is none (or
        ``amount`` exceeds the total). Trusted (no argument checks). The matcher's windows
        are capped at the graph horizon this way, so a window never grows shorter as ``s``
        moves later except by the cap: a point too busy inside the window of ``s`` is inside
        the window of every start between ``s`` and it, and the search jumps past it."""
        total = self._total
        if amount > total:
            return None
        if t >= cap:
            return None
        if total - self.used >= amount:
            return t
        times = self._points()
        sched = self._sched
        n = len(times)
        limit = total - amount
        k = bisect_right(times, t) - 1  # the point in force at t (the base point is <= t)
        cand = t
        while cand < cap:
            wend = cand + duration
            if wend > cap:
                wend = cap
            j = k
            while j < n and times[j] < wend:
                if sched[j] > limit:
                    break
                j += 1
            else:
                return cand
            k = j + 1
            if k >= n:
                return None
            cand = times[k]
        return None

    def next_point_after(self, t: int) -> int | None:
        """First scheduled point strictly after ``t`` (None if none)."""
        times = self._points()
        k = bisect_right(times, t)
        return times[k] if k < len(times) else None

    # ------------------------------------------------------------------ checked spans
    def span(self, span_id: Hashable) -> Span:
        """The span with that id (raises PlannerSpanNotFoundError)."""
        rec = self._spans.get(span_id)
        if rec is None:
            raise PlannerSpanNotFoundError(f"no span with id {span_id}")
        return Span(span_id, rec[0], rec[1] - rec[0], rec[2])

    def spans(self) -> list[Span]:
        """All live spans, in the order they were planned."""
        return [Span(sid, r[0], r[1] - r[0], r[2]) for sid, r in self._spans.items()]

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
        if not self.fits(start, end, amount):
            raise PlannerNoFitError(
                f"{amount} units are not free over [{start}, {end}) "
                f"(only {self.avail_resources_during(start, duration)} of {self._total})"
            )
        sid = self._next_id
        while sid in self._spans:
            sid += 1
        self._next_id = sid + 1
        self.put(sid, start, end, amount)
        return sid

    def rem_span(self, span_id: Hashable) -> None:
        """Remove a span, restoring exactly what it took."""
        if self.pop(span_id) is None:
            raise PlannerSpanNotFoundError(f"no span with id {span_id}")

    def reduce_span(self, span_id: Hashable, amount: int) -> int:
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
            self.pop(span_id)
            return 0
        if amount:
            if self._times is not None:
                self._shift(rec[0], rec[1], -amount)
            rec = self._spans[span_id] = (rec[0], rec[1], rec[2] - amount)
            self.used -= amount
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
        if not allow_overcommit and self.used > new_total:
            self._points()
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
        times = self._points()
        return [
            Point(t, s, total - s, r)
            for t, s, r in zip(times, self._sched, self._refs, strict=True)
        ]

    def __repr__(self) -> str:
        return (
            f"Planner(total={self._total}, base={self._base}, horizon={self.horizon}, "
            f"spans={len(self._spans)}, used={self.used})"
        )
