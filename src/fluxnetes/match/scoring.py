"""Candidate evaluation and scoring of the DFU traverser (Fluxion's scoring_api_t and
eval_egroup_t): candidate groups merged up the tree in visit order, best-k selection with
``std::sort`` tie order (:mod:`.stdsort`) or stable discovery order, and the scores of the
``locality`` (runs of consecutive scores) and ``variation`` (``perf_class``) policies.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fluxnetes.graph.model import Vertex
from fluxnetes.match.stdsort import introsort

if TYPE_CHECKING:
    from fluxnetes.match.vstate import VState


class EG:
    """Candidate edge group (Fluxion eval_egroup_t)."""

    __slots__ = ("count", "edges", "excl", "root", "score")

    def __init__(self, score: int, count: int, excl: bool, edges: list[tuple[int, int, bool, VState | None]],
                 root: bool = False) -> None:
        self.score = score
        self.count = count
        self.excl = excl
        self.edges = edges
        self.root = root


class Evals:
    __slots__ = ("best_i", "best_k", "groups", "qual", "total")

    def __init__(self) -> None:
        self.groups: list[EG] = []
        self.qual = 0
        self.total = 0
        self.best_k = 0
        self.best_i = 0

    def add(self, eg: EG) -> None:
        self.total += eg.count
        if eg.score > 0:
            self.qual += eg.count
        self.groups.append(eg)


class Dfu:
    """Per-vertex scoring scratch (Fluxion scoring_api_t) for one subsystem."""

    __slots__ = ("avail", "hier", "m", "score")

    def __init__(self) -> None:
        self.m: dict[str, Evals] = {}
        self.hier = False
        self.score = -1
        self.avail = 0

    def add(self, t: str, eg: EG) -> None:
        ev = self.m.get(t)
        if ev is None:
            ev = self.m[t] = Evals()
        ev.add(eg)

    def qual(self, t: str) -> int:
        ev = self.m.get(t)
        return ev.qual if ev is not None else 0

    def total(self, t: str) -> int:
        ev = self.m.get(t)
        return ev.total if ev is not None else 0

    def merge(self, o: Dfu) -> None:
        m = self.m
        for t, ev in o.m.items():
            mine = m.get(t)
            if mine is None:
                m[t] = ev  # the child's scratch is discarded after merging: take it over
            else:
                mine.groups.extend(ev.groups)
                mine.qual += ev.qual
                mine.total += ev.total

    def choose_best_k(self, t: str, k: int, high: bool, exact: bool,
                      runs: dict[int, int] | None = None) -> bool:
        """Select the best ``k`` candidates of type ``t`` (sorted by score, descending when
        ``high``); with ``runs`` (locality at the root) by the run holding each score instead."""
        ev = self.m.get(t)
        if ev is None:
            ev = self.m[t] = Evals()
        if k == 0 or k > ev.qual:
            return False
        if runs is None:
            sort_groups(ev.groups, high, exact)
        else:
            sort_by_keys(ev.groups, [-runs[g.score] for g in ev.groups], exact)
        i = 0
        left = k
        groups = ev.groups
        while left > 0:
            left -= groups[i].count
            i += 1
        ev.best_k = k
        ev.best_i = i
        self.hier = True
        return True


def sort_groups(groups: list[EG], high: bool, exact: bool) -> None:
    """Order candidates best-first. ``exact``: equal scores end up where libstdc++'s
    std::sort leaves them (Fluxion's answers); otherwise a stable sort keeps discovery
    (depth-first) order among equals - fluxnetes' default, see match/README.md."""
    n = len(groups)
    if n < 2:
        return
    keys = [-g.score for g in groups] if high else [g.score for g in groups]
    if not exact or len(set(keys)) == n:
        order = sorted(range(n), key=keys.__getitem__)
        groups[:] = [groups[i] for i in order]
        return
    introsort(keys, groups)


def sort_by_keys(groups: list[EG], keys: list[int], exact: bool) -> None:
    """Order candidates by ascending ``keys`` (ties as in :func:`sort_groups`)."""
    n = len(groups)
    if n < 2:
        return
    if not exact or len(set(keys)) == n:
        order = sorted(range(n), key=keys.__getitem__)
        groups[:] = [groups[i] for i in order]
        return
    introsort(keys, groups)


def score_runs(scores: set[int]) -> dict[int, int]:
    """Score -> first score of its run of consecutive integers (Fluxion's locality policy puts
    the candidate scores in an interval set, which joins adjacent integers into one interval,
    and compares candidates by the interval holding their score)."""
    out: dict[int, int] = {}
    start = prev = 0
    for i, s in enumerate(sorted(scores)):
        if i == 0 or s != prev + 1:
            start = s
        out[s] = start
        prev = s
    return out


def perf_class(v: Vertex) -> int:
    """The vertex's ``perf_class`` property as Fluxion's variation policy reads it: an integer
    prefix as ``std::stoi`` parses it; missing, unparsable, out of int range, < 0 or > 9999 all
    mean 9999 (the worst class)."""
    props = v.properties
    if not props:
        return 9999
    raw = props.get("perf_class")
    if raw is None:
        return 9999
    text = str(raw).lstrip(" \t\n\v\f\r")
    i = 0
    if text[:1] in ("+", "-"):
        i = 1
    j = i
    while j < len(text) and "0" <= text[j] <= "9":
        j += 1
    if j == i:
        return 9999
    val = int(text[:j])  # (beyond int range std::stoi throws: 9999 as well)
    return val if 0 <= val <= 9999 else 9999
