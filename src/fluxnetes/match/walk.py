"""The depth-first-and-up (DFU) matching walk, modelled step by step on Fluxion's
(fluxion-spec §5): candidate groups merged up the tree in visit order (:mod:`.scoring`), slot
packing at the first vertex whose direct children hold every slot type, pruning by own
planners, x_checkers and filters, and the ``first`` policy's dynamic exploration. A
successful walk marks its choice (``enforce``) for the update pass of :class:`~.commit.Commit`.
The top layer of :class:`~.engine.Engine`."""

from __future__ import annotations

from fluxnetes.graph.model import UP
from fluxnetes.jobspec.model import Resource
from fluxnetes.match.commit import Commit
from fluxnetes.match.counts import calc_count, effective_max
from fluxnetes.match.jobmeta import AT_ALLOC, AT_SAT, Meta, Share
from fluxnetes.match.scoring import EG, Dfu, Evals, perf_class, score_runs, sort_groups
from fluxnetes.match.slotpack import Per, build_slots, count_slots
from fluxnetes.match.vstate import VState


class Walk(Commit):
    """The matching walk (``select`` and the steps below it)."""

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
        # cnt_slot and the slots, packed as the slot index packs them (slotpack.py)
        per: Per = []
        for elem in shape:
            evs = dslot.m.get(elem.type)
            cnt = calc_count(elem.count, evs.qual) if evs is not None else 0
            if cnt == 0 or evs is None:
                return False
            cands: list[tuple[int, int, VState]] = []
            for g in evs.groups:
                e0 = g.edges[0]
                c = e0[3]
                assert c is not None  # (only the root's group has no vertex)
                cands.append((g.score, e0[0], c))
            per.append((cnt, cands))
        split = self.split_pools
        qual_slots = count_slots(per, split)
        if qual_slots == 0:
            return False
        made = build_slots(per, qual_slots, split)
        if len(made) < qual_slots:
            return False
        for score, members in made:
            dfu.add("slot", EG(score, 1, True, [(n, n, True, c) for c, n in members]))
        return True
