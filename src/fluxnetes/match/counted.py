"""``CountedResult``: an allocation answered from the per-node counters (``firstfit.py``).

One object per job is both the caller's answer and the counters' record of the live job
(``FirstFit.jobs``): what it took and its window. What the simulator reads per job (the
status, the window, the cores per node and their sum) is set when it is built; the
emitted vertices (``vertices``, ``nodes``, R, JGF) are built on first use, by the counters
that answered.
"""

from __future__ import annotations

from typing import Final, Protocol

from fluxnetes.match.jobmeta import Entry
from fluxnetes.match.results import AllocVertex, MatchResult, MatchStatus, NodeShare

_ALLOCATED: Final = MatchStatus.ALLOCATED  # (compiled: a static, not an enum lookup per job)

CORE0 = [0]  # the one core of a one-core node (shared: position lists are never changed)


class Emitter(Protocol):
    """What builds the emitted vertices of an answer (``FirstFit.entries``)."""

    def entries(self, kind: int, picks: list[tuple[int, list[int]]]) -> list[Entry]: ...


class CountedResult(MatchResult):
    """An allocation from the counters (module docstring). ``took``: the node indexes
    (ascending) on one-core nodes under the root, else None and ``picks`` given."""

    __slots__ = ("_ff", "_picks", "end", "kind", "took")

    def __init__(self, jobid: int, at: int, end: int, queue: str, ff: Emitter, kind: int,
                 took: list[int] | None, picks: list[tuple[int, list[int]]] | None,
                 shares: tuple[tuple[str, int], ...], cores: int) -> None:
        super().__init__(_ALLOCATED, jobid, at, end - at, "", None, None, queue, None)
        self._core_shares = shares
        self._cores = cores
        self.end = end
        self.kind = kind
        self.took = took
        self._picks = picks
        self._ff: Emitter | None = ff

    def picks(self) -> list[tuple[int, list[int]]]:
        """[(node index, core positions)] in tree order."""
        picks = self._picks
        if picks is None:
            took = self.took
            assert took is not None
            picks = self._picks = [(i, CORE0) for i in took]
        return picks

    @property
    def vertices(self) -> list[AllocVertex]:
        if self._emitted is None and self._ff is not None:
            self._emitted = self._ff.entries(self.kind, self.picks())
            self._ff = None
        return super().vertices  # not MatchResult.vertices.fget: compiled, it has no fget

    @property
    def nodes(self) -> list[NodeShare]:
        self.vertices  # noqa: B018 (builds the emitted records)
        return super().nodes
