"""Engines, URLs and migrations for the two supported databases.

SQLite: WAL journal, foreign keys on, and every write transaction starts with
``BEGIN IMMEDIATE`` so it holds the database's write lock from its first statement. That makes
SQLite single-writer by construction: a second process waits (busy timeout) instead of
interleaving. Read-only work uses a deferred ``BEGIN`` (see ``readonly``).

PostgreSQL (psycopg 3): READ COMMITTED; the queue service serializes cycles with an advisory
lock and locks the rows it decides on (see store.py).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.engine import Connection, make_url
from sqlalchemy.exc import ArgumentError

log = logging.getLogger("fluxnetes.store")

SQLITE_BUSY_TIMEOUT_MS = 60_000
MIGRATION_LOCK_KEY = 0x666C7578_0001  # "flux" + 1: advisory lock around migrations
CYCLE_LOCK_KEY = 0x666C7578_0002  # advisory lock held by the one process running a cycle


class StoreError(Exception):
    """Base of store errors."""


class StoreConfigError(StoreError, ValueError):
    """The store URL is not usable (bad scheme, malformed)."""


class StoreUnavailable(StoreError):
    """The database cannot be reached or is not ready; retry later. Nothing was written."""


def check_url(url: str) -> str:
    """Validate a store URL; return its backend ("sqlite" or "postgresql")."""
    try:
        u = make_url(url)
    except ArgumentError as e:
        raise StoreConfigError(
            f"store URL {url!r} is malformed: expected sqlite:///path or "
            f"postgresql+psycopg://user@host:port/db"
        ) from e
    backend = u.get_backend_name()
    if backend == "sqlite":
        if u.drivername not in ("sqlite", "sqlite+pysqlite"):
            raise StoreConfigError(f"store URL {url!r}: SQLite driver must be pysqlite")
        return "sqlite"
    if backend == "postgresql":
        if u.drivername != "postgresql+psycopg":
            raise StoreConfigError(
                f"store URL {url!r}: PostgreSQL URLs must use the psycopg driver "
                f"(postgresql+psycopg://...)"
            )
        return "postgresql"
    raise StoreConfigError(
        f"store URL {url!r}: unsupported database {backend!r} (use sqlite:///path or "
        f"postgresql+psycopg://...)"
    )


def redact(url: str) -> str:
    """The URL with any password hidden, for log lines."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return "<malformed URL>"


def _sqlite_setup(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        # let SQLAlchemy's "begin" event (below) own transaction start, not the sqlite3 module
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        if conn.get_execution_options().get("fluxnetes_readonly"):
            conn.exec_driver_sql("BEGIN")
        else:
            conn.exec_driver_sql("BEGIN IMMEDIATE")


def make_engine(url: str, *, connect_timeout: int = 5) -> Engine:
    """An engine for ``url`` (sqlite:///... or postgresql+psycopg://...). Creates the parent
    directory of a SQLite file."""
    backend = check_url(url)
    if backend == "sqlite":
        u = make_url(url)
        if u.database and u.database != ":memory:":
            Path(u.database).expanduser().parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000})
        _sqlite_setup(engine)
        return engine
    return create_engine(
        url,
        pool_pre_ping=True,
        pool_size=4,
        max_overflow=4,
        connect_args={"connect_timeout": connect_timeout, "application_name": "fluxnetes"},
    )


def readonly(engine: Engine) -> Engine:
    """The same engine with deferred (non-locking) transactions on SQLite."""
    return engine.execution_options(fluxnetes_readonly=True)


def migrate(engine: Engine, revision: str = "head") -> None:
    """Bring the schema to ``revision`` with Alembic (the scripts ship in this package). Safe to
    call from several processes at once: PostgreSQL takes an advisory lock, SQLite's
    BEGIN IMMEDIATE serializes."""
    from alembic import command
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", "fluxnetes.store:migrations")
    with engine.begin() as conn:
        if conn.dialect.name == "postgresql":
            conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": MIGRATION_LOCK_KEY})
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, revision)


def current_revision(engine: Engine) -> str | None:
    from alembic.runtime.migration import MigrationContext

    with readonly(engine).connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def head_revision() -> str:
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    cfg = Config()
    cfg.set_main_option("script_location", "fluxnetes.store:migrations")
    head = ScriptDirectory.from_config(cfg).get_current_head()
    assert head is not None
    return head
