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
        "podSets": pod_sets_of(spec, st.get("nodes") or []),
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


def pod_sets_of(spec: Mapping[str, Any], nodes: Sequence[str]) -> list[dict[str, Any]]:
    """A multi-role workload's pod sets (from the FluxJob's jobspec) and, once allocated, the
    nodes of each set's slots (the status' slot order: set after set)."""
    from fluxnetes.jobspec import parse_jobspec
    from fluxnetes.jobspec.podsets import podsets_of_jobspec

    try:
        sets = podsets_of_jobspec(parse_jobspec(spec.get("jobspec") or ""))
    except Exception:  # no jobspec, or one this version does not read: no pod sets shown
        return []
    out, at = [], 0
    for name, count in sets:
        out.append({"name": name, "count": count, "nodes": list(nodes[at:at + count])})
        at += count
    return out


def priority_factors(
    fj: Mapping[str, Any],
    fluxaccounts: Sequence[Mapping[str, Any]],
    namespace: Mapping[str, Any] | None,
    priority_classes: Sequence[Mapping[str, Any]],
    nodes: Sequence[Mapping[str, Any]],
    now: datetime,
    weights: Mapping[str, float] | None = None,
    max_age: int = 7 * 24 * 3600,
) -> dict[str, Any] | None:
    """The job's multifactor priority as the operator computes it (docs/fairshare.md), from
    what the cluster shows: the account's fair-share factor the operator published in its
    FluxAccount status, the wait since submission, the job's cores over the cluster's, its
    PriorityClass value over the highest one. None when no FluxAccount exists (fair share
    off: the queue order is priority, then submit time). ``heldBy``: the account limit that
    holds the job, as the operator wrote it."""
    from fluxnetes.k8s.fairshare import accounts as acc
    from fluxnetes.k8s.resources import ResourceError, node_allocatable
    from fluxnetes.queue.priority import PriorityBreakdown, PriorityWeights

    if not fluxaccounts:
        return None
    spec, st = fj.get("spec") or {}, fj.get("status") or {}
    ns = str((fj.get("metadata") or {}).get("namespace") or "default")
    w = PriorityWeights(**dict(weights or {}))
    out: dict[str, Any] = {}
    try:
        config = acc.parse_accounts(fluxaccounts, [namespace] if namespace else [])
        leaf = config.account_of_namespace(ns)
    except acc.AccountConfigError as exc:
        leaf = ""
        out["note"] = f"the account configuration is refused ({exc}); the operator keeps its last good one"
    by_name = {str((a.get("metadata") or {}).get("name")): a for a in fluxaccounts}
    published = ((by_name.get(leaf) or {}).get("status") or {}).get("fairShare")
    fairshare = float(published) if isinstance(published, int | float) else 0.0
    if leaf and not isinstance(published, int | float):
        out["note"] = f"account {leaf}: no fair-share factor published yet (counted as 0)"
    submit = parse_time(st.get("submitTime"))
    waited = max(0.0, (now - submit).total_seconds()) if submit else 0.0
    age = min(waited, max_age) / max_age
    total = 0
    for n in nodes:
        try:
            total += node_allocatable(n).cpu_millis // 1000
        except ResourceError:
            continue
    job_cores = int(spec.get("size") or 1) * max(1, cores(request_of(fj).get("cpu", 0)))
    size = min(job_cores / total, 1.0) if total else 0.0
    top = acc.qos_max(acc.priority_classes_of(priority_classes))
    qos = acc.qos_factor(int(spec.get("priority") or 0), top)
    value = w.age * age + w.fairshare * fairshare + w.job_size * size + w.qos * qos
    b = PriorityBreakdown(name_of(fj), leaf, value, age, fairshare, size, qos, w, out.get("note", ""))
    reason = str(st.get("reason") or "")
    out.update({
        "account": leaf, "priority": round(value, 1), "age": round(age, 6), "fairshare": round(fairshare, 6),
        "jobSize": round(size, 6), "qos": round(qos, 6),
        "weights": {"age": w.age, "fairshare": w.fairshare, "job_size": w.job_size, "qos": w.qos},
        "line": b.explain(),
        "heldBy": reason.removeprefix("held: ") if reason.startswith("held: ") else None,
    })
    return out


def _optional(conn: Conn, path: str) -> Any:
    """GET ``path``; None when it cannot be read (not installed, not allowed, the API server
    busy): what it adds to ``explain`` is optional."""
    from fluxnetes.cli.ctl.common import api

    try:
        return api(conn, "GET", path)
    except CtlError:
        return None


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
    now = datetime.now(UTC)
    info = explain_job(fj, view.nodes, view.pods, view.fluxjobs, now)
    factors = None
    if info["state"] in WAITING:
        accounts = (_optional(conn, "/apis/fluxnetes.io/v1alpha1/fluxaccounts") or {}).get("items") or []
        if accounts:
            ns_obj = _optional(conn, f"/api/v1/namespaces/{ns}")
            classes = (_optional(conn, "/apis/scheduling.k8s.io/v1/priorityclasses") or {}).get("items") or []
            factors = priority_factors(fj, accounts, ns_obj, classes, view.nodes, now)
    if factors is not None:
        info["priorityFactors"] = factors
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
    for ps in info["podSets"]:
        where = f": {', '.join(ps['nodes'])}" if ps["nodes"] else ""
        out.print(f"pod set {ps['name']} ({ps['count']} pods){where}")
    pf = info.get("priorityFactors")
    if pf is not None:
        out.print(f"fair share: {pf['line']} (default weights unless the operator runs with --fairshare-weights)")
        if pf.get("heldBy"):
            out.print(f"held by an account limit: {pf['heldBy']}")
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
