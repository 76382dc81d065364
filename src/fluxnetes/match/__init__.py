"""The matcher: Fluxion-faithful DFU traversal, policies, allocation records."""

from fluxnetes.match.matcher import Matcher
from fluxnetes.match.policies import POLICIES
from fluxnetes.match.results import (
    AllocVertex,
    JobRecord,
    MatchError,
    MatchResult,
    MatchStatus,
    NodeShare,
)

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
