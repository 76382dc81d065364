"""``FreeNodes``: the free one-core nodes under the root, in the order a policy takes them.

The simulator's machines of one-processor nodes (KTH-SP2's, any SWF machine whose
``MaxProcs`` equals ``MaxNodes``) are ``cluster -> node -> core`` with one core per node,
node indexes in uniq id order. There every free node is free whole and gives one
candidate, so a request of P slots (or P whole nodes) takes the first P free nodes in the
policy's order, and nothing else needs counting (``firstfit.py``):

* ``first``: the walk orders children by ``(-weight, -uniq_id)`` and a node's weight is
  ``MAXW`` until a commit first takes it, 0 from then on (a release leaves weights). So
  the free nodes come in two classes: never taken, by descending index, then taken before,
  by descending index. Nodes are taken from the top of the never-taken ones, so those are
  always the indexes ``0 .. fresh - 1`` (a count, not a list), and every node taken before
  has an index ``>= fresh``; the taken-before free ones are a list kept in ascending
  order, so a job takes its share of them as one slice off the end (not one heap pop per
  node: most of the matcher's time on KTH-SP2's 100 nodes, issue #32);
* the static policies (``low``, ``high``, ``lonode``, ``hinode``): the walk ranks the free
  slots by a score that never changes (``FirstFit._static_key``), so the free nodes are
  one heap of those keys with the node index as the low part.

A job costs O(P log n) to take and to give back (``first``: O(P) to take, and a give
back inserts in order: O(P log n) comparisons and a move of the list's tail, or one sort
for a big job), nothing walked in proportion to the machine.
"""

from __future__ import annotations

from bisect import insort
from heapq import heappop, heappush, nsmallest

from fluxnetes.match.vstate import MAXW

#: the low part of a static key (node indexes below this, checked by FirstFit.build)
U = 1 << 40

#: ``first``: a give back of more nodes than this appends and sorts once instead of
#: inserting each (timsort merges the appended run in about linear time)
SORT_FROM = 8


class FreeNodes:
    """The free nodes of a one-core-node machine (module docstring). ``static_keys``: the
    static policies' key per node (None: ``first``)."""

    __slots__ = ("fresh", "keys", "n", "reused", "static")

    def __init__(self, n: int, static_keys: list[int] | None) -> None:
        self.n = n
        self.static = static_keys is not None
        self.keys: list[int] = static_keys if static_keys is not None else []
        # `first`: nodes 0 .. fresh-1 were never taken; static: unused (0)
        self.fresh = 0 if static_keys is not None else n
        # `first`: the indexes of the free nodes taken before, ascending; static: heap of
        # every free node's key (a sorted list is a heap)
        self.reused: list[int] = sorted(static_keys) if static_keys is not None else []

    def __len__(self) -> int:
        return self.fresh + len(self.reused)

    def take(self, count: int) -> list[int] | None:
        """Take the first ``count`` free nodes in the policy's order; their indexes,
        ascending. None (nothing taken) when fewer are free."""
        fresh = self.fresh
        reused = self.reused
        if count > fresh + len(reused):
            return None
        if self.static:
            took = [heappop(reused) % U for _ in range(count)]
            took.sort()
            return took
        m = count if count <= fresh else fresh
        took = list(range(fresh - m, fresh))
        self.fresh = fresh - m
        if m < count:
            # the highest ones, ascending; every index there is >= fresh, above the fresh ones
            cut = len(reused) - (count - m)
            took += reused[cut:]
            del reused[cut:]
        return took

    def peek(self, count: int) -> list[int] | None:
        """What :meth:`take` would answer, taking nothing (a question, not the hot path)."""
        fresh = self.fresh
        reused = self.reused
        if count > fresh + len(reused):
            return None
        if self.static:
            return sorted(k % U for k in nsmallest(count, reused))
        m = count if count <= fresh else fresh
        return list(range(fresh - m, fresh)) + reused[len(reused) - (count - m):]

    def give(self, nodes: list[int]) -> None:
        """Nodes a job took come back free (``first``: as taken before)."""
        reused = self.reused
        if self.static:
            keys = self.keys
            for i in nodes:
                heappush(reused, keys[i])
        elif len(nodes) > SORT_FROM:
            reused += nodes
            reused.sort()
        else:
            for i in nodes:
                insort(reused, i)

    def weight(self, i: int) -> int:
        """``first``'s weight of node ``i`` (``MAXW`` until first taken, then 0)."""
        return MAXW if i < self.fresh else 0
