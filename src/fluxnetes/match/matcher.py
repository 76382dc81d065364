"""The matcher: Fluxion's match operations on a :class:`ResourceGraph` (fluxion-spec §3).

Time is an argument (``now``, seconds); nothing here reads a clock. Every allocation is a
half-open window [at, at + duration); a jobspec without duration holds its resources up to
the graph horizon (never assumed to end).
"""

from __future__ import annotations

import types
from collections.abc import Callable, Mapping
from dataclasses import asdict
from typing import Any

from fluxnetes.graph.model import UP, GraphError, ResourceGraph
from fluxnetes.jobspec.model import Jobspec, exclusive_types, parse_jobspec
from fluxnetes.match.countedpath import CountedPath
from fluxnetes.match.edits import (
    attach_subgraph,
    detach_subtree,
    set_vertex_property,
    set_vertex_status,
)
from fluxnetes.match.firstfit import FirstFit
from fluxnetes.match.indexes import Indexes
from fluxnetes.match.jobmeta import (
    AT_ALLOC,
    AT_RESERVE,
    AT_SAT,
    FAR,
    GRAPH_END,
    Meta,
)
from fluxnetes.match.placement import descendants, fitting_share
from fluxnetes.match.policies import POLICIES, explores_every_child, is_static, new_engine
from fluxnetes.match.reasons import busy_reason, type_capacity, unsat_reason
from fluxnetes.match.records import JobRecords
from fluxnetes.match.reservesearch import ReserveSearch
from fluxnetes.match.results import (
    JobRecord,
    MatchError,
    MatchResult,
    MatchStatus,
    NodeShare,
)
from fluxnetes.match.satcache import SatAnswers
from fluxnetes.match.shapes import node_shape, slot_shape
from fluxnetes.match.slotindex import SlotIndex


class Matcher:
    """Match jobspecs against one graph under one policy; records every allocation."""

    def __init__(self, graph: ResourceGraph, policy: str = "first", *, split_pools: bool | None = None,
                 tie_break: str = "stable", counters: bool = False) -> None:
        """``tie_break``: "stable" (default) orders equal-score candidates by discovery
        (depth-first) order; "fluxion" reproduces the order libstdc++'s std::sort gives them
        in Fluxion (used by the conformance replay). ``split_pools``: share pool vertices
        (memory...) by amount; default from ``graph.meta["split_pools"]`` (Kubernetes graphs).
        ``counters``: answer ``first``'s simulator requests from per-node counters while the
        graph and the requests allow it (``match/firstfit.py``: the simulator asks for it).
        """
        if tie_break not in ("stable", "fluxion"):
            raise MatchError(f"unknown tie_break '{tie_break}' (stable or fluxion)")
        if policy not in POLICIES:
            raise MatchError(f"unknown policy '{policy}' (known: {', '.join(POLICIES)})")
        if graph.root is None:
            raise MatchError("graph has no root")
        self.graph = graph
        self.policy = policy
        if split_pools is None:
            split_pools = bool(graph.meta.get("split_pools", False))
        self.split_pools = split_pools
        self.tie_break = tie_break
        self.engine = new_engine(graph.root, policy, split_pools=split_pools, tie_break=tie_break)
        self._gang_domains: object = None  # match/gang.py's packing domains (per graph version)
        self._next_jobid = 1
        self._capacity = graph.summary()
        self.stats = {"succeeded": 0, "failed": 0, "fast": 0}
        # index fast paths (every policy that explores all children, stable ties): see
        # match/indexes.py. The reservation index follows the static policies' order only
        # (not `locality`/`variation`): _static_policy.
        self._fast_policy = explores_every_child(policy, tie_break)
        self._static_policy = is_static(policy)
        self._idx = Indexes(self.engine)
        # ``fast_fail``: the failing path's shortcuts (see match/README.md "Failing
        # matches"); False runs the unoptimised path (tests compare both, the benchmark
        # measures both). Answers are the same either way.
        self.fast_fail = True
        # every recorded job and its window (match/records.py)
        self._records = JobRecords(self.engine, graph, self._idx, split_pools)
        # satisfiability answers (the far-future walk) per request, valid while the graph's
        # structure and properties stay (and, under `first`, its child order): _sat_walk
        self._sat = SatAnswers(self.engine)
        # the reservation search (match/reservesearch.py), its count bound's hosts
        self._reserve = ReserveSearch(self.engine, graph, self._idx, self.stats)
        # `first` on per-node counters (match/firstfit.py) until an operation they do not
        # cover: then every live job is written into the engine and the walk takes over
        ff = FirstFit.build(self.engine) if counters else None
        self._counted: CountedPath | None = CountedPath(ff) if ff is not None else None

    # ------------------------------------------------------------------ properties
    @property
    def counting(self) -> bool:
        """Are requests answered from per-node counters (``match/firstfit.py``) now?"""
        return self._counted is not None

    @property
    def jobs(self) -> Mapping[int, JobRecord]:
        self._leave_counters()
        return types.MappingProxyType(self._records.jobs)

    def reservation_count(self) -> int:
        """How many recorded jobs are reservations."""
        return len(self._records.book.reserved)

    def earliest_end(self) -> int | None:
        """The earliest end of a recorded job's window (None: no job is recorded)."""
        if self._counted is not None:  # (every live job is the counters')
            return self._counted.ff.earliest_end()
        ends = self._records.book.ends
        return ends.min() if ends else None

    @property
    def next_jobid(self) -> int:
        return self._next_jobid

    def reserve_jobid(self, jobid: int) -> None:
        """Never hand out ``jobid`` (or below): it names a job known elsewhere that could not
        be recorded here (yet), e.g. an allocation read back after a restart."""
        self._next_jobid = max(self._next_jobid, jobid + 1)

    # ------------------------------------------------------------------ match operations
    def allocate(self, js: Jobspec | str | Mapping[str, Any], *, now: int = 0,
                 jobid: int | None = None) -> MatchResult:
        return self._match(js, "allocate", now, jobid)

    def allocate_with_satisfiability(self, js: Jobspec | str | Mapping[str, Any], *, now: int = 0,
                                     jobid: int | None = None) -> MatchResult:
        return self._match(js, "allocate_with_satisfiability", now, jobid)

    def allocate_orelse_reserve(self, js: Jobspec | str | Mapping[str, Any], *, now: int = 0,
                                jobid: int | None = None) -> MatchResult:
        return self._match(js, "allocate_orelse_reserve", now, jobid)

    def satisfiability(self, js: Jobspec | str | Mapping[str, Any], *, now: int = 0) -> MatchResult:
        return self._match(js, "satisfiability", now, None)

    def match(self, op: str, js: Jobspec | str | Mapping[str, Any], *, now: int = 0,
              jobid: int | None = None) -> MatchResult:
        if op not in ("allocate", "allocate_with_satisfiability", "allocate_orelse_reserve", "satisfiability"):
            raise MatchError(f"unknown match operation '{op}'")
        return self._match(js, op, now, jobid)

    def _match(self, js_in: Jobspec | str | Mapping[str, Any], op: str, now: int,
               jobid: int | None) -> MatchResult:
        js = js_in if isinstance(js_in, Jobspec) else parse_jobspec(js_in)
        cp = self._counted
        if cp is not None and jobid is None and op != "satisfiability" and 0 <= now < GRAPH_END \
                and js.duration <= GRAPH_END:
            # the counters' allocation, without the checks below that cannot fail here: a
            # request of the counters' shapes names only types their graph has, and while
            # they answer no job is recorded in `_records` (the next id is free)
            shape = cp.shape(js)
            if shape is not None:
                jid = self._next_jobid
                self._next_jobid = jid + 1
                duration = js.duration if js.duration > 0 else GRAPH_END
                res = self._counted_alloc(js, op, now, jid, duration, cp.ff, shape[0], shape[1])
                if res is not None:
                    return res
                return self._walk_match(js, op, now, jid, duration)  # (the counters left)
        if now < 0:
            raise MatchError("now must be >= 0")
        sat_only = op == "satisfiability"
        # unknown types: Fluxion rejects the jobspec at parse time; we answer unsatisfiable
        for t in js.types:
            if t != "slot" and t not in self.graph.by_type:
                return MatchResult(MatchStatus.UNSATISFIABLE, -1 if sat_only else 0, now, 0,
                                   f"this graph has no '{t}' resources")
        if sat_only:
            jid = -1
        elif jobid is None:
            jid = self._next_jobid
            while jid in self._records.jobs:
                jid += 1
            self._next_jobid = jid + 1
        else:
            self._leave_counters()  # (an id chosen by the caller: the engine's records)
            if jobid in self._records.jobs:
                raise MatchError(f"job {jobid} already exists")
            if jobid < 0:
                raise MatchError("jobid must be >= 0")
            jid = jobid
        if js.duration > GRAPH_END:
            raise MatchError(f"duration {js.duration} exceeds the graph horizon ({GRAPH_END} s)")
        duration = js.duration if js.duration > 0 else GRAPH_END
        if now >= GRAPH_END:
            return self._fail(MatchStatus.BUSY, jid, js, "now is at or past the graph horizon")
        if self._counted is not None:
            counted = self._counted_answer(js, op, now, jid, duration)
            if counted is not None:
                return counted
        return self._walk_match(js, op, now, jid, duration)

    def _walk_match(self, js: Jobspec, op: str, now: int, jid: int, duration: int) -> MatchResult:
        """The match by the walk (and the index fast paths), job id ``jid`` given."""
        sat_only = op == "satisfiability"
        if js.sets:  # several pod sets: one transaction of ordinary walks (match/gang.py)
            from fluxnetes.match.gang import match_gang

            return match_gang(self, js, op, now, jid, duration)
        eng = self.engine
        x_types = exclusive_types(js.resources)
        constraint = js.constraint

        def run(at: int, alloc_type: int) -> bool:
            d = duration if at + duration <= GRAPH_END or alloc_type == AT_SAT else GRAPH_END - at
            meta = Meta(jid, at, now, d, alloc_type, constraint)
            meta.room = at == now and alloc_type == AT_ALLOC and self._all_active(now, d)
            return eng.select(js.resources, meta, x_types)

        need_nodes = js.totals.get("node", 0)
        if not sat_only:
            feasible = self._feasible(js, need_nodes, now, duration, satisfiability=False)
            fast = self._try_fast(js, jid, now, duration, x_types) if feasible else None
            if fast is not None:
                if fast.ok:
                    return fast
                feasible = False  # the walk would fail now as well
            if feasible and run(now, AT_ALLOC):
                res = self._commit(js, jid, now, duration, AT_ALLOC, now, x_types)
                if res is not None:
                    return res
                return self._fail(MatchStatus.BUSY, jid, js, self._busy_reason(js, now))
            if op == "allocate_orelse_reserve":
                fast_fail = self.fast_fail
                res = self._reserve.search(
                    js, now, duration, x_types, bound=fast_fail,
                    index=fast_fail and self._fast_policy and self._static_policy,
                    walk=lambda at: run(at, AT_RESERVE),
                    commit=lambda at: self._commit(js, jid, at, duration, AT_RESERVE, now, x_types))
                if res is not None:
                    return res
            if op == "allocate":
                return self._fail(MatchStatus.BUSY, jid, js, self._busy_reason(js, now))
        # satisfiability walk: far future, status ignored
        sat = self._feasible(js, need_nodes, now, duration, satisfiability=True) and \
            self._sat_walk(js, duration, x_types, lambda: run(FAR - duration - 1, AT_SAT))
        if sat_only:
            if sat:
                return MatchResult(MatchStatus.ALLOCATED, -1, now, duration, "")
            return MatchResult(MatchStatus.UNSATISFIABLE, -1, now, 0, self._unsat_reason(js))
        if sat:
            return self._fail(MatchStatus.BUSY, jid, js, self._busy_reason(js, now))
        return self._fail(MatchStatus.UNSATISFIABLE, jid, js, self._unsat_reason(js))

    # ------------------------------------------------------------------ counters (firstfit.py)
    def _counted_answer(self, js: Jobspec, op: str, now: int, jid: int, duration: int) -> MatchResult | None:
        """The answer from the counters, or None after leaving them (the walk answers)."""
        cp = self._counted
        assert cp is not None
        shape = cp.shape(js)
        if shape is None:
            self._leave_counters()
            return None
        kind, count = shape
        ff = cp.ff
        if op == "satisfiability":
            if ff.fits_machine(kind, count):
                return MatchResult(MatchStatus.ALLOCATED, -1, now, duration, "")
            return MatchResult(MatchStatus.UNSATISFIABLE, -1, now, 0, self._unsat_reason(js))
        return self._counted_alloc(js, op, now, jid, duration, ff, kind, count)

    def _counted_alloc(self, js: Jobspec, op: str, now: int, jid: int, duration: int, ff: FirstFit,
                       kind: int, count: int) -> MatchResult | None:
        """An allocation from the counters (``kind``, ``count``: the request's shape), or
        None after leaving them. While the counters answer, every live job is theirs: the
        job windows are kept there (``FirstFit.active``), and written into ``_records`` when
        they hand over."""
        d = duration if now + duration <= GRAPH_END else GRAPH_END - now
        if not (ff.active(now) if self.fast_fail else self._all_active(now, d)):
            self._leave_counters()
            return None
        end = now + d
        res = ff.allocate(jid, kind, count, now, end, js.queue)
        if res is None:
            if op == "allocate":
                return self._fail(MatchStatus.BUSY, jid, js, ff.busy_reason(js))
            self._leave_counters()  # a reservation search: the walk's
            return None
        self._records.book.note(now, end)
        stats = self.stats
        stats["succeeded"] += 1
        stats["fast"] += 1
        return res

    def _leave_counters(self) -> None:
        """Write the counters' live jobs into the engine; the walk answers from now on."""
        cp = self._counted
        if cp is None:
            return
        self._counted = None
        cp.hand_over(self.engine, self._records)
        self._sat.forget_walks()

    # ------------------------------------------------------------------ satisfiability
    def _sat_walk(self, js: Jobspec, duration: int, x_types: set[str], walk: Callable[[], bool]) -> bool:
        """The satisfiability walk's answer (far future, status ignored): remembered per
        request while nothing it depends on changes, or counted where that is exact
        (match/pristine.py), else ``walk()``.

        At the far future every span has ended (unless a job in ``JobSpans.late`` reaches
        there), so the walk sees the empty graph: its answer depends on the structure, the
        vertices' properties/names/ranks and the request (and under ``first`` on the child
        order, which commits change) - _sat_changed() forgets the answers when those change."""
        if not self.fast_fail or self._records.book.late:
            return walk()
        return self._sat.answer(js, duration, walk, lambda: self._pristine_sat(js, x_types))

    def _pristine_sat(self, js: Jobspec, x_types: set[str]) -> bool | None:
        """The walk's answer for ``slot[N] -> {leaves}`` from slot counts on the empty graph
        (SatAnswers.counted: policies that explore every child, stable ties); None: walk."""
        if not self._fast_policy or x_types:
            return None
        return self._sat.counted(js)

    def _sat_changed(self) -> None:
        """The graph's structure or properties changed: satisfiability answers are stale."""
        self._sat.forget()
        self._reserve.forget()

    def _fail(self, status: MatchStatus, jid: int, js: Jobspec, reason: str) -> MatchResult:
        self.stats["failed"] += 1
        return MatchResult(status, jid, 0, 0, reason, queue=js.queue)

    def _feasible(self, js: Jobspec, need_nodes: int, now: int, duration: int, *, satisfiability: bool) -> bool:
        """Fluxion's request_feasible pre-check (nodes up / nodes matching constraints)."""
        eng = self.engine
        if need_nodes == 0:
            return True
        if satisfiability:
            total_nodes = self.graph.count("node")
            if need_nodes > total_nodes:
                return False
        elif need_nodes > eng.nodes_up:
            return False
        if js.constraint is None:
            return True
        t = now if not satisfiability else GRAPH_END - 1
        ok = 0
        for v in self.graph.by_type.get("node", []):
            if not js.constraint.match(v):
                continue
            if not satisfiability and v.status != UP:
                continue
            vs = eng.vs[v.idx]
            if vs.avail(t, t + duration) == 1:
                ok += 1
                if ok >= need_nodes:
                    return True
        return False

    def _commit(self, js: Jobspec, jid: int, at: int, duration: int, alloc_type: int, now: int,
                x_types: set[str]) -> MatchResult | None:
        eng = self.engine
        d = duration if at + duration <= GRAPH_END else GRAPH_END - at
        meta = Meta(jid, at, now, d, alloc_type, js.constraint)
        reserved = alloc_type == AT_RESERVE
        emitted = eng.update(meta, x_types, reserved, [])
        if not emitted:
            return None
        entries = emitted  # every emitted vertex is what the job holds/tags there
        status = MatchStatus.RESERVED if reserved else MatchStatus.ALLOCATED
        res = MatchResult(status, jid, at, d, "", None, None, js.queue, emitted)
        self._records.add(JobRecord(jid, at, d, reserved, None, None, entries, js.queue, res))
        if self.engine.first:
            self._sat.forget_walks()  # the update pass reordered children (by_outedges)
        self.stats["succeeded"] += 1
        return res

    # ------------------------------------------------------------------ fast paths
    def _all_active(self, now: int, duration: int) -> bool:
        """Has every recorded job started by ``now`` and not ended at ``now``?"""
        return self._records.all_active(now, fast_fail=self.fast_fail)

    def _try_fast(self, js: Jobspec, jid: int, now: int, duration: int, x_types: set[str]) -> MatchResult | None:
        """The static policies' answer from indexes (None: not applicable, use the walk)."""
        if not self._fast_policy or not self._all_active(now, duration):
            return None
        shape = slot_shape(js.resources)
        eng = self.engine
        used: SlotIndex | None = None
        if shape is not None and not x_types:
            slot, elems = shape
            idx = self._idx.slot_index(elems)
            members = idx.select(slot, js.constraint)
            if members is None:
                return MatchResult(MatchStatus.BUSY, jid)
            eng.mark_selection([(u, a, True) for u, a in members])
            used = idx
        else:
            nshape = node_shape(js.resources)
            if nshape is None or x_types != {"node"}:
                return None
            node_req, slot, elems = nshape
            nidx = self._idx.node_index(slot, elems)
            nodes = nidx.select(node_req, js.constraint)
            if nodes is None:
                return MatchResult(MatchStatus.BUSY, jid)
            eng.mark_selection([(nv, nv.v.size, True) for nv in nodes])
        self.stats["fast"] += 1
        # commit exactly as after a walk: the update pass follows the marks
        result = self._commit(js, jid, now, duration, AT_ALLOC, now, x_types)
        if result is not None and used is not None:
            used.consume(used.picks)
        return result

    # ------------------------------------------------------------------ reasons
    def _type_capacity(self, t: str, *, up_only: bool) -> int:
        return type_capacity(self.graph, t, up_only=up_only)

    def _unsat_reason(self, js: Jobspec) -> str:
        return unsat_reason(self.graph, js)

    def _busy_reason(self, js: Jobspec, now: int) -> str:
        return busy_reason(self.graph, self.engine, js, now)

    # ------------------------------------------------------------------ cancel
    def cancel(self, jobid: int) -> None:
        cp = self._counted
        if cp is not None and cp.ff.release(jobid):
            return
        self._records.cancel(jobid)

    def partial_cancel(self, jobid: int, release: Mapping[str, Any] | list[NodeShare]) -> bool:
        """Release part of a job; returns True when nothing is left (the job is gone)."""
        self._leave_counters()
        return self._records.partial_cancel(jobid, release)

    # ------------------------------------------------------------------ update_allocate
    def update_allocate(self, jobid: int, placement: Mapping[str, Any] | list[NodeShare], *, at: int = 0,
                        duration: int = 0) -> MatchResult:
        """Record an existing placement (R/JGF or per-node amounts) as job ``jobid``."""
        self._leave_counters()
        rec = self._records.place(jobid, placement, at, duration)
        self._next_jobid = max(self._next_jobid, jobid + 1)
        return MatchResult(MatchStatus.ALLOCATED, jobid, rec.at, rec.duration, "", rec.nodes, rec.vertices)

    def fitting(self, share: NodeShare, *, at: int = 0) -> NodeShare:
        """The part of ``share`` (one node's) that is free from ``at`` on: what
        ``update_allocate`` can record there now."""
        self._leave_counters()
        return fitting_share(self.engine, self.graph, share, at, GRAPH_END, self._records.split_pools)

    # ------------------------------------------------------------------ status / grow / shrink
    def set_status(self, path_or_name: str, up: bool) -> None:
        self._leave_counters()
        set_vertex_status(self.graph, self.engine, path_or_name, up)
        self._idx.refresh_status()

    def set_property(self, path_or_name: str, key: str, value: str) -> None:
        """Set a vertex property (resource-query's ``set-property PATH KEY=VALUE``): later
        matches see it (``perf_class`` orders `variation`; constraints test properties)."""
        self._leave_counters()
        set_vertex_property(self.graph, path_or_name, key, value)
        self._sat_changed()
        if self.engine.perf:  # `variation`'s scores are perf_class: the indexes' orders moved
            self._idx.clear()

    def add_subgraph(self, jgf_or_graph: Mapping[str, Any] | str | ResourceGraph) -> list[str]:
        """Attach vertices (JGF with the path from the root, or a graph); returns new paths."""
        self._leave_counters()
        new = attach_subgraph(self.graph, self.engine, jgf_or_graph)
        self._capacity = self.graph.summary()
        self._idx.clear()
        self._sat_changed()
        return new

    def remove_subgraph(self, path: str) -> list[int]:
        """Remove a subtree; jobs holding resources in it lose them (partial cancel).

        Returns the ids of affected jobs (those fully removed are no longer in ``jobs``)."""
        self._leave_counters()
        try:
            v = self.graph.get(path)
        except GraphError as exc:
            raise MatchError(str(exc)) from None
        if v.parent is None:
            raise MatchError("cannot remove the root")
        eng = self.engine
        top = eng.vs[v.idx]
        gone = set(descendants(top)) | {top}
        affected = self._records.cut(gone)
        detach_subtree(self.graph, eng, v, top, gone)
        self._capacity = self.graph.summary()
        self._idx.clear()
        self._sat_changed()
        return affected

    # ------------------------------------------------------------------ info / stat
    def info(self, jobid: int) -> dict[str, Any]:
        self._leave_counters()
        rec = self._records.jobs.get(jobid)
        if rec is None:
            raise MatchError(f"job {jobid} not found")
        return {"jobid": jobid, "mode": rec.mode, "at": rec.at, "duration": rec.duration,
                "expiration": rec.end, "nodes": [asdict(n) for n in rec.nodes]}

    def stat(self) -> dict[str, Any]:
        self._leave_counters()
        g = self.graph
        nv = len(g)
        jobs = self._records.jobs
        running = sum(1 for r in jobs.values() if not r.reserved)
        return {
            "policy": self.policy,
            "vertices": nv,
            "edges": max(0, nv - 1),
            "by_type": {t: len(vs) for t, vs in g.by_type.items()},
            "capacity": dict(self._capacity),
            "nodes_up": self.engine.nodes_up,
            "jobs": len(jobs),
            "allocated": running,
            "reserved": len(jobs) - running,
            "match_succeeded": self.stats["succeeded"],
            "match_failed": self.stats["failed"],
            "next_jobid": self._next_jobid,
        }

    def free_now(self, now: int = 0) -> dict[str, int]:
        self._leave_counters()
        r = self.engine.root
        return {t: r.f_avail(i, now, now + 1) for i, t in enumerate(r.ftypes)}

    # ------------------------------------------------------------------ invariants
    def check_invariants(self) -> None:
        """free + allocated == capacity everywhere, and every job's state is exactly recorded."""
        self._leave_counters()
        self._records.check()

