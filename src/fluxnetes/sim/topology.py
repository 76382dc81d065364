"""What the machine's topology did to a run: how jobs spread over racks.

A job's *rack spread* is the number of distinct racks its nodes are in. Jobs on one node
cannot spread, so the figures count multi-node jobs only: how many spanned more than one
rack, the mean racks per multi-node job, and the fewest racks each could have used (its
node count over the largest rack), whose excess is the spread the placement added.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from fluxnetes.sim.engine import JobOutcome


def racks_of(graph: Any) -> dict[str, str]:
    """Node name -> the name of the rack above it (nodes under no rack are left out)."""
    out: dict[str, str] = {}
    for rack in graph.by_type.get("rack", []):
        for vertex in graph.walk(rack):
            if vertex.type == "node":
                out[vertex.name] = rack.name
    return out


def rack_spread(outcomes: Iterable[JobOutcome], rack_of: Mapping[str, str]) -> dict[str, float]:
    """Spread figures of the jobs that ran on more than one node (empty without racks)."""
    if not rack_of:
        return {}
    size: dict[str, int] = {}
    for rack in rack_of.values():
        size[rack] = size.get(rack, 0) + 1
    largest = max(size.values())
    multi = 0
    spanning = 0
    total = 0
    excess = 0
    for outcome in outcomes:
        nodes = outcome.nodes
        if outcome.start is None or len(nodes) < 2:
            continue
        racks = len({rack_of.get(name, "") for name in nodes})
        multi += 1
        total += racks
        spanning += racks > 1
        excess += racks - -(-len(nodes) // largest)
    if not multi:
        return {"multi_node_jobs": 0}
    return {"multi_node_jobs": multi, "spanning_racks": spanning,
            "spanning_share": spanning / multi, "mean_racks": total / multi,
            "mean_excess_racks": excess / multi}
