"""The span table: a planner's storage (key -> ``(start, end, amount)``) and the window
queries that answer from the spans alone, with the records a Planner hands out (Span, Point).
Split out of plan/planner.py (the Planner API and its scheduled points); the matcher uses
these bare on each vertex's own table. Pure core, no clock."""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Span:
    """A planned amount over ``[start, start + duration)``."""

    span_id: Hashable
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


#: A span table: key -> (start, end, amount). The storage of every planner; also used bare,
#: without a Planner object around it, by the matcher for the own planner of each vertex
#: (hundreds of thousands of mostly empty calendars: a dict per vertex that has ever been
#: used, which the cyclic GC can untrack, costs far less than an object).
SpanTable = Mapping[Any, tuple[int, int, int]]


def max_overlap(spans: Iterable[tuple[int, int, int]], at: int, end: int) -> int:
    """Largest total amount of ``(start, end, amount)`` spans in use at an instant of
    ``[at, end)``: the usage only rises where a span starts, so look at ``at`` and at every
    start inside the window. For small tables (the points of a Planner beat it above
    :data:`SMALL` spans)."""
    rel = [s for s in spans if s[0] < end and s[1] > at and s[2]]
    if not rel:
        return 0
    if len(rel) == 1:
        return rel[0][2]
    best = 0
    for p in {at if s[0] < at else s[0] for s in rel}:
        tot = 0
        for s in rel:
            if s[0] <= p < s[1]:
                tot += s[2]
        if tot > best:
            best = tot
    return best


def table_free(spans: SpanTable, total: int, used: int, at: int, end: int) -> int:
    """Fewest units free at an instant of ``[at, end)`` in a span table holding ``used``
    units in all (its sum, which the caller keeps: 0 answers at once)."""
    if not used:
        return total
    return total - max_overlap(spans.values(), at, end)


def table_overlaps(spans: SpanTable, at: int, end: int) -> bool:
    """Does any span of the table (whatever its amount) intersect ``[at, end)``?"""
    return any(s[0] < end and s[1] > at for s in spans.values())
