"""``MinMultiset``: a multiset of ints that answers its smallest member, for the matcher's
"has every recorded job started by now and not ended?" (``Matcher._all_active``), asked on
every allocation.

A heap with lazy removal: ``remove`` only lowers a count, and stale heap entries are
dropped when they reach the top (or all at once when they outnumber the live ones). Adding
and removing cost a heap push and a dict update, less than a sorted list's insert and
delete, which this replaced (the matcher never needs the members in order, only the
least).
"""

from __future__ import annotations

import heapq


class MinMultiset:
    """Integers with repetition: ``add``, ``remove``, ``min()``; ``len`` counts repeats."""

    __slots__ = ("_heap", "_live", "_n")

    def __init__(self) -> None:
        self._heap: list[int] = []
        self._live: dict[int, int] = {}  # value -> how many times it is in the multiset
        self._n = 0

    def __len__(self) -> int:
        return self._n

    def add(self, value: int) -> None:
        live = self._live
        live[value] = live.get(value, 0) + 1
        heapq.heappush(self._heap, value)
        self._n += 1

    def remove(self, value: int) -> None:
        """Take one ``value`` out (KeyError if it is not in)."""
        live = self._live
        count = live[value]
        if count == 1:
            del live[value]
        else:
            live[value] = count - 1
        self._n -= 1
        if len(self._heap) > 2 * self._n + 64:  # mostly stale entries: rebuild
            self._heap = sorted(self._items())

    def min(self) -> int:
        """The least member (ValueError when empty)."""
        heap = self._heap
        live = self._live
        while heap:
            top = heap[0]
            if top in live:
                return top
            heapq.heappop(heap)
        raise ValueError("min() of an empty MinMultiset")

    def _items(self) -> list[int]:
        return [v for v, count in self._live.items() for _ in range(count)]

    def sorted(self) -> list[int]:
        """Every member, repeats included, in increasing order."""
        return sorted(self._items())
