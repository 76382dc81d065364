"""Could a request ever run on a graph? The count questions, answered without a match.

A full satisfiability walk costs a traversal of the graph; most requests that can never run
fail a much simpler test, and these are the tests a queue can afford for *every* job it
looks at (not only the head, which a match call judges anyway):

1. **totals**: every type the request asks for, in all, against what the graph has of it
   (every vertex counts, up or down: satisfiability is about "ever", not "now");
2. **per node**: a ``slot`` whose resources all live under nodes is placed inside one node
   (the traverser puts a slot at a vertex whose children hold its types), so some node must
   hold all of one slot; a ``node`` request needs that many nodes holding what each asks;
3. **slot count**: the graph's nodes together hold at most ``sum over nodes of min over types
   (node amount // slot amount)`` slots of that shape; a request for more never fits.

Each test is a necessary condition only: a request that passes may still be unsatisfiable
for subtler reasons (exclusivity, nesting), which the matcher's own satisfiability walk
decides. A request that fails is certainly unsatisfiable, and the :class:`Shortfall` says
which resource is short, in the caller's words (``names``: graph type -> what the user
calls it, e.g. ``core`` -> ``cpu`` in Kubernetes).

Constraints (RFC 31, e.g. the hostlist ``nodefit`` adds for a pod's node rules) limit the
nodes the per-node tests look at. Pure: no clock, no I/O; the graph is only read.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from fluxnetes.graph.model import ResourceGraph, Vertex
from fluxnetes.jobspec.model import Jobspec, Resource

NODE, SLOT = "node", "slot"
MEMO_LIMIT = 4096  # request shapes remembered per graph version


@dataclass(frozen=True)
class NodeAmounts:
    """What one node vertex holds, per type (sizes summed over its subtree)."""

    vertex: Vertex
    amounts: Mapping[str, int]

    @property
    def name(self) -> str:
        return self.vertex.name


@dataclass(frozen=True)
class Shortfall:
    """Why a request can never run: the short resource and the numbers.

    ``kind``: ``total`` (``need`` of ``type`` in all, the graph has ``have``), ``node``
    (no single node has ``need`` of ``type``; the largest has ``have``), ``together`` (no
    single node holds all of ``demand`` at once), ``count`` (``units`` slots/nodes of
    ``demand`` asked, the nodes hold ``have`` of them) or ``eligible`` (no node passes the
    request's constraints). ``eligible_only``: the numbers count only the nodes the
    request's constraints allow."""

    kind: str
    type: str = ""
    need: int = 0
    have: int = 0
    demand: Mapping[str, int] = field(default_factory=dict)
    units: int = 0
    unit: str = SLOT
    eligible_only: bool = False

    def text(self, names: Mapping[str, str] | None = None) -> str:
        nm = dict(names or {})

        def amount(t: str, n: int) -> str:
            plural = "s" if t in (NODE, SLOT) and n != 1 else ""  # counted things, not amounts
            return f"{n} {nm.get(t, t)}{plural}"

        def demand() -> str:
            return ", ".join(amount(t, n) for t, n in sorted(self.demand.items()))

        where = "eligible node" if self.eligible_only else "node"
        if self.kind == "total":
            scope = "the eligible nodes have" if self.eligible_only else "the cluster has"
            return f"needs {amount(self.type, self.need)} in all; {scope} {self.have}"
        if self.kind == "node":
            return f"no {where} has {amount(self.type, self.need)}; the largest has {self.have}"
        if self.kind == "together":
            return f"no {where} has {demand()} together"
        if self.kind == "count":
            unit = nm.get(self.unit, self.unit)
            return (f"needs {self.units} {unit}s of {demand()} each; the {where}s hold at most "
                    f"{self.have} of them")
        return "no node matches the request's constraints"


@dataclass
class Capacity:
    """What a graph holds, for the count questions (make one per graph version: ``of``)."""

    totals: Mapping[str, int]
    nodes: tuple[NodeAmounts, ...]
    node_local: frozenset[str]  # types whose every vertex lies under a node
    _memo: dict[Any, Shortfall | None] = field(default_factory=dict, repr=False)

    @classmethod
    def of(cls, graph: ResourceGraph) -> Capacity:
        under_nodes: dict[str, int] = {}
        nodes: list[NodeAmounts] = []
        for v in graph.by_type.get(NODE, []):
            amounts: dict[str, int] = {}
            stack = list(v.children)
            while stack:
                u = stack.pop()
                amounts[u.type] = amounts.get(u.type, 0) + u.size
                under_nodes[u.type] = under_nodes.get(u.type, 0) + 1
                stack.extend(u.children)
            nodes.append(NodeAmounts(v, amounts))
        local = frozenset(t for t, vs in graph.by_type.items()
                          if t != NODE and vs and under_nodes.get(t, 0) == len(vs))
        return cls(totals=graph.summary(), nodes=tuple(nodes), node_local=local)

    # ------------------------------------------------------------------ the check
    def check(self, js: Jobspec) -> Shortfall | None:
        """The first count question ``js`` fails, or None (it may fit: ask the matcher)."""
        for t, n in sorted(js.totals.items()):
            if t == SLOT or n <= 0:
                continue
            have = self.totals.get(t, 0)
            if n > have:
                return Shortfall("total", t, n, have)
        key = shape_key(js)
        if key in self._memo:
            return self._memo[key]
        answer = self._check_shape(js)
        if len(self._memo) >= MEMO_LIMIT:  # bounded: a queue of ever new shapes
            self._memo.clear()
        self._memo[key] = answer
        return answer

    def _check_shape(self, js: Jobspec) -> Shortfall | None:
        con = js.constraint
        eligible = self.nodes if con is None else tuple(n for n in self.nodes if con.match(n.vertex))
        limited = con is not None and len(eligible) < len(self.nodes)
        if con is not None and not eligible and js.totals.get(NODE, 0) + js.totals.get(SLOT, 0) > 0:
            return Shortfall("eligible", eligible_only=True)
        if limited:
            for t, n in sorted(js.totals.items()):
                if t in self.node_local and n > 0:
                    have = sum(x.amounts.get(t, 0) for x in eligible)
                    if n > have:
                        return Shortfall("total", t, n, have, eligible_only=True)
        for r in js.resources:
            short = self._visit(r, 1, eligible, limited)
            if short is not None:
                return short
        return None

    def _visit(self, r: Resource, mult: int, eligible: tuple[NodeAmounts, ...],
               limited: bool) -> Shortfall | None:
        count = max(0, r.count.min)
        if r.type == NODE:
            demand = {t: n for t, n in r.agg.items() if t in self.node_local and n > 0}
            return self._fits(demand, mult * count, NODE, eligible, limited, whole=True)
        if r.type == SLOT and NODE not in r.agg:
            demand = {t: n for t, n in r.agg.items() if t != SLOT and n > 0}
            if demand and all(t in self.node_local for t in demand):
                return self._fits(demand, mult * count, SLOT, eligible, limited, whole=False)
            return None
        for c in r.with_:
            short = self._visit(c, mult * count, eligible, limited)
            if short is not None:
                return short
        return None

    @staticmethod
    def _fits(demand: Mapping[str, int], units: int, unit: str, eligible: tuple[NodeAmounts, ...],
              limited: bool, *, whole: bool) -> Shortfall | None:
        """``units`` slots (``whole``: nodes) each needing ``demand`` within one node."""
        if units <= 0:
            return None
        for t, n in sorted(demand.items()):
            largest = max((x.amounts.get(t, 0) for x in eligible), default=0)
            if largest < n:
                return Shortfall("node", t, n, largest, dict(demand), units, unit, limited)
        fit = 0
        for x in eligible:
            if whole:
                per = 1 if all(x.amounts.get(t, 0) >= n for t, n in demand.items()) else 0
            else:
                per = min(x.amounts.get(t, 0) // n for t, n in demand.items()) if demand else units
            fit += per
            if fit >= units:
                return None
        if fit == 0:
            return Shortfall("together", demand=dict(demand), units=units, unit=unit, eligible_only=limited)
        return Shortfall("count", have=fit, demand=dict(demand), units=units, unit=unit, eligible_only=limited)


def shape_key(js: Jobspec) -> tuple[Any, ...]:
    """A hashable key for what satisfiability depends on: the request's shape (types,
    counts, exclusivity, nesting; not labels or duration) and its constraint."""
    return (js.constraint, _shape(js.resources))


def _shape(resources: list[Resource]) -> tuple[Any, ...]:
    return tuple((r.type, r.count.min, r.count.max, r.exclusive, r.unit, _shape(r.with_)) for r in resources)


def node_cores(graph: ResourceGraph) -> dict[str, int]:
    """Cores of every node of ``graph``, by name: what ``Scheduler(node_cores=...)`` and
    ``Scheduler.set_node_cores`` take, so that parking wakes blocked jobs per node."""
    return {n.name: int(n.amounts.get("core", 0)) for n in Capacity.of(graph).nodes}
