"""The per-node counters (``firstfit.py``) as the matcher uses them: which requests they
answer (a request's shape, remembered per jobspec object: it is asked on every match), and
the hand-over of their live jobs to the engine when an operation they do not cover comes
(match/README.md "Speed"); the walk answers from then on."""

from __future__ import annotations

from fluxnetes.jobspec.model import Jobspec
from fluxnetes.match.counted import CountedResult
from fluxnetes.match.engine import Engine
from fluxnetes.match.firstfit import NODES, FirstFit, request_shape
from fluxnetes.match.jobmeta import AT_ALLOC, Meta
from fluxnetes.match.records import JobRecords
from fluxnetes.match.results import JobRecord
from fluxnetes.match.satcache import SAT_CACHE_MAX
from fluxnetes.match.vstate import VState


class CountedPath:
    """The counters (``ff``) and the shapes of the requests they were asked."""

    def __init__(self, ff: FirstFit) -> None:
        self.ff = ff
        self._shapes: dict[int, tuple[Jobspec, tuple[int, int] | None]] = {}

    def shape(self, js: Jobspec) -> tuple[int, int] | None:
        """``(kind, count)`` of a request the counters answer; None: not theirs. (The static
        policies' counters rank slots: whole nodes are the node index's.)"""
        known = self._shapes.get(id(js))
        if known is None or known[0] is not js:
            if len(self._shapes) >= SAT_CACHE_MAX:
                self._shapes.clear()
            known = self._shapes[id(js)] = (js, request_shape(js))
        shape = known[1]
        if shape is not None and shape[0] == NODES and self.ff.static:
            return None
        return shape

    def hand_over(self, engine: Engine, records: JobRecords) -> None:
        """Write every live job of the counters into the engine (the ordinary update pass per
        job, then the weights and child orders) and into ``records``."""
        self._shapes.clear()

        def commit(res: CountedResult, marks: list[tuple[VState, int, bool]]) -> None:
            jobid, at, end = res.jobid, res.at, res.end
            engine.mark_selection(marks)
            meta = Meta(jobid, at, at, end - at, AT_ALLOC, None)
            emitted = engine.update(meta, {"node"} if res.kind == NODES else set(), False, [])
            records.adopt(JobRecord(jobid, at, end - at, False, None, None, emitted, res.queue, res))

        self.ff.flush(commit)
