"""PlannerMulti: one Planner per resource type over a common horizon (Fluxion's planner_multi).

This is what subtree pruning filters and the root's reservation search use: a span holds a
vector of counts (one per type, 0 allowed) over one window.

Counts are given either as a mapping ``{type: count}`` (missing types mean 0) or as a
sequence aligned with :attr:`PlannerMulti.types`. A type the planner does not track has a
total of 0: asking for a positive count of it never fits (avail_during answers False,
add_span / avail_time_first raise PlannerRangeError); asking for 0 of it is ignored.

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

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from fluxnetes.plan.errors import (
    PlannerInvalidError,
    PlannerNoFitError,
    PlannerRangeError,
    PlannerSpanNotFoundError,
)
from fluxnetes.plan.planner import HORIZON, Planner, Point

Counts = Mapping[str, int] | Sequence[int]


@dataclass(frozen=True, slots=True)
class MultiSpan:
    """A planned vector of counts over ``[start, start + duration)``."""

    span_id: int
    start: int
    duration: int
    counts: Mapping[str, int]

    @property
    def end(self) -> int:
        return self.start + self.duration


class PlannerMulti:
    """Calendars of several resource types sharing one horizon."""

    __slots__ = ("_base", "_horizon", "_next_id", "_planners", "_spans", "_types")

    def __init__(self, totals: Mapping[str, int], base: int = 0, horizon: int = HORIZON) -> None:
        if horizon < 1:
            raise PlannerInvalidError(f"horizon must be >= 1, got {horizon}")
        self._base = base
        self._horizon = horizon
        self._planners: dict[str, Planner] = {}
        for typ, total in totals.items():
            self._planners[typ] = self._new_planner(typ, total)
        self._types: tuple[str, ...] = tuple(self._planners)
        # span id -> (start, end, {type: (sub span id, count)}) ; count 0 types are absent
        self._spans: dict[int, tuple[int, int, dict[str, list[int]]]] = {}
        self._next_id = 1

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
        return {t: p.total for t, p in self._planners.items()}

    def total(self, typ: str) -> int:
        """Total of one type (0 for an untracked type)."""
        p = self._planners.get(typ)
        return p.total if p is not None else 0

    def planner(self, typ: str) -> Planner:
        """The sub-planner of one type (read it; change it only through this object)."""
        try:
            return self._planners[typ]
        except KeyError:
            raise PlannerInvalidError(
                f"type {typ!r} is not tracked (tracked: {self._types})"
            ) from None

    def __len__(self) -> int:
        return len(self._spans)

    def __contains__(self, span_id: object) -> bool:
        return span_id in self._spans

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
            p = self._planners.get(typ)
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

    # ------------------------------------------------------------------ queries
    def avail_during(self, t: int, duration: int, counts: Counts) -> bool:
        """True if every type has its count free over ``[t, t + duration)``."""
        planners = self._planners
        if isinstance(counts, dict):
            # hot path (matcher prune checks): no normalisation pass
            self._check_window(t, duration)
            end = t + duration
            for typ, c in counts.items():
                if c > 0:
                    p = planners.get(typ)
                    if p is None or not p._fits(t, end, c):
                        return False
                elif c < 0:
                    raise PlannerInvalidError(f"count of {typ!r} must be >= 0, got {c}")
            return True
        self._check_window(t, duration)
        for typ, c in self._items(counts):
            p = planners.get(typ)
            if p is None or not p.avail_during(t, duration, c):
                return False
        return True

    def avail_at(self, t: int) -> dict[str, int]:
        """Free amount of every type in force at ``t``."""
        return {typ: p.avail_at(t) for typ, p in self._planners.items()}

    def avail_resources_during(self, t: int, duration: int) -> dict[str, int]:
        """Minimum free amount of every type over ``[t, t + duration)``."""
        self._check_window(t, duration)
        return {typ: p.avail_resources_during(t, duration) for typ, p in self._planners.items()}

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
        for p in self._planners.values():
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
        planners = self._planners
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

    # ------------------------------------------------------------------ spans
    def add_span(self, start: int, duration: int, counts: Counts) -> int:
        """Plan a vector of counts over ``[start, start + duration)`` (all or nothing).

        Raises PlannerRangeError if a count exceeds its total, PlannerNoFitError if some type
        is not free over the window, PlannerInvalidError for bad arguments. A span whose
        counts are all 0 is allowed (it holds nothing but has an id)."""
        self._check_window(start, duration)
        items = self._items(counts)
        self._check_range(items)
        planners = self._planners
        for typ, c in items:
            if not planners[typ].avail_during(start, duration, c):
                raise PlannerNoFitError(
                    f"{c} {typ!r} are not free over [{start}, {start + duration}) "
                    f"(only {planners[typ].avail_resources_during(start, duration)} "
                    f"of {planners[typ].total})"
                )
        subs: dict[str, list[int]] = {}
        for typ, c in items:
            subs[typ] = [planners[typ].add_span(start, duration, c), c]
        sid = self._next_id
        self._next_id = sid + 1
        self._spans[sid] = (start, start + duration, subs)
        return sid

    def span(self, span_id: int) -> MultiSpan:
        rec = self._spans.get(span_id)
        if rec is None:
            raise PlannerSpanNotFoundError(f"no span with id {span_id}")
        start, end, subs = rec
        counts = {typ: subs[typ][1] if typ in subs else 0 for typ in self._types}
        return MultiSpan(span_id, start, end - start, counts)

    def spans(self) -> list[MultiSpan]:
        return [self.span(sid) for sid in sorted(self._spans)]

    def rem_span(self, span_id: int) -> None:
        """Remove a span, restoring exactly what it took."""
        rec = self._spans.pop(span_id, None)
        if rec is None:
            raise PlannerSpanNotFoundError(f"no span with id {span_id}")
        for typ, (sub, _c) in rec[2].items():
            self._planners[typ].rem_span(sub)

    def reduce_span(self, span_id: int, counts: Counts) -> bool:
        """Release part of a span (partial release). Returns True if the span is now empty
        and was removed (every count reached 0)."""
        rec = self._spans.get(span_id)
        if rec is None:
            raise PlannerSpanNotFoundError(f"no span with id {span_id}")
        subs = rec[2]
        items = self._items(counts)
        for typ, c in items:
            held = subs[typ][1] if typ in subs else 0
            if c > held:
                raise PlannerInvalidError(
                    f"cannot release {c} {typ!r} from span {span_id} holding {held}"
                )
        for typ, c in items:
            entry = subs[typ]
            left = self._planners[typ].reduce_span(entry[0], c)
            if left == 0:
                del subs[typ]
            else:
                entry[1] = left
        if not subs:
            del self._spans[span_id]
            return True
        return False

    # ------------------------------------------------------------------ elasticity
    def update_total(self, typ: str, new_total: int, *, allow_overcommit: bool = False) -> None:
        """Change the total of one type; an unknown type is added (existing spans hold 0 of it)."""
        p = self._planners.get(typ)
        if p is None:
            self._planners[typ] = self._new_planner(typ, new_total)
            self._types = tuple(self._planners)
        else:
            p.update_total(new_total, allow_overcommit=allow_overcommit)

    def update_totals(self, totals: Mapping[str, int], *, allow_overcommit: bool = False) -> None:
        """Re-total or add several types (each checked before any is changed)."""
        if not allow_overcommit:
            for typ, new_total in totals.items():
                p = self._planners.get(typ)
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
        if typ in self._planners:
            raise PlannerInvalidError(f"type {typ!r} is already tracked")
        self.update_total(typ, total)

    # ------------------------------------------------------------------ debugging
    def points(self) -> dict[str, list[Point]]:
        return {typ: p.points() for typ, p in self._planners.items()}

    def __repr__(self) -> str:
        return f"PlannerMulti(totals={self.totals()}, base={self._base}, spans={len(self._spans)})"
