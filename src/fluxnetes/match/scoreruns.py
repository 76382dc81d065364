"""Fluxion's `locality` candidate ranking as a kept-up-to-date structure: the distinct
scores of the candidates joined into runs of consecutive integers."""

from __future__ import annotations

from collections.abc import Iterator

from sortedcontainers import SortedList


class ScoreRuns:
    """A multiset of integer scores seen as Fluxion's `locality` policy sees its candidates:
    the distinct scores joined into runs of consecutive integers (its interval set), kept up
    to date as scores come and go instead of being rebuilt per match."""

    __slots__ = ("count", "distinct", "starts")

    def __init__(self) -> None:
        self.count: dict[int, int] = {}
        self.distinct: SortedList = SortedList()
        self.starts: SortedList = SortedList()  # the first score of every run

    def add(self, s: int, n: int = 1) -> None:
        count = self.count
        c = count.get(s, 0)
        count[s] = c + n
        if c:
            return
        self.distinct.add(s)
        if s - 1 not in count:
            self.starts.add(s)
        if s + 1 in count:
            self.starts.remove(s + 1)  # its run now starts at or below s

    def remove(self, s: int, n: int = 1) -> None:
        count = self.count
        c = count[s] - n
        if c:
            count[s] = c
            return
        del count[s]
        self.distinct.remove(s)
        if s - 1 not in count:
            self.starts.remove(s)
        if s + 1 in count:
            self.starts.add(s + 1)  # s split its run: the upper part starts at s + 1

    def runs_desc(self) -> Iterator[tuple[int, int, int]]:
        """(first, last, distinct scores in it) of each run, the run with the highest first
        score first (greater_interval_first)."""
        starts = self.starts
        distinct = self.distinct
        for i in range(len(starts) - 1, -1, -1):
            r = starts[i]
            lo = distinct.bisect_left(r)
            hi = distinct.bisect_left(starts[i + 1]) if i + 1 < len(starts) else len(distinct)
            yield r, distinct[hi - 1], hi - lo
