"""Errors raised by the planners.

Each class carries the errno name Fluxion's planner would report, so the matcher can map
planner failures onto its own EBUSY / ENODEV / EINVAL outcomes without string matching.
"""

from __future__ import annotations


class PlannerError(Exception):
    """Base class of every planner error."""

    errno_name: str = "EINVAL"


class PlannerInvalidError(PlannerError, ValueError):
    """Bad arguments: negative or zero duration, a window outside the horizon, unknown type,
    amounts that are negative or larger than a span holds (Fluxion: EINVAL)."""

    errno_name = "EINVAL"


class PlannerRangeError(PlannerError):
    """The request exceeds the planner's total: it can never fit (Fluxion: ERANGE)."""

    errno_name = "ERANGE"


class PlannerNoFitError(PlannerError):
    """The request is within the total but not free over the asked window (an add_span that
    does not fit, or a total shrunk below what is already scheduled)."""

    errno_name = "EBUSY"


class PlannerSpanNotFoundError(PlannerError, LookupError):
    """No span with that id (Fluxion: ENOENT)."""

    errno_name = "ENOENT"

    def __str__(self) -> str:  # LookupError would quote the message like a key
        return str(self.args[0]) if self.args else "span not found"
