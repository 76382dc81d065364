"""PlannerMulti: one Planner per resource type over a common horizon (Fluxion's planner_multi).

This is what the matcher's subtree pruning filters and the root's reservation search use: a
span holds a vector of counts (one per type, 0 allowed) over one window.

Counts are given either as a mapping ``{type: count}`` (missing types mean 0) or as a
sequence aligned with :attr:`PlannerMulti.types`. A type the planner does not track has a
total of 0: asking for a positive count of it never fits (avail_during answers False,
add_span / avail_time_first raise PlannerRangeError); asking for 0 of it is ignored.

As :class:`Planner`, two ways to use it: the checked API (``add_span`` returns an id) and the
keyed, trusted API of the matcher's hot paths (``put`` / ``pop`` / ``fits`` / ``free`` /
``fit_times``, keys chosen by the caller, end-based windows). Read-only, it is a mapping
``key -> (start, end, counts aligned with types)``.

Difference from Fluxion, on purpose: ``avail_time_first`` draws candidate times from the
*union* of every type's scheduled points, where Fluxion only uses the first type's points.
Fluxion can therefore miss an earlier start that only another type's point reveals (e.g. GPUs
freed at t while cores were already free); the union never does, and every time it returns
is still an existing scheduled point. The search is a leapfrog join: each type reports the
earliest instant >= t where its own count fits; if they disagree, t jumps to the latest of
those answers (a scheduled point of that type) and the round repeats. Cost per round is
k x O(log P + points scanned); rounds are bounded by the number of distinct points.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from fluxnetes.plan.errors import (
    PlannerInvalidError,
    PlannerNoFitError,
    PlannerRangeError,
    PlannerSpanNotFoundError,
)
from fluxnetes.plan.planner import HORIZON, Planner
from fluxnetes.plan.spantable import Point

Counts = Mapping[str, int] | Sequence[int]


@dataclass(frozen=True, slots=True)
class MultiSpan:
    """A planned vector of counts over ``[start, start + duration)``."""

    span_id: Hashable
    start: int
    duration: int
    counts: Mapping[str, int]

    @property
    def end(self) -> int:
        return self.start + self.duration


class PlannerMulti:
    """Calendars of several resource types sharing one horizon."""

    __slots__ = ("_base", "_horizon", "_idx", "_list", "_next_id", "_planners", "_spans", "_types")

    def __init__(self, totals: Mapping[str, int], base: int = 0, horizon: int = HORIZON) -> None:
        if horizon < 1:
            raise PlannerInvalidError(f"horizon must be >= 1, got {horizon}")
        self._base = base
        self._horizon = horizon
        planners: dict[str, Planner] = {}
        for typ, total in totals.items():
            planners[typ] = self._new_planner(typ, total)
        self._planners: dict[str, Planner] | None = planners
        self._types: tuple[str, ...] = ()
        self._list: list[Planner] = []
        self._idx: Mapping[str, int] = {}
        self._retype()
        # key -> (start, end, counts aligned with the types when it was planned; a type
        # added later holds 0 of it). Each type's planner holds the same key when count > 0.
        self._spans: dict[Hashable, tuple[int, int, tuple[int, ...]]] = {}
        self._next_id = 1

    @classmethod
    def aligned(
        cls, types: tuple[str, ...], index: Mapping[str, int], totals: Sequence[int]
    ) -> PlannerMulti:
        """Trusted, cheap constructor for callers that already hold the types, their index
        (type -> position) and totals aligned with them (the matcher makes one filter per
        inner vertex it touches): ``types`` and ``index`` are shared, never mutated here."""
        self = cls.__new__(cls)
        self._base = 0
        self._horizon = HORIZON
        self._planners = None
        self._types = types
        self._idx = index
        self._list = [Planner(t) for t in totals]
        self._spans = {}
        self._next_id = 1
        return self

    def _by_type(self) -> dict[str, Planner]:
        planners = self._planners
        if planners is None:
            planners = self._planners = dict(zip(self._types, self._list, strict=True))
        return planners

    def _retype(self) -> None:
        planners = self._by_type()
        self._types = tuple(planners)
        self._list = list(planners.values())
        self._idx = {t: i for i, t in enumerate(self._types)}

    def _new_planner(self, typ: str, total: int) -> Planner:
        if not isinstance(typ, str) or not typ:
            raise PlannerInvalidError(f"resource type must be a non-empty string, got {typ!r}")
        if total < 0:
            raise PlannerInvalidError(f"total of {typ!r} must be >= 0, got {total}")
        return Planner(total, self._base, self._horizon)

    # ------------------------------------------------------------------ properties
    @property
    def types(self) -> tuple[str, ...]:
        """Tracked types, in the order sequences of counts are aligned with."""
        return self._types

    @property
    def base(self) -> int:
        return self._base

    @property
    def horizon(self) -> int:
        return self._horizon

    @property
    def end(self) -> int:
        return self._base + self._horizon

    def totals(self) -> dict[str, int]:
        return {t: p.total for t, p in self._by_type().items()}

    def total(self, typ: str) -> int:
        """Total of one type (0 for an untracked type)."""
        p = self._by_type().get(typ)
        return p.total if p is not None else 0

    def planner(self, typ: str) -> Planner:
        """The sub-planner of one type (read it; change it only through this object)."""
        try:
            return self._by_type()[typ]
        except KeyError:
            raise PlannerInvalidError(
                f"type {typ!r} is not tracked (tracked: {self._types})"
            ) from None

    def used(self) -> list[int]:
        """Sum of every span's count, per type (aligned with :attr:`types`)."""
        return [p.used for p in self._list]

    def __len__(self) -> int:
        return len(self._spans)

    def __contains__(self, key: object) -> bool:
        return key in self._spans

    def __iter__(self) -> Iterator[Hashable]:
        return iter(self._spans)

    def keys(self) -> Iterable[Hashable]:
        return self._spans.keys()

    def __getitem__(self, key: Hashable) -> tuple[int, int, tuple[int, ...]]:
        start, end, counts = self._spans[key]
        return (start, end, self._aligned(counts))

    def _aligned(self, counts: tuple[int, ...]) -> tuple[int, ...]:
        n = len(self._types)
        return counts if len(counts) == n else counts + (0,) * (n - len(counts))

    # ------------------------------------------------------------------ helpers
    def _items(self, counts: Counts) -> list[tuple[str, int]]:
        """Normalise counts to (type, count) pairs with count > 0; validate."""
        pairs: Iterable[tuple[str, int]]
        if isinstance(counts, Mapping):
            pairs = counts.items()
        else:
            if len(counts) != len(self._types):
                raise PlannerInvalidError(
                    f"expected {len(self._types)} counts (types {self._types}), got {len(counts)}"
                )
            pairs = zip(self._types, counts, strict=True)
        out: list[tuple[str, int]] = []
        for typ, c in pairs:
            if c < 0:
                raise PlannerInvalidError(f"count of {typ!r} must be >= 0, got {c}")
            if c:
                out.append((typ, c))
        return out

    def _check_range(self, items: list[tuple[str, int]]) -> None:
        for typ, c in items:
            p = self._by_type().get(typ)
            total = p.total if p is not None else 0
            if c > total:
                raise PlannerRangeError(
                    f"request of {c} {typ!r} exceeds the total {total}: it never fits"
                )

    def _check_window(self, t: int, duration: int) -> None:
        if duration < 1:
            raise PlannerInvalidError(f"duration must be >= 1, got {duration}")
        if t < self._base or t + duration > self._base + self._horizon:
            raise PlannerInvalidError(
                f"window [{t}, {t + duration}) is outside the planner horizon "
                f"[{self._base}, {self._base + self._horizon})"
            )

    # ------------------------------------------------------------------ trusted, keyed API
    def put(self, key: Hashable, start: int, end: int, counts: Sequence[int]) -> None:
        """Record counts (aligned with :attr:`types`) over ``[start, end)`` under ``key``
        without checking that they fit. The key must be new."""
        spans = self._spans
        if key in spans:
            raise PlannerInvalidError(f"span {key!r} already exists")
        lst = self._list
        for i, c in enumerate(counts):
            if c:
                # Planner._put inline (one call less per type: this runs for every inner
                # vertex of every commit); the key is new to each sub-planner too
                p = lst[i]
                ps = p._spans
                if ps:
                    b = p._bounds
                    if b is not None:
                        p._bounds = (b[0] if b[0] > start else start, b[1] if b[1] < end else end)
                else:
                    p._bounds = (start, end)
                ps[key] = (start, end, c)
                p.used += c
                if p._times is not None:
                    p._schedule(start, end, c)
        spans[key] = (start, end, tuple(counts))

    def pop(self, key: Hashable) -> tuple[int, ...] | None:
        """Remove the span ``key`` (restoring exactly); returns its counts, None if absent."""
        rec = self._spans.pop(key, None)
        if rec is None:
            return None
        lst = self._list
        counts = rec[2]
        for i, c in enumerate(counts):
            if c:
                lst[i].pop(key)
        return counts if len(counts) == len(lst) else self._aligned(counts)

    def unheld(self, i: int) -> int:
        """Units of type number ``i`` that no span holds at all (total minus every span's
        count, whatever its window; may be negative)."""
        p = self._list[i]
        return p._total - p.used

    def free(self, i: int, at: int, end: int) -> int:
        """Fewest units of type number ``i`` free at an instant of ``[at, end)``."""
        return self._list[i].free(at, end)

    def fits(self, req: Mapping[str, int], at: int, end: int) -> bool:
        """Is every requested count of a tracked type free over ``[at, end)``? Types this
        planner does not track, and zero counts, are ignored (the matcher's prune check)."""
        idx = self._idx
        lst = self._list
        for t, need in req.items():
            i = idx.get(t)
            if i is None or not need:
                continue
            p = lst[i]
            tot = p._total  # same package: the prune check is the matcher's hottest call
            if need > tot:
                return False
            if tot - p.used >= need:
                continue
            if not p._fits_busy(at, end, need):
                return False
        return True

    def fit_times(self, on_or_after: int, duration: int, req: Mapping[str, int]) -> Iterator[int]:
        """Scheduled points ``>= on_or_after`` (increasing) where every requested count of a
        tracked type fits over ``[t, t + duration)``; each step reads the current state.
        Nothing if a count exceeds its total (it never fits)."""
        items = [(t, c) for t, c in req.items() if c > 0 and t in self._idx]
        for t, c in items:
            if c > self._list[self._idx[t]].total:
                return
        t0 = self._joint_fit(self._next_point(on_or_after - 1), duration, items)
        while t0 is not None:
            yield t0
            t0 = self._joint_fit(self._next_point(t0), duration, items)

    # ------------------------------------------------------------------ checked queries
    def avail_during(self, t: int, duration: int, counts: Counts) -> bool:
        """True if every type has its count free over ``[t, t + duration)``."""
        planners = self._by_type()
        self._check_window(t, duration)
        end = t + duration
        if isinstance(counts, dict):
            # hot path: no normalisation pass
            for typ, c in counts.items():
                if c > 0:
                    p = planners.get(typ)
                    if p is None or not p.fits(t, end, c):
                        return False
                elif c < 0:
                    raise PlannerInvalidError(f"count of {typ!r} must be >= 0, got {c}")
            return True
        for typ, c in self._items(counts):
            p = planners.get(typ)
            if p is None or not p.fits(t, end, c):
                return False
        return True

    def avail_at(self, t: int) -> dict[str, int]:
        """Free amount of every type in force at ``t``."""
        return {typ: p.avail_at(t) for typ, p in self._by_type().items()}

    def avail_resources_during(self, t: int, duration: int) -> dict[str, int]:
        """Minimum free amount of every type over ``[t, t + duration)``."""
        self._check_window(t, duration)
        return {typ: p.avail_resources_during(t, duration) for typ, p in self._by_type().items()}

    def avail_time_first(
        self, on_or_after: int, duration: int, counts: Counts, *, include_start: bool = False
    ) -> int | None:
        """Earliest scheduled point (of any type) ``t >= on_or_after`` where all counts fit over
        ``[t, t + duration)`` within the horizon; None if none. ``include_start`` also allows
        ``on_or_after`` itself. Raises PlannerRangeError if a count exceeds its total."""
        items = self._prepare_search(on_or_after, duration, counts)
        start = on_or_after if include_start else self._next_point(on_or_after - 1)
        return self._joint_fit(start, duration, items)

    def avail_times(
        self, on_or_after: int, duration: int, counts: Counts, *, include_start: bool = False
    ) -> Iterator[int]:
        """Successive candidate start times (increasing); each step reads the current state."""
        items = self._prepare_search(on_or_after, duration, counts)
        start = on_or_after if include_start else self._next_point(on_or_after - 1)
        t = self._joint_fit(start, duration, items)
        while t is not None:
            yield t
            t = self._joint_fit(self._next_point(t), duration, items)

    def _prepare_search(
        self, on_or_after: int, duration: int, counts: Counts
    ) -> list[tuple[str, int]]:
        if duration < 1:
            raise PlannerInvalidError(f"duration must be >= 1, got {duration}")
        if on_or_after < self._base:
            raise PlannerInvalidError(
                f"on_or_after {on_or_after} is before the planner base {self._base}"
            )
        items = self._items(counts)
        self._check_range(items)
        return items

    def _next_point(self, t: int) -> int | None:
        """First scheduled point of any type strictly after ``t`` (base counts as a point)."""
        if t < self._base:
            return self._base
        best: int | None = None
        for p in self._list:
            if not p.used:
                continue  # only the base point, which is <= t
            nxt = p.next_point_after(t)
            if nxt is not None and (best is None or nxt < best):
                best = nxt
        return best

    def _joint_fit(self, t: int | None, duration: int, items: list[tuple[str, int]]) -> int | None:
        if t is None:
            return None
        end = self._base + self._horizon
        if not items:
            # nothing asked: the first candidate whose window fits the horizon
            return t if t + duration <= end else None
        planners = self._by_type()
        while True:
            if t + duration > end:
                return None
            latest = t
            for typ, c in items:
                e = planners[typ].earliest_any(t, duration, c)
                if e is None:
                    return None
                if e > latest:
                    latest = e
            if latest == t:
                return t
            t = latest  # a scheduled point of some type; no instant in [t, latest) fits all

    # ------------------------------------------------------------------ checked spans
    def add_span(self, start: int, duration: int, counts: Counts) -> int:
        """Plan a vector of counts over ``[start, start + duration)`` (all or nothing).

        Raises PlannerRangeError if a count exceeds its total, PlannerNoFitError if some type
        is not free over the window, PlannerInvalidError for bad arguments. A span whose
        counts are all 0 is allowed (it holds nothing but has an id)."""
        self._check_window(start, duration)
        items = self._items(counts)
        self._check_range(items)
        planners = self._by_type()
        end = start + duration
        for typ, c in items:
            if not planners[typ].fits(start, end, c):
                raise PlannerNoFitError(
                    f"{c} {typ!r} are not free over [{start}, {end}) "
                    f"(only {planners[typ].avail_resources_during(start, duration)} "
                    f"of {planners[typ].total})"
                )
        sid = self._next_id
        while sid in self._spans:
            sid += 1
        self._next_id = sid + 1
        vec = [0] * len(self._types)
        for typ, c in items:
            vec[self._idx[typ]] = c
        self.put(sid, start, end, vec)
        return sid

    def span(self, span_id: Hashable) -> MultiSpan:
        rec = self._spans.get(span_id)
        if rec is None:
            raise PlannerSpanNotFoundError(f"no span with id {span_id}")
        start, end, _c = rec
        counts = dict(zip(self._types, self[span_id][2], strict=True))
        return MultiSpan(span_id, start, end - start, counts)

    def spans(self) -> list[MultiSpan]:
        return [self.span(sid) for sid in self._spans]

    def rem_span(self, span_id: Hashable) -> None:
        """Remove a span, restoring exactly what it took."""
        if self.pop(span_id) is None:
            raise PlannerSpanNotFoundError(f"no span with id {span_id}")

    def reduce_span(self, span_id: Hashable, counts: Counts) -> bool:
        """Release part of a span (partial release). Returns True if the span is now empty
        and was removed (every count reached 0)."""
        rec = self._spans.get(span_id)
        if rec is None:
            raise PlannerSpanNotFoundError(f"no span with id {span_id}")
        held = list(self._aligned(rec[2]))
        items = self._items(counts)
        idx = self._idx
        for typ, c in items:
            i = idx.get(typ)
            have = held[i] if i is not None and i < len(held) else 0
            if c > have:
                raise PlannerInvalidError(
                    f"cannot release {c} {typ!r} from span {span_id} holding {have}"
                )
        for typ, c in items:
            i = idx[typ]
            self._list[i].reduce_span(span_id, c)
            held[i] -= c
        if not any(held):
            del self._spans[span_id]
            return True
        self._spans[span_id] = (rec[0], rec[1], tuple(held))
        return False

    # ------------------------------------------------------------------ elasticity
    def update_total(self, typ: str, new_total: int, *, allow_overcommit: bool = False) -> None:
        """Change the total of one type; an unknown type is added (existing spans hold 0 of it)."""
        p = self._by_type().get(typ)
        if p is None:
            self._by_type()[typ] = self._new_planner(typ, new_total)
            self._retype()
        else:
            p.update_total(new_total, allow_overcommit=allow_overcommit)

    def update_totals(self, totals: Mapping[str, int], *, allow_overcommit: bool = False) -> None:
        """Re-total or add several types (each checked before any is changed)."""
        if not allow_overcommit:
            for typ, new_total in totals.items():
                p = self._by_type().get(typ)
                if p is not None and new_total >= 0:
                    peak = max(pt.scheduled for pt in p.points())
                    if peak > new_total:
                        raise PlannerNoFitError(
                            f"cannot set total of {typ!r} to {new_total}: "
                            f"{peak} units are already scheduled"
                        )
        for typ, new_total in totals.items():
            self.update_total(typ, new_total, allow_overcommit=allow_overcommit)

    def add_type(self, typ: str, total: int) -> None:
        """Track a new type (error if already tracked)."""
        if typ in self._by_type():
            raise PlannerInvalidError(f"type {typ!r} is already tracked")
        self.update_total(typ, total)

    def retyped(self, totals: Mapping[str, int]) -> PlannerMulti:
        """A new planner tracking exactly ``totals`` (in that order) holding the same spans
        under the same keys (counts of types no longer tracked are dropped, new types hold
        0). Used when a subtree changes shape (grow/shrink)."""
        new = PlannerMulti(totals, self._base, self._horizon)
        old = self._idx
        for key, (start, end, counts) in self._spans.items():
            vec = [counts[old[t]] if t in old and old[t] < len(counts) else 0 for t in new._types]
            new.put(key, start, end, vec)
        return new

    # ------------------------------------------------------------------ debugging
    def points(self) -> dict[str, list[Point]]:
        return {typ: p.points() for typ, p in self._by_type().items()}

    def __repr__(self) -> str:
        return f"PlannerMulti(totals={self.totals()}, base={self._base}, spans={len(self._spans)})"
