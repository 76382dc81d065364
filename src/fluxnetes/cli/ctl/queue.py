"""`kubectl fluxnetes queue`: waiting and running FluxJobs, in scheduling order."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Annotated, Any

import typer

from fluxnetes.cli.ctl.common import (
    WAITING,
    AllNsOpt,
    Conn,
    ContextOpt,
    CtlError,
    KubeconfigOpt,
    NamespaceOpt,
    Output,
    OutputOpt,
    emit,
    fail,
    fetch,
    fmt_request,
    name_of,
    parse_time,
    pod_sets,
    queue_key,
    relative,
    table,
)


def queue_rows(
    fluxjobs: Iterable[Mapping[str, Any]], now: datetime, include_finished: bool = False
) -> list[dict[str, Any]]:
    """Running jobs first (by start), then waiting ones in the order the queue walks them."""
    running: list[Mapping[str, Any]] = []
    waiting: list[Mapping[str, Any]] = []
    done: list[Mapping[str, Any]] = []
    for fj in fluxjobs:
        phase = (fj.get("status") or {}).get("phase") or "Provisional"
        (running if phase == "Running" else waiting if phase in WAITING else done).append(fj)
    running.sort(key=lambda f: ((f.get("status") or {}).get("startTime") or "", name_of(f)))
    waiting.sort(key=queue_key)
    done.sort(key=lambda f: ((f.get("status") or {}).get("endTime") or "", name_of(f)))
    order = running + waiting + (done if include_finished else [])
    rows = []
    for position, fj in enumerate(order, 1):
        spec, st, md = fj.get("spec") or {}, fj.get("status") or {}, fj.get("metadata") or {}
        phase = st.get("phase") or "Provisional"
        sets = pod_sets(fj)
        expected = parse_time(st.get("expectedStart"))
        started = parse_time(st.get("startTime"))
        rows.append(
            {
                "position": position,
                "namespace": md.get("namespace", ""),
                "name": md.get("name", ""),
                "state": phase,
                "size": spec.get("size"),
                # a multi-role workload's pod sets (status.podSets), e.g. "launcher 1, worker 8"
                "podSets": ", ".join(f"{ps['name']} {ps['count']}" for ps in sets if ps["name"]),
                # per pod; each pod set at its own shape, e.g. "launcher 1c,1Gi; worker 4c,4Gi"
                "request": "; ".join(f"{ps['name'] + ' ' if ps['name'] else ''}{fmt_request(ps['request'])}"
                                     for ps in sets),
                "podSetRequests": [{"name": ps["name"], "count": ps["count"], "request": ps["request"]}
                                   for ps in sets if ps["name"]],
                "priority": spec.get("priority") or 0,
                "duration": spec.get("duration") or 0,
                "jobid": st.get("jobid"),
                "submitted": st.get("submitTime") or md.get("creationTimestamp"),
                "expectedStart": st.get("expectedStart"),
                "startTime": st.get("startTime"),
                "start": relative(started, now)
                if phase == "Running"
                else relative(expected, now),
                "nodes": st.get("nodeList") or ",".join(sorted(set(st.get("nodes") or []))),
                "reason": st.get("reason") or "",
            }
        )
    return rows




def queue_cmd(
    kubeconfig: KubeconfigOpt = None,
    context: ContextOpt = None,
    namespace: NamespaceOpt = None,
    all_namespaces: AllNsOpt = False,
    include_finished: Annotated[
        bool, typer.Option("--all", help="Also list finished jobs.")
    ] = False,
    output: OutputOpt = Output.table,
) -> None:
    """Waiting and running FluxJobs in scheduling order: state, size, expected start, reason."""
    conn = Conn(kubeconfig, context, namespace)
    try:
        view = fetch(conn, fluxjobs="" if all_namespaces else conn.resolved_namespace())
    except CtlError as exc:
        raise fail(exc) from None
    rows = queue_rows(view.fluxjobs, datetime.now(UTC), include_finished)
    where = "all namespaces" if all_namespaces else f"namespace {conn.resolved_namespace()}"
    tbl = table(
        f"fluxnetes queue ({where}): {sum(r['state'] == 'Running' for r in rows)} running, "
        f"{sum(r['state'] in WAITING for r in rows)} waiting",
        ["#", "JOB", "STATE", "SIZE", "PER POD", "PRIO", "START", "NODES", "REASON"],
        (
            [
                r["position"],
                f"{r['namespace']}/{r['name']}" if all_namespaces else r["name"],
                r["state"],
                f"{r['size']} ({r['podSets']})" if r["podSets"] else r["size"],
                r["request"],
                r["priority"],
                r["start"],
                r["nodes"],
                r["reason"],
            ]
            for r in rows
        ),
    )
    emit(rows, output, tbl)


def register(ctl: typer.Typer) -> None:
    ctl.command("queue")(queue_cmd)
