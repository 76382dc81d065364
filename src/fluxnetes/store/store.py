"""The Store: the queue's memory behind one object: its connection, transactions and locks,
the public operations, and the queries. The statements of each operation live by concern:
``submissions.py`` (groups entering), ``transitions.py`` (state changes), ``decisions.py`` (a
scheduling cycle's reads and writes), ``allocations.py`` (what running jobs hold).

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
from typing import Any

from sqlalchemy import Engine, func, select, text
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.orm import Session

from fluxnetes.store import allocations, decisions, submissions, transitions
from fluxnetes.store.allocations import AllocationRecord, NodeAmount
from fluxnetes.store.db import (
    CYCLE_LOCK_KEY,
    StoreUnavailable,
    check_url,
    make_engine,
    migrate,
    readonly,
    redact,
)
from fluxnetes.store.models import Event, GroupMember, Job
from fluxnetes.store.records import (
    EventRecord,
    JobNotFound,
    JobRecord,
    Submission,
    SubmissionError,
    job_record,
)
from fluxnetes.store.states import JobState, check_transition

log = logging.getLogger("fluxnetes.store")


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
        with self.session() as s:
            return submissions.submit_many(s, self.backend, subs, now, state)

    def observe_member(
        self, sub: Submission, pod: str, now: int, *, pod_uid: str = ""
    ) -> tuple[JobRecord, int]:
        """Record that pod ``pod`` of group ``sub`` was seen. The group is created provisional
        on its first pod and moves to pending in the same transaction that records its
        ``sub.size``-th distinct pod. Returns the job and the number of pods seen."""
        sub.validate()
        with self.session() as s:
            return submissions.observe_member(s, self.backend, sub, pod, now, pod_uid)

    def forget_member(self, job_id: int, pod: str, now: int) -> int:
        """A pod of a still provisional group went away before the group was complete: it no
        longer counts. Returns the pods still seen (a group that already entered the queue is
        not changed: its pods' ends are releases, see release_nodes)."""
        with self.session() as s:
            return submissions.forget_member(s, self.backend, job_id, pod, now)

    # ----------------------------------------------------------------- state changes

    def transition(
        self, job_id: int, target: JobState | str, now: int, reason: str = ""
    ) -> JobRecord:
        """Move a job to ``target`` (one transaction, with its event). Raises
        IllegalTransition naming both states. Use ``Store.start`` (or the queue service) to
        enter running: it needs an allocation."""
        target = JobState(target)
        with self.session() as s:
            job = transitions.lock_job(s, self.backend, job_id)
            if target is JobState.RUNNING:
                check_transition(str(job_id), job.state, target)
                raise SubmissionError(
                    f"job {job_id}: entering running needs an allocation; use Store.start"
                )
            transitions.set_state(s, job, target, now, reason)
            return job_record(job)

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
        with self.session() as s:
            transitions.set_states(s, self.backend, ids, target, now, reason)

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
            job = transitions.lock_job(s, self.backend, job_id)
            transitions.set_state(s, job, JobState.RUNNING, now, reason)
            job.start_time = at
            job.matcher_jobid = job.id
            allocations.write(s, [(job.id, at, duration, r or {}, list(nodes))])
            return job_record(job)

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
            q = select(*Job.__table__.columns).where(Job.id.in_(ids)).order_by(Job.id)
            if self.backend == "postgresql":
                q = q.with_for_update()
            loaded = [job_record(r) for r in s.execute(q)]
            missing = set(ids) - {j.id for j in loaded}
            if missing:
                raise JobNotFound(f"job {min(missing)} not found")
            decisions.persist(s, now, loaded=loaded, started=starts, reserved={}, unsatisfiable={})

    def release_nodes(self, job_id: int, nodes: Iterable[str], now: int, reason: str = "") -> int:
        """Partial release: the job gives back what it holds on ``nodes`` (its pods there
        ended). Returns how many nodes it still holds; releasing the last node completes the
        job (running -> completed) in the same transaction."""
        with self.session() as s:
            job = transitions.lock_job(s, self.backend, job_id)
            if job.state != JobState.RUNNING.value:
                raise SubmissionError(
                    f"job {job_id}: partial release needs state running, job is {job.state}"
                )
            left = allocations.drop(s, job_id, nodes)
            if left == 0:
                transitions.set_state(
                    s, job, JobState.COMPLETED, now, reason or "all pods finished"
                )
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
            job = transitions.lock_job(s, self.backend, job_id)
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
        """The first ``limit`` queued jobs in queue order (``decisions.queued``)."""
        return decisions.queued(s, self.backend, limit)

    @staticmethod
    def live_revisions(s: Session) -> dict[int, int]:
        return allocations.live_revisions(s)

    @staticmethod
    def load_allocations(
        s: Session, job_ids: Iterable[int] | None = None
    ) -> list[AllocationRecord]:
        return allocations.load(s, job_ids)

    # one cycle's decisions written into the cycle's transaction
    persist_decisions = staticmethod(decisions.persist)

    # ----------------------------------------------------------------- queries

    def get(self, job_id: int) -> JobRecord:
        with self.session(write=False) as s:
            row = s.execute(select(*Job.__table__.columns).where(Job.id == job_id)).one_or_none()
            if row is None:
                raise JobNotFound(f"job {job_id} not found")
            return job_record(row)

    def find(self, namespace: str, name: str, uid: str = "") -> JobRecord | None:
        with self.session(write=False) as s:
            row = s.execute(
                select(*Job.__table__.columns).where(
                    Job.namespace == namespace, Job.name == name, Job.uid == uid
                )
            ).one_or_none()
            return None if row is None else job_record(row)

    def jobs(self, states: Iterable[JobState | str] | None = None) -> list[JobRecord]:
        q = select(*Job.__table__.columns).order_by(Job.id)
        if states is not None:
            q = q.where(Job.state.in_([JobState(x).value for x in states]))
        with self.session(write=False) as s:
            return [job_record(r) for r in s.execute(q)]

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


__all__ = ["Store"]
