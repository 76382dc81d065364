"""Allocations in the store: what a running job holds, per node (``allocations`` and
``allocation_nodes``), written at its start, shrunk or cut when its pods end, read back by a
restarted process or a queue service. Statements on a caller's session (``Store`` owns the
transactions, the job row locks and the state changes around them).

A release is written as what the job still holds (``shrink``: the node's amounts after it;
``drop``: nodes given back whole), never as a difference: a write repeated after its commit was
not acknowledged (the journal retries until the store answers) then lands on the same amounts,
where subtracting twice would record less than the job holds and a restart would overbook.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import delete, func, insert, select, update
from sqlalchemy.orm import Session

from fluxnetes.store.db import StoreError
from fluxnetes.store.models import ALLOCATION_NODES, ALLOCATIONS, Allocation, AllocationNode


class AllocationError(StoreError, ValueError):
    """A release the allocation cannot take (a node it does not hold, more than it holds)."""


@dataclass(frozen=True)
class NodeAmount:
    """What one node gives to one job (mirrors fluxnetes.match.NodeShare)."""

    name: str
    path: str = ""
    cores: int = 0
    gpus: int = 0
    memory: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


def node_amount(share: Any) -> NodeAmount:
    """A NodeAmount from a matcher's per-node share (a fluxnetes.match.NodeShare or alike, read
    by attribute); a missing or empty amount counts as 0."""
    return NodeAmount(
        name=str(share.name),
        path=str(getattr(share, "path", "") or ""),
        cores=int(getattr(share, "cores", 0) or 0),
        gpus=int(getattr(share, "gpus", 0) or 0),
        memory=int(getattr(share, "memory", 0) or 0),
        extra=dict(getattr(share, "extra", None) or {}),
    )


@dataclass(frozen=True)
class AllocationRecord:
    """A live allocation. ``nodes`` is what the job holds now (releases lower or drop them);
    ``r`` is the R its writer gave at the start, never rewritten by a release: read ``nodes``
    (store README, "Releases")."""

    job_id: int
    at: int
    duration: int
    revision: int
    r: dict[str, Any]
    nodes: tuple[NodeAmount, ...]


Start = tuple[int, int, int, dict[str, Any], list[NodeAmount]]  # job id, at, duration, R, nodes


def write(s: Session, allocs: Sequence[Start]) -> None:
    """Record the allocations of starting jobs (an old, released one of a requeued job is
    replaced)."""
    if not allocs:
        return
    ids = [a[0] for a in allocs]
    s.execute(delete(AllocationNode).where(AllocationNode.job_id.in_(ids)))
    s.execute(delete(Allocation).where(Allocation.job_id.in_(ids)))
    s.execute(
        insert(ALLOCATIONS),
        [
            {"job_id": j, "at": at, "duration": d, "r": r, "revision": 0, "released_time": None}
            for j, at, d, r, _ in allocs
        ],
    )
    s.execute(
        insert(ALLOCATION_NODES),
        [
            {
                "job_id": j,
                "node": n.name,
                "path": n.path,
                "cores": n.cores,
                "gpus": n.gpus,
                "memory": n.memory,
                "extra": dict(n.extra),
            }
            for j, _, _, _, nodes in allocs
            for n in nodes
        ],
    )


def release(s: Session, job_ids: Sequence[int], now: int) -> None:
    """The jobs left running: their live allocations are marked released at ``now`` (the rows
    stay, for the record; recovery and the queue service read only live ones)."""
    a = ALLOCATIONS.c
    s.connection().execute(
        update(ALLOCATIONS)
        .where(a.job_id.in_(job_ids), a.released_time.is_(None))
        .values(released_time=now)
    )


def drop(s: Session, job_id: int, names: Iterable[str]) -> int:
    """The job gives back ``names`` whole. Returns how many nodes it still holds."""
    s.execute(
        delete(AllocationNode).where(
            AllocationNode.job_id == job_id, AllocationNode.node.in_(set(names))
        )
    )
    _bump(s, job_id)
    left = s.scalar(
        select(func.count()).select_from(AllocationNode).where(AllocationNode.job_id == job_id)
    )
    assert left is not None
    return left


def shrink(s: Session, job_id: int, left: Sequence[NodeAmount]) -> None:
    """The job gives back part of what it holds on some nodes: each of ``left`` is what it
    still holds on that node afterwards (its path is kept). Each amount must be held and may
    not grow (AllocationError, nothing changed): a release never adds to an allocation."""
    if not left:
        return
    rows = {
        n.node: n
        for n in s.scalars(
            select(AllocationNode).where(
                AllocationNode.job_id == job_id,
                AllocationNode.node.in_([a.name for a in left]),
            )
        )
    }
    for a in left:
        row = rows.get(a.name)
        if row is None:
            raise AllocationError(f"job {job_id}: node {a.name!r} is not held")
        held = {"cores": row.cores, "gpus": row.gpus, "memory": row.memory}
        held |= {f"extra {k}": int(v) for k, v in (row.extra or {}).items()}
        want = {"cores": a.cores, "gpus": a.gpus, "memory": a.memory}
        want |= {f"extra {k}": int(v) for k, v in a.extra.items()}
        for what, amount in want.items():
            if amount < 0 or amount > held.get(what, 0):
                raise AllocationError(
                    f"job {job_id}: node {a.name!r}: {what} {amount} > {held.get(what, 0)} held"
                    if amount >= 0
                    else f"job {job_id}: node {a.name!r}: {what} {amount} < 0"
                )
    for a in left:
        row = rows[a.name]
        row.cores, row.gpus, row.memory, row.extra = a.cores, a.gpus, a.memory, dict(a.extra)
    _bump(s, job_id)


def _bump(s: Session, job_id: int) -> None:
    # a queue service compares revisions to see its matcher's copy is stale (service.py)
    s.execute(
        update(Allocation)
        .where(Allocation.job_id == job_id)
        .values(revision=Allocation.revision + 1)
    )


def live_revisions(s: Session) -> dict[int, int]:
    rows = s.execute(
        select(Allocation.job_id, Allocation.revision).where(Allocation.released_time.is_(None))
    )
    return {r.job_id: r.revision for r in rows}


def load(s: Session, job_ids: Iterable[int] | None = None) -> list[AllocationRecord]:
    """Live allocations (of running jobs) with their per-node amounts, by job id."""
    q = select(Allocation).where(Allocation.released_time.is_(None))
    nq = (
        select(AllocationNode)
        .join(Allocation, Allocation.job_id == AllocationNode.job_id)
        .where(Allocation.released_time.is_(None))
        .order_by(AllocationNode.job_id, AllocationNode.id)
    )
    if job_ids is not None:
        ids = list(job_ids)
        q = q.where(Allocation.job_id.in_(ids))
        nq = nq.where(AllocationNode.job_id.in_(ids))
    nodes: dict[int, list[NodeAmount]] = {}
    for n in s.scalars(nq):
        nodes.setdefault(n.job_id, []).append(
            NodeAmount(n.node, n.path, n.cores, n.gpus, n.memory, dict(n.extra or {}))
        )
    return [
        AllocationRecord(
            a.job_id, a.at, a.duration, a.revision, a.r, tuple(nodes.get(a.job_id, ()))
        )
        for a in s.scalars(q.order_by(Allocation.job_id))
    ]
