"""plan: availability of resources over time (Fluxion's planner and planner_multi).

Pure core: integer time is always passed in; nothing here reads a clock.
"""

from fluxnetes.plan.errors import (
    PlannerError,
    PlannerInvalidError,
    PlannerNoFitError,
    PlannerRangeError,
    PlannerSpanNotFoundError,
)
from fluxnetes.plan.multi import MultiSpan, PlannerMulti
from fluxnetes.plan.planner import HORIZON, SMALL, Planner
from fluxnetes.plan.spantable import (
    Point,
    Span,
    SpanTable,
    max_overlap,
    table_free,
    table_overlaps,
)

__all__ = [
    "HORIZON",
    "SMALL",
    "MultiSpan",
    "Planner",
    "PlannerError",
    "PlannerInvalidError",
    "PlannerMulti",
    "PlannerNoFitError",
    "PlannerRangeError",
    "PlannerSpanNotFoundError",
    "Point",
    "Span",
    "SpanTable",
    "max_overlap",
    "table_free",
    "table_overlaps",
]
