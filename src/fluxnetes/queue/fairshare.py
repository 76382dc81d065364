"""Fair-share factors over an account tree: Slurm's classic formula and Fair Tree.

Pure functions of the tree and each node's decayed usage (``usage.Usage.totals(now)``):
one pass over the tree (plus a sort of each node's children for Fair Tree), never over
the jobs or the usage history. Both return a ``ShareRow`` per node; a leaf's ``factor``
is its fair-share factor in [0, 1] (higher = more deserving).

* ``classic`` — Slurm's classic algorithm (``PriorityFlags=NO_FAIR_TREE``), as published in
  https://slurm.schedmd.com/priority_multifactor.html "Fair-share Factor" and
  https://slurm.schedmd.com/classic_fair_share.html:

  - normalized shares ``S = prod over the path (S_node / S_node+siblings)``;
  - normalized usage ``U = U_H / R_H`` (decayed usage over the cluster's decayed total);
  - effective usage, top-down: accounts just under the root ``U_E = U``, below
    ``U_E = U + (U_E,parent - U) * S_raw / S_raw,all_siblings``;
  - factor ``F = 2 ** (-U_E / S / d)`` (``d``: FairShareDampeningFactor, default 1).

* ``fair_tree`` — Fair Tree (Slurm's default since 19.05), as published in
  https://slurm.schedmd.com/fair_tree.html:

  - level fairshare among siblings ``LF = S / U`` with ``S = S_raw,self / S_raw,self+siblings``
    and ``U = U_raw,self / U_raw,parent`` (no usage: LF = infinity);
  - children sorted by LF, highest first, and visited depth-first; each user (leaf) found
    gets ``rank / user_count``, rank counting down from user_count (the top user gets 1.0);
  - ties: sibling users with equal LF share a rank; a user tied with a sibling account
    shares the rank of that account's first user (users sort before accounts on ties);
    tied sibling accounts have their children merged before descending. As in Slurm's
    implementation, a tie does not consume the ranks: after a 3-way tie at rank r the
    next user gets r - 3.

Deviation: LF values equal to within a relative 1e-9 count as tied (the doc's "ties are
allowed"; rationally equal values must not be split by float rounding). A childless
account is a leaf here (jobs may charge it directly) and is ranked like a user.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from fluxnetes.queue.accounts import ROOT, AccountTree

Algorithm = Literal["fair_tree", "classic"]
ALGORITHMS: tuple[Algorithm, ...] = ("fair_tree", "classic")
TIE_TOLERANCE = 1e-9


@dataclass(frozen=True)
class ShareRow:
    """One node's fair-share figures (what ``sshare -l`` shows)."""

    name: str
    parent: str | None
    leaf: bool
    shares_raw: int
    shares_level: float  # S among siblings
    shares_norm: float  # S of the whole machine (product along the path)
    usage_raw: float  # decayed resource-seconds, descendants included
    usage_norm: float  # usage_raw / the root's usage_raw
    usage_effective: float  # classic: U_E; fair_tree: usage_raw / parent's usage_raw
    level_fs: float  # S_level / U_level (inf: no usage)
    factor: float  # leaves: the fair-share factor; accounts: classic F / best leaf (Fair Tree)


class _Shape:
    """What the factors need of a tree that never changes with usage (computed once per
    tree, so a cycle does not redo it): each node's S among siblings and of the machine."""

    def __init__(self, tree: AccountTree) -> None:
        sums = {name: sum(tree.nodes[c].shares for c in kids) for name, kids in tree.children.items()}
        self.level: dict[str, float] = {ROOT: 1.0}
        self.norm: dict[str, float] = {ROOT: 1.0}
        self.edges: list[tuple[str, str]] = []  # (name, parent), parents first
        for name in tree.order[1:]:
            parent = tree.nodes[name].parent
            assert parent is not None
            self.level[name] = tree.nodes[name].shares / sums[parent]
            self.norm[name] = self.norm[parent] * self.level[name]
            self.edges.append((name, parent))
        self.leaf = frozenset(name for name in tree.order[1:] if not tree.children[name])
        self.position = {name: i for i, name in enumerate(tree.order)}
        # Fair Tree's tie order among siblings: users (leaves) before accounts, then tree
        # order, as one integer; children lists pre-sorted by it (a stable sort by level
        # fairshare then keeps it for equal values)
        n = len(tree.order)
        self.tie_rank = {name: i + (0 if name in self.leaf else n) for name, i in self.position.items()}
        self.kids = {name: sorted(kids, key=self.tie_rank.__getitem__) for name, kids in tree.children.items()}


_SHAPES: weakref.WeakKeyDictionary[AccountTree, _Shape] = weakref.WeakKeyDictionary()


def _shape(tree: AccountTree) -> _Shape:
    found = _SHAPES.get(tree)
    if found is None:
        found = _SHAPES[tree] = _Shape(tree)
    return found


def _levels(shape: _Shape, usage: Mapping[str, float]) -> tuple[float, dict[str, float], dict[str, float]]:
    """The root's usage, each node's usage (clamped at 0) and its level usage share
    (usage / the parent's usage; 0 when the parent has none)."""
    get = usage.get
    total = float(get(ROOT, 0.0))
    raw: dict[str, float] = {ROOT: total}
    level: dict[str, float] = {ROOT: 1.0}
    for name, parent in shape.edges:
        r = float(get(name, 0.0))
        if r < 0.0:
            r = 0.0
        raw[name] = r
        p = raw[parent]
        level[name] = r / p if p > 0 else 0.0
    return total, raw, level


def _lf(s_level: float, u_level: float) -> float:
    return math.inf if u_level <= 0 else s_level / u_level


def _classic_effective(shape: _Shape, total: float, raw: Mapping[str, float]) -> dict[str, float]:
    """U_E per node (top-down: parents before children)."""
    effective: dict[str, float] = {ROOT: 1.0 if total > 0 else 0.0}
    level = shape.level
    for name, parent in shape.edges:
        u_norm = raw[name] / total if total > 0 else 0.0
        if parent == ROOT:
            effective[name] = u_norm
        else:
            effective[name] = u_norm + (effective[parent] - u_norm) * level[name]
    return effective


def classic(tree: AccountTree, usage: Mapping[str, float], dampening: float = 1.0) -> dict[str, ShareRow]:
    """Slurm's classic fair-share factor for every node (see the module docstring)."""
    if not (dampening > 0 and math.isfinite(dampening)):
        raise ValueError(f"dampening: must be a number > 0, got {dampening!r}")
    shape = _shape(tree)
    total, raw, level = _levels(shape, usage)
    effective = _classic_effective(shape, total, raw)
    rows: dict[str, ShareRow] = {}
    for name in tree.order:
        node = tree.nodes[name]
        s_norm = shape.norm[name]
        u_norm = (1.0 if total > 0 else 0.0) if name == ROOT else (raw[name] / total if total > 0 else 0.0)
        rows[name] = ShareRow(name, node.parent, name in shape.leaf, node.shares, shape.level[name],
                              s_norm, raw[name], u_norm, effective[name],
                              _lf(shape.level[name], level[name]),
                              2.0 ** (-effective[name] / s_norm / dampening))
    return rows


def _same(a: float, b: float) -> bool:
    if a == b:
        return True
    if math.isinf(a) or math.isinf(b):
        return False
    return abs(a - b) <= TIE_TOLERANCE * max(abs(a), abs(b))


def _fair_tree_ranks(tree: AccountTree, shape: _Shape, level: Mapping[str, float]) -> tuple[dict[str, float], dict[str, float]]:
    """Each leaf's Fair Tree factor, and each node's level fairshare."""
    s_level = shape.level
    level_fs = {name: (math.inf if u <= 0 else s_level[name] / u) for name, u in level.items()}
    leaf = shape.leaf
    children = tree.children
    kids = shape.kids
    n_users = len(tree.leaves)
    inf = math.inf
    factor: dict[str, float] = {}
    rank = n_users
    rnt = n_users  # the rank if there were no ties

    by_lf = level_fs.__getitem__
    by_tie = shape.tie_rank.__getitem__

    def visit(siblings: list[str], tied_in: bool) -> None:
        nonlocal rank, rnt
        # highest LF first; users before accounts on (exact) ties; then tree order. The
        # siblings come in tie order and the sort is stable (reverse=True keeps stability)
        ordered = sorted(siblings, key=by_lf, reverse=True)
        prev: float | None = None
        i = 0
        count = len(ordered)
        while i < count:
            name = ordered[i]
            lf = level_fs[name]
            # _same(prev, lf) inlined (this loop runs over every leaf every cycle)
            tied = tied_in if i == 0 else (prev is not None and (
                prev == lf or (prev != inf and lf != inf
                               and abs(prev - lf) <= TIE_TOLERANCE * (prev if prev > lf else lf))))
            if name in leaf:
                if not tied:
                    rank = rnt
                factor[name] = rank / n_users
                rnt -= 1
                i += 1
            else:
                group = [name]
                while (i + len(group) < count and ordered[i + len(group)] not in leaf
                       and _same(lf, level_fs[ordered[i + len(group)]])):
                    group.append(ordered[i + len(group)])
                merged = (list(kids[name]) if len(group) == 1 else
                          sorted((child for acct in group for child in children[acct]), key=by_tie))
                visit(merged, tied)
                i += len(group)
            prev = lf

    # users tied with the first sibling at the top (i == 0) are handled via prev; at the
    # very top nothing is tied yet
    visit(kids[ROOT], False)
    return factor, level_fs


def fair_tree(tree: AccountTree, usage: Mapping[str, float]) -> dict[str, ShareRow]:
    """Fair Tree's rank-based factor for every leaf (see the module docstring)."""
    shape = _shape(tree)
    total, raw, level = _levels(shape, usage)
    factor, level_fs = _fair_tree_ranks(tree, shape, level)
    rows: dict[str, ShareRow] = {}
    for name in reversed(tree.order):  # children first, so accounts can take their best leaf
        node = tree.nodes[name]
        if name in shape.leaf:
            f = factor[name]
        else:
            f = max((rows[c].factor for c in tree.children[name]), default=0.0)
        u_norm = (1.0 if total > 0 else 0.0) if name == ROOT else (raw[name] / total if total > 0 else 0.0)
        rows[name] = ShareRow(name, node.parent, name in shape.leaf, node.shares, shape.level[name],
                              shape.norm[name], raw[name], u_norm, level[name], level_fs[name], f)
    return {name: rows[name] for name in tree.order}


def leaf_factors(algorithm: Algorithm, tree: AccountTree, usage: Mapping[str, float],
                 dampening: float = 1.0) -> dict[str, float]:
    """Only the leaves' factors (what the queue order needs): the same numbers as
    ``factors(...)[leaf].factor``, without building the rows."""
    shape = _shape(tree)
    total, raw, level = _levels(shape, usage)
    if algorithm == "fair_tree":
        return _fair_tree_ranks(tree, shape, level)[0]
    if algorithm == "classic":
        if not (dampening > 0 and math.isfinite(dampening)):
            raise ValueError(f"dampening: must be a number > 0, got {dampening!r}")
        effective = _classic_effective(shape, total, raw)
        norm = shape.norm
        return {name: 2.0 ** (-effective[name] / norm[name] / dampening) for name in tree.leaves}
    raise ValueError(f"fairshare algorithm: must be one of {', '.join(ALGORITHMS)}, got {algorithm!r}")


def factors(algorithm: Algorithm, tree: AccountTree, usage: Mapping[str, float],
            dampening: float = 1.0) -> dict[str, ShareRow]:
    """The rows under the selected algorithm."""
    if algorithm == "classic":
        return classic(tree, usage, dampening)
    if algorithm == "fair_tree":
        return fair_tree(tree, usage)
    raise ValueError(f"fairshare algorithm: must be one of {', '.join(ALGORITHMS)}, got {algorithm!r}")
