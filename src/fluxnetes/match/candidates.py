"""What the slot and node indexes share with the walk: a candidate vertex's score as the
walk computes it, and the node vertex a jobspec constraint is tested on."""

from __future__ import annotations

from typing import Any

from fluxnetes.graph.model import Vertex
from fluxnetes.match.engine import Engine
from fluxnetes.match.scoring import perf_class
from fluxnetes.match.vstate import VState

Allow = Any  # a jobspec Constraint (``.match(vertex) -> bool``) or None: every node


def vertex_score(eng: Engine, v: Vertex, ml: int) -> int:
    """The walk's score of candidate vertex ``v`` (dom_dfv / _leaf): 1 + perf_class under
    `variation`, else 1 + node factor + id + 1."""
    return 1 + perf_class(v) if eng.perf else 1 + ml + v.id + 1



def node_of(u: VState) -> Any:
    """The node (or storage_node) vertex at or above ``u``, where the walk applies
    constraints; None when there is none (then nothing is filtered)."""
    x: VState | None = u
    while x is not None:
        if x.v.type in ("node", "storage_node"):
            return x.v
        x = x.parent
    return None
