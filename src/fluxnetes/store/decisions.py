"""A scheduling cycle's reads and writes, as statements on the cycle's session: the head of
the queue it considers, and its decisions (starts, reservations, rejections) written in a few
bulk statements, only what changed. ``Store.cycle_session`` owns the transaction."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import bindparam, insert, select, update
from sqlalchemy.orm import Session

from fluxnetes.store import allocations
from fluxnetes.store.models import EVENTS, JOBS, Job
from fluxnetes.store.records import JobRecord, event_row, job_record
from fluxnetes.store.states import QUEUED, JobState, check_transition


def queued(s: Session, backend: str, limit: int) -> list[JobRecord]:
    """The first ``limit`` queued (pending/reserved) jobs in queue order: priority high
    first, then submit time, then id. On PostgreSQL they are locked for the cycle
    (FOR UPDATE SKIP LOCKED: a row another transaction is changing is left for the next
    cycle)."""
    is_queued = Job.state.in_([st.value for st in QUEUED])
    order = (Job.priority.desc(), Job.submit_time, Job.id)
    # pick the ids first (a narrow top-N), then fetch and lock those rows: sorting whole
    # rows under FOR UPDATE would sort the entire queue
    first = select(Job.id).where(is_queued).order_by(*order).limit(limit).scalar_subquery()
    q = select(*Job.__table__.columns).where(Job.id.in_(first), is_queued).order_by(*order)
    if backend == "postgresql":
        q = q.with_for_update(skip_locked=True)
    return [job_record(r) for r in s.execute(q)]


def persist(
    s: Session,
    now: int,
    *,
    loaded: Sequence[JobRecord],
    started: Sequence[allocations.Start],
    reserved: dict[int, int],
    unsatisfiable: dict[int, str],
    failed: dict[int, str] | None = None,
) -> None:
    """Write one cycle's decisions (only what changed). ``started``: (job id, at, duration,
    R, nodes); ``reserved``: job id -> expected start; ``unsatisfiable`` / ``failed``: job id
    -> reason. Loaded reserved jobs that got no reservation this time go back to pending."""
    failed = failed or {}
    by_id = {j.id: j for j in loaded}
    job_updates: list[dict[str, Any]] = []
    events: list[dict[str, Any]] = []

    def change(jid: int, target: JobState, reason: str, **cols: Any) -> None:
        job = by_id[jid]
        check_transition(f"{jid} ({job.namespace}/{job.name})", job.state, target)
        row = {
            "id": jid,
            "state": target.value,
            "reason": reason,
            "updated_time": now,
            "expected_start": None,
        }
        row.update(cols)
        job_updates.append(row)
        events.append(event_row(jid, now, job.state.value, target.value, reason))

    started_ids = set()
    for jid, at, _dur, _r, _nodes in started:
        started_ids.add(jid)
        change(jid, JobState.RUNNING, "allocated", start_time=at, matcher_jobid=jid)
    for jid, why in unsatisfiable.items():
        change(jid, JobState.UNSATISFIABLE, why, end_time=now)
    for jid, why in failed.items():
        change(jid, JobState.FAILED, why, end_time=now)
    expected_only: list[dict[str, Any]] = []
    for jid, at in reserved.items():
        job = by_id[jid]
        if job.state is JobState.RESERVED:
            if job.expected_start != at:  # still reserved, new expected start: no event
                expected_only.append({"id": jid, "expected_start": at, "updated_time": now})
        else:
            change(jid, JobState.RESERVED, f"reserved, expected start {at}", expected_start=at)
    for job in loaded:
        if (
            job.state is JobState.RESERVED
            and job.id not in reserved
            and job.id not in started_ids
            and job.id not in unsatisfiable
            and job.id not in failed
        ):
            change(job.id, JobState.PENDING, "reservation dropped")
    # group updates by column set: a bulk UPDATE by primary key needs uniform rows
    groups: dict[tuple[str, ...], list[dict[str, Any]]] = {}
    for row in job_updates + expected_only:
        groups.setdefault(tuple(sorted(row)), []).append(row)
    conn = s.connection()
    table = JOBS
    for cols, rows in groups.items():
        stmt = (
            update(table)
            .where(table.c.id == bindparam("_id"))
            .values({c: bindparam("v_" + c) for c in cols if c != "id"})
        )
        conn.execute(
            stmt, [{"_id": r["id"]} | {"v_" + c: r[c] for c in cols if c != "id"} for r in rows]
        )
    allocations.write(s, started)
    if events:
        conn.execute(insert(EVENTS), events)
