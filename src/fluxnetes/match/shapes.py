"""The request shapes the index fast paths answer: ``slot[N] -> {leaf requests}`` and
``node[N] exclusive -> slot -> {leaf requests}`` (``slotindex.py``, ``nodeindex.py``)."""

from __future__ import annotations

from fluxnetes.jobspec.model import Resource


def slot_shape(resources: list[Resource]) -> tuple[Resource, list[Resource]] | None:
    """``[slot -> {leaf requests}]`` with nothing exclusive-false/nested: (slot, elements)."""
    if len(resources) != 1:
        return None
    s = resources[0]
    if s.type != "slot" or not s.with_:
        return None
    for e in s.with_:
        if e.with_ or e.exclusive is False or e.type == "slot":
            return None
    return s, s.with_


def node_shape(resources: list[Resource]) -> tuple[Resource, Resource, list[Resource]] | None:
    """``[node (exclusive) -> slot -> {leaf requests}]``: (node, slot, elements)."""
    if len(resources) != 1:
        return None
    n = resources[0]
    if n.type != "node" or n.exclusive is not True or len(n.with_) != 1:
        return None
    inner = slot_shape(n.with_)
    if inner is None:
        return None
    return n, inner[0], inner[1]
