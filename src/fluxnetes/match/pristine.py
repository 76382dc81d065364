"""Satisfiability of slot requests from counts, without the walk (the failing path's cost).

When a request cannot start now and gets no reservation, the matcher asks whether it could
ever run: a satisfiability walk at the far future with node status ignored (fluxion-spec §5.6).
There every recorded span has ended (spans end by the graph horizon), so the walk sees the
empty graph, and its answer depends only on the graph's structure, the vertices'
properties/names/ranks (constraints) and the request. For a policy that explores every
child (the static ones, `locality`, `variation`: no ``first`` early stop; they differ only in
how they rank candidates, which a count does not see) and ``slot[N] -> {leaf requests}``
that answer is a count:
the walk places slots at the first vertices (top-down) whose direct children hold every
slot type ("hosts", as in :mod:`.fast`), packs each host's free leaves into slots
(``dom_slot``'s cnt_slot), and succeeds when the slots found allow ``slot.count``. On the
empty graph every leaf is free, so a host's slot count follows from its children's sizes.

:class:`PristineSlots` computes that count once per set of slot element types and per graph
version (the matcher drops it when the structure or a property changes), so the question
costs a few dictionary look-ups instead of a walk over every vertex (1-2 s at 5,000 nodes).

It answers only where the count provably equals the walk (otherwise ``None``: the walk runs):

* every vertex the walk would visit has ``id >= -1`` (scores are then >= 1, so every
  candidate group qualifies) and a size >= 0; vertices of size 0 are pruned by the walk
  (``avail == 0``) and skipped here with their subtrees;
* the candidates of each element type under a host are leaves, and either all of one size
  (not shared pools) or all shared pools (``split_pools``, size > 1): then cnt_slot's
  greedy packing does not depend on the candidates' order (no scores needed);
* no element is a ``node``/``storage_node`` (constraints apply there) and the graph has no
  vertex of type ``slot``.

Ancestors' pruning filters never cut a host that has a slot: a filter asks for one slot's
minimum counts (``Resource.agg``), which any host with a slot holds below it.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from fluxnetes.graph.model import Vertex
from fluxnetes.jobspec.model import Resource
from fluxnetes.match.counts import calc_count
from fluxnetes.match.engine import Engine
from fluxnetes.match.vstate import VState

# one element type under one host: (number of candidates, their size, shared pools?)
TypeSummary = tuple[int, int, bool]
HostSummary = tuple[TypeSummary, ...]  # aligned with PristineSlots.types


class Unknown(Exception):
    """The count cannot be shown equal to the walk for this graph/type set."""


class PristineSlots:
    """Slot hosts of one set of element types on the empty graph, status ignored."""

    def __init__(self, eng: Engine, types: frozenset[str]) -> None:
        self.types = tuple(sorted(types))
        # per host: (node/storage_node vertices on the path from the root, its summary)
        self.hosts: list[tuple[tuple[Vertex, ...], HostSummary]] = []
        self.by_summary: Counter[HostSummary] = Counter()
        self.known = True
        try:
            self._discover(eng)
        except Unknown:
            self.known = False
            self.hosts = []
            self.by_summary.clear()

    def _discover(self, eng: Engine) -> None:
        types = frozenset(self.types)
        if "slot" in types or "node" in types or "storage_node" in types:
            raise Unknown
        split = eng.split_pools
        order = self.types
        root = eng.root
        rv = root.v
        if rv.type == "slot" or rv.id < -1 or rv.size < 0:
            raise Unknown
        stack: list[tuple[VState, tuple[Vertex, ...]]] = [(root, ())]
        while stack:
            u, nodes = stack.pop()
            v = u.v
            if v.size == 0:
                continue  # the walk prunes it (avail == 0), and all below it
            if v.type == "node" or v.type == "storage_node":
                nodes = (*nodes, v)
            kids = u.children
            if not kids:
                continue  # a leaf outside any host: no slot
            # one pass over the children: the vertices the walk scores below an inner
            # vertex must score >= 1, and per slot type (n, size, pools, leaves only?)
            per: dict[str, list[Any]] = {}
            for c in kids:
                cv = c.v
                if cv.id < -1 or cv.size < 0 or cv.type == "slot":
                    raise Unknown
                acc = per.get(cv.type)
                if acc is None:
                    acc = per[cv.type] = [0, -1, False, True]
                if cv.type not in types:
                    continue
                if c.children:
                    acc[3] = False
                    continue
                size = cv.size
                if size == 0:
                    continue  # never a candidate (avail == 0)
                pool = split and size > 1
                if acc[0] == 0:
                    acc[1], acc[2] = size, pool
                elif pool != acc[2] or (not pool and size != acc[1]):
                    acc[3] = False  # packing would depend on the candidates' order
                elif pool:
                    acc[1] += size  # pools pack by their sum
                acc[0] += 1
            if types <= per.keys():
                summary: list[TypeSummary] = []
                for t in order:
                    n, size, pools, ok = per[t]
                    if not ok:
                        raise Unknown
                    summary.append((1, size, True) if pools else (n, size, False))
                key = tuple(summary)
                self.hosts.append((nodes, key))
                self.by_summary[key] += 1
                continue
            stack.extend((c, nodes) for c in kids if c.children)

    @staticmethod
    def host_slots(summary: HostSummary, counts: tuple[Resource, ...]) -> int:
        """Slots one host packs (dom_slot's cnt_slot on its free leaves)."""
        best = -1
        for (n, size, pools), elem in zip(summary, counts, strict=True):
            if n == 0:
                return 0
            qc = size if pools else n * size
            cnt = calc_count(elem.count, qc)
            if cnt == 0:
                return 0
            if pools:
                fit = qc // cnt
            else:
                per = -(-cnt // size)  # candidates per slot (remainders are not carried)
                fit = n // per
            if best < 0 or fit < best:
                best = fit
        return max(best, 0)

    def total(self, elems: list[Resource], allow: Any = None) -> int | None:
        """Slots on the empty graph for elements ``elems`` (their types are ``self.types``),
        counting only hosts whose node(s) pass ``allow``; None when unknown."""
        if not self.known:
            return None
        by_type = {e.type: e for e in elems}
        if len(by_type) != len(elems) or set(by_type) != set(self.types):
            return None
        counts = tuple(by_type[t] for t in self.types)
        if allow is None:
            return sum(self.host_slots(s, counts) * k for s, k in self.by_summary.items())
        memo: dict[HostSummary, int] = {}
        out = 0
        for nodes, s in self.hosts:
            if not all(allow.match(nv) for nv in nodes):
                continue
            k = memo.get(s)
            if k is None:
                k = memo[s] = self.host_slots(s, counts)
            out += k
        return out
