"""`kubectl fluxnetes queue`: waiting and running FluxJobs, in scheduling order, and running
groups that have no FluxJob (the operator's default, ``--fluxjobs waiting``: a group placed
at once gets none), read from their pods; with ``--all``, finished ones of both kinds."""

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
    api,
    emit,
    fail,
    fetch,
    fluxjob_keys,
    fmt_request,
    name_of,
    parse_time,
    placed_group,
    pod_sets,
    queue_key,
    relative,
    table,
)
from fluxnetes.cli.ctl.unrecorded import FINISHED, state_of


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


def unrecorded_rows(
    pods: Iterable[Mapping[str, Any]], fluxjobs: Iterable[Mapping[str, Any]], namespace: str | None,
    finished: bool = False,
) -> list[dict[str, Any]]:
    """Groups running with no FluxJob (``--fluxjobs waiting`` gives none to a group placed at
    once): their bound, unfinished pods name the group they were placed for (the
    ``fluxnetes.io/fluxjob`` annotation). One row per group, marked ``fluxJob: False``; its
    size is the pods seen, its request what one of them asks. ``namespace``: None for all.
    ``finished``: instead, the groups whose bound pods have all finished (Completed, or Failed
    when one failed), from ``pods`` that include finished ones."""
    from fluxnetes.k8s.resources import GPU, ResourceError, pod_request

    known = fluxjob_keys(fluxjobs)
    groups: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for p in pods:
        key = placed_group(p)
        if key is None or key in known or (namespace is not None and key[0] != namespace):
            continue
        if not (p.get("spec") or {}).get("nodeName"):
            continue
        if not finished and (p.get("status") or {}).get("phase") in FINISHED:
            continue
        groups.setdefault(key, []).append(p)
    rows = []
    for (ns, name), members in sorted(groups.items(), key=lambda kv: (_first_start(kv[1]), kv[0])):
        state = state_of(members)
        if (state != "Running") != finished:
            continue  # (finished: a group with a pod still running is listed as running)
        try:
            r = pod_request(members[0].get("spec") or {})
            request = fmt_request({"cpu": r.cpu_millis, "memory": r.memory_bytes, GPU: r.gpus, **r.extended})
        except ResourceError:
            request = "?"  # (a request the operator would have refused; it placed the pod all the same)
        rows.append({
            "namespace": ns, "name": name, "state": state, "fluxJob": False, "size": len(members),
            "podSets": "", "podSetRequests": [],
            "request": request,
            "priority": "", "duration": "", "jobid": None, "submitted": None, "expectedStart": None,
            "startTime": _first_start(members) or None,
            "nodes": ",".join(sorted({str((p.get("spec") or {}).get("nodeName")) for p in members})),
            "reason": ("started at once: no FluxJob (--fluxjobs waiting); shown from its pods" if not finished
                       else "started at once and finished: no FluxJob (--fluxjobs waiting); shown from its pods"),
        })
    return rows


def _first_start(pods: Iterable[Mapping[str, Any]]) -> str:
    return min((str((p.get("status") or {}).get("startTime") or (p.get("metadata") or {}).get("creationTimestamp") or "")
                for p in pods), default="")


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
        view = fetch(conn, pods=True, fluxjobs="" if all_namespaces else conn.resolved_namespace())
    except CtlError as exc:
        raise fail(exc) from None
    now = datetime.now(UTC)
    rows = queue_rows(view.fluxjobs, now, include_finished)
    # running groups without a FluxJob (--fluxjobs waiting) come after the ones with one
    extra = unrecorded_rows(view.pods, view.fluxjobs, None if all_namespaces else conn.resolved_namespace())
    for r in extra:
        r["start"] = relative(parse_time(r["startTime"]), now)
    running = sum(r["state"] == "Running" for r in rows)
    rows = rows[:running] + extra + rows[running:]
    if include_finished:
        # finished groups without a FluxJob: their finished pods (the view holds unfinished ones)
        ns = None if all_namespaces else conn.resolved_namespace()
        try:
            listed = api(conn, "GET", f"/api/v1/namespaces/{ns}/pods" if ns else "/api/v1/pods")
        except CtlError as exc:
            raise fail(exc) from None
        done = unrecorded_rows(listed.get("items") or [], view.fluxjobs, ns, finished=True)
        for r in done:
            r["start"] = relative(parse_time(r["startTime"]), now)
        rows += done
    for position, r in enumerate(rows, 1):
        r["position"] = position
    where = "all namespaces" if all_namespaces else f"namespace {conn.resolved_namespace()}"
    tbl = table(
        f"fluxnetes queue ({where}): {sum(r['state'] == 'Running' for r in rows)} running, "
        f"{sum(r['state'] in WAITING for r in rows)} waiting",
        ["#", "JOB", "STATE", "SIZE", "PER POD", "PRIO", "START", "NODES", "REASON"],
        (
            [
                r["position"],
                f"{r['namespace']}/{r['name']}" if all_namespaces else r["name"],
                r["state"] if r.get("fluxJob", True) else f"{r['state']} (no FluxJob)",
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
