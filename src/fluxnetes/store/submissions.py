"""Groups entering the store, as statements on a caller's session: batched idempotent inserts
of complete groups, and the pods of a provisional group counted until it is complete.
``Store`` owns the transactions around them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import delete, func, insert, select, text, tuple_
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from fluxnetes.store.models import EVENTS, JOBS, Event, GroupMember, Job
from fluxnetes.store.records import JobRecord, Submission, event_row, job_record
from fluxnetes.store.states import JobState
from fluxnetes.store.transitions import add_event, lock_job, set_state

SUBMIT_BATCH = 500  # rows per INSERT statement (well under both databases' parameter limits)

_PG_SUBMIT = text(
    """
    INSERT INTO jobs (namespace, name, uid, kind, jobspec, size, duration, priority, queue,
                      state, reason, submit_time, updated_time)
    SELECT ns, nm, u, k, js, sz, d, p, q, :state, '', :now, :now
    FROM unnest(CAST(:ns AS text[]), CAST(:nm AS text[]), CAST(:u AS text[]),
                CAST(:k AS text[]), CAST(:js AS text[]), CAST(:sz AS integer[]),
                CAST(:d AS bigint[]), CAST(:p AS integer[]), CAST(:q AS text[]))
         WITH ORDINALITY AS t(ns, nm, u, k, js, sz, d, p, q, i)
    ORDER BY i
    ON CONFLICT (namespace, name, uid) DO NOTHING
    RETURNING id, namespace, name, uid
    """
)
_PG_SUBMIT_EVENTS = text(
    "INSERT INTO events (job_id, time, from_state, to_state, reason) "
    "SELECT j, :now, NULL, :state, 'submitted' FROM unnest(CAST(:ids AS bigint[])) AS t(j)"
)

Key = tuple[str, str, str]  # a group's identity: namespace, name, uid


def upsert(backend: str, table: Any) -> Any:
    """The dialect's INSERT (both have ON CONFLICT DO NOTHING)."""
    return (postgresql.insert if backend == "postgresql" else sqlite.insert)(table)


def submit_many(
    s: Session, backend: str, subs: Sequence[Submission], now: int, state: JobState
) -> list[int]:
    """Insert the groups not in the store yet (with their events) and return every group's
    id in input order (the ones already present keep theirs)."""
    ids: dict[Key, int] = {}
    table = JOBS
    stmt = (
        upsert(backend, table)
        .on_conflict_do_nothing(index_elements=["namespace", "name", "uid"])
        .returning(table.c.id, table.c.namespace, table.c.name, table.c.uid)
    )
    conn = s.connection()
    for start in range(0, len(subs), SUBMIT_BATCH):
        chunk = subs[start : start + SUBMIT_BATCH]
        if backend == "postgresql":
            new = _pg_insert_jobs(conn, chunk, state, now)
            if new:
                conn.execute(
                    _PG_SUBMIT_EVENTS,
                    {"ids": [i for i, _ in new], "now": now, "state": state.value},
                )
        else:
            rows = [
                {
                    "namespace": x.namespace,
                    "name": x.name,
                    "uid": x.uid,
                    "kind": x.kind,
                    "jobspec": x.jobspec,
                    "size": x.size,
                    "duration": x.duration,
                    "priority": x.priority,
                    "queue": x.queue,
                    "state": state.value,
                    "reason": "",
                    "submit_time": now,
                    "updated_time": now,
                }
                for x in chunk
            ]
            # one cached statement run as executemany ("insertmanyvalues" batches it
            # into multi-row INSERTs without recompiling per batch)
            new = [(r.id, (r.namespace, r.name, r.uid)) for r in conn.execute(stmt, rows)]
            if new:
                conn.execute(
                    insert(EVENTS),
                    [event_row(i, now, None, state.value, "submitted") for i, _ in new],
                )
        ids.update((k, i) for i, k in new)
        missing = list({(x.namespace, x.name, x.uid) for x in chunk} - ids.keys())
        if missing:  # already present (resubmissions): look their ids up
            key = tuple_(table.c.namespace, table.c.name, table.c.uid)
            found = conn.execute(
                select(table.c.id, table.c.namespace, table.c.name, table.c.uid).where(
                    key.in_(missing)
                )
            )
            ids.update(((r.namespace, r.name, r.uid), r.id) for r in found)
    return [ids[(x.namespace, x.name, x.uid)] for x in subs]


def _pg_insert_jobs(
    conn: Any, chunk: Sequence[Submission], state: JobState, now: int
) -> list[tuple[int, Key]]:
    """PostgreSQL: one INSERT ... SELECT FROM unnest(arrays) per batch: a short statement
    with one array parameter per column (a multi-row VALUES of 500 rows costs more to build
    and parse than to execute)."""
    params = {
        "ns": [x.namespace for x in chunk],
        "nm": [x.name for x in chunk],
        "u": [x.uid for x in chunk],
        "k": [x.kind for x in chunk],
        "js": [x.jobspec for x in chunk],
        "sz": [x.size for x in chunk],
        "d": [x.duration for x in chunk],
        "p": [x.priority for x in chunk],
        "q": [x.queue for x in chunk],
        "state": state.value,
        "now": now,
    }
    rows = conn.execute(_PG_SUBMIT, params)
    return [(r.id, (r.namespace, r.name, r.uid)) for r in rows]


def _members_seen(s: Session, job_id: int) -> int:
    seen = s.scalar(
        select(func.count()).select_from(GroupMember).where(GroupMember.job_id == job_id)
    )
    return int(seen or 0)


def observe_member(
    s: Session, backend: str, sub: Submission, pod: str, now: int, pod_uid: str
) -> tuple[JobRecord, int]:
    """Store.observe_member's statements: the group made provisional on its first pod, the
    pod counted while it is provisional, and the group moved to pending by its
    ``sub.size``-th distinct pod."""
    s.execute(
        upsert(backend, Job)
        .values(
            namespace=sub.namespace,
            name=sub.name,
            uid=sub.uid,
            kind=sub.kind,
            jobspec=sub.jobspec,
            size=sub.size,
            duration=sub.duration,
            priority=sub.priority,
            queue=sub.queue,
            state=JobState.PROVISIONAL.value,
            reason="waiting for the group's pods",
            submit_time=now,
            updated_time=now,
        )
        .on_conflict_do_nothing(index_elements=["namespace", "name", "uid"])
    )
    q = select(Job).where(Job.namespace == sub.namespace, Job.name == sub.name, Job.uid == sub.uid)
    if backend == "postgresql":
        q = q.with_for_update()
    job = s.scalars(q).one()
    if not s.scalar(select(func.count()).select_from(Event).where(Event.job_id == job.id)):
        add_event(s, job.id, now, None, JobState.PROVISIONAL.value, "first pod seen")
    if job.state == JobState.PROVISIONAL.value:
        s.execute(
            upsert(backend, GroupMember)
            .values(job_id=job.id, pod=pod, pod_uid=pod_uid, seen_time=now)
            .on_conflict_do_nothing(index_elements=["job_id", "pod"])
        )
    seen = _members_seen(s, job.id)
    if job.state == JobState.PROVISIONAL.value and seen >= job.size:
        set_state(s, job, JobState.PENDING, now, f"group complete ({seen} pods)")
        job.submit_time = now  # queue order starts when the group is complete
    return job_record(job), seen


def forget_member(s: Session, backend: str, job_id: int, pod: str, now: int) -> int:
    """Store.forget_member's statements: un-count ``pod`` while the group is provisional."""
    job = lock_job(s, backend, job_id)
    if job.state == JobState.PROVISIONAL.value:
        s.execute(delete(GroupMember).where(GroupMember.job_id == job_id, GroupMember.pod == pod))
        job.updated_time = now
    return _members_seen(s, job_id)
