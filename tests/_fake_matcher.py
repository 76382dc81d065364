"""A tiny matcher for unit tests of the queue: N single-core nodes, exact earliest fit.

It implements only the protocol the queue uses (allocate, allocate_orelse_reserve,
satisfiability, cancel) with the real matcher's meaning. Used by tests only.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

FOREVER = 2**62


class Status(enum.Enum):
    ALLOCATED = "ALLOCATED"
    RESERVED = "RESERVED"
    BUSY = "BUSY"
    UNSATISFIABLE = "UNSATISFIABLE"


@dataclass(frozen=True)
class Spec:
    cores: int
    duration: int = 0


@dataclass(frozen=True)
class Share:
    name: str
    path: str
    cores: int
    gpus: int = 0
    memory: int = 0
    extra: dict[str, int] = field(default_factory=dict)


@dataclass
class Result:
    status: Status
    jobid: int | None
    at: int = 0
    duration: int = 0
    reason: str = ""
    nodes: list[Share] = field(default_factory=list)


class FakeMatcher:
    def __init__(self, nodes: int) -> None:
        self.size = nodes
        self.spans: dict[int, tuple[int, int, list[int]]] = {}  # jobid -> (start, end, nodes)
        self.next_id = 1
        self.calls = 0

    def _free_nodes(self, start: int, end: int) -> list[int]:
        busy: set[int] = set()
        for s, e, nodes in self.spans.values():
            if s < end and start < e:
                busy.update(nodes)
        return [n for n in range(self.size) if n not in busy]

    def _try(self, spec: Spec, at: int) -> list[int] | None:
        end = at + spec.duration if spec.duration > 0 else FOREVER
        free = self._free_nodes(at, end)
        return free[: spec.cores] if len(free) >= spec.cores else None

    def _record(self, spec: Spec, at: int, nodes: list[int], status: Status) -> Result:
        jobid = self.next_id
        self.next_id += 1
        end = at + spec.duration if spec.duration > 0 else FOREVER
        self.spans[jobid] = (at, end, nodes)
        shares = [Share(f"node{n}", f"/cluster0/node{n}", 1) for n in nodes]
        return Result(status, jobid, at, spec.duration, "", shares)

    def allocate(self, spec: Spec, *, now: int, jobid: object = None) -> Result:
        self.calls += 1
        nodes = self._try(spec, now)
        if nodes is None:
            return Result(Status.BUSY, None, reason="busy")
        return self._record(spec, now, nodes, Status.ALLOCATED)

    def allocate_orelse_reserve(self, spec: Spec, *, now: int, jobid: object = None) -> Result:
        self.calls += 1
        if spec.cores > self.size:
            return Result(Status.UNSATISFIABLE, None, reason=f"needs {spec.cores} cores")
        nodes = self._try(spec, now)
        if nodes is not None:
            return self._record(spec, now, nodes, Status.ALLOCATED)
        candidates = sorted({e for _, e, _ in self.spans.values() if now < e < FOREVER})
        for t in candidates:
            nodes = self._try(spec, t)
            if nodes is not None:
                return self._record(spec, t, nodes, Status.RESERVED)
        return Result(Status.BUSY, None, reason="cannot be reserved")

    def satisfiability(self, spec: Spec) -> Result:
        self.calls += 1
        if spec.cores > self.size:
            return Result(Status.UNSATISFIABLE, None, reason=f"needs {spec.cores} cores")
        return Result(Status.ALLOCATED, None)

    def cancel(self, jobid: int) -> None:
        del self.spans[jobid]
