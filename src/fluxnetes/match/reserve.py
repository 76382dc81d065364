"""A count bound that lets the reservation search skip start times where the walk must fail.

``allocate_orelse_reserve`` tries the root filter's candidate start times in order and walks
the whole graph at each until a walk succeeds (fluxion-spec §5.6). The root aggregates let
through every time where the cluster as a whole has the job's totals free, so on a busy
cluster (every node partly used, jobs ending one by one) hundreds of candidates each cost a
full walk that fails at the node filters.

For ``slot[N] -> {leaf requests}`` the walk only ever finds slots at the slot hosts (the first
vertices, top-down, whose direct children hold every slot type: :mod:`.fast`), from the
host's direct children of the element types that are free over the window. A host can give
at most ``min over elements of ub // count.min`` slots, where ``ub`` bounds what its children
of that type offer over the window:

* from the host's pruning filter, when the type is one it tracks and every child of that
  type is a leaf other than a shared pool: a leaf free over the whole window is held by no
  job at any instant of it, so the filter's fewest free units over the window are at least
  the free leaves' sizes;
* otherwise from the children themselves (sum of their own free amounts over the window).

The walk succeeds only if the hosts give ``calc_count(slot.count, slots) > 0``, i.e. at
least ``slot.count.min`` slots. :class:`ReserveBound` skips a candidate time whose bound is
below that, and walks at the others - so the answer (time and vertices) is the walk's, for
every policy (the bound ignores status, constraints, exclusivity and the policy's choices,
which can only remove slots). To avoid looking at every host at every candidate, each host
keeps the earliest instant at which its filter types could cover one slot
(:meth:`Planner.earliest_capped`), in a heap; only hosts whose instant has come are looked
at again.
"""

from __future__ import annotations

import heapq

from fluxnetes.jobspec.model import Resource
from fluxnetes.match.engine import Engine
from fluxnetes.match.vstate import VState

# per element type at one host: (filter type tracked there, or None; the children of that type)
TypeSource = tuple[str | None, tuple[VState, ...]]


class ReserveHosts:
    """The slot hosts of one set of element types, with where to read each type's bound."""

    def __init__(self, eng: Engine, types: frozenset[str]) -> None:
        self.types = types
        self.hosts: list[tuple[VState, dict[str, TypeSource]]] = []
        split = eng.split_pools
        stack = [eng.root]
        while stack:
            u = stack.pop()
            kids = u.children
            if not kids:
                continue
            ktypes = {c.v.type for c in kids}
            if types <= ktypes:
                src: dict[str, TypeSource] = {}
                for t in types:
                    of_t = tuple(c for c in kids if c.v.type == t)
                    use_f = t in u.fidx and u.f is not None and all(
                        not c.children and not (split and c.v.size > 1) for c in of_t)
                    src[t] = (t if use_f else None, of_t)
                self.hosts.append((u, src))
                continue
            stack.extend(kids)


class ReserveBound:
    """Per reservation search: may the walk at candidate ``t`` succeed? (False: it fails)."""

    def __init__(self, hosts: ReserveHosts, elems: list[Resource], slot: Resource, duration: int,
                 cap: int) -> None:
        self.hosts = hosts
        self.need_slots = slot.count.min
        self.duration = duration
        self.cap = cap
        by_type = {e.type: e for e in elems}
        # per element: (type, min count) - the least a slot takes of it
        self.mins = [(t, max(1, by_type[t].count.min)) for t in sorted(by_type)]
        self.heap: list[tuple[int, int]] | None = None

    def _key(self, i: int, t: int) -> int | None:
        """Earliest instant >= t where host i's filter types could cover one slot."""
        u, src = self.hosts.hosts[i]
        f = u.f
        dur = self.duration
        cap = self.cap
        while True:
            latest = t
            for typ, need in self.mins:
                ftype = src[typ][0]
                if ftype is None:
                    continue
                assert f is not None
                e = f.planner(ftype).earliest_capped(t, dur, need, cap)
                if e is None:
                    return None
                if e > latest:
                    latest = e
            if latest == t:
                return t
            t = latest

    def _slots(self, i: int, t: int) -> int:
        """Upper bound on the slots host i gives over the window at t."""
        u, src = self.hosts.hosts[i]
        end = min(t + self.duration, self.cap)
        best = -1
        for typ, need in self.mins:
            ftype, kids = src[typ]
            if ftype is not None:
                assert u.f is not None
                ub = u.f.free(u.fidx[ftype], t, end)
            else:
                ub = 0
                for c in kids:
                    a = c.avail(t, end)
                    if a > 0:
                        ub += a
            n = ub // need if ub >= need else 0
            if n == 0:
                return 0
            if best < 0 or n < best:
                best = n
        return max(best, 0)

    def next_start(self) -> int | None:
        """After a False from may_fit(t): no host can give a slot before this instant (> t);
        None: none ever can."""
        heap = self.heap
        return heap[0][0] if heap else None

    def may_fit(self, t: int) -> bool:
        heap = self.heap
        if heap is None:
            heap = []
            for i in range(len(self.hosts.hosts)):
                k = self._key(i, t)
                if k is not None:
                    heap.append((k, i))
            heapq.heapify(heap)
            self.heap = heap
        total = 0
        back: list[tuple[int, int]] = []
        ok = False
        while heap and heap[0][0] <= t:
            _k, i = heapq.heappop(heap)
            k = self._key(i, t)
            if k is None:
                continue
            if k > t:
                heapq.heappush(heap, (k, i))
                continue
            back.append((t + 1, i))  # candidates only grow: look again at the next one
            total += self._slots(i, t)
            if total >= self.need_slots:
                ok = True
                break
        for item in back:
            heapq.heappush(heap, item)
        return ok or self.need_slots <= 0
