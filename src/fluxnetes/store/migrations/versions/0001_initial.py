"""initial schema: jobs, group members, allocations, allocation nodes, events

Revision ID: 0001
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "jobs",
        sa.Column("id", BigId, primary_key=True, autoincrement=True),
        sa.Column("namespace", sa.String(253), nullable=False),
        sa.Column("name", sa.String(253), nullable=False),
        sa.Column("uid", sa.String(64), nullable=False),
        sa.Column("kind", sa.String(64), nullable=False),
        sa.Column("jobspec", sa.Text(), nullable=False),
        sa.Column("size", sa.Integer(), nullable=False),
        sa.Column("duration", sa.BigInteger(), nullable=False),
        sa.Column("priority", sa.Integer(), nullable=False),
        sa.Column("queue", sa.String(64), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("submit_time", sa.BigInteger(), nullable=False),
        sa.Column("start_time", sa.BigInteger(), nullable=True),
        sa.Column("end_time", sa.BigInteger(), nullable=True),
        sa.Column("matcher_jobid", sa.BigInteger(), nullable=True),
        sa.Column("expected_start", sa.BigInteger(), nullable=True),
        sa.Column("updated_time", sa.BigInteger(), nullable=False),
        sa.UniqueConstraint("namespace", "name", "uid", name="uq_jobs_identity"),
    )
    op.create_index("ix_jobs_state", "jobs", ["state"])
    queued = sa.text("state IN ('pending', 'reserved')")
    op.create_index(
        "ix_jobs_queued",
        "jobs",
        [sa.text("priority DESC"), "submit_time", "id"],
        postgresql_where=queued,
        sqlite_where=queued,
    )
    op.create_table(
        "group_members",
        sa.Column("id", BigId, primary_key=True, autoincrement=True),
        sa.Column(
            "job_id", sa.BigInteger(), sa.ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False
        ),
        sa.Column("pod", sa.String(253), nullable=False),
        sa.Column("pod_uid", sa.String(64), nullable=False),
        sa.Column("seen_time", sa.BigInteger(), nullable=False),
        sa.UniqueConstraint("job_id", "pod", name="uq_group_members_pod"),
    )
    op.create_index("ix_group_members_job_id", "group_members", ["job_id"])
    op.create_table(
        "allocations",
        sa.Column(
            "job_id",
            sa.BigInteger(),
            sa.ForeignKey("jobs.id", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column("at", sa.BigInteger(), nullable=False),
        sa.Column("duration", sa.BigInteger(), nullable=False),
        sa.Column("r", sa.JSON(), nullable=False),
        sa.Column("revision", sa.Integer(), nullable=False),
        sa.Column("released_time", sa.BigInteger(), nullable=True),
    )
    op.create_index("ix_allocations_released_time", "allocations", ["released_time"])
    op.create_table(
        "allocation_nodes",
        sa.Column("id", BigId, primary_key=True, autoincrement=True),
        sa.Column(
            "job_id",
            sa.BigInteger(),
            sa.ForeignKey("allocations.job_id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("node", sa.String(253), nullable=False),
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("cores", sa.Integer(), nullable=False),
        sa.Column("gpus", sa.Integer(), nullable=False),
        sa.Column("memory", sa.BigInteger(), nullable=False),
        sa.Column("extra", sa.JSON(), nullable=False),
        sa.UniqueConstraint("job_id", "node", name="uq_allocation_nodes_node"),
    )
    op.create_index("ix_allocation_nodes_job_id", "allocation_nodes", ["job_id"])
    op.create_table(
        "events",
        sa.Column("id", BigId, primary_key=True, autoincrement=True),
        sa.Column(
            "job_id", sa.BigInteger(), sa.ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False
        ),
        sa.Column("time", sa.BigInteger(), nullable=False),
        sa.Column("from_state", sa.String(16), nullable=True),
        sa.Column("to_state", sa.String(16), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
    )
    op.create_index("ix_events_job_id", "events", ["job_id"])


def downgrade() -> None:
    op.drop_table("events")
    op.drop_table("allocation_nodes")
    op.drop_table("allocations")
    op.drop_table("group_members")
    op.drop_table("jobs")
