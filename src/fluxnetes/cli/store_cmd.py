"""`fluxnetes store`: create/upgrade the store's schema and look inside it."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated

import typer

from fluxnetes.cli.common import error_exit

if TYPE_CHECKING:
    from fluxnetes.k8s.kube import Kube

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


_DNS_SUBDOMAIN = r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?"
_DNS_LABEL = r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?"
_SECRET_KEY = r"[-._a-zA-Z0-9]{1,253}"
_PASSWORD_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"


class SecretWithoutKey(Exception):
    """The Secret exists without the password key: left alone, reported."""


def random_password(length: int) -> str:
    """Letters and digits only: the password goes into a PostgreSQL URL unescaped."""
    import secrets

    return "".join(secrets.choice(_PASSWORD_ALPHABET) for _ in range(length))


async def _ensure_secret(kube: Kube, namespace: str, name: str, key: str, length: int) -> bool:
    """Create Secret ``namespace/name`` holding a random ``key`` unless it exists; True when
    created. Only `get` on that Secret and `create` on Secrets are used (the chart's Role).
    An existing Secret is never changed; one without ``key`` is an error (SecretWithoutKey)."""
    from fluxnetes.k8s.kube import SECRETS, ApiError

    def check(existing: dict[str, object]) -> None:
        data = existing.get("data") or {}
        if not isinstance(data, dict) or key not in data:
            raise SecretWithoutKey(f"Secret {namespace}/{name} exists but has no key {key!r}; it was left unchanged "
                             f"(add the key or delete the Secret)")

    current = await kube.get_or_none(SECRETS, name, namespace)
    if current is not None:
        check(current)
        return False
    import base64

    body = {
        "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
        "metadata": {"name": name, "namespace": namespace,
                     "labels": {"app.kubernetes.io/managed-by": "fluxnetes",
                                "app.kubernetes.io/component": "postgresql"}},
        "data": {key: base64.b64encode(random_password(length).encode()).decode()},
    }
    try:
        await kube.create(SECRETS, body, namespace)
    except ApiError as exc:
        if exc.status != 409:
            raise
        check(await kube.get(SECRETS, name, namespace))  # created meanwhile by another pod
        return False
    return True


def ensure_secret(
    name: Annotated[str, typer.Option("--name", help="Name of the Secret.")],
    namespace: Annotated[str, typer.Option("--namespace", "-n", help="Namespace of the Secret.")],
    key: Annotated[str, typer.Option("--key", help="Key holding the password.")] = "password",
    length: Annotated[int, typer.Option("--length", help="Password length (letters and digits), 16-256.")] = 32,
    kubeconfig: Annotated[
        str | None, typer.Option(help="kubeconfig file (default: in-cluster, then ~/.kube/config).")
    ] = None,
    context: Annotated[str | None, typer.Option(help="kubeconfig context.")] = None,
) -> None:
    """Create a Secret with a random password unless it already exists.

    Used by the init container of the PostgreSQL pod in dist/fluxnetes.yaml, so that the static
    manifest carries no password: the first start makes one, later starts keep it. An existing
    Secret is never changed; the password is never printed. Needs `get` on that Secret and
    `create` on Secrets in the namespace."""
    import asyncio
    import os
    import re

    import aiohttp
    from kubernetes_asyncio.config import ConfigException

    from fluxnetes.k8s.kube import ApiError, Kube

    if not re.fullmatch(_DNS_SUBDOMAIN, name):
        raise error_exit(f"--name: {name!r} is not a valid Secret name (lower-case letters, digits, '-' and '.')")
    if not re.fullmatch(_DNS_LABEL, namespace):
        raise error_exit(f"--namespace: {namespace!r} is not a valid namespace name (lower-case letters, digits, '-')")
    if not re.fullmatch(_SECRET_KEY, key):
        raise error_exit(f"--key: {key!r} is not a valid Secret key (letters, digits, '-', '_' and '.')")
    if not 16 <= length <= 256:
        raise error_exit(f"--length: must be between 16 and 256, got {length}")
    if kubeconfig is not None and not os.path.isfile(kubeconfig):
        raise error_exit(f"--kubeconfig: {kubeconfig} is not a file")

    async def run() -> bool:
        kube = await Kube.from_config(kubeconfig, context, 4)
        try:
            return await _ensure_secret(kube, namespace, name, key, length)
        finally:
            await kube.close()

    try:
        created = asyncio.run(run())
    except ApiError as exc:
        if exc.forbidden:
            raise error_exit(
                f"permission denied: {exc.method} {exc.path} was refused (HTTP {exc.status}); the identity needs "
                f"`get` on secrets/{name} and `create` on secrets in namespace {namespace}", 2) from None
        if exc.status == 404:
            raise error_exit(f"namespace {namespace} not found ({exc})", 2) from None
        raise error_exit(f"the API server refused: {exc}", 2) from None
    except SecretWithoutKey as exc:
        raise error_exit(str(exc), 2) from None
    except (aiohttp.ClientError, OSError) as exc:
        raise error_exit(f"cannot reach the API server: {exc}", 2) from None
    except ConfigException as exc:
        where = kubeconfig or "not in a cluster (no service account token) and no usable $KUBECONFIG or ~/.kube/config"
        raise error_exit(f"no usable Kubernetes configuration: {where}: {exc}", 2) from None
    if created:
        typer.echo(f"secret {namespace}/{name}: created with a random {key} ({length} characters)")
    else:
        typer.echo(f"secret {namespace}/{name}: exists, kept unchanged")


def register(app: typer.Typer) -> None:
    group = typer.Typer(help="The persistent queue (SQLite or PostgreSQL).", no_args_is_help=True)
    group.command("migrate")(migrate)
    group.command("status")(status)
    group.command("jobs")(jobs)
    group.command("ensure-secret")(ensure_secret)
    app.add_typer(group, name="store")
