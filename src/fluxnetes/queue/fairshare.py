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


def _level_sums(tree: AccountTree) -> dict[str, int]:
    return {name: sum(tree.nodes[c].shares for c in kids) for name, kids in tree.children.items()}


def _base(tree: AccountTree, usage: Mapping[str, float]) -> dict[str, tuple[float, float, float, float, float]]:
    """Per node: (shares_level, shares_norm, usage_raw, usage_norm, level usage share)."""
    sums = _level_sums(tree)
    total = float(usage.get(ROOT, 0.0))
    out: dict[str, tuple[float, float, float, float, float]] = {ROOT: (1.0, 1.0, total, 1.0 if total > 0 else 0.0, 1.0)}
    for name in tree.order[1:]:
        node = tree.nodes[name]
        parent = node.parent
        assert parent is not None
        s_level = node.shares / sums[parent]
        s_norm = out[parent][1] * s_level
        raw = max(float(usage.get(name, 0.0)), 0.0)
        parent_raw = max(float(usage.get(parent, 0.0)), 0.0)
        out[name] = (s_level, s_norm, raw, raw / total if total > 0 else 0.0,
                     raw / parent_raw if parent_raw > 0 else 0.0)
    return out


def _lf(s_level: float, u_level: float) -> float:
    return math.inf if u_level <= 0 else s_level / u_level


def classic(tree: AccountTree, usage: Mapping[str, float], dampening: float = 1.0) -> dict[str, ShareRow]:
    """Slurm's classic fair-share factor for every node (see the module docstring)."""
    if not (dampening > 0 and math.isfinite(dampening)):
        raise ValueError(f"dampening: must be a number > 0, got {dampening!r}")
    base = _base(tree, usage)
    effective: dict[str, float] = {ROOT: base[ROOT][3]}
    rows: dict[str, ShareRow] = {}
    for name in tree.order:
        s_level, s_norm, raw, u_norm, u_level = base[name]
        node = tree.nodes[name]
        if node.parent is None or node.parent == ROOT:
            u_e = u_norm
        else:
            u_e = u_norm + (effective[node.parent] - u_norm) * s_level
        effective[name] = u_e
        rows[name] = ShareRow(name, node.parent, tree.is_leaf(name), node.shares, s_level, s_norm,
                              raw, u_norm, u_e, _lf(s_level, u_level),
                              2.0 ** (-u_e / s_norm / dampening))
    return rows


def _same(a: float, b: float) -> bool:
    if a == b:
        return True
    if math.isinf(a) or math.isinf(b):
        return False
    return abs(a - b) <= TIE_TOLERANCE * max(abs(a), abs(b))


def fair_tree(tree: AccountTree, usage: Mapping[str, float]) -> dict[str, ShareRow]:
    """Fair Tree's rank-based factor for every leaf (see the module docstring)."""
    base = _base(tree, usage)
    level_fs = {name: _lf(b[0], b[4]) for name, b in base.items()}
    position = {name: i for i, name in enumerate(tree.order)}
    n_users = len(tree.leaves)
    factor: dict[str, float] = {}
    rank = n_users
    rnt = n_users  # the rank if there were no ties

    def visit(siblings: list[str], tied_in: bool) -> None:
        nonlocal rank, rnt
        # highest LF first; users before accounts on (exact) ties; then tree order
        ordered = sorted(siblings, key=lambda n: (-level_fs[n], not tree.is_leaf(n), position[n]))
        prev: float | None = None
        i = 0
        while i < len(ordered):
            name = ordered[i]
            lf = level_fs[name]
            tied = tied_in if i == 0 else (prev is not None and _same(prev, lf))
            if tree.is_leaf(name):
                if not tied:
                    rank = rnt
                factor[name] = rank / n_users
                rnt -= 1
                i += 1
            else:
                group = [name]
                while (i + len(group) < len(ordered) and not tree.is_leaf(ordered[i + len(group)])
                       and _same(lf, level_fs[ordered[i + len(group)]])):
                    group.append(ordered[i + len(group)])
                merged = [child for acct in group for child in tree.children[acct]]
                visit(merged, tied)
                i += len(group)
            prev = lf

    # users tied with the first sibling at the top (i == 0) are handled via prev; at the
    # very top nothing is tied yet
    visit(list(tree.children[ROOT]), False)
    rows: dict[str, ShareRow] = {}
    for name in reversed(tree.order):  # children first, so accounts can take their best leaf
        s_level, s_norm, raw, u_norm, u_level = base[name]
        node = tree.nodes[name]
        if tree.is_leaf(name):
            f = factor[name]
        else:
            f = max((rows[c].factor for c in tree.children[name]), default=0.0)
        rows[name] = ShareRow(name, node.parent, tree.is_leaf(name), node.shares, s_level, s_norm,
                              raw, u_norm, u_level, level_fs[name], f)
    return {name: rows[name] for name in tree.order}


def factors(algorithm: Algorithm, tree: AccountTree, usage: Mapping[str, float],
            dampening: float = 1.0) -> dict[str, ShareRow]:
    """The rows under the selected algorithm."""
    if algorithm == "classic":
        return classic(tree, usage, dampening)
    if algorithm == "fair_tree":
        return fair_tree(tree, usage)
    raise ValueError(f"fairshare algorithm: must be one of {', '.join(ALGORITHMS)}, got {algorithm!r}")
