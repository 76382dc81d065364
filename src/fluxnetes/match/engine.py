"""The depth-first-and-up (DFU) traverser, modelled step by step on Fluxion's (fluxion-spec §5).

It mirrors Fluxion's structure closely because the reference answers depend on its details:
candidate groups merged up the tree in visit order (:mod:`.scoring`), slot packing at the first
vertex whose direct children hold every slot type, edge marks and the update pass that only
follows marked edges, pruning filters and the ``first`` policy's dynamic child order (kept in
each vertex's :class:`~.vstate.VState`). It is one object in three layers, each in the module
named after what it holds: the tree and its priming (``walktree.py``), marks and the update
pass (``commit.py``), the matching walk (``walk.py``).

Time: every span is a half-open interval [start, end); all availability over time is
:mod:`fluxnetes.plan`'s (see :mod:`.vstate`), and the root filter's earliest-fit search
gives the candidate times for reservations.
"""

from __future__ import annotations

from fluxnetes.match.walk import Walk


class Engine(Walk):
    """Per-graph traverser state + the DFU walk for one policy (``Engine(root_vertex,
    high=..., ...)``: the switches are :class:`~.walktree.WalkTree`'s)."""
