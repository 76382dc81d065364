"""The traverser's tree: one scheduling state per graph vertex (:class:`~.vstate.VState`),
built from the graph and primed with subtree totals, pruning filters and, for `first`-style
policies, the dynamic child order; and the reservation candidates read from the root's filter.
The base of :class:`~.engine.Engine` (``commit.py`` and ``walk.py`` build on it)."""

from __future__ import annotations

from collections.abc import Iterator

from fluxnetes.graph.model import UP, Vertex, gc_paused
from fluxnetes.match.vstate import (
    _EMPTY_DICT,
    _EMPTY_LIST,
    VState,
    _has_room,
    _order_key,
)
from fluxnetes.plan import PlannerMulti


class WalkTree:
    """The traverser's per-graph state for one policy: the policy's switches and the tree."""

    def __init__(self, root_vertex: Vertex, *, high: bool, node_centric: bool, stop_on_1: bool,
                 node_exclusive: bool, split_pools: bool = False, exact_ties: bool = False,
                 prune_types: tuple[str, ...] = ("core", "node"), slot_high: bool | None = None,
                 perf_scores: bool = False, locality: bool = False) -> None:
        """``high``: candidates by descending score at vertices and at the root;
        ``slot_high``: the same for packing slots (default ``high``; `variation` packs by
        descending score but chooses ascending); ``perf_scores``: a vertex scores
        1 + perf_class instead of 1 + id + 1 (+ node factor) (`variation`); ``locality``: at
        the root, candidates are ordered by the run of consecutive scores holding theirs,
        higher runs first (`locality`)."""
        self.high = high
        self.slot_high = high if slot_high is None else slot_high
        self.perf = perf_scores
        self.locality = locality
        self.node_centric = node_centric
        self.first = stop_on_1
        self.node_exclusive = node_exclusive
        self.split_pools = split_pools
        self.exact = exact_ties
        self.prune_all = prune_types
        self.leaf_types: list[str] = []
        self.seq = 0
        # vertices marked with the current seq (enforce, mark_selection): the update pass
        # visits only these below an unshadowed vertex instead of scanning every child
        self.marked: list[VState] = []
        self._kids: dict[int, list[VState]] = {}  # update(): marked children by id(parent)
        self.vs: dict[int, VState] = {}
        self.root: VState = self._build(root_vertex, None)
        self.nodes_up = 0
        self.prime()

    # ------------------------------------------------------------------ set-up
    def _build(self, top: Vertex, parent: VState | None) -> VState:
        with gc_paused():
            vsmap = self.vs
            root = VState(top, parent)
            vsmap[top.idx] = root
            stack = [root]
            while stack:
                s = stack.pop()
                kids = s.v.children
                if kids:
                    ch = [VState(c, s) for c in kids]
                    for cs in ch:
                        vsmap[cs.v.idx] = cs
                    s.children = ch
                    stack.extend(ch)
            return root

    def is_pruning_type(self, t: str) -> bool:
        return t in self.prune_all or t in self.leaf_types

    def my_types(self, t: str) -> tuple[str, ...]:
        own = [x for x in self.prune_all if x != t]
        if t == "cluster":
            own.extend(x for x in self.leaf_types if x not in own)
        return tuple(own)

    def prime(self) -> None:
        """(Re)compute leaf types, subtree totals and filters; keeps existing spans."""
        with gc_paused():
            self._prime()

    def _prime(self) -> None:
        self._pre: dict[int, int] | None = None
        self.leaf_types = []
        prune_all = self.prune_all
        leaf_types = self.leaf_types
        # internal vertices in DFS pre-order; leaf types in discovery order (Fluxion adds
        # them while priming)
        internal: list[VState] = []
        stack = [self.root]
        while stack:
            s = stack.pop()
            if s.children:
                internal.append(s)
                stack.extend(reversed(s.children))
            else:
                t = s.v.type
                if t not in prune_all and t not in leaf_types:
                    leaf_types.append(t)
                if s.ftypes:  # lost its children (shrink): no filter any more
                    s.ftypes = ()
                    s.fidx = _EMPTY_DICT
                    s.ftot = _EMPTY_LIST
                    s.f = None
                    s.order = _EMPTY_LIST
                    s.okeys = _EMPTY_LIST
        tracked = set(prune_all) | set(leaf_types)
        sums: dict[int, dict[str, int]] = {}
        nodes_up = 0
        for s in reversed(internal):  # children before parents
            v = s.v
            agg: dict[str, int] = {}
            for c in s.children:
                cv = c.v
                ct = cv.type
                if c.children:
                    for t, n in sums.pop(id(c)).items():
                        agg[t] = agg.get(t, 0) + n
                if ct in tracked:
                    agg[ct] = agg.get(ct, 0) + cv.size
                if ct == "node" and cv.status == UP:
                    nodes_up += 1
            sums[id(s)] = agg
            for i, c in enumerate(s.children):
                c.pos = i
            types = self.my_types(v.type)
            s.ftypes = types
            s.fidx = {t: i for i, t in enumerate(types)}
            s.ftot = [agg.get(t, 0) for t in types]
            # filters exist for every inner vertex from the start: made here, while the GC is
            # paused, rather than one by one during matches
            if s.f is not None and len(s.f):
                # keep recorded spans, re-aligned to the new types and totals
                s.f = s.f.retyped(dict(zip(types, s.ftot, strict=True)))
            else:
                s.f = PlannerMulti.aligned(types, s.fidx, s.ftot)
            if self.first:  # (the dynamic child order only `first`-style policies read)
                order = sorted(s.children, key=_order_key)
                s.order = order
                s.okeys = [(-c.weight, -c.v.uniq_id) for c in order]
        if self.first:  # (after every filter is made: room reads the children's filters)
            for s in internal:
                room = [c for c in s.order if _has_room(c)]
                for c in s.children:
                    c.inroom = False
                for c in room:
                    c.inroom = True
                s.room = room
                s.rkeys = [(-c.weight, -c.v.uniq_id) for c in room]
        if self.root.v.type == "node" and self.root.v.status == UP:
            nodes_up += 1
        self.nodes_up = nodes_up

    def preorder(self) -> dict[int, int]:
        """id(vstate) -> depth-first position (cached until the tree changes)."""
        if self._pre is None:
            pre: dict[int, int] = {}
            stack = [self.root]
            while stack:
                s = stack.pop()
                pre[id(s)] = len(pre)
                stack.extend(reversed(s.children))
            self._pre = pre
        return self._pre

    # ------------------------------------------------------------------ candidate times
    def candidate_times(self, after: int, duration: int, totals: dict[str, int]) -> Iterator[int]:
        """Reservation candidates (fluxion-spec §5.6): scheduled points of the root filter at
        or after ``after`` where the root has the job's totals free for the whole window, in
        increasing order, read from the current state at each step."""
        f = self.root.f
        if f is None:
            return iter(())
        return f.fit_times(after, duration, totals)
