"""Why a request failed, in words: the short resource (UNSATISFIABLE: more than the graph
has; BUSY: more than is free now), or the shape when the totals would do."""

from __future__ import annotations

from fluxnetes.graph.model import UP, ResourceGraph, Vertex
from fluxnetes.jobspec.model import Jobspec
from fluxnetes.match.engine import Engine


def type_capacity(graph: ResourceGraph, t: str, *, up_only: bool) -> int:
    vs = graph.by_type.get(t, [])
    if not up_only:
        return sum(v.size for v in vs)
    return sum(v.size for v in vs if is_up(v))


def is_up(v: Vertex) -> bool:
    x: Vertex | None = v
    while x is not None:
        if x.status != UP:
            return False
        x = x.parent
    return True


def unsat_reason(graph: ResourceGraph, js: Jobspec) -> str:
    for t, n in js.totals.items():
        if t == "slot":
            continue
        cap = type_capacity(graph, t, up_only=False)
        if n > cap:
            return f"needs {n} {t}, only {cap} exist in this graph"
    from fluxnetes.queue.satisfy import Capacity  # the short resource, by the count questions

    short = Capacity.of(graph).check(js)
    if short is not None:
        return short.text()
    return "no part of this graph has the requested shape (per-node/per-slot counts, exclusivity or constraints)"


def busy_reason(graph: ResourceGraph, eng: Engine, js: Jobspec, now: int) -> str:
    r = eng.root
    for t, n in js.totals.items():
        if t == "slot":
            continue
        if t in r.fidx:
            free = r.f_avail(r.fidx[t], now, now + 1)
        else:
            free = type_capacity(graph, t, up_only=True)
        if n > free:
            return f"needs {n} {t}, {free} free now"
    down = graph.count("node") - eng.nodes_up
    extra = f" ({down} node(s) down)" if down else ""
    return f"resources are free in total but not in the requested shape/place now{extra}"

