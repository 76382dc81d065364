"""Marking a selection and committing it (fluxion-spec §5): ``enforce`` marks the walk's
choice (``mark_selection`` a fast path's), the update pass follows only marked edges and
records the job in own planners, x_checkers and pruning filters, and ``remove_entries`` takes
a job's records out again. The middle layer of :class:`~.engine.Engine`."""

from __future__ import annotations

from bisect import bisect_left
from operator import attrgetter

from fluxnetes.match.jobmeta import AT_SAT, Entry, Meta
from fluxnetes.match.scoring import Dfu
from fluxnetes.match.vstate import (
    _EMPTY_LIST,
    VState,
    _reroom,
    _unlist,
)
from fluxnetes.match.walktree import WalkTree


class Commit(WalkTree):
    """Marks and the update pass, over the tree of :class:`~.walktree.WalkTree`."""

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
