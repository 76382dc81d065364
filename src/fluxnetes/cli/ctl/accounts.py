"""`kubectl fluxnetes accounts`: fair share per account, like Slurm's ``sshare``.

Reads the FluxAccount objects (cluster-scoped): the spec (shares, parent, limits) is the
users', the status (normalized shares, decayed usage, fair-share factor, running, queued,
held, namespaces) is what the operator published last (``FairShareBook.publish``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import typer

from fluxnetes.cli.ctl.common import (
    Conn,
    ContextOpt,
    CtlError,
    KubeconfigOpt,
    Output,
    OutputOpt,
    api,
    console,
    emit,
    fail,
    table,
)

FLUXACCOUNTS_PATH = "/apis/fluxnetes.io/v1alpha1/fluxaccounts"
LIMIT_LABELS = (
    ("maxRunningCores", "cores"),
    ("maxRunningGPUs", "gpus"),
    ("maxRunningNodes", "nodes"),
    ("maxRunningJobs", "jobs"),
    ("maxQueuedJobs", "queued"),
)


def _name(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name") or "")


def fmt_limits(limits: Mapping[str, Any] | None) -> str:
    if not limits:
        return ""
    return ",".join(f"{label}<={limits[key]}" for key, label in LIMIT_LABELS if limits.get(key) is not None)


def implicit_default(fluxaccounts: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The default account the operator adds when no FluxAccount is the default (none has
    ``spec.default: true`` and none is named "default"): a top-level leaf of 1 share, which
    every other account's normalized shares count (with one FluxAccount of 1 share, each has
    0.5). It has no object, so no published status: its normalized shares are computed here
    from the shares alone. None when there is none, or the configuration is refused."""
    from fluxnetes.k8s.fairshare import accounts as acc
    from fluxnetes.queue.fairshare import classic

    if not fluxaccounts:
        return None  # no FluxAccount: fair share is off
    try:
        config = acc.parse_accounts(fluxaccounts)
    except acc.AccountConfigError:
        return None
    if not config.implicit_default:
        return None
    norm = classic(config.tree, {})[config.default].shares_norm
    return {"metadata": {"name": config.default}, "spec": {"shares": 1, "default": True},
            "status": {"normalizedShares": round(norm, 6)}, "implicit": True}


def account_rows(fluxaccounts: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per FluxAccount, parents before their children (siblings by name), with its
    depth in the tree, and the implicit default account (``implicit_default``) where the
    operator adds one. An account whose parent is missing is shown at the top."""
    by_name = {_name(a): a for a in fluxaccounts if _name(a)}
    extra = implicit_default(fluxaccounts)
    if extra is not None:
        by_name[_name(extra)] = extra
    children: dict[str, list[str]] = {}
    for name, a in by_name.items():
        parent = str((a.get("spec") or {}).get("parent") or "")
        children.setdefault(parent if parent in by_name else "", []).append(name)
    rows: list[dict[str, Any]] = []
    seen: set[str] = set()

    def visit(parent: str, depth: int) -> None:
        for name in sorted(children.get(parent, ())):
            if name in seen:  # a cycle (the operator refuses it; show each account once)
                continue
            seen.add(name)
            a = by_name[name]
            spec = a.get("spec") or {}
            status = a.get("status") or {}
            rows.append({
                "name": name,
                "parent": str(spec.get("parent") or ""),
                "depth": depth,
                "default": bool(spec.get("default", False)),
                "implicit": bool(a.get("implicit", False)),  # no FluxAccount: added by the operator
                "shares": int(spec.get("shares", 1)),
                "normalizedShares": status.get("normalizedShares"),
                "usage": status.get("usage"),
                "normalizedUsage": status.get("normalizedUsage"),
                "fairShare": status.get("fairShare"),
                "running": status.get("running"),
                "runningCores": status.get("runningCores"),
                "queued": status.get("queued"),
                "held": status.get("held"),
                "limits": dict(spec.get("limits") or {}),
                "namespaces": list(status.get("namespaces") or []),
                "error": str(status.get("error") or ""),
                "updated": status.get("updated"),
            })
            visit(name, depth + 1)

    visit("", 0)
    for name in sorted(by_name):  # in a cycle: not reachable from the top
        if name not in seen:
            children[""] = [name]
            visit("", 0)
    return rows


def _num(value: Any, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def render(rows: list[dict[str, Any]]) -> Any:
    from rich.console import Group
    from rich.text import Text

    cols = ("ACCOUNT", "SHARES", "NORM SHARES", "USAGE", "NORM USAGE", "FAIRSHARE",
            "RUNNING", "CORES", "QUEUED", "HELD", "LIMITS", "NAMESPACES")
    body = [
        ("  " * r["depth"] + r["name"] + (" (default, implicit)" if r["implicit"] else " (default)" if r["default"]
                                          else ""), r["shares"],
         _num(r["normalizedShares"], ".4f"), _num(r["usage"], ".0f"), _num(r["normalizedUsage"], ".4f"),
         _num(r["fairShare"], ".4f"), _num(r["running"], "d"), _num(r["runningCores"], "d"),
         _num(r["queued"], "d"), _num(r["held"], "d"), fmt_limits(r["limits"]), ",".join(r["namespaces"]))
        for r in rows
    ]
    notes = [Text(f"FluxAccount {r['name']}: {r['error']}", style="red") for r in rows if r["error"]]
    if any(r["implicit"] for r in rows):
        notes.append(Text("implicit: no FluxAccount is the default, so the operator adds this account of 1 share; "
                          "namespaces that choose no account charge it (its usage is not published)"))
    if any(r["fairShare"] is None and not r["implicit"] for r in rows):
        notes.append(Text("-: not published yet (the operator writes each FluxAccount's status "
                          "while it runs)"))
    return Group(table("Accounts", cols, body), *notes)


def accounts_cmd(
    kubeconfig: KubeconfigOpt = None,
    context: ContextOpt = None,
    output: OutputOpt = Output.table,
) -> None:
    """Fair share per account: shares, decayed usage, fair-share factor, running and queued."""
    from fluxnetes.k8s.kube import ApiError

    conn = Conn(kubeconfig, context, None)
    try:
        try:
            items = (api(conn, "GET", FLUXACCOUNTS_PATH) or {}).get("items") or []
        except CtlError as exc:
            if isinstance(exc.__cause__, ApiError) and exc.__cause__.status == 404:
                raise CtlError("the FluxAccount resource is not installed in this cluster "
                               "(install fluxnetes: kubectl apply --server-side -f dist/fluxnetes.yaml)") from None
            raise
    except CtlError as exc:
        raise fail(exc) from None
    rows = account_rows(items)
    if output is Output.table:
        if not rows:
            typer.echo("no FluxAccount: fair share is off (docs/fairshare.md; examples/accounts.yaml)")
            return
        console().print(render(rows))
    else:
        emit(rows, output)


def register(ctl: typer.Typer) -> None:
    ctl.command("accounts")(accounts_cmd)
