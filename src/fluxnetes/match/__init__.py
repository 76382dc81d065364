"""The matcher: Fluxion-faithful DFU traversal, policies, allocation records."""

from fluxnetes.match.matcher import POLICIES, JobRecord, Matcher
from fluxnetes.match.results import AllocVertex, MatchError, MatchResult, MatchStatus, NodeShare

__all__ = [
    "POLICIES",
    "AllocVertex",
    "JobRecord",
    "MatchError",
    "MatchResult",
    "MatchStatus",
    "Matcher",
    "NodeShare",
]
