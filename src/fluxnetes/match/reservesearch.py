"""The reservation search of ``allocate_orelse_reserve`` (fluxion-spec §5.6): the scheduled
points of the root filter where the root has the job's totals free for the whole window
(``Engine.candidate_times``), tried in order; the first where a walk succeeds is the
reservation. Most candidates of ``slot[N] -> {leaves}`` requests are decided without a walk
(match/README.md "Reservations"): the count bound (``reserve.py``) skips those where the walk
must fail, and for the static policies with stable ties the slot index answers as the walk
would (``SlotIndex.select_at``).
"""

from __future__ import annotations

from collections.abc import Callable

from fluxnetes.graph.model import ResourceGraph
from fluxnetes.jobspec.model import Jobspec
from fluxnetes.match.engine import Engine
from fluxnetes.match.indexes import Indexes
from fluxnetes.match.jobmeta import GRAPH_END
from fluxnetes.match.reserve import ReserveBound, ReserveHosts
from fluxnetes.match.results import MatchResult
from fluxnetes.match.shapes import slot_shape
from fluxnetes.match.vstate import VState


class ReserveSearch:
    """The search over candidate start times; keeps the slot hosts of the count bound per
    set of slot element types (dropped by :meth:`forget` when the graph changes)."""

    def __init__(self, engine: Engine, graph: ResourceGraph, indexes: Indexes, stats: dict[str, int]) -> None:
        self.engine = engine
        self.graph = graph
        self.idx = indexes
        self.stats = stats  # the matcher's counters: "fast" counts answers of the index
        self._hosts: dict[frozenset[str], ReserveHosts] = {}

    def forget(self) -> None:
        """The graph's structure or properties changed: the hosts are stale."""
        self._hosts.clear()

    def search(self, js: Jobspec, now: int, duration: int, x_types: set[str], *, bound: bool,
               index: bool, walk: Callable[[int], bool],
               commit: Callable[[int], MatchResult | None]) -> MatchResult | None:
        """The reservation at the first candidate time where the walk (``walk(at)``, then
        ``commit(at)``) succeeds, or None. ``bound``: skip times by the count bound;
        ``index``: let the slot index answer in place of the walk."""
        eng = self.engine
        cands = eng.candidate_times(now + 1, duration, js.totals)
        bounds: ReserveBound | None = None
        at_index = None
        set_up = False
        while True:
            when = next(cands, None)
            if when is None or when >= GRAPH_END:
                return None
            if not set_up:  # (only when there is a candidate at all)
                set_up = True
                bounds = self._bound(js, duration) if bound else None
                at_index = self._index(js, duration, x_types) if index else None
            if bounds is not None and not bounds.may_fit(when):
                # the hosts cannot give enough slots: the walk would fail here, and
                # at every candidate before the first instant a host could give one
                nxt = bounds.next_start()
                if nxt is None:
                    return None
                if nxt > when + 1:
                    cands = eng.candidate_times(nxt, duration, js.totals)
                continue
            if at_index is not None:
                try:
                    members = at_index(when)
                except LookupError:
                    at_index = None  # not applicable to these hosts: walk
                else:
                    if members is None:
                        continue  # fewer slots than asked: the walk fails here
                    eng.mark_selection([(u, a, True) for u, a in members])
                    self.stats["fast"] += 1
                    return commit(when)
            if walk(when):
                return commit(when)

    def _index(self, js: Jobspec, duration: int,
               x_types: set[str]) -> Callable[[int], list[tuple[VState, int]] | None] | None:
        """The walk's answer at a candidate time from the slot index (``slot[N] -> {leaves}``,
        fixed counts): SlotIndex.select_at; None: walk."""
        if x_types or "slot" in self.graph.by_type:
            return None
        shape = slot_shape(js.resources)
        if shape is None:
            return None
        slot, elems = shape
        if slot.count.min != slot.count.max:
            return None
        idx = self.idx.slot_index(elems)
        constraint = js.constraint

        def at_time(when: int) -> list[tuple[VState, int]] | None:
            end = when + duration if when + duration <= GRAPH_END else GRAPH_END
            return idx.select_at(slot, constraint, when, end)

        return at_time

    def _bound(self, js: Jobspec, duration: int) -> ReserveBound | None:
        """The count bound (match/reserve.py) for ``slot -> {leaves}`` requests; None: walk
        at every candidate."""
        if "slot" in self.graph.by_type:
            return None
        shape = slot_shape(js.resources)
        if shape is None:
            return None
        slot, elems = shape
        types = frozenset(e.type for e in elems)
        if len(types) != len(elems):
            return None
        hosts = self._hosts.get(types)
        if hosts is None:
            hosts = self._hosts[types] = ReserveHosts(self.engine, types)
        return ReserveBound(hosts, elems, slot, duration, GRAPH_END)
