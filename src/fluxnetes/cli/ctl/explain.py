"""`kubectl fluxnetes explain JOB`: why a job waits, behind what, and its history."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Annotated, Any

import typer

from fluxnetes.cli.ctl.common import (
    GPU,
    WAITING,
    ClusterView,
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
    fmt_pod_sets,
    fmt_request,
    name_of,
    parse_time,
    pod_sets,
    queue_key,
    relative,
    split_job,
    table,
)
from fluxnetes.cli.ctl.nodes import node_rows
from fluxnetes.cli.ctl.unrecorded import (
    explain_unrecorded,
    group_pods,
    groups_of_workload,
    print_unrecorded,
)


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
    sets = pod_sets(fj)  # each pod set at its own shape (an MPIJob: a small launcher, big workers)
    size = int(spec.get("size") or 0) or sum(ps["count"] for ps in sets)
    out: dict[str, Any] = {
        "job": name_of(fj),
        "state": phase,
        "reason": st.get("reason") or "",
        "size": size,
        "perPod": "; ".join(f"{ps['name'] + ' ' if ps['name'] else ''}{fmt_request(ps['request'])}" for ps in sets),
        "shape": fmt_pod_sets(sets),
        "duration": spec.get("duration") or 0,
        "priority": spec.get("priority") or 0,
        "expectedStart": st.get("expectedStart"),
        "expectedStartIn": relative(parse_time(st.get("expectedStart")), now),
        "nodes": st.get("nodes") or [],
        "podSets": [{**ps, "request": fmt_request(ps["request"])} for ps in sets if ps["name"]],
        "history": history_of(st),
    }
    if phase in WAITING:
        others = [f for f in fluxjobs if name_of(f) != name_of(fj)]
        rows = node_rows(nodes, pods, others)
        shapes = [(ps["count"], _need(ps["request"])) for ps in sets]
        exclusive = bool(spec.get("exclusive"))
        # extended resources (``example.com/fpga``) by their full names: free = allocatable
        # less what the pods bound there ask
        extended = sorted({k for _, need in shapes for k in need if k not in RESOURCES})
        ext_free = _extended_free(nodes, pods, extended) if extended else {}
        free: dict[str, dict[str, int]] = {}
        short: dict[str, int] = {"cores": 0, "memory": 0, "gpus": 0, **dict.fromkeys(extended, 0), "down": 0}
        for r in rows:
            if r["status"] == "down":
                short["down"] += 1
                continue
            if exclusive and (r["fluxnetesPods"] or r["foreignPods"]):
                continue
            free[r["node"]] = {res: max(0, r[f"{res}Free"]) for res in RESOURCES} | ext_free.get(r["node"], {})
        fits, missing = gang_room(shapes, free, exclusive)
        for res, n in missing.items():
            short[res] += n
        placeable = sum(fits.values())
        capacity_ok = could_ever_fit(shapes, size, exclusive, nodes)
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


RESOURCES = ("cores", "memory", "gpus")


def _need(req: Mapping[str, int]) -> dict[str, int]:
    """What one pod takes, as the nodes view counts it (whole cores, bytes, GPUs), and any
    other extended resource by its full name."""
    need = {"cores": cores(req.get("cpu", 0)), "memory": req.get("memory", 0), "gpus": req.get(GPU, 0)}
    return need | {k: v for k, v in req.items() if k not in ("cpu", "memory", GPU) and v > 0}


def _allocatable(node: Mapping[str, Any]) -> dict[str, int] | None:
    """A node's room as explain counts it (None: its allocatable does not parse)."""
    from fluxnetes.k8s.resources import ResourceError, node_allocatable

    try:
        a = node_allocatable(node)
    except ResourceError:
        return None
    return {"cores": a.cpu_millis // 1000, "memory": a.memory_bytes, "gpus": a.gpus, **a.extended}


def _extended_free(nodes: Sequence[Mapping[str, Any]], pods: Sequence[Mapping[str, Any]],
                   names: Sequence[str]) -> dict[str, dict[str, int]]:
    """Per node, the free amount of each extended resource in ``names``."""
    from fluxnetes.k8s.resources import ResourceError, pod_request

    free: dict[str, dict[str, int]] = {}
    for node in nodes:
        cap = _allocatable(node) or {}
        free[str((node.get("metadata") or {}).get("name", ""))] = {k: cap.get(k, 0) for k in names}
    for pod in pods:
        where = (pod.get("spec") or {}).get("nodeName")
        if not where or where not in free or (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue
        try:
            asked = pod_request(pod.get("spec") or {}).extended
        except ResourceError:
            continue
        for k in names:
            free[where][k] -= int(asked.get(k, 0))
    return free


def gang_room(
    shapes: Sequence[tuple[int, Mapping[str, int]]], free: Mapping[str, Mapping[str, int]], exclusive: bool
) -> tuple[dict[str, int], dict[str, int]]:
    """How many of the gang's pods the ``free`` room (per node) takes now, each pod set at
    its own shape: the largest shape first, nodes filled in name order (an estimate: the
    matcher may pack otherwise). Returns the pods placed per node and, for the first pod
    that finds no room, the number of nodes short of each resource for it."""
    left = {n: dict(v) for n, v in free.items()}
    placed: dict[str, int] = {}
    missing: dict[str, int] = {}
    for count, need in sorted(shapes, key=lambda s: tuple(-s[1].get(r, 0) for r in RESOURCES)):
        todo = count
        for node in sorted(left):
            if todo <= 0:
                break
            if exclusive and placed.get(node):
                continue  # one pod per node, whole nodes
            room = [left[node].get(r, 0) // v for r, v in need.items() if v > 0]
            n = min(todo, min(room) if room else todo, 1 if exclusive else todo)
            if n > 0:
                for r, v in need.items():
                    left[node][r] = left[node].get(r, 0) - v * n
                placed[node] = placed.get(node, 0) + n
                todo -= n
        if todo > 0 and not missing:
            missing = {r: sum(1 for n in left.values() if n.get(r, 0) < v) for r, v in need.items() if v > 0}
    return placed, missing


def history_of(st: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every phase the job entered, oldest first: ``status.history`` (a phase entered again
    is a new entry), else, for a status written before the operator kept it, the
    conditions (one per phase, its latest entry) in time order."""
    entries = [h for h in st.get("history") or [] if isinstance(h, Mapping)]
    if entries:
        rows = [{"time": h.get("time"), "state": h.get("phase"), "message": h.get("message") or ""}
                for h in entries]
    else:
        rows = [{"time": c.get("lastTransitionTime"), "state": c.get("type"),
                 "message": c.get("message") or c.get("reason") or ""}
                for c in st.get("conditions") or [] if isinstance(c, Mapping)]
    # stable: entries of one second keep the order they were written in
    return sorted(rows, key=lambda h: str(h["time"] or ""))


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
    job_cores = sum(ps["count"] * max(1, cores(ps["request"].get("cpu", 0))) for ps in pod_sets(fj))
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
    shapes: Sequence[tuple[int, Mapping[str, int]]], size: int, exclusive: bool, nodes: Sequence[Mapping[str, Any]]
) -> bool:
    """Would the whole gang fit on the empty nodes (each pod set at its own shape)?"""
    caps: dict[str, dict[str, int]] = {}
    for node in nodes:
        cap = _allocatable(node)
        if cap is not None:
            caps[str((node.get("metadata") or {}).get("name", ""))] = cap
    placed, _ = gang_room(shapes, caps, exclusive)
    return sum(placed.values()) >= size


# -- output ------------------------------------------------------------------------------------


def resolve(conn: Conn, view: ClusterView, ns: str, name: str
            ) -> tuple[str, dict[str, Any] | None, list[Mapping[str, Any]]]:
    """What ``explain NAME`` is about: (group name, its FluxJob, or None and its pods). A
    group placed at once under ``--fluxjobs waiting`` (the operator's default) has no FluxJob:
    its running pods, or, once it finished (``view`` holds unfinished pods only), its finished
    ones. NAME may also be the workload's own name (Job ``quick``: group ``job-quick``).
    CtlError when nothing answers to NAME."""
    try:
        return name, find_fluxjob(view, ns, name), []
    except CtlError as exc:
        missing = exc
    members = group_pods(view.pods, ns, name)
    if members:
        return name, None, members
    listed = (_optional(conn, f"/api/v1/namespaces/{ns}/pods") or {}).get("items") or []
    members = group_pods(listed, ns, name, include_finished=True)
    if members:
        return name, None, members
    named = sorted(groups_of_workload(listed, ns, name))
    if len(named) > 1:
        raise CtlError(f"{missing}; the pods of workload {name} were placed for several groups: "
                       f"{', '.join(named)} (name one)")
    if named:
        group = named[0]
        for fj in view.fluxjobs:
            md = fj.get("metadata") or {}
            if md.get("namespace") == ns and md.get("name") == group:
                return group, fj, []
        return group, None, group_pods(view.pods, ns, group) or group_pods(listed, ns, group, include_finished=True)
    raise CtlError(f"{missing}; nor a group of that name without a FluxJob (no pod was placed for it), "
                   "nor a workload of that name with placed pods")


def explain_cmd(
    job: Annotated[str, typer.Argument(help="FluxJob NAME or NAMESPACE/NAME, a group without a FluxJob (placed at once), or the name of the workload (Job, ReplicaSet, pod, ...) of either.")],
    kubeconfig: KubeconfigOpt = None,
    context: ContextOpt = None,
    namespace: NamespaceOpt = None,
    output: OutputOpt = Output.table,
) -> None:
    """Why JOB waits: the short resource, the reservations ahead of it, its decision history.

    A group without a FluxJob (the operator's default, --fluxjobs waiting, gives none to a
    group placed at once that completes) is explained from its pods, running or finished: its
    state, nodes, share of each, workload. JOB may also name the workload (a Job `quick`
    for its group `job-quick`)."""
    conn = Conn(kubeconfig, context, namespace)
    now = datetime.now(UTC)
    try:
        ns, name = split_job(job, conn)
        view = fetch(conn, nodes=True, pods=True, fluxjobs="")
    except CtlError as exc:
        raise fail(exc) from None
    try:
        name, fj, members = resolve(conn, view, ns, name)
    except CtlError as exc:
        raise fail(exc) from None
    if fj is None:
        info = explain_unrecorded(ns, name, members, now)
        if output is Output.table:
            print_unrecorded(info, console())
        else:
            emit(info, output)
        return
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
        f"[bold]{info['job']}[/]: {info['state']}  size {info['size']}"
        + (f": {info['shape']}" if info["podSets"] else f" x ({info['perPod']})")
        + f"  priority {info['priority']}  duration {duration}"
    )
    if info["reason"]:
        out.print(f"reason: {info['reason']}")
    if info.get("expectedStart"):
        out.print(f"expected start: {info['expectedStart']} ({info['expectedStartIn']})")
    if info["nodes"]:
        out.print(f"nodes: {', '.join(info['nodes'])}")
    for ps in info["podSets"]:
        where = f": {', '.join(ps['nodes'])}" if ps["nodes"] else ""
        out.print(f"pod set {ps['name']} ({ps['count']} pods, {ps['request']} each){where}")
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
