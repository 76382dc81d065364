"""`fluxnetes store`: create/upgrade the store's schema and look inside it."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from fluxnetes.cli.common import error_exit

StoreOption = Annotated[
    str | None,
    typer.Option(
        "--store",
        help="sqlite:///path or postgresql+psycopg://user@host:port/db. Default: "
        "$FLUXNETES_STORE_URL, else a SQLite file in the user data directory.",
    ),
]


def _url(store: str | None) -> str:
    from pydantic import ValidationError

    from fluxnetes.config import Settings
    from fluxnetes.store import StoreConfigError, check_url

    try:
        if store:
            check_url(store)
            return store
        return Settings.from_env().store_url
    except StoreConfigError as e:
        raise error_exit(str(e)) from None
    except ValidationError as e:
        raise error_exit(f"FLUXNETES_STORE_URL: {e.errors()[0]['msg']}") from None


def migrate(store: StoreOption = None) -> None:
    """Create the schema or upgrade it to the newest revision (also done on every start)."""
    from fluxnetes.store import Store, StoreUnavailable, redact

    url = _url(store)
    try:
        s = Store.open(url)
        typer.echo(f"{redact(url)}: schema at revision {s.revision()}")
        s.close()
    except StoreUnavailable as e:
        raise error_exit(str(e)) from None


def status(
    store: StoreOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Schema revision, jobs per state and recorded allocations."""
    from fluxnetes.store import Store, StoreUnavailable, redact
    from fluxnetes.store.db import head_revision

    url = _url(store)
    s = Store(url)
    try:
        rev = s.revision()
        if rev is None:
            raise error_exit(f"{redact(url)}: no schema yet (run `fluxnetes store migrate`)")
        counts = {k.value: v for k, v in s.counts().items()}
        allocs = s.allocations()
    except StoreUnavailable as e:
        raise error_exit(str(e)) from None
    finally:
        s.close()
    doc = {
        "store": redact(url),
        "revision": rev,
        "head": head_revision(),
        "jobs": counts,
        "allocations": len(allocs),
        "allocated_cores": sum(n.cores for a in allocs for n in a.nodes),
    }
    if as_json:
        typer.echo(json.dumps(doc, indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    typer.echo(f"store {doc['store']}: schema {rev} (newest {doc['head']})")
    table = Table()
    table.add_column("state")
    table.add_column("jobs", justify="right")
    for state, n in counts.items():
        table.add_row(state, str(n))
    Console().print(table)
    typer.echo(f"{doc['allocations']} running allocations, {doc['allocated_cores']} cores")


def jobs(
    store: StoreOption = None,
    state: Annotated[
        list[str] | None, typer.Option("--state", help="Only these states (repeat).")
    ] = None,
    limit: Annotated[int, typer.Option(help="At most this many (newest first).")] = 50,
) -> None:
    """List jobs with their state, reason and times."""
    from fluxnetes.store import JobState, Store, StoreUnavailable

    states = None
    if state:
        valid = {s.value for s in JobState}
        bad = [x for x in state if x not in valid]
        if bad:
            raise error_exit(f"--state: {bad[0]!r} is not one of {', '.join(sorted(valid))}")
        states = state
    s = Store(_url(store))
    try:
        rows = s.jobs(states)[-limit:][::-1]
    except StoreUnavailable as e:
        raise error_exit(str(e)) from None
    finally:
        s.close()
    from rich.console import Console
    from rich.table import Table

    table = Table()
    for col in ("id", "namespace/name", "kind", "size", "state", "submit", "start", "reason"):
        table.add_column(col)
    for j in rows:
        table.add_row(
            str(j.id),
            f"{j.namespace}/{j.name}",
            j.kind,
            str(j.size),
            j.state.value,
            str(j.submit_time),
            "" if j.start_time is None else str(j.start_time),
            j.reason,
        )
    Console().print(table)


def register(app: typer.Typer) -> None:
    group = typer.Typer(help="The persistent queue (SQLite or PostgreSQL).", no_args_is_help=True)
    group.command("migrate")(migrate)
    group.command("status")(status)
    group.command("jobs")(jobs)
    app.add_typer(group, name="store")
