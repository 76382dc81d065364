"""The Store: every read and write of the queue's memory.

Every state change runs in one transaction that also appends its event; the transition table
in ``states.py`` is enforced on every change. Times are passed in by the caller.

Concurrency
- PostgreSQL: a state change locks its job row (SELECT ... FOR UPDATE). Submissions are
  idempotent inserts (ON CONFLICT DO NOTHING on the group identity namespace/name/uid), so two
  submitters never create the same group twice. A scheduling cycle holds a transaction-scoped
  advisory lock (only one process runs a cycle at a time; others skip) and locks the queued
  rows it considers with FOR UPDATE SKIP LOCKED, so a concurrent cancel either waits for the
  cycle's commit or is skipped by the cycle.
- SQLite: single writer. Every write transaction begins with BEGIN IMMEDIATE (the database
  write lock), other writers wait up to the busy timeout. Run one fluxnetes process per file.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, bindparam, delete, func, insert, select, text, tuple_, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import DBAPIError, IntegrityError, OperationalError
from sqlalchemy.orm import Session

from fluxnetes.store import allocations
from fluxnetes.store.allocations import (
    AllocationError,
    AllocationRecord,
    NodeAmount,
)
from fluxnetes.store.db import (
    CYCLE_LOCK_KEY,
    StoreError,
    StoreUnavailable,
    check_url,
    make_engine,
    migrate,
    readonly,
    redact,
)
from fluxnetes.store.models import (
    ALLOCATIONS,
    EVENTS,
    JOBS,
    Allocation,
    Event,
    GroupMember,
    Job,
)
from fluxnetes.store.states import QUEUED, TERMINAL, JobState, check_transition

log = logging.getLogger("fluxnetes.store")

SUBMIT_BATCH = 500

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
)  # rows per INSERT statement (well under both databases' parameter limits)


class JobNotFound(StoreError, LookupError):
    pass


class SubmissionError(StoreError, ValueError):
    """A submission breaks a rule (names the field)."""


@dataclass(frozen=True)
class Submission:
    """A complete group entering the queue (or a provisional one, see Store.observe_member)."""

    namespace: str
    name: str
    jobspec: str
    size: int = 1
    duration: int = 0  # seconds, 0 = unknown
    priority: int = 0
    queue: str = "default"
    kind: str = "Pod"
    uid: str = ""

    def validate(self) -> None:
        for fname, limit in (("namespace", 253), ("name", 253), ("kind", 64), ("queue", 64)):
            v = getattr(self, fname)
            if not isinstance(v, str) or not v:
                raise SubmissionError(f"submission.{fname}: must be a non-empty string")
            if len(v) > limit:
                raise SubmissionError(f"submission.{fname}: longer than {limit} characters")
        if len(self.uid) > 64:
            raise SubmissionError("submission.uid: longer than 64 characters")
        if not isinstance(self.size, int) or self.size < 1:
            raise SubmissionError(f"submission.size: must be an integer >= 1, got {self.size!r}")
        if not isinstance(self.duration, int) or self.duration < 0:
            raise SubmissionError(
                f"submission.duration: must be an integer >= 0 (0 = unknown), got {self.duration!r}"
            )
        if not isinstance(self.priority, int):
            raise SubmissionError(f"submission.priority: must be an integer, got {self.priority!r}")


@dataclass(frozen=True)
class JobRecord:
    id: int
    namespace: str
    name: str
    uid: str
    kind: str
    jobspec: str
    size: int
    duration: int
    priority: int
    queue: str
    state: JobState
    reason: str
    submit_time: int
    start_time: int | None
    end_time: int | None
    matcher_jobid: int | None
    expected_start: int | None
    updated_time: int

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}" + (f" ({self.uid})" if self.uid else "")


_JOB_COLS = [c.name for c in Job.__table__.columns]


def _record(row: Any) -> JobRecord:
    m = row._mapping if hasattr(row, "_mapping") else row
    vals = {c: m[c] for c in _JOB_COLS}
    vals["state"] = JobState(vals["state"])
    return JobRecord(**vals)


@dataclass(frozen=True)
class EventRecord:
    id: int
    job_id: int
    time: int
    from_state: JobState | None
    to_state: JobState
    reason: str


class Store:
    """The persistent queue. ``Store(url)`` connects lazily; ``Store.open(url)`` also runs the
    migrations (what a starting process does)."""

    def __init__(self, url: str, *, engine: Engine | None = None) -> None:
        self.backend = check_url(url)
        self.url = url
        self.engine = engine if engine is not None else make_engine(url)
        self._ro = readonly(self.engine)
        self._local = threading.local()

    @classmethod
    def open(cls, url: str) -> Store:
        """Connect and migrate to the newest schema. Raises StoreUnavailable if the database
        cannot be reached (the caller retries; see service.wait_for_store)."""
        store = cls(url)
        store.migrate()
        return store

    def __repr__(self) -> str:
        return f"Store({redact(self.url)})"

    def close(self) -> None:
        self.engine.dispose()

    # ----------------------------------------------------------------- plumbing

    @contextlib.contextmanager
    def _guard(self) -> Iterator[None]:
        """Turn connection-level failures into StoreUnavailable (with a clear message)."""
        try:
            yield
        except OperationalError as e:
            raise StoreUnavailable(
                f"store {redact(self.url)} unavailable: {str(e.orig).strip().splitlines()[0]}"
            ) from e
        except DBAPIError as e:
            if e.connection_invalidated:
                raise StoreUnavailable(f"store {redact(self.url)} connection lost: {e.orig}") from e
            raise

    @contextlib.contextmanager
    def session(self, *, write: bool = True) -> Iterator[Session]:
        """One transaction: committed on success, rolled back on error. Inside ``batch()``
        the batch's transaction is used."""
        active = getattr(self._local, "session", None)
        if active is not None:
            yield active
            return
        with self._guard(), Session(self.engine if write else self._ro) as s, s.begin():
            yield s

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        """Run several store operations (submit_many, start, transition, ...) of this thread in
        one transaction: all of them or none."""
        if getattr(self._local, "session", None) is not None:
            yield
            return
        with self.session() as s:
            self._local.session = s
            try:
                yield
            finally:
                self._local.session = None

    def migrate(self) -> None:
        with self._guard():
            migrate(self.engine)

    def revision(self) -> str | None:
        """The schema revision in the database (None: never migrated)."""
        from fluxnetes.store.db import current_revision

        with self._guard():
            return current_revision(self.engine)

    def ping(self) -> None:
        """Raise StoreUnavailable unless the database answers and the schema is current."""
        from fluxnetes.store.db import current_revision, head_revision

        with self._guard():
            rev = current_revision(self.engine)
        if rev != head_revision():
            raise StoreUnavailable(
                f"store {redact(self.url)} not ready: schema at {rev or 'nothing'}, "
                f"expected {head_revision()} (migrations have not run)"
            )

    def _lock_job(self, s: Session, job_id: int) -> Job:
        q = select(Job).where(Job.id == job_id)
        if self.backend == "postgresql":
            q = q.with_for_update()
        job = s.scalars(q).one_or_none()
        if job is None:
            raise JobNotFound(f"job {job_id} not found")
        return job

    @staticmethod
    def _event(
        s: Session, job_id: int, now: int, from_state: str | None, to_state: str, reason: str
    ) -> None:
        s.add(
            Event(job_id=job_id, time=now, from_state=from_state, to_state=to_state, reason=reason)
        )

    def _insert(self) -> Any:
        return (postgresql.insert if self.backend == "postgresql" else sqlite.insert)(Job)

    # ----------------------------------------------------------------- submissions

    def submit(self, sub: Submission, now: int) -> JobRecord:
        """Queue one complete group (idempotent: an existing group is returned unchanged)."""
        (job_id,) = self.submit_many([sub], now)
        return self.get(job_id)

    def submit_many(
        self, subs: Sequence[Submission], now: int, *, state: JobState = JobState.PENDING
    ) -> list[int]:
        """Queue many groups in one transaction (batched inserts). Idempotent per group
        identity (namespace, name, uid): a group already in the store keeps its row, state and
        id, and no event is written for it. Returns the ids in input order."""
        if state not in (JobState.PENDING, JobState.PROVISIONAL):
            raise SubmissionError(f"submission state: must be pending or provisional, got {state}")
        for sub in subs:
            sub.validate()
        ids: dict[tuple[str, str, str], int] = {}
        table = JOBS
        ins = postgresql.insert if self.backend == "postgresql" else sqlite.insert
        stmt = (
            ins(table)
            .on_conflict_do_nothing(index_elements=["namespace", "name", "uid"])
            .returning(table.c.id, table.c.namespace, table.c.name, table.c.uid)
        )
        with self.session() as s:
            conn = s.connection()
            for start in range(0, len(subs), SUBMIT_BATCH):
                chunk = subs[start : start + SUBMIT_BATCH]
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
                if self.backend == "postgresql":
                    new = self._pg_insert_jobs(conn, chunk, state, now)
                else:
                    # one cached statement run as executemany ("insertmanyvalues" batches it
                    # into multi-row INSERTs without recompiling per batch)
                    new = [(r.id, (r.namespace, r.name, r.uid)) for r in conn.execute(stmt, rows)]
                if new and self.backend == "postgresql":
                    conn.execute(
                        _PG_SUBMIT_EVENTS,
                        {"ids": [i for i, _ in new], "now": now, "state": state.value},
                    )
                elif new:
                    conn.execute(
                        insert(EVENTS),
                        [
                            {
                                "job_id": i,
                                "time": now,
                                "from_state": None,
                                "to_state": state.value,
                                "reason": "submitted",
                            }
                            for i, _ in new
                        ],
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

    @staticmethod
    def _pg_insert_jobs(
        conn: Any, chunk: Sequence[Submission], state: JobState, now: int
    ) -> list[tuple[int, tuple[str, str, str]]]:
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

    def observe_member(
        self, sub: Submission, pod: str, now: int, *, pod_uid: str = ""
    ) -> tuple[JobRecord, int]:
        """Record that pod ``pod`` of group ``sub`` was seen. The group is created provisional
        on its first pod and moves to pending in the same transaction that records its
        ``sub.size``-th distinct pod. Returns the job and the number of pods seen."""
        sub.validate()
        with self.session() as s:
            s.execute(
                self._insert()
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
            q = select(Job).where(
                Job.namespace == sub.namespace, Job.name == sub.name, Job.uid == sub.uid
            )
            if self.backend == "postgresql":
                q = q.with_for_update()
            job = s.scalars(q).one()
            if not s.scalar(select(func.count()).select_from(Event).where(Event.job_id == job.id)):
                self._event(s, job.id, now, None, JobState.PROVISIONAL.value, "first pod seen")
            if job.state == JobState.PROVISIONAL.value:
                ins = (postgresql.insert if self.backend == "postgresql" else sqlite.insert)(
                    GroupMember
                )
                s.execute(
                    ins.values(
                        job_id=job.id, pod=pod, pod_uid=pod_uid, seen_time=now
                    ).on_conflict_do_nothing(index_elements=["job_id", "pod"])
                )
            seen = s.scalar(
                select(func.count()).select_from(GroupMember).where(GroupMember.job_id == job.id)
            )
            assert seen is not None
            if job.state == JobState.PROVISIONAL.value and seen >= job.size:
                self._set_state(s, job, JobState.PENDING, now, f"group complete ({seen} pods)")
                job.submit_time = now  # queue order starts when the group is complete
            rec = _record_from_obj(job)
        return rec, seen

    def forget_member(self, job_id: int, pod: str, now: int) -> int:
        """A pod of a still provisional group went away before the group was complete: it no
        longer counts. Returns the pods still seen (a group that already entered the queue is
        not changed: its pods' ends are releases, see release_nodes)."""
        with self.session() as s:
            job = self._lock_job(s, job_id)
            if job.state == JobState.PROVISIONAL.value:
                s.execute(
                    delete(GroupMember).where(GroupMember.job_id == job_id, GroupMember.pod == pod)
                )
                job.updated_time = now
            seen = s.scalar(
                select(func.count()).select_from(GroupMember).where(GroupMember.job_id == job_id)
            )
            return int(seen or 0)

    # ----------------------------------------------------------------- state changes

    def _set_state(self, s: Session, job: Job, target: JobState, now: int, reason: str) -> None:
        check_transition(f"{job.id} ({job.namespace}/{job.name})", job.state, target)
        prev = job.state
        job.state = target.value
        job.reason = reason
        job.updated_time = now
        if target is not JobState.RESERVED:
            job.expected_start = None
        if prev == JobState.RUNNING.value:  # leaving running always gives the resources back
            s.execute(
                update(Allocation)
                .where(Allocation.job_id == job.id, Allocation.released_time.is_(None))
                .values(released_time=now)
            )
            if target is JobState.PENDING:  # requeued: it will get a new start
                job.start_time = None
                job.matcher_jobid = None
        if target in (
            JobState.COMPLETED,
            JobState.FAILED,
            JobState.CANCELLED,
            JobState.UNSATISFIABLE,
        ):
            job.end_time = now
        self._event(s, job.id, now, prev, target.value, reason)

    def transition(
        self, job_id: int, target: JobState | str, now: int, reason: str = ""
    ) -> JobRecord:
        """Move a job to ``target`` (one transaction, with its event). Raises
        IllegalTransition naming both states. Use ``Store.start`` (or the queue service) to
        enter running: it needs an allocation."""
        target = JobState(target)
        with self.session() as s:
            job = self._lock_job(s, job_id)
            if target is JobState.RUNNING:
                check_transition(str(job_id), job.state, target)
                raise SubmissionError(
                    f"job {job_id}: entering running needs an allocation; use Store.start"
                )
            self._set_state(s, job, target, now, reason)
            return _record_from_obj(job)

    def transition_many(
        self, job_ids: Sequence[int], target: JobState | str, now: int, reason: str = ""
    ) -> None:
        """``transition`` for many jobs in one transaction and a few statements (e.g. many
        groups completed at once). All or nothing: one illegal change raises and none is made."""
        target = JobState(target)
        if target is JobState.RUNNING:
            raise SubmissionError("entering running needs an allocation; use Store.start")
        ids = list(dict.fromkeys(job_ids))
        if not ids:
            return
        t = JOBS
        with self.session() as s:
            conn = s.connection()
            q = select(t.c.id, t.c.state, t.c.namespace, t.c.name).where(t.c.id.in_(ids))
            if self.backend == "postgresql":
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
                    update(t)
                    .where(t.c.id.in_(was_running))
                    .values(start_time=None, matcher_jobid=None)
                )
            conn.execute(update(t).where(t.c.id.in_(ids)).values(values))
            if was_running:
                conn.execute(
                    update(ALLOCATIONS)
                    .where(
                        ALLOCATIONS.c.job_id.in_(was_running), ALLOCATIONS.c.released_time.is_(None)
                    )
                    .values(released_time=now)
                )
            conn.execute(
                insert(EVENTS),
                [
                    {
                        "job_id": j,
                        "time": now,
                        "from_state": rows[j].state,
                        "to_state": target.value,
                        "reason": reason,
                    }
                    for j in ids
                ],
            )

    def start(
        self,
        job_id: int,
        now: int,
        *,
        at: int,
        duration: int,
        nodes: Iterable[NodeAmount],
        r: dict[str, Any] | None = None,
        reason: str = "allocated",
    ) -> JobRecord:
        """Record an allocation and move the job to running, in one transaction."""
        with self.session() as s:
            job = self._lock_job(s, job_id)
            self._set_state(s, job, JobState.RUNNING, now, reason)
            job.start_time = at
            job.matcher_jobid = job.id
            allocations.write(s, [(job.id, at, duration, r or {}, list(nodes))])
            return _record_from_obj(job)

    def start_many(
        self,
        starts: Sequence[allocations.Start],
        now: int,
    ) -> None:
        """``start`` for many jobs in one transaction: (job id, at, duration, R, nodes)."""
        if not starts:
            return
        ids = [x[0] for x in starts]
        with self.session() as s:
            q = select(*JOBS.columns).where(JOBS.c.id.in_(ids)).order_by(JOBS.c.id)
            if self.backend == "postgresql":
                q = q.with_for_update()
            loaded = [_record(r) for r in s.execute(q)]
            missing = set(ids) - {j.id for j in loaded}
            if missing:
                raise JobNotFound(f"job {min(missing)} not found")
            self.persist_decisions(
                s, now, loaded=loaded, started=starts, reserved={}, unsatisfiable={}
            )

    def release_nodes(self, job_id: int, nodes: Iterable[str], now: int, reason: str = "") -> int:
        """Partial release: the job gives back what it holds on ``nodes`` (its pods there
        ended). Returns how many nodes it still holds; releasing the last node completes the
        job (running -> completed) in the same transaction."""
        with self.session() as s:
            job = self._lock_job(s, job_id)
            if job.state != JobState.RUNNING.value:
                raise SubmissionError(
                    f"job {job_id}: partial release needs state running, job is {job.state}"
                )
            left = allocations.drop(s, job_id, nodes)
            if left == 0:
                self._set_state(s, job, JobState.COMPLETED, now, reason or "all pods finished")
            else:
                job.updated_time = now
            return left

    def shrink_nodes(self, job_id: int, left: Iterable[NodeAmount], now: int) -> bool:
        """Partial release within nodes: some of the job's pods on a node ended while others
        of it run on there, so it holds less of that node. ``left``: what it still holds on
        each such node (absolute amounts: a repeated write changes nothing more). One
        transaction. False (and nothing changed) if the job is no longer running: its end,
        which released everything, was written first. A node not held, or an amount above
        what is held, raises AllocationError."""
        with self.session() as s:
            job = self._lock_job(s, job_id)
            if job.state != JobState.RUNNING.value:
                return False
            allocations.shrink(s, job_id, list(left))
            job.updated_time = now
            return True

    # ----------------------------------------------------------------- cycle support

    @contextlib.contextmanager
    def cycle_session(self) -> Iterator[Session | None]:
        """The transaction a scheduling cycle runs in. Yields None (and does nothing) if another
        process is running a cycle right now (PostgreSQL advisory lock); on SQLite the
        transaction holds the database write lock."""
        with self.session() as s:
            if self.backend == "postgresql":
                got = s.scalar(text("SELECT pg_try_advisory_xact_lock(:k)"), {"k": CYCLE_LOCK_KEY})
                if not got:
                    yield None
                    return
            yield s

    def queued_for_cycle(self, s: Session, limit: int) -> list[JobRecord]:
        """The first ``limit`` queued (pending/reserved) jobs in queue order: priority high
        first, then submit time, then id. On PostgreSQL they are locked for the cycle
        (FOR UPDATE SKIP LOCKED: a row another transaction is changing is left for the next
        cycle)."""
        queued = Job.state.in_([st.value for st in QUEUED])
        order = (Job.priority.desc(), Job.submit_time, Job.id)
        # pick the ids first (a narrow top-N), then fetch and lock those rows: sorting whole
        # rows under FOR UPDATE would sort the entire queue
        first = select(Job.id).where(queued).order_by(*order).limit(limit).scalar_subquery()
        q = select(*Job.__table__.columns).where(Job.id.in_(first), queued).order_by(*order)
        if self.backend == "postgresql":
            q = q.with_for_update(skip_locked=True)
        return [_record(r) for r in s.execute(q)]

    @staticmethod
    def live_revisions(s: Session) -> dict[int, int]:
        return allocations.live_revisions(s)

    @staticmethod
    def load_allocations(
        s: Session, job_ids: Iterable[int] | None = None
    ) -> list[AllocationRecord]:
        return allocations.load(s, job_ids)

    def persist_decisions(
        self,
        s: Session,
        now: int,
        *,
        loaded: Sequence[JobRecord],
        started: Sequence[allocations.Start],
        reserved: dict[int, int],
        unsatisfiable: dict[int, str],
        failed: dict[int, str] | None = None,
    ) -> None:
        """Write one cycle's decisions (only what changed) into the cycle's transaction.
        ``started``: (job id, at, duration, R, nodes); ``reserved``: job id -> expected start;
        ``unsatisfiable``: job id -> reason. Loaded reserved jobs that got no reservation this
        time go back to pending."""
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
            events.append(
                {
                    "job_id": jid,
                    "time": now,
                    "from_state": job.state.value,
                    "to_state": target.value,
                    "reason": reason,
                }
            )

        started_ids = set()
        for jid, at, _dur, _r, _nodes in started:
            started_ids.add(jid)
            change(jid, JobState.RUNNING, "allocated", start_time=at, matcher_jobid=jid)
        for jid, why in unsatisfiable.items():
            change(jid, JobState.UNSATISFIABLE, why, end_time=now)
        for jid, why in (failed or {}).items():
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
                and job.id not in (failed or {})
            ):
                change(job.id, JobState.PENDING, "reservation dropped")
        # group updates by column set: ORM bulk UPDATE by primary key needs uniform rows
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

    # ----------------------------------------------------------------- queries

    def get(self, job_id: int) -> JobRecord:
        with self.session(write=False) as s:
            row = s.execute(select(*Job.__table__.columns).where(Job.id == job_id)).one_or_none()
            if row is None:
                raise JobNotFound(f"job {job_id} not found")
            return _record(row)

    def find(self, namespace: str, name: str, uid: str = "") -> JobRecord | None:
        with self.session(write=False) as s:
            row = s.execute(
                select(*Job.__table__.columns).where(
                    Job.namespace == namespace, Job.name == name, Job.uid == uid
                )
            ).one_or_none()
            return None if row is None else _record(row)

    def jobs(self, states: Iterable[JobState | str] | None = None) -> list[JobRecord]:
        q = select(*Job.__table__.columns).order_by(Job.id)
        if states is not None:
            q = q.where(Job.state.in_([JobState(x).value for x in states]))
        with self.session(write=False) as s:
            return [_record(r) for r in s.execute(q)]

    def counts(self) -> dict[JobState, int]:
        with self.session(write=False) as s:
            rows = s.execute(select(Job.state, func.count()).group_by(Job.state))
            out = dict.fromkeys(JobState, 0)
            out.update({JobState(st): n for st, n in rows})
            return out

    def events(self, job_id: int | None = None) -> list[EventRecord]:
        q = select(Event).order_by(Event.id)
        if job_id is not None:
            q = q.where(Event.job_id == job_id)
        with self.session(write=False) as s:
            return [
                EventRecord(
                    e.id,
                    e.job_id,
                    e.time,
                    JobState(e.from_state) if e.from_state else None,
                    JobState(e.to_state),
                    e.reason,
                )
                for e in s.scalars(q)
            ]

    def allocations(self) -> list[AllocationRecord]:
        """Live allocations (running jobs) with their per-node amounts."""
        with self.session(write=False) as s:
            return self.load_allocations(s)

    def members(self, job_id: int) -> list[str]:
        with self.session(write=False) as s:
            return list(
                s.scalars(
                    select(GroupMember.pod)
                    .where(GroupMember.job_id == job_id)
                    .order_by(GroupMember.id)
                )
            )


def _record_from_obj(job: Job) -> JobRecord:
    vals = {c: getattr(job, c) for c in _JOB_COLS}
    vals["state"] = JobState(vals["state"])
    return JobRecord(**vals)


__all__ = [
    "AllocationError",
    "AllocationRecord",
    "EventRecord",
    "IntegrityError",
    "JobNotFound",
    "JobRecord",
    "NodeAmount",
    "Store",
    "StoreUnavailable",
    "Submission",
    "SubmissionError",
]
