"""Alembic environment: always run programmatically by fluxnetes.store.db.migrate(), which passes
an open connection in ``config.attributes["connection"]`` (so the migrations ship inside the
installed package and need no alembic.ini)."""

from __future__ import annotations

from alembic import context

from fluxnetes.store.models import Base

connection = context.config.attributes.get("connection")
if connection is None:  # pragma: no cover - only reachable from a hand-made alembic.ini
    raise RuntimeError("run fluxnetes migrations through fluxnetes.store.db.migrate(url)")

context.configure(
    connection=connection,
    target_metadata=Base.metadata,
    render_as_batch=connection.dialect.name == "sqlite",  # ALTER TABLE support on SQLite
    compare_type=True,
)
with context.begin_transaction():
    context.run_migrations()
