"""Every recorded job's window [at, end), kept so that "has every recorded job started by now
and not ended?" (the precondition of the index fast paths, the counters and ``first``'s room
lists) is two heap reads, and so that the satisfiability cache knows when a span reaches its
window (``late``). Which jobs are reservations is kept here too (``Matcher.reservation_count``).
"""

from __future__ import annotations

from collections.abc import Mapping

from fluxnetes.match.jobmeta import FAR, GRAPH_END
from fluxnetes.match.multiset import MinMultiset
from fluxnetes.match.results import JobRecord

# spans ending after this could overlap a satisfiability walk's window
# [FAR - duration - 1, FAR - 1) (duration <= GRAPH_END); spans end by GRAPH_END normally
SAT_SAFE_END = FAR - GRAPH_END - 1


class JobSpans:
    """The recorded jobs' windows, by job id, with the latest start and earliest end."""

    def __init__(self) -> None:
        # every recorded job's [at, end); the starts (negated: the latest is the least) and
        # the ends as multisets: "all active at now" from the latest start and earliest end
        self.spans: dict[int, tuple[int, int]] = {}
        self.starts = MinMultiset()
        self.ends = MinMultiset()
        self.late: set[int] = set()  # jobs with spans reaching the satisfiability window
        self.reserved: set[int] = set()  # jobs recorded as reservations
        # the unoptimised path's (``Matcher.fast_fail = False``) bounds: raised by every new
        # span, recomputed from the job records after a release (``dirty``)
        self.dirty = False
        self.max_at = -1
        self.min_end = GRAPH_END + 1

    def note(self, at: int, end: int) -> None:
        if at > self.max_at:
            self.max_at = at
        if end < self.min_end:
            self.min_end = end

    def track(self, jid: int, at: int, end: int, reserved: bool) -> None:
        """Job ``jid`` holds [at, end) from now on (replacing what it held)."""
        if reserved:
            self.reserved.add(jid)
        else:
            self.reserved.discard(jid)
        old = self.spans.get(jid)
        if old == (at, end):
            return
        if old is not None:
            self.untrack(jid)
        self.spans[jid] = (at, end)
        self.starts.add(-at)
        self.ends.add(end)
        if end > SAT_SAFE_END:
            self.late.add(jid)

    def untrack(self, jid: int) -> None:
        self.reserved.discard(jid)
        old = self.spans.pop(jid, None)
        if old is None:
            return
        self.starts.remove(-old[0])
        self.ends.remove(old[1])
        self.late.discard(jid)

    def all_active(self, now: int) -> bool:
        """Has every tracked job started by ``now`` and not ended at ``now``?"""
        starts, ends = self.starts, self.ends
        return (not starts or -starts.min() <= now) and (not ends or now < ends.min())

    def all_active_recorded(self, now: int, jobs: Mapping[int, JobRecord]) -> bool:
        """``all_active`` the unoptimised way: bounds recomputed from ``jobs`` when dirty."""
        if self.dirty:
            self.max_at = max((r.at for r in jobs.values()), default=-1)
            self.min_end = min((r.end for r in jobs.values()), default=GRAPH_END + 1)
            self.dirty = False
        return self.max_at <= now < self.min_end
