"""The index fast paths' indexes (``match/fast.py``), one per request shape, built on first use
and kept current as the matcher commits, releases and edits the graph."""

from __future__ import annotations

from typing import Any

from fluxnetes.graph.model import gc_paused
from fluxnetes.jobspec.model import Resource
from fluxnetes.match.engine import Engine
from fluxnetes.match.fast import NodeIndex, SlotIndex
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
