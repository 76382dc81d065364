"""fair share: decayed usage per account (survives operator restarts)

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "account_usage",
        sa.Column("account", sa.String(253), primary_key=True),
        sa.Column("usage", sa.Double(), nullable=False),
        sa.Column("updated_time", sa.BigInteger(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("account_usage")
