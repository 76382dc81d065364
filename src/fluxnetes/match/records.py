"""The matcher's job records: every recorded job (:class:`JobRecord`) by id, their windows
(:class:`JobSpans`), and how a job's state is written into the engine and the indexes from
what it holds - after a match's update pass, for a placement read back (update_allocate),
after a partial release, after a subtree is removed - and taken out again (cancel).

While the per-node counters answer (``match/firstfit.py``) their live jobs are theirs, not
recorded here; :meth:`JobRecords.adopt` takes each one over when they hand over.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fluxnetes.graph.model import ResourceGraph
from fluxnetes.match.engine import Engine
from fluxnetes.match.indexes import Indexes
from fluxnetes.match.invariants import check_invariants
from fluxnetes.match.jobmeta import GRAPH_END
from fluxnetes.match.placement import (
    holdings_from_r,
    holdings_from_shares,
    postorder,
    release_r,
    release_shares,
    write_holdings,
)
from fluxnetes.match.results import JobRecord, MatchError, NodeShare, node_shares
from fluxnetes.match.spans import JobSpans
from fluxnetes.match.vstate import VState


class JobRecords:
    """Recorded jobs by id and their windows, kept in step with the engine and the indexes."""

    def __init__(self, engine: Engine, graph: ResourceGraph, indexes: Indexes, split_pools: bool) -> None:
        self.engine = engine
        self.graph = graph
        self.idx = indexes
        self.split_pools = split_pools
        self.jobs: dict[int, JobRecord] = {}
        # every recorded job's [at, end) and which are reservations (match/spans.py)
        self.book = JobSpans()

    def add(self, rec: JobRecord) -> None:
        """Record a job the update pass has just written into the engine (``rec.entries``)."""
        at, end = rec.at, rec.at + rec.duration
        self.jobs[rec.jobid] = rec
        self.idx.touch([e.vs for e in rec.entries])
        self.book.note(at, end)
        self.book.track(rec.jobid, at, end, rec.reserved)

    def adopt(self, rec: JobRecord) -> None:
        """Record a live job of the counters, just written into the engine as they hand over
        (its window was noted when they answered; the indexes are rebuilt after them)."""
        self.jobs[rec.jobid] = rec
        self.book.track(rec.jobid, rec.at, rec.at + rec.duration, False)

    def cancel(self, jobid: int) -> None:
        rec = self.jobs.pop(jobid, None)
        if rec is None:
            raise MatchError(f"job {jobid} not found")
        self.engine.remove_entries(jobid, rec.entries, rec.reserved)
        self.idx.touch([e.vs for e in rec.entries])
        self.book.dirty = True
        self.book.untrack(jobid)

    def all_active(self, now: int, *, fast_fail: bool) -> bool:
        """Has every recorded job started by ``now`` and not ended at ``now``?"""
        if fast_fail:
            return self.book.all_active(now)
        return self.book.all_active_recorded(now, self.jobs)

    # ------------------------------------------------------------------ holdings
    @staticmethod
    def holdings(rec: JobRecord) -> dict[VState, int]:
        """What a job holds: vstate -> amount held in its own planner."""
        return {e.vs: e.plan for e in rec.entries if e.plan > 0}

    def write(self, rec: JobRecord, holdings: dict[VState, int]) -> None:
        """(Re)write a job's state from exclusive holdings: own planners, tags, filters."""
        jid = rec.jobid
        entries = write_holdings(self.engine, rec, holdings, self.split_pools)
        rec.entries = entries
        self.idx.touch(entries_vs := [e.vs for e in entries])
        self.book.note(rec.at, rec.at + rec.duration)
        self.book.track(jid, rec.at, rec.at + rec.duration, rec.reserved)
        verts = postorder(self.engine, entries_vs, holdings)
        rec.vertices = verts
        rec.nodes = node_shares(verts)

    def put(self, rec: JobRecord, holdings: dict[VState, int]) -> None:
        """Record a new job ``rec`` holding ``holdings`` (written into the engine here)."""
        self.write(rec, holdings)
        self.jobs[rec.jobid] = rec

    # ------------------------------------------------------------------ operations
    def partial_cancel(self, jobid: int, release: Mapping[str, Any] | list[NodeShare]) -> bool:
        """Release part of a job; returns True when nothing is left (the job is gone)."""
        rec = self.jobs.get(jobid)
        if rec is None:
            raise MatchError(f"job {jobid} not found")
        holdings = self.holdings(rec)
        if isinstance(release, list):
            release_shares(self.graph, rec, holdings, release)
        elif isinstance(release, Mapping):
            release_r(holdings, release)
        else:
            raise MatchError("release must be an R/JGF mapping or a list of NodeShare")
        self.engine.remove_entries(jobid, rec.entries, rec.reserved)
        self.idx.touch([e.vs for e in rec.entries])
        self.book.dirty = True
        if not any(holdings.values()):
            del self.jobs[jobid]
            self.book.untrack(jobid)
            return True
        self.write(rec, {u: a for u, a in holdings.items() if a > 0})
        return False

    def place(self, jobid: int, placement: Mapping[str, Any] | list[NodeShare], at: int,
              duration: int) -> JobRecord:
        """Record an existing placement (R/JGF or per-node amounts) as job ``jobid``; an R's
        execution window overrides ``at`` and ``duration``."""
        if jobid in self.jobs:
            raise MatchError(f"job {jobid} already exists")
        if isinstance(placement, Mapping):
            ex = placement.get("execution")
            if isinstance(ex, Mapping):
                st = int(ex.get("starttime", 0) or 0)
                exp = int(ex.get("expiration", 0) or 0)
                if st or exp:
                    at = st
                    duration = exp - st if exp > st else 0
        d = duration if duration > 0 else GRAPH_END - at
        if at + d > GRAPH_END:
            d = GRAPH_END - at
        if isinstance(placement, list):
            holdings = holdings_from_shares(self.engine, self.graph, placement, at, at + d, self.split_pools)
        elif isinstance(placement, Mapping):
            holdings = holdings_from_r(self.engine, self.graph, placement, at, at + d, self.split_pools)
        else:
            raise MatchError("placement must be an R/JGF mapping or a list of NodeShare")
        if not holdings:
            raise MatchError("placement holds no resources")
        rec = JobRecord(jobid, at, d, False, [], [])
        self.put(rec, holdings)
        return rec

    def cut(self, gone: set[VState]) -> list[int]:
        """Take what is in ``gone`` (a subtree about to be removed) away from every job that
        holds some of it; a job left with nothing is removed. Returns the affected job ids."""
        eng = self.engine
        affected = []
        for jid, rec in list(self.jobs.items()):
            hold = self.holdings(rec)
            if not any(u in gone for u in hold) and not any(e.vs in gone for e in rec.entries):
                continue
            affected.append(jid)
            eng.remove_entries(jid, rec.entries, rec.reserved)
            left = {u: a for u, a in hold.items() if u not in gone}
            if left:
                self.write(rec, left)
            else:
                del self.jobs[jid]
                self.book.untrack(jid)
        return affected

    def check(self) -> None:
        """free + allocated == capacity everywhere, and every job's state is exactly recorded."""
        book = self.book
        check_invariants(self.engine, self.jobs, book.reserved, book.ends.sorted(), self.split_pools)
