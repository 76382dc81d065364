"""Per-vertex scheduling state of the DFU traverser (:class:`VState`) and the helpers that
keep a vertex's ``room`` list (its children with a free core, for ``first``-style walks)
current.

Time: every span is a half-open interval [start, end); all availability over time is
:mod:`fluxnetes.plan`'s: span tables for each vertex's own planner and x_checker, a
PlannerMulti per inner vertex for its pruning filter (aggregate counts of ``core`` and
``node`` per subtree plus leaf types at the cluster). The ``first`` policy's dynamic child
order (availability-weighted ``by_outedges``) is kept here too; the walk that reads and
updates all of it is :mod:`.engine`.
"""

from __future__ import annotations

from bisect import bisect_left
from typing import Any

from fluxnetes.graph.model import Vertex
from fluxnetes.plan import PlannerMulti, table_free, table_overlaps

MAXW = (1 << 64) - 1  # initial by_outedges weight

_EMPTY_LIST: list[Any] = []  # shared by leaves; never mutated (replaced when a child is added)
_EMPTY_DICT: dict[str, int] = {}


class VState:
    """Scheduling state of one vertex (and of the containment edge from its parent).

    Time is :mod:`fluxnetes.plan`'s, created on first use: ``ps`` the vertex's own planner
    as a bare span table (job id -> (start, end, amount); total = its size, ``pused`` its
    sum), ``xs`` its x_checker (a bare span table too: job id -> (start, end, 1) for every
    job using something at or under the vertex; leaves use ``ps`` for that), ``f`` its
    pruning filter (a PlannerMulti over ``ftypes`` with totals ``ftot``,
    the subtree's capacity; key = job id).
    """

    __slots__ = (
        "alloc_n",
        "children",
        "f",
        "fidx",
        "ftot",
        "ftypes",
        "inroom",
        "mexcl",
        "mneeds",
        "mseq",
        "okeys",
        "order",
        "parent",
        "pos",
        "ps",
        "pused",
        "rkeys",
        "room",
        "v",
        "weight",
        "xs",
    )

    def __init__(self, v: Vertex, parent: VState | None) -> None:
        self.v = v
        self.parent = parent
        self.pos = 0  # index in parent.children (set by Engine.prime)
        # leaves share immutable empties (most vertices are leaves; keeps memory and GC low)
        self.children: list[VState] = _EMPTY_LIST
        self.ps: dict[int, tuple[int, int, int]] | None = None
        self.pused = 0
        self.alloc_n = 0  # how many of ps are allocations (not reservations)
        self.xs: dict[int, tuple[int, int, int]] | None = None
        # pruning filter (subtree aggregate) ; empty for leaves
        self.ftypes: tuple[str, ...] = ()
        self.fidx: dict[str, int] = _EMPTY_DICT
        self.ftot: list[int] = _EMPTY_LIST
        self.f: PlannerMulti | None = None
        # parent-edge data
        self.weight = MAXW
        self.mseq = 0
        self.mneeds = 0
        self.mexcl = False
        # dynamic ("first") child order: keys (-weight, -uniq_id)
        self.order: list[VState] = _EMPTY_LIST
        self.okeys: list[tuple[int, int]] = _EMPTY_LIST
        # the children of ``order`` that have a core no recorded span holds (``room``), with
        # their keys; ``inroom``: this vertex is in its parent's ``room`` (first-style only)
        self.room: list[VState] = _EMPTY_LIST
        self.rkeys: list[tuple[int, int]] = _EMPTY_LIST
        self.inroom = False

    # views (tests, invariants) ------------------------------------------------------------
    @property
    def fspans(self) -> PlannerMulti | None:
        """The filter's spans: job id -> (start, end, counts aligned with ftypes)."""
        return self.f

    @property
    def fused(self) -> list[int]:
        f = self.f
        return f.used() if f is not None else [0] * len(self.ftypes)

    # own planner ----------------------------------------------------------------------
    def avail(self, at: int, end: int) -> int:
        ps = self.ps
        if not ps:
            return self.v.size
        return table_free(ps, self.v.size, self.pused, at, end)

    def hold(self, jobid: int, at: int, end: int, amount: int) -> None:
        """Record ``amount`` of this vertex for the job over [at, end)."""
        ps = self.ps
        if ps is None:
            self.ps = {jobid: (at, end, amount)}
        else:
            ps[jobid] = (at, end, amount)
        self.pused += amount

    def tag(self, jobid: int, at: int, end: int) -> None:
        """x_checker: the job uses something at or under this vertex over [at, end)."""
        xs = self.xs
        if xs is None:
            self.xs = {jobid: (at, end, 1)}
        else:
            xs[jobid] = (at, end, 1)

    def x_busy(self, at: int, end: int) -> bool:
        """Any job on this vertex during [at, end)? (leaves: their planner spans are the tags)"""
        xs = self.xs
        if xs and table_overlaps(xs, at, end):
            return True
        ps = self.ps
        if not ps or self.children:
            return False
        return table_overlaps(ps, at, end)

    # filter -------------------------------------------------------------------------------
    # (inner vertices only: every inner vertex has its ``f`` from prime() on)
    def f_avail(self, i: int, at: int, end: int) -> int:
        assert self.f is not None
        return self.f.free(i, at, end)

    def f_add(self, jobid: int, at: int, end: int, counts: tuple[int, ...]) -> None:
        assert self.f is not None
        self.f.put(jobid, at, end, counts)
        if self.parent is not None and self.parent.order:
            _reroom(self)



def _has_room(c: VState) -> bool:
    """Has ``c`` a core that no recorded span holds (True if it counts no cores)?"""
    f = c.f
    if f is None:
        return True
    i = c.fidx.get("core")
    return i is None or f.unheld(i) > 0


def _unlist(room: list[VState], rkeys: list[tuple[int, int]], c: VState, key: tuple[int, int]) -> None:
    j = bisect_left(rkeys, key)
    if j < len(rkeys) and room[j] is c:
        del rkeys[j]
        del room[j]
    else:  # pragma: no cover - defensive: keys are unique (uniq_id)
        k = room.index(c)
        del rkeys[k]
        del room[k]


def _reroom(c: VState) -> None:
    """``c``'s filter changed: keep its membership in its parent's ``room`` current."""
    p = c.parent
    if p is None:
        return
    want = _has_room(c)
    if want == c.inroom:
        return
    key = (-c.weight, -c.v.uniq_id)
    if want:
        j = bisect_left(p.rkeys, key)
        if p.room is _EMPTY_LIST:
            p.room, p.rkeys = [], []
        p.rkeys.insert(j, key)
        p.room.insert(j, c)
    else:
        _unlist(p.room, p.rkeys, c, key)
    c.inroom = want


def _order_key(c: VState) -> tuple[int, int]:
    return (-c.weight, -c.v.uniq_id)
