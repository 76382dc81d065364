"""Index-based fast paths for the static policies (low, high, lonode, hinode).

The DFU walk of a static policy visits every unpruned vertex, then keeps the best
candidates - on a 4096-node core-level graph that is ~270k vertex visits per match. For
the common request shapes the walk's answer can be read from small indexes instead, and
these classes do exactly that. They return the *same* answer as the walk (with the stable
tie-break; tests compare both on random graphs), and the matcher uses them only when their
preconditions hold (otherwise it falls back to the walk):

* ``SlotIndex`` - ``slot[N] -> {leaf types}`` with no node level (Fluence-style pod groups,
  benchmark shapes (a) and (c)). Slot hosts are the first vertices (top-down) whose direct
  children hold every slot type; per host the free leaves are kept sorted in policy order,
  packed into slots exactly as the walk packs them, and hosts sit in a sorted list keyed by
  their best slot. A match merges hosts' slot lists (k-way) to get the N best slots in the
  order the walk's root sort would give.
* ``NodeIndex`` - ``node[N] (exclusive) -> slot[k] -> {leaf types}`` (benchmark (b)): the
  walk picks the N eligible nodes with the best node score (id order); eligible = up, no job
  on it, and enough leaves for k slots when empty. Kept in a sorted list.

Preconditions (checked by the matcher): a static policy with stable ties, a match at ``now``
while every recorded job is active at ``now`` (started at or before it, ending after it) -
then "free over the window" is simply "no job on it". A jobspec constraint (RFC 31) is a
filter on node vertices, as in the walk: hosts / nodes whose node fails it are skipped
(``allow``), and counts are taken against what remains.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from typing import Any

from sortedcontainers import SortedList

from fluxnetes.graph.model import UP, Vertex
from fluxnetes.jobspec.model import Resource
from fluxnetes.match.counts import calc_count
from fluxnetes.match.engine import Engine
from fluxnetes.match.scoring import perf_class
from fluxnetes.match.vstate import VState


def slot_shape(resources: list[Resource]) -> tuple[Resource, list[Resource]] | None:
    """``[slot -> {leaf requests}]`` with nothing exclusive-false/nested: (slot, elements)."""
    if len(resources) != 1:
        return None
    s = resources[0]
    if s.type != "slot" or not s.with_:
        return None
    for e in s.with_:
        if e.with_ or e.exclusive is False or e.type == "slot":
            return None
    return s, s.with_


def node_shape(resources: list[Resource]) -> tuple[Resource, Resource, list[Resource]] | None:
    """``[node (exclusive) -> slot -> {leaf requests}]``: (node, slot, elements)."""
    if len(resources) != 1:
        return None
    n = resources[0]
    if n.type != "node" or n.exclusive is not True or len(n.with_) != 1:
        return None
    inner = slot_shape(n.with_)
    if inner is None:
        return None
    return n, inner[0], inner[1]


def vertex_score(eng: Engine, v: Vertex, ml: int) -> int:
    """The walk's score of candidate vertex ``v`` (dom_dfv / _leaf): 1 + perf_class under
    `variation`, else 1 + node factor + id + 1."""
    return 1 + perf_class(v) if eng.perf else 1 + ml + v.id + 1


class ScoreRuns:
    """A multiset of integer scores seen as Fluxion's `locality` policy sees its candidates:
    the distinct scores joined into runs of consecutive integers (its interval set), kept up
    to date as scores come and go instead of being rebuilt per match."""

    __slots__ = ("count", "distinct", "starts")

    def __init__(self) -> None:
        self.count: dict[int, int] = {}
        self.distinct: SortedList = SortedList()
        self.starts: SortedList = SortedList()  # the first score of every run

    def add(self, s: int, n: int = 1) -> None:
        count = self.count
        c = count.get(s, 0)
        count[s] = c + n
        if c:
            return
        self.distinct.add(s)
        if s - 1 not in count:
            self.starts.add(s)
        if s + 1 in count:
            self.starts.remove(s + 1)  # its run now starts at or below s

    def remove(self, s: int, n: int = 1) -> None:
        count = self.count
        c = count[s] - n
        if c:
            count[s] = c
            return
        del count[s]
        self.distinct.remove(s)
        if s - 1 not in count:
            self.starts.remove(s)
        if s + 1 in count:
            self.starts.add(s + 1)  # s split its run: the upper part starts at s + 1

    def runs_desc(self) -> Iterator[tuple[int, int, int]]:
        """(first, last, distinct scores in it) of each run, the run with the highest first
        score first (greater_interval_first)."""
        starts = self.starts
        distinct = self.distinct
        for i in range(len(starts) - 1, -1, -1):
            r = starts[i]
            lo = distinct.bisect_left(r)
            hi = distinct.bisect_left(starts[i + 1]) if i + 1 < len(starts) else len(distinct)
            yield r, distinct[hi - 1], hi - lo


Slot = tuple[Any, int, list[tuple[VState, int]]]  # (key, position, members)
Allow = Any  # a jobspec Constraint (``.match(vertex) -> bool``) or None: every node


def _node_of(u: VState) -> Any:
    """The node (or storage_node) vertex at or above ``u``, where the walk applies
    constraints; None when there is none (then nothing is filtered)."""
    x: VState | None = u
    while x is not None:
        if x.v.type in ("node", "storage_node"):
            return x.v
        x = x.parent
    return None


class _Runs:
    """A host's slots when they are runs of ``cnt`` unit leaves of one type, in policy
    order: built on demand instead of materialised (hosts x slots can be 10^5+)."""

    __slots__ = ("cands", "cnt", "high", "memo")

    def __init__(self, cands: list[tuple[int, VState]], cnt: int, high: bool) -> None:
        self.cands = cands
        self.cnt = cnt
        self.high = high
        # slots built since the last remove (select() reads the first ones several times);
        # callers only read them (select copies the members out)
        self.memo: dict[int, Slot] = {}

    def __len__(self) -> int:
        return len(self.cands) // self.cnt

    def __getitem__(self, i: int) -> Slot:
        hit = self.memo.get(i)
        if hit is not None:
            return hit
        cnt = self.cnt
        score = 1
        members: list[tuple[VState, int]] = []
        for sc, c in self.cands[i * cnt:(i + 1) * cnt]:
            score += sc
            members.append((c, 1))
        slot = (-score if self.high else score, i, members)
        self.memo[i] = slot
        return slot

    def score(self, i: int) -> int:
        """Slot ``i``'s score without building it."""
        cnt = self.cnt
        return 1 + sum(sc for sc, _c in self.cands[i * cnt:(i + 1) * cnt])

    def scores(self) -> list[int]:
        """Every slot's score (1 + its members' scores), in position order."""
        cnt = self.cnt
        cands = self.cands
        return [1 + sum(sc for sc, _c in cands[i:i + cnt]) for i in range(0, len(self) * cnt, cnt)]

    def remove(self, gone: set[int]) -> None:
        cnt = self.cnt
        for i in sorted(gone, reverse=True):
            del self.cands[i * cnt:(i + 1) * cnt]
        self.memo.clear()  # positions shifted


class _Host:
    __slots__ = ("dfs", "down", "key", "ml", "scores", "slots", "total", "unit", "vs")

    def __init__(self, vs: VState, dfs: int, ml: int) -> None:
        self.vs = vs
        self.dfs = dfs
        self.ml = ml
        self.down = False
        self.unit = False  # slots are aligned runs of unit leaves (see consume())
        self.slots: list[Slot] | _Runs = []
        self.total = 0
        self.key: Any = None  # its first slot's key (Slot[0]: an int or a tuple, by policy); None: no slot
        self.scores: dict[int, int] = {}  # `locality`: slot score -> how many slots have it


class SlotIndex:
    """Slot hosts for one set of slot element types, kept ready for the walk's answer."""

    def __init__(self, eng: Engine, types: frozenset[str], elems: list[Resource]) -> None:
        self.eng = eng
        self.types = types
        self.elems = elems  # element requests (counts matter for packing)
        # fixed counts (min == max): a host's slot size does not depend on what is free
        self.fixed = all(e.count.min == e.count.max for e in elems)
        self.hosts: list[_Host] = []
        self.host_of: dict[int, _Host] = {}  # id(leaf vstate) -> host
        self.dirty: set[_Host] = set()
        self._order: dict[int, list[list[tuple[int, VState]]]] = {}
        self.ranked: SortedList = SortedList()
        self.total_slots = 0
        self._node_vertex: dict[int, Any] = {}  # host dfs -> its node vertex (constraints)
        self._lb: list[tuple[Any, int, _Host]] | None = None  # select_at's host order
        self._lb_unknown = False
        self._fcheck: dict[int, list[tuple[int, int]]] = {}  # host dfs -> (filter index, need)
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
                h = _Host(u, len(self.hosts), ml)
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
        eng = self.eng
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
        _ = eng

    def _refresh(self, h: _Host) -> None:
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

    def _slot_scores(self, h: _Host) -> list[int]:
        slots = h.slots
        if isinstance(slots, _Runs):
            return slots.scores()
        return [-s[0] if self.eng.high else s[0] for s in slots]

    def _rescore(self, h: _Host) -> None:
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

    def _static(self, h: _Host) -> list[list[tuple[int, VState]]]:
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

    def _fits(self, h: _Host) -> bool:
        """_pack's count test (every element's count allows at least one slot) from the
        host's children as they are, without sorting them: most hosts of a busy graph fail
        it for a big request, and _pack would return no slot for them anyway."""
        split = self.eng.split_pools
        kids = h.vs.children
        for elem in self.elems:
            t = elem.type
            qc = 0
            for c in kids:
                cv = c.v
                if cv.type != t or cv.status != UP:
                    continue
                if c.xs or c.alloc_n or c.ps:
                    if not (split and cv.size > 1 and not c.children):
                        continue
                    avail = cv.size - c.pused
                else:
                    avail = cv.size
                if avail > 0:
                    qc += avail
            if calc_count(elem.count, qc) == 0:
                return False
        return True

    def _pack(self, h: _Host) -> list[Slot] | _Runs:
        if not self._fits(h):
            return []
        eng = self.eng
        high = eng.high
        split = eng.split_pools
        per: list[tuple[int, list[tuple[int, int, VState]]]] = []
        unit = True
        for elem, order in zip(self.elems, self._static(h), strict=True):
            cands: list[tuple[int, int, VState]] = []  # (score, count, vs) in policy order
            for sc, c in order:
                cv = c.v
                if cv.status != UP:
                    continue
                if c.xs or c.alloc_n or c.ps:
                    if not (split and cv.size > 1 and not c.children):
                        continue
                    avail = cv.size - c.pused
                else:
                    avail = cv.size
                if avail <= 0:
                    continue
                if avail != 1:
                    unit = False
                cands.append((sc, avail, c))
            qc = len(cands) if unit else sum(a for _s, a, _c in cands)
            cnt = calc_count(elem.count, qc)
            if cnt == 0:
                return []
            per.append((cnt, cands))
        h.unit = unit
        if unit and len(per) == 1:
            # one element type of unit leaves (cores): slots are consecutive runs of cnt, and
            # their keys never decrease along the policy order, so positions are the order
            cnt, cands = per[0]
            if len(cands) < cnt:
                return []
            runs = _Runs([(x[0], x[2]) for x in cands], cnt, high)
            if eng.slot_high != high and cands[0][0] != cands[-1][0]:
                # packed in the opposite order to the ranking (`variation`) with unequal
                # scores: the keys fall along the positions, so keep them sorted by key
                out = [runs[i] for i in range(len(runs))]
                out.sort(key=_slot_key)
                return out
            return runs
        # cnt_slot: shares per type (whole candidates, remainders not carried)
        nslots = None
        for cnt, cands in per:
            fit = 0
            acc = 0
            for _s, a, c in cands:
                if split and c.v.size > 1 and not c.children:
                    acc += a
                    fit += acc // cnt
                    acc %= cnt
                    continue
                acc += a
                if acc >= cnt:
                    fit += 1
                    acc = 0
            nslots = fit if nslots is None else min(nslots, fit)
        if not nslots:
            return []
        slots: list[tuple[Any, int, list[tuple[VState, int]]]] = []
        pos = [0] * len(per)
        left = [0] * len(per)
        for i in range(nslots):
            score = 1
            members: list[tuple[VState, int]] = []
            for ei, (cnt, cands) in enumerate(per):
                j = 0
                while j < cnt:
                    gi = pos[ei]
                    if gi >= len(cands):
                        slots.sort(key=_slot_key)
                        return slots
                    s, a, c = cands[gi]
                    if split and c.v.size > 1 and not c.children:
                        if left[ei] == 0:
                            left[ei] = a
                        take = min(left[ei], cnt - j)
                        left[ei] -= take
                        if left[ei] == 0:
                            pos[ei] = gi + 1
                        members.append((c, take))
                        score += s
                        j += take
                        continue
                    pos[ei] = gi + 1
                    members.append((c, a))
                    score += s
                    j += a
            slots.append((-score if high else score, i, members))
        slots.sort(key=_slot_key)
        return slots

    def sync(self) -> None:
        if self.dirty:
            for h in self.dirty:
                self._refresh(h)
            self.dirty.clear()

    def consume(self, picks: list[tuple[_Host, int]]) -> None:
        """After a successful commit of ``picks`` (host, slot position): drop those slots.

        For hosts whose slots are aligned runs of unit leaves, taking whole runs leaves the
        other runs unchanged, so no repacking is needed - when the element counts are fixed:
        a range (``core[1:2]``) takes as many as are free, so fewer free leaves can mean
        shorter runs; other hosts are repacked lazily."""
        if not self.fixed:
            return
        by_host: dict[int, tuple[_Host, set[int]]] = {}
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
            if isinstance(h.slots, _Runs):
                h.slots.remove(gone)
            else:
                h.slots = [s for i, s in enumerate(h.slots) if i not in gone]
            h.total = len(h.slots)
            self.total_slots += h.total
            if len(h.slots):
                h.key = h.slots[0][0]
                self.ranked.add((h.key, h.dfs, h))

    def _unscore(self, h: _Host, gone: list[int]) -> None:
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

    def _allowed(self, allow: Allow) -> Any:
        """The ranked hosts whose node passes ``allow`` (the walk prunes the others)."""
        nodes = self._node_vertex
        out = []
        for entry in self.ranked:
            h = entry[2]
            nv = nodes.get(h.dfs, False)
            if nv is False:
                nv = nodes[h.dfs] = _node_of(h.vs)
            if nv is None or allow.match(nv):
                out.append(entry)
        return out

    def select(self, slot: Resource, allow: Allow = None) -> list[tuple[VState, int]] | None:
        """Members of the N best slots (the walk's root choice), or None if it fails."""
        self.picks: list[tuple[_Host, int]] = []
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
        heap: list[tuple[Any, int, int, _Host]] = []
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


    def _select_runs(self, n: int, allowed: list[_Host] | None) -> list[tuple[VState, int]] | None:
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
                seq: Iterator[_Host] = (hosts[d] for d in _unique(heapq.merge(
                    *[iter(buckets[sc]) for sc in runs.distinct.irange(first, last)])))
            else:  # many distinct scores: scan the hosts in order instead
                seq = (h for h in candidates if h.total and any(first <= sc <= last for sc in h.scores))
            for h in seq:
                slots = h.slots
                if isinstance(slots, _Runs):
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

    # ------------------------------------------------------------------ as of a future window
    def _bounds(self) -> list[tuple[Any, int, _Host]] | None:
        """Per host a lower bound on its best slot's key (from the static candidate order,
        whatever is free), sorted; None when a bound cannot be given (non-leaf candidates,
        or element counts that are ranges)."""
        got = self._lb
        if got is not None or self._lb_unknown:
            return got
        if not self.fixed:
            self._lb_unknown = True
            return None
        high = self.eng.high
        split = self.eng.split_pools
        out: list[tuple[Any, int, _Host]] = []
        fcheck = self._fcheck
        for h in self.hosts:
            score = 1
            ok = True
            checks: list[tuple[int, int]] = []
            for elem, order in zip(self.elems, self._static(h), strict=True):
                cnt = elem.count.min
                if any(c.children for _s, c in order):
                    self._lb_unknown = True
                    return None
                unit = all(c.v.size == 1 and not (split and c.v.size > 1) for _s, c in order)
                fi = h.vs.fidx.get(elem.type)
                if fi is not None and not any(split and c.v.size > 1 for _s, c in order):
                    # the host's filter bounds these leaves (see match/reserve.py)
                    checks.append((fi, cnt))
                # unit leaves: exactly cnt members, at best the first cnt in policy order;
                # else members hold >= 1 unit each: at most cnt of them (high), one at least (low)
                k = cnt if unit else (min(cnt, len(order)) if high else 1)
                if len(order) < (cnt if unit else 1) or k < 1:
                    ok = False
                    break
                score += sum(sc for sc, _c in order[:k])
            if ok:
                out.append((-score if high else score, h.dfs, h))
                fcheck[h.dfs] = checks
        out.sort(key=lambda x: (x[0], x[1]))
        self._lb = out
        return out

    def _free_at(self, c: VState, at: int, end: int) -> int:
        """What the walk at [at, end) (a reservation) sees free of candidate leaf ``c``."""
        cv = c.v
        if cv.status != UP:
            return 0
        if self.eng.split_pools and cv.size > 1:
            return c.avail(at, end) if c.ps else cv.size
        if (c.xs or c.ps) and c.x_busy(at, end):
            return 0
        return c.avail(at, end) if c.ps else cv.size

    def _host_open_at(self, h: _Host, at: int, end: int) -> bool:
        """The walk's host-level checks at [at, end): up (and its ancestors), own planner of
        the host and its ancestors not full over the window; and (no slot otherwise) the
        host's filter has one slot's count of each leaf type it bounds free over it."""
        if h.down:
            return False
        f = h.vs.f
        if f is not None:
            for fi, need in self._fcheck.get(h.dfs, ()):
                if f.free(fi, at, end) < need:
                    return False  # fewer leaves free over the window than one slot takes
        x: VState | None = h.vs
        while x is not None:
            if x.ps and x.avail(at, end) == 0:
                return False
            x = x.parent
        return True

    def _pack_at(self, h: _Host, at: int, end: int) -> list[Slot] | _Runs:
        """_pack with the leaves free over [at, end) instead of the leaves free now."""
        high = self.eng.high
        split = self.eng.split_pools
        per: list[tuple[int, list[tuple[int, int, VState]]]] = []
        unit = True
        for elem, order in zip(self.elems, self._static(h), strict=True):
            cands: list[tuple[int, int, VState]] = []
            for sc, c in order:
                avail = self._free_at(c, at, end)
                if avail <= 0:
                    continue
                if avail != 1:
                    unit = False
                cands.append((sc, avail, c))
            qc = len(cands) if unit else sum(a for _s, a, _c in cands)
            cnt = calc_count(elem.count, qc)
            if cnt == 0:
                return []
            per.append((cnt, cands))
        if unit and len(per) == 1:
            cnt, cands = per[0]
            if len(cands) < cnt:
                return []
            return _Runs([(x[0], x[2]) for x in cands], cnt, high)
        return _pack_slots(per, high, split)

    def select_at(self, slot: Resource, allow: Allow, at: int, end: int) -> list[tuple[VState, int]] | None:
        """The walk's choice of ``slot`` (a fixed count) for a reservation over [at, end):
        members of the N best slots, or None if fewer than N exist. Hosts are packed lazily
        in the order of a lower bound on their best slot, until no unpacked host can beat the
        slots found. Raises LookupError when not applicable (the caller walks)."""
        if slot.count.min != slot.count.max:
            raise LookupError("slot count is a range")
        bounds = self._bounds()
        if bounds is None:
            raise LookupError("no static bound for these hosts")
        need = slot.count.min
        nodes = self._node_vertex
        chosen: list[tuple[VState, int]] = []
        heap: list[tuple[Any, int, int, int]] = []
        packed: list[list[Slot] | _Runs] = []
        it = iter(bounds)
        nxt = next(it, None)
        taken = 0
        while taken < need:
            while nxt is not None and (not heap or (nxt[0], nxt[1], 0) <= heap[0][:3]):
                h = nxt[2]
                nxt = next(it, None)
                if allow is not None:
                    nv = nodes.get(h.dfs, False)
                    if nv is False:
                        nv = nodes[h.dfs] = _node_of(h.vs)
                    if nv is not None and not allow.match(nv):
                        continue
                if not self._host_open_at(h, at, end):
                    continue
                slots = self._pack_at(h, at, end)
                if len(slots):
                    packed.append(slots)
                    heapq.heappush(heap, (slots[0][0], h.dfs, 0, len(packed) - 1))
            if not heap:
                return None
            _key, dfs, si, pi = heapq.heappop(heap)
            slots = packed[pi]
            chosen.extend(slots[si][2])
            taken += 1
            if si + 1 < len(slots):
                heapq.heappush(heap, (slots[si + 1][0], dfs, si + 1, pi))
        return chosen


def _pack_slots(per: list[tuple[int, list[tuple[int, int, VState]]]], high: bool, split: bool) -> list[Slot]:
    """cnt_slot and the slots' members (as SlotIndex._pack builds them)."""
    nslots = None
    for cnt, cands in per:
        fit = 0
        acc = 0
        for _s, a, c in cands:
            if split and c.v.size > 1 and not c.children:
                acc += a
                fit += acc // cnt
                acc %= cnt
                continue
            acc += a
            if acc >= cnt:
                fit += 1
                acc = 0
        nslots = fit if nslots is None else min(nslots, fit)
    if not nslots:
        return []
    slots: list[Slot] = []
    pos = [0] * len(per)
    left = [0] * len(per)
    for i in range(nslots):
        score = 1
        members: list[tuple[VState, int]] = []
        for ei, (cnt, cands) in enumerate(per):
            j = 0
            while j < cnt:
                gi = pos[ei]
                if gi >= len(cands):
                    slots.sort(key=_slot_key)
                    return slots
                s, a, c = cands[gi]
                if split and c.v.size > 1 and not c.children:
                    if left[ei] == 0:
                        left[ei] = a
                    take = min(left[ei], cnt - j)
                    left[ei] -= take
                    if left[ei] == 0:
                        pos[ei] = gi + 1
                    members.append((c, take))
                    score += s
                    j += take
                    continue
                pos[ei] = gi + 1
                members.append((c, a))
                score += s
                j += a
        slots.append((-score if high else score, i, members))
    slots.sort(key=_slot_key)
    return slots


def _slot_key(s: tuple[Any, int, Any]) -> tuple[Any, int]:
    return (s[0], s[1])


_MERGE_MAX = 256  # `locality`: runs of up to this many distinct scores merge their buckets


def _unique(it: Iterator[int]) -> Iterator[int]:
    """A sorted iterator without repeats."""
    prev = None
    for x in it:
        if x != prev:
            yield x
            prev = x


class NodeIndex:
    """Eligible whole nodes for ``node[N] exclusive -> slot[k] -> leaves``."""

    def __init__(self, eng: Engine, slot: Resource, elems: list[Resource]) -> None:
        self.eng = eng
        self.slot = slot
        self.elems = elems
        self.nodes: dict[int, tuple[VState, int]] = {}  # id(vs) -> (vs, dfs)
        self.ranked: SortedList = SortedList()
        self.member: dict[int, Any] = {}
        self.dirty: set[int] = set()
        # `locality`: eligible nodes' scores as runs, and the nodes by (score, dfs)
        self.runs: ScoreRuns | None = ScoreRuns() if eng.locality else None
        self.by_score: SortedList = SortedList()
        self.score: dict[int, int] = {}  # id(vs) -> score (static between set-ups)
        dfs = 0
        stack = [eng.root]
        while stack:
            u = stack.pop()
            if u.v.type == "node":
                if self._capable(u):
                    self.nodes[id(u)] = (u, dfs)
                    dfs += 1
                continue
            stack.extend(reversed(u.children))
        for k, (u, _d) in self.nodes.items():
            self.score[k] = vertex_score(eng, u.v, 0)
        # scores ascending in depth-first order: a run's nodes in score order are already in
        # discovery order (the usual case: node ids follow the tree)
        pairs = sorted((self.score[k], d) for k, (_u, d) in self.nodes.items())
        self.monotone = all(pairs[i][1] < pairs[i + 1][1] for i in range(len(pairs) - 1))
        for k in self.nodes:
            self._refresh(k)

    def _capable(self, node: VState) -> bool:
        """Could this node host k slots when empty (static structure)?"""
        types = frozenset(e.type for e in self.elems)
        hosts: list[VState] = []
        stack = [node]
        while stack:
            u = stack.pop()
            kt = {c.v.type for c in u.children}
            if u.children and types <= kt:
                hosts.append(u)
                continue
            stack.extend(u.children)
        total = 0
        for h in hosts:
            nsl = None
            for e in self.elems:
                cands = [c for c in h.children if c.v.type == e.type]
                qc = sum(c.v.size for c in cands)
                cnt = calc_count(e.count, qc)
                if cnt == 0:
                    nsl = 0
                    break
                fit = 0
                acc = 0
                for c in cands:
                    acc += c.v.size
                    if acc >= cnt:
                        fit += 1
                        acc = 0
                nsl = fit if nsl is None else min(nsl, fit)
            total += nsl or 0
        return calc_count(self.slot.count, total) > 0

    def _eligible(self, u: VState) -> bool:
        x: VState | None = u
        while x is not None:
            if x.v.status != UP:
                return False
            x = x.parent
        if u.xs:
            return False
        # ancestors exclusively held (own planner consumed) prune the node
        p = u.parent
        while p is not None:
            if p.ps and p.pused >= p.v.size:
                return False
            p = p.parent
        return True

    def _refresh(self, k: int) -> None:
        u, dfs = self.nodes[k]
        old = self.member.pop(k, None)
        runs = self.runs
        score = self.score[k]
        if old is not None:
            self.ranked.remove(old)
            if runs is not None:
                runs.remove(score)
                self.by_score.remove((score, dfs, k))
        if self._eligible(u):
            key = (-score if self.eng.high else score, dfs, k)
            self.member[k] = key
            self.ranked.add(key)
            if runs is not None:
                runs.add(score)
                self.by_score.add((score, dfs, k))

    def touch(self, changed: list[VState]) -> None:
        for u in changed:
            if u.v.type == "node" and id(u) in self.nodes:
                self.dirty.add(id(u))

    def refresh_status(self) -> None:
        self.dirty.update(self.nodes)

    def select(self, node_req: Resource, allow: Allow = None) -> list[VState] | None:
        if self.dirty:
            for k in self.dirty:
                self._refresh(k)
            self.dirty.clear()
        ranked = self.ranked
        if allow is not None:
            ranked = [key for key in ranked if allow.match(self.nodes[key[2]][0].v)]
        n = calc_count(node_req.count, len(ranked))
        if n == 0:
            return None
        if self.runs is not None:
            return self._select_runs(n, None if allow is None else ranked)
        return [self.nodes[key[2]][0] for key in ranked[:n]]

    def _select_runs(self, n: int, allowed: list[Any] | None) -> list[VState] | None:
        """`locality`'s root choice: the eligible nodes' scores joined into runs of
        consecutive integers, the run with the highest first score first, nodes within a run
        in discovery order."""
        runs = self.runs
        by_score = self.by_score
        if allowed is not None:
            runs = ScoreRuns()
            by_score = SortedList()
            for _key, dfs, k in allowed:
                runs.add(self.score[k])
                by_score.add((self.score[k], dfs, k))
        assert runs is not None
        out: list[VState] = []
        for first, last, _w in runs.runs_desc():
            members = by_score.irange((first,), (last + 1,), inclusive=(True, False))
            if not self.monotone:
                members = sorted(members, key=lambda m: m[1])
            for _sc, _dfs, k in members:
                out.append(self.nodes[k][0])
                if len(out) == n:
                    return out
        return None
