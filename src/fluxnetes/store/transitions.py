"""State changes of jobs, as statements on a caller's session: the transition table checked,
the job's columns that go with a state set, the event appended, and the allocation released
when a job leaves running. ``Store`` owns the transactions around them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import insert, select, update
from sqlalchemy.orm import Session

from fluxnetes.store import allocations
from fluxnetes.store.models import EVENTS, JOBS, Event, Job
from fluxnetes.store.records import JobNotFound, event_row
from fluxnetes.store.states import TERMINAL, JobState, check_transition


def lock_job(s: Session, backend: str, job_id: int) -> Job:
    """The job's row, locked for this transaction on PostgreSQL (SQLite's write transaction
    already excludes other writers)."""
    q = select(Job).where(Job.id == job_id)
    if backend == "postgresql":
        q = q.with_for_update()
    job = s.scalars(q).one_or_none()
    if job is None:
        raise JobNotFound(f"job {job_id} not found")
    return job


def add_event(
    s: Session, job_id: int, now: int, from_state: str | None, to_state: str, reason: str
) -> None:
    s.add(Event(job_id=job_id, time=now, from_state=from_state, to_state=to_state, reason=reason))


def set_state(s: Session, job: Job, target: JobState, now: int, reason: str) -> None:
    """Move a loaded (locked) job to ``target``, with its event; raises IllegalTransition."""
    check_transition(f"{job.id} ({job.namespace}/{job.name})", job.state, target)
    prev = job.state
    job.state = target.value
    job.reason = reason
    job.updated_time = now
    if target is not JobState.RESERVED:
        job.expected_start = None
    if prev == JobState.RUNNING.value:  # leaving running always gives the resources back
        allocations.release(s, [job.id], now)
        if target is JobState.PENDING:  # requeued: it will get a new start
            job.start_time = None
            job.matcher_jobid = None
    if target in TERMINAL:
        job.end_time = now
    add_event(s, job.id, now, prev, target.value, reason)


def set_states(
    s: Session, backend: str, ids: Sequence[int], target: JobState, now: int, reason: str
) -> None:
    """``set_state`` for many jobs in a few statements (``ids`` without repeats). All or
    nothing: one illegal change raises before anything is written."""
    t = JOBS
    conn = s.connection()
    q = select(t.c.id, t.c.state, t.c.namespace, t.c.name).where(t.c.id.in_(ids))
    if backend == "postgresql":
        q = q.order_by(t.c.id).with_for_update()  # id order: no deadlock between batches
    rows = {r.id: r for r in conn.execute(q)}
    for jid in ids:
        if jid not in rows:
            raise JobNotFound(f"job {jid} not found")
        r = rows[jid]
        check_transition(f"{jid} ({r.namespace}/{r.name})", r.state, target)
    values: dict[str, Any] = {
        "state": target.value,
        "reason": reason,
        "updated_time": now,
        "expected_start": None,
    }
    if target in TERMINAL:
        values["end_time"] = now
    was_running = [j for j in ids if rows[j].state == JobState.RUNNING.value]
    if target is JobState.PENDING:
        conn.execute(
            update(t).where(t.c.id.in_(was_running)).values(start_time=None, matcher_jobid=None)
        )
    conn.execute(update(t).where(t.c.id.in_(ids)).values(values))
    if was_running:
        allocations.release(s, was_running, now)
    conn.execute(
        insert(EVENTS), [event_row(j, now, rows[j].state, target.value, reason) for j in ids]
    )
