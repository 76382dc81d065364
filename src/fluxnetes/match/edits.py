"""Graph edits and what the engine must follow of them: node status, vertex properties, and
subtrees attached or removed (the engine's vertex state built or dropped, then primed again).
The matcher calls these and then drops what they make stale (its indexes, satisfiability
answers, the capacity summary) and settles the jobs a removal touches."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fluxnetes.graph.jgf import read_jgf, write_jgf
from fluxnetes.graph.model import DOWN, UP, GraphError, ResourceGraph, Vertex
from fluxnetes.match.engine import Engine
from fluxnetes.match.results import MatchError
from fluxnetes.match.vstate import VState


def set_vertex_status(graph: ResourceGraph, eng: Engine, path_or_name: str, up: bool) -> None:
    try:
        v = graph.get(path_or_name)
    except GraphError as exc:
        raise MatchError(str(exc)) from None
    v.status = UP if up else DOWN
    eng.nodes_up = sum(1 for n in graph.by_type.get("node", []) if n.status == UP)


def set_vertex_property(graph: ResourceGraph, path_or_name: str, key: str, value: str) -> None:
    if not key or "=" in key:
        raise MatchError(f"set-property: property name {key!r} must be non-empty and without '='")
    try:
        v = graph.get(path_or_name)
    except GraphError as exc:
        raise MatchError(str(exc)) from None
    # a new dict: results already returned keep the properties they were emitted with
    v.properties = {**(v.properties or {}), key: str(value)}


def attach_subgraph(graph: ResourceGraph, eng: Engine,
                    jgf_or_graph: Mapping[str, Any] | str | ResourceGraph) -> list[str]:
    """Read vertices into ``graph`` and build their engine state; returns the new paths."""
    before = set(graph.by_path)
    src = write_jgf(jgf_or_graph) if isinstance(jgf_or_graph, ResourceGraph) else jgf_or_graph
    try:
        read_jgf(src if isinstance(src, str | bytes) else dict(src), graph=graph)
    except GraphError as exc:
        raise MatchError(f"add_subgraph: {exc}") from None
    new = [p for p in graph.by_path if p not in before]
    fresh_ranks(graph, new)
    tops = [graph.by_path[p] for p in new if graph.by_path[p].parent is not None
            and graph.by_path[p].parent.path not in new]  # type: ignore[union-attr]
    for v in tops:
        assert v.parent is not None
        pvs = eng.vs[v.parent.idx]
        cvs = eng._build(v, pvs)
        pvs.children = [*pvs.children, cvs]
    eng.prime()
    return new


def fresh_ranks(graph: ResourceGraph, new_paths: list[str]) -> None:
    """New nodes whose rank another node already has get the next free rank (their
    subtree follows), so R_lite stays unambiguous after growing."""
    g = graph
    newset = set(new_paths)
    used = {v.rank for v in g.by_type.get("node", []) if v.path not in newset}
    nxt = max(used | {-1}) + 1
    for p in new_paths:
        v = g.by_path[p]
        if v.type != "node" or v.rank < 0 or v.rank not in used:
            if v.type == "node":
                used.add(v.rank)
            continue
        old = v.rank
        for x in g.walk(v):
            if x.rank == old:
                x.rank = nxt
        used.add(nxt)
        nxt += 1


def detach_subtree(graph: ResourceGraph, eng: Engine, v: Vertex, top: VState,
                   gone: set[VState]) -> None:
    """Drop the subtree at ``v`` (engine state ``top``, ``gone`` = it and every vertex below)."""
    pvs = top.parent
    assert pvs is not None
    pvs.children = [c for c in pvs.children if c is not top]
    for u in gone:
        eng.vs.pop(u.v.idx, None)
    graph.remove_subtree(v)
    eng.prime()
