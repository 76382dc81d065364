"""The index fast paths: indexes that give the walk's answer for the common request shapes
(``shapes.py``) of the policies that explore every child (the static ones, `locality`,
`variation`) without walking every vertex (on a 4096-node core-level graph a walk is ~270k
vertex visits per match). One index per request shape, built on first use and kept current as
the matcher commits, releases and edits the graph:

* ``SlotIndex`` (``slotindex.py``; a future window: ``slotwindow.py``) for
  ``slot[N] -> {leaf types}`` with no node level;
* ``NodeIndex`` (``nodeindex.py``) for ``node[N] (exclusive) -> slot[k] -> {leaf types}``.

They return the *same* answer as the walk (with the stable tie-break; tests compare both on
random graphs), and the matcher uses them only when their preconditions hold (otherwise it
walks): a match at ``now`` while every recorded job is active at ``now`` (started at or
before it, ending after it) - then "free over the window" is simply "no job on it". A jobspec
constraint (RFC 31) is a filter on node vertices, as in the walk: hosts / nodes whose node
fails it are skipped, and counts are taken against what remains.
"""

from __future__ import annotations

from typing import Any

from fluxnetes.graph.model import gc_paused
from fluxnetes.jobspec.model import Resource
from fluxnetes.match.engine import Engine
from fluxnetes.match.nodeindex import NodeIndex
from fluxnetes.match.slotindex import SlotIndex
from fluxnetes.match.vstate import VState


class Indexes:
    """Slot indexes by slot elements, node indexes by slot count and elements."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.slots: dict[Any, SlotIndex] = {}
        self.nodes: dict[Any, NodeIndex] = {}

    def slot_index(self, elems: list[Resource]) -> SlotIndex:
        key = tuple((e.type, e.count) for e in elems)
        idx = self.slots.get(key)
        if idx is None:
            with gc_paused():  # (many small objects at once: no full collections meanwhile)
                idx = self.slots[key] = SlotIndex(self.engine, frozenset(e.type for e in elems), elems)
        return idx

    def node_index(self, slot: Resource, elems: list[Resource]) -> NodeIndex:
        key = (slot.count, tuple((e.type, e.count) for e in elems))
        nidx = self.nodes.get(key)
        if nidx is None:
            with gc_paused():
                nidx = self.nodes[key] = NodeIndex(self.engine, slot, elems)
        return nidx

    def touch(self, changed: list[VState]) -> None:
        """These vertices' holdings changed."""
        for si in self.slots.values():
            si.touch(changed)
        for ni in self.nodes.values():
            ni.touch(changed)

    def refresh_status(self) -> None:
        """A node went up or down."""
        for si in self.slots.values():
            si.refresh_status()
        for ni in self.nodes.values():
            ni.refresh_status()

    def clear(self) -> None:
        """The graph or the candidates' order changed: rebuild on next use."""
        self.slots.clear()
        self.nodes.clear()
