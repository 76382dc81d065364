"""The node index: ``node[N] exclusive -> slot[k] -> {leaf requests}`` (see ``indexes.py`` for
when the matcher asks it). The walk picks the N eligible nodes with the best node score (id
order); eligible = up, no job on it, and enough leaves for k slots when empty. Kept in a
sorted list; `locality` reads the eligible nodes by runs of scores (``scoreruns.py``)."""

from __future__ import annotations

from typing import Any

from sortedcontainers import SortedList

from fluxnetes.graph.model import UP
from fluxnetes.jobspec.model import Resource
from fluxnetes.match.candidates import Allow, vertex_score
from fluxnetes.match.counts import calc_count
from fluxnetes.match.engine import Engine
from fluxnetes.match.scoreruns import ScoreRuns
from fluxnetes.match.vstate import VState


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
