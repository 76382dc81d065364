"""The depth-first-and-up (DFU) traverser, modelled step by step on Fluxion's (fluxion-spec §5).

This module holds the matching walk. It mirrors Fluxion's structure closely because the
reference answers depend on its details: candidate groups merged up the tree in visit order
(:mod:`.scoring`), slot packing at the first vertex whose direct children hold every slot
type, edge marks and the update pass that only follows marked edges, pruning filters and
the ``first`` policy's dynamic child order (kept in each vertex's :class:`~.vstate.VState`).

Time: every span is a half-open interval [start, end); all availability over time is
:mod:`fluxnetes.plan`'s (see :mod:`.vstate`), and the root filter's earliest-fit search
gives the candidate times for reservations.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator
from operator import attrgetter

from fluxnetes.graph.model import UP, Vertex, gc_paused
from fluxnetes.jobspec.model import UINT_MAX, Resource
from fluxnetes.match.counts import calc_count, effective_max
from fluxnetes.match.jobmeta import AT_ALLOC, AT_SAT, Entry, Meta, Share
from fluxnetes.match.scoring import EG, Dfu, Evals, perf_class, score_runs, sort_groups
from fluxnetes.match.vstate import (
    _EMPTY_DICT,
    _EMPTY_LIST,
    VState,
    _has_room,
    _order_key,
    _reroom,
    _unlist,
)
from fluxnetes.plan import PlannerMulti


class Engine:
    """Per-graph traverser state + the DFU walk for one policy."""

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

    # ------------------------------------------------------------------ helpers
    def exclusivity(self, resources: list[Resource], t: str) -> bool:
        return any(r.type == t and r.exclusive is True for r in resources)

    # ------------------------------------------------------------------ select
    def select(self, resources: list[Resource], meta: Meta, x_types: set[str]) -> bool:
        """One matching walk at meta.at; on success edges are marked for update()."""
        self.seq += 1
        self.marked = []
        self.meta = meta
        self.x_types = x_types
        root = self.root
        x_in = self.exclusivity(resources, root.v.type)
        dfu = Dfu()
        ok, score, avail, _x = self.dom_dfv(root, resources, True, x_in, dfu, 0)
        if not ok:
            return False
        dfu.add(root.v.type, EG(score, avail, x_in, [(avail, avail, x_in, None)], root=True))
        # dom_finish_graph
        ivscores: set[int] | None = set() if self.locality else None
        for r in resources:
            qc = dfu.qual(r.type)
            cnt = calc_count(r.count, qc)
            if cnt == 0:
                return False
            if ivscores is not None:
                # locality: one interval set over every top-level type seen so far
                ev = dfu.m.get(r.type)
                if ev is not None:
                    ivscores.update(g.score for g in ev.groups)
                dfu.choose_best_k(r.type, cnt, True, self.exact, score_runs(ivscores))
                continue
            dfu.choose_best_k(r.type, cnt, self.high, self.exact)
        # has_root
        needs = 1
        for r in resources:
            if r.type == root.v.type:
                cnt = calc_count(r.count, avail)
                if cnt == 0:
                    return False
                needs = cnt
        # has_remaining
        for ev in dfu.m.values():
            if ev.qual == 0:
                return False
        self.enforce(dfu, True)
        self.root_needs = needs
        self.root_excl = x_in
        return True

    def dom_dfv(self, u: VState, resources: list[Resource], pristine: bool, excl: bool, to_parent: Dfu,
                ml: int) -> tuple[bool, int, int, bool]:
        v = u.v
        vtype = v.type
        meta = self.meta
        x_in = excl
        if not x_in:
            for r in resources:
                if r.type == vtype and r.exclusive is True:
                    x_in = True
                    break
        # ---- test()
        match_res: Resource | None = None
        slot_res: Resource | None = None
        nslots = 0
        matched = False
        for r in resources:
            if r.type == vtype:
                if matched:
                    return False, 0, 0, x_in
                match_res = r
                for c in r.with_:
                    if c.type == "slot":
                        slot_res = c
                        nslots = effective_max(c.count)
                matched = True
            elif r.type == "slot":
                if matched:
                    return False, 0, 0, x_in
                slot_res = r
                nslots = effective_max(r.count)
                matched = True
        is_slot = False
        if slot_res is not None:
            is_slot = True
            kids = u.children
            for c in slot_res.with_:
                ct = c.type
                for k in kids:
                    if k.v.type == ct:
                        break
                else:
                    is_slot = False
                    break
        check_pres = pristine
        if is_slot:
            assert slot_res is not None
            nxt = slot_res.with_
            check_pres = False
        elif match_res is not None:
            nxt = match_res.with_
            check_pres = False
        elif pristine:
            nxt = resources
        else:
            return False, 0, 0, x_in
        # ---- prune()
        at = meta.at
        end = meta.end
        if meta.alloc_type != AT_SAT and v.status != UP:
            return False, 0, 0, x_in
        if meta.constraint is not None and (vtype == "node" or vtype == "storage_node") \
                and not meta.constraint.match(v):
            return False, 0, 0, x_in
        if u.ps and u.avail(at, end) == 0:
            return False, 0, 0, x_in
        for r in resources:
            rt = r.type
            if rt != vtype and rt != "slot":
                continue
            if rt != "slot" and (x_in or r.exclusive is True):
                if x_in and r.exclusive is False:
                    return False, 0, 0, x_in
                if not (self.split_pools and v.size > 1 and not u.children):
                    if meta.alloc_type == AT_ALLOC and u.alloc_n:
                        return False, 0, 0, x_in
                    if (u.xs or u.ps) and u.x_busy(at, end):
                        return False, 0, 0, x_in
            f = u.f
            if f is not None and r.agg and not f.fits(r.agg, at, end):
                return False, 0, 0, x_in
        # ---- discover
        if self.node_centric and vtype == "node":
            factor = (v.id + 2) * 10000 + abs(v.uniq_id % 10000 - 1)
            ml += factor
        dfu = Dfu()
        if is_slot:
            self.dom_slot(u, nxt, nslots, check_pres, dfu, ml)
        elif u.children:
            self.explore(u, nxt, check_pres, x_in, dfu, ml, 1)
        avail = u.avail(at, end) if u.ps else v.size
        if avail == 0:
            return False, 0, 0, x_in
        # ---- dom_finish_vtx
        met = True
        for r in resources:
            if r.type != vtype:
                continue
            for c in r.with_:
                qc = dfu.qual(c.type)
                cnt = calc_count(c.count, qc)
                if cnt == 0:
                    met = False
                    break
                dfu.choose_best_k(c.type, cnt, self.high, self.exact)
        if self.node_centric and vtype == "node":
            ml -= factor
        if not met:
            return False, 0, 0, x_in
        score = 1 + perf_class(v) if self.perf else 1 + ml + v.id + 1
        # ---- resolve
        if dfu.hier:
            self.enforce(dfu, False)
        else:
            to_parent.merge(dfu)
        return True, score, avail, x_in

    def _leaf(self, u: VState, resources: list[Resource], pristine: bool, excl: bool,
              ml: int) -> tuple[bool, int, int, bool]:
        """dom_dfv for a leaf vertex, when no slot/node request is in ``resources``
        (same checks in the same order, without the scratch objects)."""
        v = u.v
        vtype = v.type
        meta = self.meta
        x_in = excl
        match_res: Resource | None = None
        for r in resources:
            if r.type == vtype:
                if match_res is not None:
                    return False, 0, 0, x_in
                match_res = r
                if r.exclusive is True:
                    x_in = True
        if match_res is None and not pristine:
            return False, 0, 0, x_in
        if meta.alloc_type != AT_SAT and v.status != UP:
            return False, 0, 0, x_in
        at = meta.at
        end = meta.end
        ps = u.ps
        if ps and u.avail(at, end) == 0:
            return False, 0, 0, x_in
        if match_res is not None:
            if x_in or match_res.exclusive is True:
                if x_in and match_res.exclusive is False:
                    return False, 0, 0, x_in
                if not (self.split_pools and v.size > 1):
                    if meta.alloc_type == AT_ALLOC and u.alloc_n:
                        return False, 0, 0, x_in
                    if (u.xs or u.ps) and u.x_busy(at, end):
                        return False, 0, 0, x_in
            if match_res.with_:
                return False, 0, 0, x_in  # a leaf has no children to satisfy them
        avail = u.avail(at, end) if ps else v.size
        if avail == 0:
            return False, 0, 0, x_in
        return True, (1 + perf_class(v) if self.perf else 1 + ml + v.id + 1), avail, x_in

    def explore(self, u: VState, resources: list[Resource], pristine: bool, excl: bool, dfu: Dfu, ml: int,
                multiplier: int) -> bool:
        found = False
        leaf_ok = True
        for r in resources:
            if r.type == "slot" or r.type == "node" or r.type == "storage_node":
                leaf_ok = False
                break
        leaf = self._leaf
        dom_dfv = self.dom_dfv
        if not self.first:
            for c in u.children:
                if leaf_ok and not c.children:
                    ok, score, avail, x = leaf(c, resources, pristine, excl, ml)
                else:
                    ok, score, avail, x = dom_dfv(c, resources, pristine, excl, dfu, ml)
                if ok:
                    dfu.add(c.v.type, EG(score, avail, x, [(avail, avail, x, c)]))
                    found = True
            return found
        tallies: dict[str, Share] = {}
        for r in resources:
            tallies[r.type] = Share(effective_max(r.count))
        sat: set[str] = set()
        m = dfu.m
        # the aggregate-filter prune of dom_dfv, checked before the call (no side effects
        # precede it there, so skipping here gives the same answer, cheaper)
        slot_aggs = [r.agg for r in resources if r.type == "slot" and r.agg]
        type_aggs = {r.type: r.agg for r in resources if r.type != "slot" and r.agg}
        meta = self.meta
        at = meta.at
        end = meta.end
        # every slot needs a core and every span holds at `at`: a child with no core free of
        # spans fails the filter check below, so only the children with room are looked at
        # (same children in the same order, minus ones the walk would skip)
        children = u.room if meta.room and any(a.get("core", 0) > 0 for a in slot_aggs) \
            else u.order
        for c in children:
            ct = c.v.type
            if ct in sat:
                continue
            f = c.f
            if f is not None:
                skip = False
                for agg in slot_aggs:
                    if not f.fits(agg, at, end):
                        skip = True
                        break
                if skip:
                    continue
                agg2 = type_aggs.get(ct)
                if agg2 is not None and not f.fits(agg2, at, end):
                    continue
            if leaf_ok and not c.children:
                ok, score, avail, x = leaf(c, resources, pristine, excl, ml)
                if not ok:
                    continue
                # a leaf adds one group of its own type and merges nothing: only that
                # type's tally can move
                ev = m.get(ct)
                if ev is None:
                    ev = m[ct] = Evals()
                ev.groups.append(EG(score, avail, x, [(avail, avail, x, c)]))
                ev.total += avail
                if score > 0:
                    ev.qual += avail
                found = True
                tl = tallies.get(ct)
                if tl is None:
                    continue
                total = ev.total
                if total > tl.prev:
                    tl.acc += total - tl.prev
                    tl.prev = total
                    if tl.acc >= tl.per:
                        tl.shares += 1
                        tl.acc = 0
                if tl.shares >= multiplier:
                    sat.add(ct)
                    if len(sat) == len(tallies):
                        break
                continue
            ok, score, avail, x = dom_dfv(c, resources, pristine, excl, dfu, ml)
            if not ok:
                continue
            dfu.add(ct, EG(score, avail, x, [(avail, avail, x, c)]))
            found = True
            enough = True
            for t, tl in tallies.items():
                ev = m.get(t)
                total = ev.total if ev is not None else 0
                if total > tl.prev:
                    delta = total - tl.prev
                    tl.prev = total
                    tl.acc += delta
                    if tl.acc >= tl.per:
                        tl.shares += 1
                        tl.acc = 0
                if tl.shares >= multiplier:
                    sat.add(t)
                else:
                    enough = False
            if enough:
                break
        return found

    def _unit_slots(self, u: VState, elem: Resource, nslots: int, dfu: Dfu, ml: int) -> bool | None:
        """dom_slot for one fixed-count element over unit leaves (cores), without per-core
        scratch objects. Same candidates, order and packing as the general code; returns
        None when the shape/children do not qualify (the caller then runs the general code)."""
        c0 = elem.count
        if c0.min != c0.max or c0.operator != "+" or c0.operand != 1 or elem.with_:
            return None
        t = elem.type
        cnt = c0.min
        leaf = self._leaf
        shape = [elem]
        cands: list[tuple[int, VState]] = []
        # `first` explores in availability order and stops after nslots whole shares (the
        # dynamic explorer); the static policies look at every child.
        children, want = (u.order, nslots * cnt) if self.first else (u.children, -1)
        for c in children:
            cv = c.v
            if cv.type != t:
                continue  # other types fail the slot walk (not pristine)
            if c.children or cv.size != 1:
                return None
            ok, score, avail, _x = leaf(c, shape, False, True, ml)
            if ok:
                if avail != 1:
                    return None
                cands.append((score, c))
                if len(cands) == want:
                    break
        if not cands:
            return False
        if self.slot_high:
            cands.sort(key=lambda x: -x[0])
        else:
            cands.sort(key=lambda x: x[0])
        n = len(cands) // cnt
        if n == 0:
            return False
        for i in range(n):
            run = cands[i * cnt:(i + 1) * cnt]
            score = 1
            edges: list[tuple[int, int, bool, VState | None]] = []
            for sc, c in run:
                score += sc
                edges.append((1, 1, True, c))
            dfu.add("slot", EG(score, 1, True, edges))
        return True

    def dom_slot(self, u: VState, shape: list[Resource], nslots: int, pristine: bool, dfu: Dfu, ml: int) -> bool:
        if len(shape) == 1 and not self.exact and not self.split_pools:
            done = self._unit_slots(u, shape[0], nslots, dfu, ml)
            if done is not None:
                return done
        dslot = Dfu()
        if not self.explore(u, shape, pristine, True, dslot, ml, nslots):
            return False
        high = self.slot_high
        for ev in dslot.m.values():  # dom_finish_slot: choose_accum_all
            if ev.qual:
                sort_groups(ev.groups, high, self.exact)
        # cnt_slot
        qual_slots = UINT_MAX
        per: list[tuple[Resource, int, list[EG]]] = []
        for elem in shape:
            evs = dslot.m.get(elem.type)
            qc = evs.qual if evs is not None else 0
            cnt = calc_count(elem.count, qc)
            fit = 0
            if cnt and evs is not None:
                acc = 0
                for g in evs.groups:
                    e0 = g.edges[0]
                    c0 = e0[3]
                    if self.split_pools and c0 is not None and c0.v.size > 1 and not c0.children:
                        acc += e0[0]
                        fit += acc // cnt
                        acc %= cnt
                        continue
                    acc += e0[0]
                    if acc >= cnt:
                        fit += 1
                        acc = 0
            if fit < qual_slots:
                qual_slots = fit
            per.append((elem, cnt, evs.groups if evs is not None else []))
        if qual_slots == 0 or qual_slots == UINT_MAX:
            return False
        split = self.split_pools
        iters = [0] * len(per)
        left = [0] * len(per)  # split pools: amount left in the current candidate
        made: list[EG] = []
        for _ in range(qual_slots):
            score = 1
            edges: list[tuple[int, int, bool, VState | None]] = []
            for ei, (_elem, cnt, groups) in enumerate(per):
                j = 0
                while j < cnt:
                    gi = iters[ei]
                    if gi >= len(groups):
                        return False
                    g = groups[gi]
                    e0 = g.edges[0]
                    c = e0[3]
                    if split and c is not None and c.v.size > 1 and not c.children:
                        if left[ei] == 0:
                            left[ei] = e0[0]
                        take = min(left[ei], cnt - j)
                        left[ei] -= take
                        if left[ei] == 0:
                            iters[ei] = gi + 1
                        edges.append((take, take, True, c))
                        score += g.score
                        j += take
                        continue
                    iters[ei] = gi + 1
                    edges.append((e0[0], e0[0], True, c))
                    score += g.score
                    j += e0[0]
            made.append(EG(score, 1, True, edges))
        for eg in made:
            dfu.add("slot", eg)
        return True

    def enforce(self, dfu: Dfu, unconstrained: bool) -> None:
        seq = self.seq
        marked = self.marked
        touched: set[int] = set()
        for _t, ev in dfu.m.items():
            if not ev.best_k:
                continue
            groups = ev.groups
            for i in range(ev.best_i):
                g = groups[i]
                if g.root:
                    continue
                for cnt_needs in g.edges:
                    c = cnt_needs[3]
                    if c is None:
                        continue
                    if id(c) in touched:
                        c.mneeds += cnt_needs[1]  # a split pool shared by several slots
                    else:
                        touched.add(id(c))
                        c.mneeds = cnt_needs[1]
                    c.mexcl = cnt_needs[2]
                    c.mseq = seq
                    marked.append(c)
                    if unconstrained:
                        p = c.parent
                        while p is not None and p.parent is not None:
                            if p.mseq == seq:
                                break
                            pt = p.v.type
                            ev2 = dfu.m.get(pt)
                            if ev2 is not None and not ev2.best_k:
                                p.mneeds = p.v.size
                                p.mexcl = False
                                p.mseq = seq
                                marked.append(p)
                            p = p.parent

    def mark_selection(self, chosen: list[tuple[VState, int, bool]]) -> None:
        """Mark a selection made outside the walk (fast paths) the way enforce() does at
        the root: chosen edges get (needs, exclusive), their ancestors (size, shared)."""
        self.seq += 1
        seq = self.seq
        marked: list[VState] = []
        self.marked = marked
        touched: set[int] = set()
        for c, needs, excl in chosen:
            if id(c) in touched:
                c.mneeds += needs
            else:
                touched.add(id(c))
                c.mneeds = needs
            c.mexcl = excl
            c.mseq = seq
            marked.append(c)
            p = c.parent
            while p is not None and p.parent is not None and p.mseq != seq:
                p.mneeds = p.v.size
                p.mexcl = False
                p.mseq = seq
                marked.append(p)
                p = p.parent
        self.root_needs = 1
        self.root_excl = False

    # ------------------------------------------------------------------ update
    def update(self, meta: Meta, x_types: set[str], reserved: bool,
               record: list[Entry] | None) -> list[Entry]:
        """Commit the marked selection; returns emitted vertices (post-order)."""
        self.x_types = x_types
        self.meta = meta
        out: list[Entry] = []
        acc: dict[str, int] = {}
        # marked children per parent, in child order: the pass follows only marked edges
        # below a vertex that is not shadowed, so it need not scan all of its children
        seq = self.seq
        kids: dict[int, list[VState]] = {}
        seen: set[int] = set()
        for c in self.marked:
            p = c.parent
            if p is None or c.mseq != seq or id(c) in seen:
                continue
            seen.add(id(c))
            lst = kids.get(id(p))
            if lst is None:
                kids[id(p)] = [c]
            else:
                lst.append(c)
        for lst in kids.values():
            if len(lst) > 1:
                lst.sort(key=attrgetter("pos"))
        self._kids = kids
        self._upd(self.root, self.root_needs, self.root_excl, False, acc, out, reserved, record)
        return out

    def _upd(self, u: VState, needs: int, excl: bool, shadow: bool, to_parent: dict[str, int],
             out: list[Entry], reserved: bool, record: list[Entry] | None) -> int:
        v = u.v
        mod = shadow or v.type in self.x_types or (self.node_exclusive and v.type == "node")
        excl = excl or mod
        n = 0
        dfu: dict[str, int] = {}
        seq = self.seq
        meta = self.meta
        jid = meta.jobid
        at = meta.at
        end = meta.end
        recording = record is not None and meta.alloc_type != AT_SAT
        tracked = self.prune_all
        leaf_types = self.leaf_types
        split = self.split_pools
        for c in (u.children if mod else self._kids.get(id(u), _EMPTY_LIST)):
            if not mod and c.mseq != seq:
                continue
            x = c.mexcl or mod
            cv = c.v
            cn = cv.size if mod else c.mneeds
            if not c.children:
                # leaf: inline version of the recursive call below
                if not x:
                    continue
                if recording:
                    ps = c.ps
                    if ps is None:
                        c.ps = {jid: (at, end, cn)}
                    else:
                        ps[jid] = (at, end, cn)
                    c.pused += cn
                    if not reserved:
                        c.alloc_n += 1
                ct = cv.type
                if ct in tracked or ct in leaf_types:
                    add = cn if (split and cv.size > 1) else cv.size
                    if add:
                        dfu[ct] = dfu.get(ct, 0) + add
                out.append(Entry(c, cn, True, None))
                n += 1
                continue
            k = self._upd(c, cn, x, mod, dfu, out, reserved, record)
            if k > 0:
                if self.first:
                    self._upd_by_outedges(u, c)
                n += k
        if excl:
            n += 1
            if recording:
                u.hold(jid, at, end, needs)  # == _add_plan, inline
                if not reserved:
                    u.alloc_n += 1
        if n > 0:
            fcounts = None
            if record is not None:
                xs = u.xs  # x_checker tag (VState.tag, inline: once per vertex per commit)
                if xs is None:
                    u.xs = {jid: (at, end, 1)}
                else:
                    xs[jid] = (at, end, 1)
                f = u.f
                if f is not None and dfu:
                    fcounts = tuple([dfu.get(t, 0) for t in u.ftypes])
                    f.put(jid, at, end, fcounts)
                    if u.parent is not None and u.parent.order:  # (inroom implies this)
                        _reroom(u)
            # is_pruning_type, inline (hot: once per emitted inner vertex and counted type)
            vt = v.type
            if vt in tracked or vt in leaf_types:
                if excl:
                    add = needs if (split and v.size > 1 and not u.children) else v.size
                else:
                    add = v.size - needs
                if add:
                    to_parent[vt] = to_parent.get(vt, 0) + add
            for t, cnum in dfu.items():
                if t in tracked or t in leaf_types:
                    to_parent[t] = to_parent.get(t, 0) + cnum
            out.append(Entry(u, needs, excl, fcounts))
        return n

    def _add_plan(self, u: VState, jobid: int, at: int, end: int, amount: int, reserved: bool) -> None:
        u.hold(jobid, at, end, amount)
        if not reserved:
            u.alloc_n += 1

    def _upd_by_outedges(self, u: VState, c: VState) -> None:
        if not c.ftypes:
            return
        i = len(c.ftypes) - 1
        avail = c.f_avail(i, self.meta.now, self.meta.now + 1)
        if avail == 0 and not c.f:
            return
        old = (-c.weight, -c.v.uniq_id)
        j = bisect_left(u.okeys, old)
        if j < len(u.okeys) and u.okeys[j] == old and u.order[j] is c:
            del u.okeys[j]
            del u.order[j]
        else:  # pragma: no cover - defensive: keys should always be found
            k = u.order.index(c)
            del u.okeys[k]
            del u.order[k]
        if c.inroom:
            _unlist(u.room, u.rkeys, c, old)
        c.weight = max(avail, 0)
        key = (-c.weight, -c.v.uniq_id)
        j = bisect_left(u.okeys, key)
        u.okeys.insert(j, key)
        u.order.insert(j, c)
        if c.inroom:
            j = bisect_left(u.rkeys, key)
            u.rkeys.insert(j, key)
            u.room.insert(j, c)

    # ------------------------------------------------------------------ removal
    def remove_entries(self, jobid: int, entries: list[Entry], reserved: bool) -> None:
        for e in entries:
            u = e.vs
            if u.xs is not None:
                u.xs.pop(jobid, None)
            if e.plan and u.ps is not None:
                sp = u.ps.pop(jobid, None)
                if sp is not None:
                    u.pused -= sp[2]
                    if not reserved:
                        u.alloc_n -= 1
            if e.fcounts is not None and u.f is not None:
                u.f.pop(jobid)
                if u.parent is not None and u.parent.order:
                    _reroom(u)

    # ------------------------------------------------------------------ candidate times
    def candidate_times(self, after: int, duration: int, totals: dict[str, int]) -> Iterator[int]:
        """Reservation candidates (fluxion-spec §5.6): scheduled points of the root filter at
        or after ``after`` where the root has the job's totals free for the whole window, in
        increasing order, read from the current state at each step."""
        f = self.root.f
        if f is None:
            return iter(())
        return f.fit_times(after, duration, totals)
