"""`kubectl fluxnetes explain JOB`: why a job waits, behind what, and its history."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Annotated, Any

import typer

from fluxnetes.cli.ctl.common import (
    GPU,
    WAITING,
    Conn,
    ContextOpt,
    CtlError,
    KubeconfigOpt,
    NamespaceOpt,
    Output,
    OutputOpt,
    console,
    cores,
    emit,
    fail,
    fetch,
    find_fluxjob,
    fmt_request,
    name_of,
    parse_time,
    queue_key,
    relative,
    request_of,
    split_job,
    table,
)
from fluxnetes.cli.ctl.nodes import node_rows


def explain_job(
    fj: Mapping[str, Any],
    nodes: Sequence[Mapping[str, Any]],
    pods: Sequence[Mapping[str, Any]],
    fluxjobs: Sequence[Mapping[str, Any]],
    now: datetime,
) -> dict[str, Any]:
    """Why a job waits: its state and reason as the operator wrote them, which resource is
    short now (from the nodes' free room), and the jobs ahead of it in the queue."""
    spec, st = fj.get("spec") or {}, fj.get("status") or {}
    phase = st.get("phase") or "Provisional"
    size = int(spec.get("size") or 1)
    req = request_of(fj)
    out: dict[str, Any] = {
        "job": name_of(fj),
        "state": phase,
        "reason": st.get("reason") or "",
        "size": size,
        "perPod": fmt_request(req),
        "duration": spec.get("duration") or 0,
        "priority": spec.get("priority") or 0,
        "expectedStart": st.get("expectedStart"),
        "expectedStartIn": relative(parse_time(st.get("expectedStart")), now),
        "nodes": st.get("nodes") or [],
        "history": [
            {
                "time": c.get("lastTransitionTime"),
                "state": c.get("type"),
                "message": c.get("message") or c.get("reason") or "",
            }
            for c in st.get("conditions") or []
        ],
    }
    if phase in WAITING:
        others = [f for f in fluxjobs if name_of(f) != name_of(fj)]
        rows = node_rows(nodes, pods, others)
        need = {
            "cores": cores(req.get("cpu", 0)),
            "memory": req.get("memory", 0),
            "gpus": req.get(GPU, 0),
        }
        exclusive = bool(spec.get("exclusive"))
        fits: dict[str, int] = {}
        short: dict[str, int] = {"cores": 0, "memory": 0, "gpus": 0, "down": 0}
        for r in rows:
            if r["status"] == "down":
                short["down"] += 1
                continue
            if exclusive and (r["fluxnetesPods"] or r["foreignPods"]):
                continue
            room = []
            for res in ("cores", "memory", "gpus"):
                free = r[f"{res}Free"] if res != "memory" else r["memoryFree"]
                if need[res] > 0:
                    slots = max(0, free) // need[res]
                    if slots == 0:
                        short[res] += 1
                    room.append(slots)
            n = min(room) if room else 0
            if exclusive:
                n = min(n, 1)
            if n > 0:
                fits[r["node"]] = n
        placeable = sum(fits.values())
        capacity_ok = could_ever_fit(need, size, exclusive, nodes)
        if not capacity_ok:
            out["short"] = "the cluster as a whole is too small for this job (Unsatisfiable)"
        elif placeable >= size:
            out["short"] = "nothing now: the free room fits it; it waits for its turn in the queue"
        else:
            limiting = [
                k for k, v in sorted(short.items(), key=lambda kv: -kv[1]) if v and k != "down"
            ]
            out["short"] = (
                f"room for {placeable} of {size} pod(s) now"
                + (
                    "; short of " + ", ".join(f"{k} on {short[k]} node(s)" for k in limiting)
                    if limiting
                    else ""
                )
                + (f"; {short['down']} node(s) down or cordoned" if short["down"] else "")
            )
        out["roomNow"] = fits
        mine = queue_key(fj)
        ahead = [
            f
            for f in others
            if (f.get("status") or {}).get("phase") in WAITING and queue_key(f) < mine
        ]
        out["ahead"] = [
            {
                "job": name_of(f),
                "state": (f.get("status") or {}).get("phase"),
                "size": (f.get("spec") or {}).get("size"),
                "expectedStart": (f.get("status") or {}).get("expectedStart"),
            }
            for f in sorted(ahead, key=queue_key)
        ]
        reserved = [a for a in out["ahead"] if a["state"] == "Reserved"]
        out["waitsBehind"] = [a["job"] for a in reserved]
        running = [f for f in others if (f.get("status") or {}).get("phase") == "Running"]
        ends = []
        for f in running:
            start = parse_time((f.get("status") or {}).get("startTime"))
            dur = int((f.get("spec") or {}).get("duration") or 0)
            if start and dur:
                ends.append((start.timestamp() + dur, name_of(f)))
        out["runningEnds"] = [
            {
                "job": name,
                "expectedEnd": datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            }
            for t, name in sorted(ends)
        ]
    return out


def could_ever_fit(
    need: Mapping[str, int], size: int, exclusive: bool, nodes: Sequence[Mapping[str, Any]]
) -> bool:
    from fluxnetes.k8s.resources import ResourceError, node_allocatable

    total = 0
    for node in nodes:
        try:
            a = node_allocatable(node)
        except ResourceError:
            continue
        caps = {"cores": a.cpu_millis // 1000, "memory": a.memory_bytes, "gpus": a.gpus}
        slots = [caps[k] // v for k, v in need.items() if v > 0]
        n = min(slots) if slots else size
        total += min(n, 1) if exclusive else n
    return total >= size


# -- output ------------------------------------------------------------------------------------


def explain_cmd(
    job: Annotated[str, typer.Argument(help="FluxJob NAME or NAMESPACE/NAME.")],
    kubeconfig: KubeconfigOpt = None,
    context: ContextOpt = None,
    namespace: NamespaceOpt = None,
    output: OutputOpt = Output.table,
) -> None:
    """Why JOB waits: the short resource, the reservations ahead of it, its decision history."""
    conn = Conn(kubeconfig, context, namespace)
    try:
        ns, name = split_job(job, conn)
        view = fetch(conn, nodes=True, pods=True, fluxjobs="")
        fj = find_fluxjob(view, ns, name)
    except CtlError as exc:
        raise fail(exc) from None
    info = explain_job(fj, view.nodes, view.pods, view.fluxjobs, datetime.now(UTC))
    if output is not Output.table:
        emit(info, output)
        return
    duration = f"{info['duration']}s" if info["duration"] else "unknown"
    out = console()
    out.print(
        f"[bold]{info['job']}[/]: {info['state']}  size {info['size']} x ({info['perPod']})"
        f"  priority {info['priority']}  duration {duration}"
    )
    if info["reason"]:
        out.print(f"reason: {info['reason']}")
    if info.get("expectedStart"):
        out.print(f"expected start: {info['expectedStart']} ({info['expectedStartIn']})")
    if info["nodes"]:
        out.print(f"nodes: {', '.join(info['nodes'])}")
    if "short" in info:
        out.print(f"short now: {info['short']}")
        if info["waitsBehind"]:
            out.print(f"waits behind reservation(s) of: {', '.join(info['waitsBehind'])}")
        if info["ahead"]:
            out.print(
                table(
                    "ahead in the queue",
                    ["JOB", "STATE", "SIZE", "EXPECTED START"],
                    (
                        [a["job"], a["state"], a["size"], a["expectedStart"] or "-"]
                        for a in info["ahead"]
                    ),
                )
            )
        if info["runningEnds"]:
            out.print(
                table(
                    "running jobs, by expected end",
                    ["JOB", "EXPECTED END"],
                    ([e["job"], e["expectedEnd"]] for e in info["runningEnds"]),
                )
            )
    if info["history"]:
        out.print(
            table(
                "history",
                ["TIME", "STATE", "MESSAGE"],
                ([h["time"], h["state"], h["message"]] for h in info["history"]),
            )
        )


def register(ctl: typer.Typer) -> None:
    ctl.command("explain")(explain_cmd)
