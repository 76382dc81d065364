"""SQLAlchemy 2 models of the store. The schema itself is created by the Alembic migrations in
``migrations/versions`` (the models mirror them; a test checks they agree).

Times are integers (seconds), passed in by the caller: the store never reads the clock.
"""

from __future__ import annotations

from typing import Any, cast

from sqlalchemy import (
    JSON,
    BigInteger,
    Double,
    ForeignKey,
    Index,
    Integer,
    String,
    Table,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

# SQLite only auto-increments an INTEGER PRIMARY KEY; PostgreSQL gets a BIGINT identity.
BigId = BigInteger().with_variant(Integer(), "sqlite")


class Base(DeclarativeBase):
    pass


class Job(Base):
    """One pod group (one jobspec)."""

    __tablename__ = "jobs"
    __table_args__ = (
        # the identity of a group: a re-created owner with the same name has a new uid
        UniqueConstraint("namespace", "name", "uid", name="uq_jobs_identity"),
        Index("ix_jobs_state", "state"),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    namespace: Mapped[str] = mapped_column(String(253))
    name: Mapped[str] = mapped_column(String(253))
    uid: Mapped[str] = mapped_column(String(64), default="")
    kind: Mapped[str] = mapped_column(String(64), default="Pod")  # wrapped workload kind
    jobspec: Mapped[str] = mapped_column(Text, default="")  # jobspec V1 as YAML/JSON text
    size: Mapped[int] = mapped_column(Integer, default=1)  # pods in the group
    duration: Mapped[int] = mapped_column(BigInteger, default=0)  # seconds, 0 = unknown
    priority: Mapped[int] = mapped_column(Integer, default=0)
    queue: Mapped[str] = mapped_column(String(64), default="default")
    state: Mapped[str] = mapped_column(String(16))
    reason: Mapped[str] = mapped_column(Text, default="")
    submit_time: Mapped[int] = mapped_column(BigInteger)
    start_time: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    end_time: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    matcher_jobid: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    expected_start: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    updated_time: Mapped[int] = mapped_column(BigInteger)


# The queue in cycle order, queued jobs only: a cycle reads its first queue-depth rows straight
# from this index (no sort of the whole queue, and PostgreSQL can lock rows as it reads them).
_QUEUED_SQL = "state IN ('pending', 'reserved')"
Index(
    "ix_jobs_queued",
    Job.priority.desc(),
    Job.submit_time,
    Job.id,
    postgresql_where=text(_QUEUED_SQL),
    sqlite_where=text(_QUEUED_SQL),
)


class GroupMember(Base):
    """A pod seen for a group while the group is provisional (and kept afterwards)."""

    __tablename__ = "group_members"
    __table_args__ = (UniqueConstraint("job_id", "pod", name="uq_group_members_pod"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    job_id: Mapped[int] = mapped_column(
        BigInteger, ForeignKey("jobs.id", ondelete="CASCADE"), index=True
    )
    pod: Mapped[str] = mapped_column(String(253))
    pod_uid: Mapped[str] = mapped_column(String(64), default="")
    seen_time: Mapped[int] = mapped_column(BigInteger)


class Allocation(Base):
    """The resources a running job holds: R (RFC 20 R version 1) as JSON, plus one
    AllocationNode row per node. ``released_time`` is set when the job leaves running;
    ``revision`` grows on every partial release so a service can tell its copy is stale."""

    __tablename__ = "allocations"

    job_id: Mapped[int] = mapped_column(
        BigInteger, ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True
    )
    at: Mapped[int] = mapped_column(BigInteger)
    duration: Mapped[int] = mapped_column(BigInteger)  # 0 = unknown
    r: Mapped[dict[str, Any]] = mapped_column(JSON)
    revision: Mapped[int] = mapped_column(Integer, default=0)
    released_time: Mapped[int | None] = mapped_column(BigInteger, nullable=True, index=True)


class AllocationNode(Base):
    """Per-node amounts of an allocation (what update_allocate replays)."""

    __tablename__ = "allocation_nodes"
    __table_args__ = (UniqueConstraint("job_id", "node", name="uq_allocation_nodes_node"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    job_id: Mapped[int] = mapped_column(
        BigInteger, ForeignKey("allocations.job_id", ondelete="CASCADE"), index=True
    )
    node: Mapped[str] = mapped_column(String(253))
    path: Mapped[str] = mapped_column(Text, default="")
    cores: Mapped[int] = mapped_column(Integer, default=0)
    gpus: Mapped[int] = mapped_column(Integer, default=0)
    memory: Mapped[int] = mapped_column(BigInteger, default=0)
    extra: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)


class Event(Base):
    """Append-only log of state changes (never updated or deleted)."""

    __tablename__ = "events"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    job_id: Mapped[int] = mapped_column(
        BigInteger, ForeignKey("jobs.id", ondelete="CASCADE"), index=True
    )
    time: Mapped[int] = mapped_column(BigInteger)
    from_state: Mapped[str | None] = mapped_column(String(16), nullable=True)
    to_state: Mapped[str] = mapped_column(String(16))
    reason: Mapped[str] = mapped_column(Text, default="")


class AccountUsage(Base):
    """Fair share: an account's decayed usage (resource-seconds) as of ``updated_time``
    (``fluxnetes.queue.usage``), written by the operator, read back after a restart."""

    __tablename__ = "account_usage"

    account: Mapped[str] = mapped_column(String(253), primary_key=True)
    usage: Mapped[float] = mapped_column(Double)
    updated_time: Mapped[int] = mapped_column(BigInteger)


# the Core tables (bulk statements use them directly: no ORM bookkeeping per row)
JOBS = cast(Table, Job.__table__)
ALLOCATIONS = cast(Table, Allocation.__table__)
ALLOCATION_NODES = cast(Table, AllocationNode.__table__)
EVENTS = cast(Table, Event.__table__)
ACCOUNT_USAGE = cast(Table, AccountUsage.__table__)
