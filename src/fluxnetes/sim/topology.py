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


def fragmentation(outcomes: Iterable[JobOutcome], node_cores: Mapping[str, int],
                  rack_of: Mapping[str, str]) -> dict[str, float]:
    """How broken up the free machine was, as time averages from the first submission to
    the last end (``{}`` when no job ran):

    * ``stranded_core_share``: free cores on nodes that are partly in use, as a share of the
      machine's cores (cores a whole-node job cannot get);
    * ``held_unused_share``: cores held by jobs beyond the processors they asked for (a
      3-processor job on a whole 4-core node holds one it does not use), as a share of the
      machine's cores;
    * ``rack_fragmentation`` (with racks): the share of the free cores that lie outside the
      rack with the most free cores (0: every free core in one rack, so a job of a rack's
      size could start; towards 1: the free cores scattered over the racks), averaged over
      the time some core was free.
    """
    events: list[tuple[int, int, tuple[tuple[str, int], ...], int]] = []  # (t, sign, shares, unused)
    first = None
    for o in outcomes:
        if o.start is None or o.end is None:
            continue
        first = o.job.submit if first is None else min(first, o.job.submit)
        unused = max(o.cores - o.job.procs, 0)
        events.append((o.start, 1, o.shares, unused))
        events.append((o.end, -1, o.shares, unused))
    total = sum(node_cores.values())
    if first is None or not total:
        return {}
    events.sort(key=lambda e: e[0])  # stable; within one instant the order does not matter
    used = dict.fromkeys(node_cores, 0)
    rack_free: dict[str, int] = {}
    for name, cores in node_cores.items():
        rack = rack_of.get(name)
        if rack is not None:
            rack_free[rack] = rack_free.get(rack, 0) + cores
    free = total
    stranded = 0  # free cores on partly used nodes
    unused_held = 0
    area_stranded = area_unused = area_frag = 0.0
    free_time = 0
    t_prev = first
    i = 0
    while i < len(events):
        t = events[i][0]
        span = t - t_prev
        if span > 0:
            area_stranded += stranded * span
            area_unused += unused_held * span
            if free > 0:
                free_time += span
                if rack_free:
                    area_frag += (free - max(rack_free.values())) / free * span
        while i < len(events) and events[i][0] == t:
            _, sign, shares, unused = events[i]
            i += 1
            unused_held += sign * unused
            for name, cores in shares:
                cap = node_cores.get(name, 0)
                before = used.get(name, 0)
                after = before + sign * cores
                used[name] = after
                if 0 < before < cap:
                    stranded -= cap - before
                if 0 < after < cap:
                    stranded += cap - after
                free -= sign * cores
                rack = rack_of.get(name)
                if rack is not None:
                    rack_free[rack] -= sign * cores
        t_prev = t
    length = max(t_prev - first, 1)
    out = {"stranded_core_share": area_stranded / (total * length),
           "held_unused_share": area_unused / (total * length)}
    if rack_free:
        out["rack_fragmentation"] = area_frag / free_time if free_time else 0.0
    return out
