"""Record a simulation in the store (``fluxnetes.sim``'s observer protocol).

The simulator runs its own in-memory queue; with a ``StoreRecorder`` every submission, start,
end and rejection is also written to the store — the same rows, allocations and events the
operator writes — so a simulated run can be inspected with ``fluxnetes store status|jobs`` or
SQL. Without it the simulator touches no database (for speed).

Events are buffered and written in one transaction when time moves on and ``batch`` events
are waiting (and on ``close``), with consecutive events of a kind written by one statement
group; the store trails the simulation by at most one batch.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

from fluxnetes.store.allocations import NodeAmount, node_amount
from fluxnetes.store.records import Submission
from fluxnetes.store.states import JobState
from fluxnetes.store.store import Store


def _nodes(allocation: Any) -> list[NodeAmount]:
    return [node_amount(n) for n in getattr(allocation, "nodes", ())]


def _r(allocation: Any) -> dict[str, Any]:
    to_rv1 = getattr(allocation, "to_rv1", None)
    if to_rv1 is None:
        return {}
    try:
        return dict(to_rv1(with_scheduling=False))  # the JGF part is large and derivable
    except TypeError:
        return dict(to_rv1())


@dataclass
class StoreRecorder:
    """A ``fluxnetes.sim.engine.SimObserver`` writing into ``store``. Jobs are named
    ``<prefix><sim id>`` in ``namespace``; ``jobspec_for(job)`` (optional) gives the jobspec
    text to record."""

    store: Store
    namespace: str = "sim"
    prefix: str = "job-"
    jobspec_for: Any = None
    batch: int = 1_000  # buffered events that trigger a write
    ids: dict[str, int] = field(default_factory=dict)  # sim job id -> store job id
    _now: int | None = None
    _submits: list[tuple[Any, int]] = field(default_factory=list)
    _after: list[tuple[str, Any, int, Any]] = field(default_factory=list)

    def _at(self, now: int) -> None:
        # flush when time moves on and enough is buffered (a few transactions per batch)
        waiting = len(self._submits) + len(self._after)
        if self._now is not None and now != self._now and waiting >= self.batch:
            self.flush()
        self._now = now

    def on_submit(self, job: Any, now: int) -> None:
        self._at(now)
        self._submits.append((job, now))

    def on_start(self, job: Any, now: int, allocation: Any) -> None:
        self._at(now)
        self._after.append(("start", job, now, allocation))

    def on_end(self, job: Any, now: int) -> None:
        self._at(now)
        self._after.append(("end", job, now, None))

    def on_reject(self, job: Any, now: int, reason: str) -> None:
        self._at(now)
        self._after.append(("reject", job, now, reason))

    def flush(self) -> None:
        """Write what is buffered (submissions first, then the rest in arrival order), in one
        transaction."""
        with self.store.batch():
            self._flush()

    def _flush(self) -> None:
        for now, group in itertools.groupby(self._submits, key=lambda e: e[1]):
            jobs = [job for job, _ in group]
            subs = [
                Submission(
                    namespace=self.namespace,
                    name=f"{self.prefix}{job.id}",
                    jobspec=str(self.jobspec_for(job)) if self.jobspec_for is not None else "",
                    size=1,
                    duration=int(getattr(job, "estimate", 0) or 0),
                    priority=int(getattr(job, "priority", 0) or 0),
                    kind="SimJob",
                )
                for job in jobs
            ]
            got = self.store.submit_many(subs, now)
            self.ids.update((str(job.id), jid) for job, jid in zip(jobs, got, strict=True))
        self._submits.clear()
        # consecutive events of one kind go in one statement group (order is kept: a job
        # with a zero run time starts and ends in the same instant)
        for (kind, at), run in itertools.groupby(self._after, key=lambda e: (e[0], e[2])):
            events = list(run)
            if kind == "start":
                self.store.start_many(
                    [
                        (
                            self.ids[str(job.id)],
                            int(getattr(a, "at", at) or at),
                            int(getattr(a, "duration", 0) or 0),
                            _r(a),
                            _nodes(a),
                        )
                        for _, job, _, a in events
                    ],
                    at,
                )
            elif kind == "end":
                ids = [self.ids[str(job.id)] for _, job, _, _ in events]
                self.store.transition_many(ids, JobState.COMPLETED, at, "ran to its end")
            else:
                for reason, same in itertools.groupby(events, key=lambda e: str(e[3])):
                    ids = [self.ids[str(job.id)] for _, job, _, _ in same]
                    self.store.transition_many(ids, JobState.UNSATISFIABLE, at, reason)
        self._after.clear()

    def close(self) -> None:
        self.flush()
