"""The slot index: ``slot[N] -> {leaf requests}`` with no node level (Fluence-style pod
groups; see ``indexes.py`` for when the matcher asks it). Slot hosts are the first vertices
(top-down) whose direct children hold every slot type; per host the free leaves are kept
packed into slots in policy order (``slotpack.py``), and hosts sit in a sorted list keyed by
their best slot. A match merges the hosts' slot lists (k-way) to get the N best slots in the
order the walk's root sort would give; `locality` reads them by runs of scores instead
(``scoreruns.py``). The same choice for a future window (a reservation) is ``slotwindow.py``.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from typing import Any

from sortedcontainers import SortedList

from fluxnetes.graph.model import UP
from fluxnetes.jobspec.model import Resource
from fluxnetes.match.candidates import Allow, node_of, vertex_score
from fluxnetes.match.counts import calc_count
from fluxnetes.match.engine import Engine
from fluxnetes.match.scoreruns import ScoreRuns
from fluxnetes.match.slotpack import (
    Slot,
    SlotHost,
    UnitRuns,
    free_candidates,
    free_now,
    pack_slots,
    slot_key,
)
from fluxnetes.match.slotwindow import SlotWindow
from fluxnetes.match.vstate import VState

_MERGE_MAX = 256  # `locality`: runs of up to this many distinct scores merge their buckets


class SlotIndex:
    """Slot hosts for one set of slot element types, kept ready for the walk's answer."""

    def __init__(self, eng: Engine, types: frozenset[str], elems: list[Resource]) -> None:
        self.eng = eng
        self.types = types
        self.elems = elems  # element requests (counts matter for packing)
        # fixed counts (min == max): a host's slot size does not depend on what is free
        self.fixed = all(e.count.min == e.count.max for e in elems)
        self.hosts: list[SlotHost] = []
        self.host_of: dict[int, SlotHost] = {}  # id(leaf vstate) -> host
        self.dirty: set[SlotHost] = set()
        self._order: dict[int, list[list[tuple[int, VState]]]] = {}
        self.ranked: SortedList = SortedList()
        self.total_slots = 0
        self._node_vertex: dict[int, Any] = {}  # host dfs -> its node vertex (constraints)
        self._window: SlotWindow | None = None  # select_at's state, made on first use
        # `locality`: the scores of every host's slots as runs, and per score the hosts
        # (dfs positions) having a slot with it
        self.runs: ScoreRuns | None = ScoreRuns() if eng.locality else None
        self.buckets: dict[int, SortedList] = {}
        self._discover()
        for h in self.hosts:
            self._refresh(h)

    def _discover(self) -> None:
        eng = self.eng
        types = self.types
        # depth-first in child order; ml = node factor of the node on the path (node-centric)
        stack: list[tuple[VState, int, bool]] = [(eng.root, 0, False)]
        while stack:
            u, ml, down = stack.pop()
            v = u.v
            down = down or v.status != UP
            if eng.node_centric and v.type == "node":
                ml = ml + (v.id + 2) * 10000 + abs(v.uniq_id % 10000 - 1)
            kids = u.children
            if not kids:
                continue
            ktypes = {c.v.type for c in kids}
            if types <= ktypes:
                h = SlotHost(u, len(self.hosts), ml)
                h.down = down
                self.hosts.append(h)
                for c in kids:
                    if c.v.type in types:
                        self.host_of[id(c)] = h
                continue
            for c in reversed(kids):
                stack.append((c, ml, down))

    def touch(self, changed: list[VState]) -> None:
        ho = self.host_of
        for u in changed:
            h = ho.get(id(u))
            if h is not None:
                self.dirty.add(h)

    def refresh_status(self) -> None:
        for h in self.hosts:
            x: VState | None = h.vs
            down = False
            while x is not None:
                if x.v.status != UP:
                    down = True
                    break
                x = x.parent
            if down != h.down:
                h.down = down
                self.dirty.add(h)

    def _refresh(self, h: SlotHost) -> None:
        if h.key is not None:
            self.ranked.remove((h.key, h.dfs, h))
            h.key = None
        self.total_slots -= h.total
        h.slots = []
        h.total = 0
        hv = h.vs
        if not h.down and (not hv.ps or hv.pused < hv.v.size):
            h.slots = self._pack(h)
            h.total = len(h.slots)
        self.total_slots += h.total
        if len(h.slots):
            h.key = h.slots[0][0]
            self.ranked.add((h.key, h.dfs, h))
        if self.runs is not None:
            self._rescore(h)

    def _slot_scores(self, h: SlotHost) -> list[int]:
        slots = h.slots
        if isinstance(slots, UnitRuns):
            return slots.scores()
        return [-s[0] if self.eng.high else s[0] for s in slots]

    def _rescore(self, h: SlotHost) -> None:
        """`locality`: replace the host's slot scores in the runs and buckets."""
        runs = self.runs
        assert runs is not None
        old = h.scores
        new: dict[int, int] = {}
        for sc in self._slot_scores(h):
            new[sc] = new.get(sc, 0) + 1
        buckets = self.buckets
        for sc, n in old.items():
            runs.remove(sc, n)
            if sc not in new:
                b = buckets[sc]
                b.remove(h.dfs)
                if not b:
                    del buckets[sc]
        for sc, n in new.items():
            runs.add(sc, n)
            if sc not in old:
                b = buckets.get(sc)
                if b is None:
                    b = buckets[sc] = SortedList()
                b.add(h.dfs)
        h.scores = new

    def static_order(self, h: SlotHost) -> list[list[tuple[int, VState]]]:
        """Per element type: (score, child) in the walk's sorted order (scores are static)."""
        st = self._order.get(id(h))
        if st is None:
            eng = self.eng
            high = eng.slot_high  # slots are packed in this order (`variation`: not eng.high)
            st = []
            for elem in self.elems:
                t = elem.type
                cands = [(vertex_score(eng, c.v, h.ml), c) for c in h.vs.children if c.v.type == t]
                cands.sort(key=(lambda x: -x[0]) if high else (lambda x: x[0]))  # stable
                st.append(cands)
            self._order[id(h)] = st
        return st

    def _fits(self, h: SlotHost) -> bool:
        """_pack's count test (every element's count allows at least one slot) from the
        host's children as they are, without sorting them: most hosts of a busy graph fail
        it for a big request, and _pack would return no slot for them anyway."""
        split = self.eng.split_pools
        kids = h.vs.children
        for elem in self.elems:
            t = elem.type
            qc = 0
            for c in kids:
                if c.v.type == t:
                    avail = free_now(c, split)
                    if avail > 0:
                        qc += avail
            if calc_count(elem.count, qc) == 0:
                return False
        return True

    def _pack(self, h: SlotHost) -> list[Slot] | UnitRuns:
        if not self._fits(h):
            return []
        eng = self.eng
        high = eng.high
        split = eng.split_pools
        got = free_candidates(self.elems, self.static_order(h), lambda c: free_now(c, split))
        if got is None:
            return []
        per, unit = got
        h.unit = unit
        if unit and len(per) == 1:
            # one element type of unit leaves (cores): slots are consecutive runs of cnt, and
            # their keys never decrease along the policy order, so positions are the order
            cnt, cands = per[0]
            if len(cands) < cnt:
                return []
            runs = UnitRuns([(x[0], x[2]) for x in cands], cnt, high)
            if eng.slot_high != high and cands[0][0] != cands[-1][0]:
                # packed in the opposite order to the ranking (`variation`) with unequal
                # scores: the keys fall along the positions, so keep them sorted by key
                out = [runs[i] for i in range(len(runs))]
                out.sort(key=slot_key)
                return out
            return runs
        return pack_slots(per, high, split)

    def sync(self) -> None:
        if self.dirty:
            for h in self.dirty:
                self._refresh(h)
            self.dirty.clear()

    def consume(self, picks: list[tuple[SlotHost, int]]) -> None:
        """After a successful commit of ``picks`` (host, slot position): drop those slots.

        For hosts whose slots are aligned runs of unit leaves, taking whole runs leaves the
        other runs unchanged, so no repacking is needed - when the element counts are fixed:
        a range (``core[1:2]``) takes as many as are free, so fewer free leaves can mean
        shorter runs; other hosts are repacked lazily."""
        if not self.fixed:
            return
        by_host: dict[int, tuple[SlotHost, set[int]]] = {}
        for h, pos in picks:
            by_host.setdefault(id(h), (h, set()))[1].add(pos)
        for h, gone in by_host.values():
            if not h.unit or h not in self.dirty:
                continue
            self.dirty.discard(h)
            if h.key is not None:
                self.ranked.remove((h.key, h.dfs, h))
                h.key = None
            self.total_slots -= h.total
            if self.runs is not None:
                # the slots left keep their members and scores: take the gone ones out
                high = self.eng.high
                self._unscore(h, [-k if high else k for k in (h.slots[i][0] for i in gone)])
            if isinstance(h.slots, UnitRuns):
                h.slots.remove(gone)
            else:
                h.slots = [s for i, s in enumerate(h.slots) if i not in gone]
            h.total = len(h.slots)
            self.total_slots += h.total
            if len(h.slots):
                h.key = h.slots[0][0]
                self.ranked.add((h.key, h.dfs, h))

    def _unscore(self, h: SlotHost, gone: list[int]) -> None:
        """`locality`: slots with these scores left host ``h``."""
        runs = self.runs
        assert runs is not None
        scores = h.scores
        for sc in gone:
            runs.remove(sc)
            k = scores[sc] - 1
            if k:
                scores[sc] = k
                continue
            del scores[sc]
            b = self.buckets[sc]
            b.remove(h.dfs)
            if not b:
                del self.buckets[sc]

    def passes(self, h: SlotHost, allow: Allow) -> bool:
        """Host ``h``'s node passes the constraint ``allow`` (not None); the walk prunes the
        hosts whose node fails it (a host with no node above it is never filtered)."""
        nodes = self._node_vertex
        nv = nodes.get(h.dfs, False)
        if nv is False:
            nv = nodes[h.dfs] = node_of(h.vs)
        return nv is None or bool(allow.match(nv))

    def _allowed(self, allow: Allow) -> Any:
        """The ranked hosts whose node passes ``allow`` (the walk prunes the others)."""
        return [entry for entry in self.ranked if self.passes(entry[2], allow)]

    def select(self, slot: Resource, allow: Allow = None) -> list[tuple[VState, int]] | None:
        """Members of the N best slots (the walk's root choice), or None if it fails."""
        self.picks: list[tuple[SlotHost, int]] = []
        self.sync()
        ranked = self.ranked if allow is None else self._allowed(allow)
        total = self.total_slots if allow is None else sum(e[2].total for e in ranked)
        n = calc_count(slot.count, total)
        if n == 0:
            return None
        if self.runs is not None:
            return self._select_runs(n, None if allow is None else [e[2] for e in ranked])
        chosen: list[tuple[VState, int]] = []
        it = iter(ranked)
        nxt = next(it, None)
        heap: list[tuple[Any, int, int, SlotHost]] = []
        taken = 0
        while taken < n:
            while nxt is not None and (not heap or (nxt[0], nxt[1], 0) <= heap[0][:3]):
                h = nxt[2]
                s0 = h.slots[0]
                heapq.heappush(heap, (s0[0], h.dfs, 0, h))
                nxt = next(it, None)
            if not heap:
                return None
            _key, _d, si, h = heapq.heappop(heap)
            chosen.extend(h.slots[si][2])
            self.picks.append((h, si))
            taken += 1
            if si + 1 < len(h.slots):
                s1 = h.slots[si + 1]
                heapq.heappush(heap, (s1[0], h.dfs, si + 1, h))
        return chosen


    def _select_runs(self, n: int, allowed: list[SlotHost] | None) -> list[tuple[VState, int]] | None:
        """`locality`'s root choice of ``n`` slots: runs of consecutive slot scores, the run
        with the highest first score first; within a run every slot ranks equal, so they
        come in discovery order (host depth-first, then packing position). ``allowed``: the
        hosts a constraint leaves (their runs are counted apart), None: every host."""
        if allowed is None:
            runs = self.runs
            buckets = self.buckets
            assert runs is not None
            candidates = self.hosts
        else:
            runs = ScoreRuns()
            buckets = {}
            for h in allowed:
                for sc, k in h.scores.items():
                    runs.add(sc, k)
                    buckets.setdefault(sc, SortedList()).add(h.dfs)
            candidates = sorted(allowed, key=lambda h: h.dfs)
        high = self.eng.high
        hosts = self.hosts
        chosen: list[tuple[VState, int]] = []
        picks = self.picks
        taken = 0
        for first, last, width in runs.runs_desc():
            if width <= _MERGE_MAX:
                # the hosts having a slot in the run, merged from the runs' buckets
                seq: Iterator[SlotHost] = (hosts[d] for d in _unique(heapq.merge(
                    *[iter(buckets[sc]) for sc in runs.distinct.irange(first, last)])))
            else:  # many distinct scores: scan the hosts in order instead
                seq = (h for h in candidates if h.total and any(first <= sc <= last for sc in h.scores))
            for h in seq:
                slots = h.slots
                if isinstance(slots, UnitRuns):
                    # runs: keys never decrease along the positions, so scores move one way
                    # (down when ranking high): stop at the first slot past the run
                    for si in range(len(slots)):
                        sc = slots.score(si)
                        if sc < first if high else sc > last:
                            break
                        if first <= sc <= last:
                            chosen.extend(slots[si][2])
                            picks.append((h, si))
                            taken += 1
                            if taken == n:
                                return chosen
                    continue
                for si in sorted(range(len(slots)), key=lambda i: slots[i][1]):
                    s = slots[si]
                    sc = -s[0] if high else s[0]
                    if first <= sc <= last:
                        chosen.extend(s[2])
                        picks.append((h, si))
                        taken += 1
                        if taken == n:
                            return chosen
        return None

    def select_at(self, slot: Resource, allow: Allow, at: int, end: int) -> list[tuple[VState, int]] | None:
        """The walk's choice of ``slot`` for a reservation over [at, end)
        (``SlotWindow.select_at``)."""
        if self._window is None:
            self._window = SlotWindow(self)
        return self._window.select_at(slot, allow, at, end)


def _unique(it: Iterator[int]) -> Iterator[int]:
    """A sorted iterator without repeats."""
    prev = None
    for x in it:
        if x != prev:
            yield x
            prev = x
