"""Placements read into holdings, and holdings written out as emitted vertices.

A *holding* is what a job holds in a vertex's own planner (``VState -> amount``). Adopting a
known placement (``Matcher.update_allocate``: R/JGF or per-node amounts) reads one into
holdings and checks it is free; releasing part of a job (``Matcher.partial_cancel``) zeroes the
holdings a release names; ``write_holdings`` writes holdings into the engine (a placement
adopted, what is left after a partial release). Functions over explicit arguments: the matcher
records the result.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fluxnetes.graph.model import GraphError, ResourceGraph, Vertex
from fluxnetes.jobspec.constraints import expand_idset
from fluxnetes.match.engine import Engine
from fluxnetes.match.jobmeta import JobEntry
from fluxnetes.match.results import AllocVertex, JobRecord, MatchError, NodeShare
from fluxnetes.match.vstate import VState


def release_r(holdings: dict[VState, int], r: Mapping[str, Any]) -> None:
    g = r.get("scheduling") if "scheduling" in r else (r if "graph" in r else None)
    if isinstance(g, Mapping) and isinstance(g.get("graph"), Mapping):
        nodes = g["graph"].get("nodes") or []
        paths: set[str] = set()
        for n in nodes:
            try:
                paths.add(n["metadata"]["paths"]["containment"])
            except (KeyError, TypeError):
                raise MatchError("release JGF: every vertex needs metadata.paths.containment") from None
        for u in list(holdings):
            if u.v.path in paths:
                holdings[u] = 0
        return
    ex = r.get("execution")
    if isinstance(ex, Mapping) and isinstance(ex.get("R_lite"), list):
        ranks: set[int] = set()
        for ent in ex["R_lite"]:
            ranks.update(expand_idset(str(ent.get("rank", ""))))
        for u in list(holdings):
            if u.v.rank in ranks:
                holdings[u] = 0
        return
    raise MatchError("release: expected R with scheduling JGF, a JGF graph, or R_lite")


def release_shares(graph: ResourceGraph, rec: JobRecord, holdings: dict[VState, int],
                   shares: list[NodeShare]) -> None:
    for sh in shares:
        node = node_of_share(graph, sh)
        under = [u for u in holdings if is_under(u.v, node)]
        if not under:
            raise MatchError(f"job {rec.jobid} holds nothing on {node.name}")
        want = {"core": sh.cores, "gpu": sh.gpus, "memory": sh.memory, **sh.extra}
        if not any(want.values()):
            for u in under:
                holdings[u] = 0
            continue
        for t, amount in want.items():
            if amount <= 0:
                continue
            cands = sorted((u for u in under if u.v.type == t and holdings[u] > 0),
                           key=lambda x: -x.v.uniq_id)
            for u in cands:
                if amount <= 0:
                    break
                take = min(amount, holdings[u])
                holdings[u] -= take
                amount -= take
            if amount > 0:
                raise MatchError(f"job {rec.jobid} holds less {t} on {node.name} than asked to release")
        # inner vertices (node/socket held whole) go when nothing below them is held
        for u in sorted(under, key=lambda x: -x.v.path.count("/")):
            below = [c for c in descendants(u) if c in holdings]
            if u.children and holdings[u] > 0 and below and not any(holdings[c] for c in below):
                holdings[u] = 0


def node_of_share(graph: ResourceGraph, sh: NodeShare) -> Vertex:
    key = sh.path or sh.name
    try:
        v = graph.get(key)
    except GraphError as exc:
        raise MatchError(str(exc)) from None
    return v


def check_free(u: VState, amount: int, at: int, end: int, split_pools: bool) -> None:
    if u.avail(at, end) < amount:
        raise MatchError(f"{u.v.path}: only {u.avail(at, end)} of {u.v.size} free, cannot record {amount}")
    pool = split_pools and u.v.size > 1 and not u.children
    if not pool and u.x_busy(at, end):
        raise MatchError(f"{u.v.path}: already used by another job")


def holdings_from_shares(eng: Engine, graph: ResourceGraph, shares: list[NodeShare], at: int, end: int,
                         split_pools: bool) -> dict[VState, int]:
    holdings: dict[VState, int] = {}
    for sh in shares:
        node = node_of_share(graph, sh)
        nvs = eng.vs[node.idx]
        want = {"core": sh.cores, "gpu": sh.gpus, "memory": sh.memory, **sh.extra}
        leaves = [x for x in descendants(nvs) if not x.children]
        for t, amount in want.items():
            if amount < 0:
                raise MatchError(f"{node.name}: {t} amount must be >= 0")
            if amount == 0:
                continue
            for u in leaves:
                if amount <= 0:
                    break
                if u.v.type != t or u in holdings:
                    continue
                pool = split_pools and u.v.size > 1
                free = u.avail(at, end)
                if not pool and (u.x_busy(at, end) or free < u.v.size):
                    continue
                take = min(free, amount) if pool else u.v.size
                if take <= 0:
                    continue
                holdings[u] = take
                amount -= take
            if amount > 0:
                raise MatchError(f"{node.name}: not enough free {t} to record this placement")
    return holdings


def fitting_share(eng: Engine, graph: ResourceGraph, sh: NodeShare, at: int, end: int,
                  split_pools: bool) -> NodeShare:
    """The part of ``sh`` that is free on its node over [at, end): per resource type, what
    :func:`holdings_from_shares` could take there (whole leaves, or a pool's free amount),
    at most what ``sh`` asks. Recording it never fails for want of room."""
    node = node_of_share(graph, sh)
    want = {"core": sh.cores, "gpu": sh.gpus, "memory": sh.memory, **sh.extra}
    got = dict.fromkeys(want, 0)
    for u in descendants(eng.vs[node.idx]):
        t = u.v.type
        if u.children or got.get(t, 0) >= want.get(t, 0):
            continue
        pool = split_pools and u.v.size > 1
        free = u.avail(at, end)
        if not pool and (u.x_busy(at, end) or free < u.v.size):
            continue
        got[t] += min(free, want[t] - got[t]) if pool else u.v.size
    # (a whole leaf may overshoot the ask: take whole leaves only while the ask is not met)
    extra = {t: min(n, want[t]) for t, n in got.items() if t not in ("core", "gpu", "memory") and n > 0}
    return NodeShare(name=sh.name, path=sh.path, cores=min(got["core"], sh.cores), gpus=min(got["gpu"], sh.gpus),
                     memory=min(got["memory"], sh.memory), extra=extra)


def holdings_from_r(eng: Engine, graph: ResourceGraph, r: Mapping[str, Any], at: int, end: int,
                    split_pools: bool) -> dict[VState, int]:
    g = r.get("scheduling") if "scheduling" in r else (r if "graph" in r else None)
    holdings: dict[VState, int] = {}
    if isinstance(g, Mapping) and isinstance(g.get("graph"), Mapping):
        for n in g["graph"].get("nodes") or []:
            md = n.get("metadata") if isinstance(n, Mapping) else None
            if not isinstance(md, Mapping):
                raise MatchError("placement JGF: vertex without metadata")
            path = (md.get("paths") or {}).get("containment")
            v = graph.by_path.get(path) if isinstance(path, str) else None
            if v is None:
                raise MatchError(f"placement JGF: vertex {path!r} is not in the graph")
            if md.get("type") != v.type:
                raise MatchError(f"placement JGF: {path} has type {md.get('type')!r}, graph says {v.type!r}")
            if md.get("exclusive") is True:
                u = eng.vs[v.idx]
                amount = int(md.get("size", 1)) if split_pools and v.size > 1 else v.size
                check_free(u, amount, at, end, split_pools)
                holdings[u] = amount
        return holdings
    ex = r.get("execution")
    if isinstance(ex, Mapping) and isinstance(ex.get("R_lite"), list):
        by_rank: dict[int, list[Vertex]] = {}
        for v in graph.by_type.get("node", []):
            by_rank.setdefault(v.rank, []).append(v)
        for ent in ex["R_lite"]:
            ranks = expand_idset(str(ent.get("rank", "")))
            children = ent.get("children") or {}
            for rank in ranks:
                for node in by_rank.get(rank, []):
                    for t, ids in children.items():
                        idl = set(expand_idset(str(ids)))
                        for u in descendants(eng.vs[node.idx]):
                            if u.v.type == t and u.v.id in idl:
                                check_free(u, u.v.size, at, end, split_pools)
                                holdings[u] = u.v.size
        return holdings
    raise MatchError("placement: expected R with scheduling JGF, a JGF graph, or R_lite")


def write_holdings(eng: Engine, rec: JobRecord, holdings: dict[VState, int],
                   split_pools: bool) -> list[JobEntry]:
    """Write a job's state from exclusive holdings into the engine (own planners, tags,
    filters); returns its entries (the matcher records them)."""
    jid, at, end = rec.jobid, rec.at, rec.at + rec.duration
    counted: dict[VState, dict[str, int]] = {}
    tagged: set[VState] = set()
    for u, amount in holdings.items():
        t = u.v.type
        cnt = amount if (split_pools and u.v.size > 1 and not u.children) else u.v.size
        p = u.parent
        x: VState | None = u
        while x is not None:
            tagged.add(x)
            x = x.parent
        while p is not None:
            if eng.is_pruning_type(t):
                d = counted.setdefault(p, {})
                d[t] = d.get(t, 0) + cnt
            p = p.parent
    entries: list[JobEntry] = []
    for u in tagged:
        amount = holdings.get(u, 0)
        if amount:
            eng._add_plan(u, jid, at, end, amount, rec.reserved)
        if u.children or not amount:  # leaves: their planner spans are the tags
            u.tag(jid, at, end)
        fc = None
        cnts = counted.get(u)
        if u.ftypes and cnts:
            fc = tuple(cnts.get(t, 0) for t in u.ftypes)
            u.f_add(jid, at, end, fc)
        entries.append(JobEntry(u, amount if amount else (u.v.size if u.parent is not None else 1),
                                amount > 0, fc))
    return entries


def descendants(u: VState) -> list[VState]:
    out: list[VState] = []
    stack = list(u.children)
    while stack:
        x = stack.pop()
        out.append(x)
        stack.extend(x.children)
    return out


def is_under(v: Vertex, top: Vertex) -> bool:
    x: Vertex | None = v
    while x is not None:
        if x is top:
            return True
        x = x.parent
    return False


def postorder(eng: Engine, tagged: list[VState], holdings: dict[VState, int]) -> list[AllocVertex]:
    """Emitted vertices as Fluxion's update pass emits them: post-order, child order."""
    pos = eng.preorder()
    order = sorted(tagged, key=lambda u: pos[id(u)])
    out: list[AllocVertex] = []
    stack: list[VState] = []

    def emit(u: VState) -> None:
        v = u.v
        p = v.parent
        held = holdings.get(u, 0)
        needs = held if held else (v.size if p is not None else 1)
        out.append(AllocVertex(v.uniq_id, v.path, v.type, v.basename, v.name, v.id, v.rank, v.unit,
                               v.properties, held > 0, needs, p.uniq_id if p is not None else -1))

    for u in order:
        while stack and not is_anc(stack[-1], u):
            emit(stack.pop())
        stack.append(u)
    while stack:
        emit(stack.pop())
    return out


def is_anc(a: VState, u: VState) -> bool:
    p = u.parent
    while p is not None:
        if p is a:
            return True
        p = p.parent
    return False
