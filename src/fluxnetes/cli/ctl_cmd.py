"""`fluxnetes ctl` (also the `kubectl fluxnetes` plugin): look at and steer the queue.

    kubectl fluxnetes queue [-A]          waiting and running FluxJobs, in scheduling order
    kubectl fluxnetes nodes               per-node use as the scheduler sees it
    kubectl fluxnetes explain JOB         why a job waits (short resource, reservation ahead)
    kubectl fluxnetes graph [-f out.json] the current resource graph, as JGF
    kubectl fluxnetes cancel JOB          cancel a job, queued or running

Everything is computed from what the API server holds (Nodes, pods bound to nodes, FluxJob
objects), so it works from any machine with a kubeconfig and needs no port to the operator.
The pure functions (``queue_rows``, ``node_rows``, ``explain_job``) take plain dicts so they
can be tested without a cluster.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer

# FluxJob phases (fluxnetes.k8s.fluxjob.Phase), spelled here to keep `--help` import-light
WAITING = ("Provisional", "Pending", "Reserved")
ACTIVE = ("Running", *WAITING)
FINAL = ("Completed", "Failed", "Cancelled", "Unsatisfiable")
GPU = "nvidia.com/gpu"
MIB = 1024 * 1024
ANN_FLUXJOB = "fluxnetes.io/fluxjob"
LABEL_MANAGED = "fluxnetes.io/managed"


class Output(StrEnum):
    table = "table"
    json = "json"
    yaml = "yaml"


class CtlError(Exception):
    """A problem the user can fix (bad job name, no access, no cluster); printed, exit 1."""


# -- options shared by every command ---------------------------------------------------------

KubeconfigOpt = Annotated[
    Path | None,
    typer.Option(
        "--kubeconfig",
        envvar="KUBECONFIG",
        help="Kubeconfig file (default: $KUBECONFIG, ~/.kube/config, in-cluster).",
    ),
]
ContextOpt = Annotated[str | None, typer.Option("--context", help="Kubeconfig context to use.")]
NamespaceOpt = Annotated[
    str | None,
    typer.Option("--namespace", "-n", help="Namespace (default: the context's, else 'default')."),
]
AllNsOpt = Annotated[bool, typer.Option("--all-namespaces", "-A", help="Every namespace.")]
OutputOpt = Annotated[Output, typer.Option("--output", "-o", help="table, json or yaml.")]


@dataclass
class Conn:
    kubeconfig: Path | None
    context: str | None
    namespace: str | None

    def resolved_namespace(self) -> str:
        return self.namespace or context_namespace(self.kubeconfig, self.context) or "default"


def context_namespace(kubeconfig: Path | None, context: str | None) -> str | None:
    """The namespace set on the kubeconfig context (what kubectl would use)."""
    import os

    import yaml

    paths = (
        [kubeconfig]
        if kubeconfig
        else [Path(p) for p in os.environ.get("KUBECONFIG", "").split(os.pathsep) if p]
        or [Path.home() / ".kube" / "config"]
    )
    for path in paths:
        try:
            cfg = yaml.safe_load(path.read_text()) or {}
        except (OSError, yaml.YAMLError):
            continue
        name = context or cfg.get("current-context")
        for ctx in cfg.get("contexts") or []:
            if ctx.get("name") == name:
                ns = (ctx.get("context") or {}).get("namespace")
                return str(ns) if ns else None
    return None


# -- reading the cluster -----------------------------------------------------------------------


@dataclass
class ClusterView:
    nodes: list[dict[str, Any]] = field(default_factory=list)
    pods: list[dict[str, Any]] = field(default_factory=list)  # bound to a node, not finished
    fluxjobs: list[dict[str, Any]] = field(default_factory=list)


def fetch(
    conn: Conn, *, nodes: bool = False, pods: bool = False, fluxjobs: str | None = None
) -> ClusterView:
    """Read what a command needs. ``fluxjobs``: a namespace, "" for all, None for none."""
    import asyncio

    async def go() -> ClusterView:
        from fluxnetes.k8s.kube import FLUXJOBS, NODES, PODS, ApiError, Kube

        try:
            kube = await Kube.from_config(
                str(conn.kubeconfig) if conn.kubeconfig else None, conn.context, concurrency=8
            )
        except Exception as exc:  # kubeconfig missing/unreadable, unknown context, ...
            raise CtlError(f"cannot load the Kubernetes configuration: {exc}") from None
        view = ClusterView()
        try:
            if nodes:
                view.nodes, _ = await kube.list(NODES)
            if pods:
                view.pods, _ = await kube.list(
                    PODS,
                    field_selector="spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed",
                )
            if fluxjobs is not None:
                view.fluxjobs, _ = await kube.list(FLUXJOBS, fluxjobs or None)
        except ApiError as exc:
            if exc.status == 404 and "fluxjobs" in str(exc):
                raise CtlError(
                    "the FluxJob resource is not installed in this cluster "
                    "(install fluxnetes: kubectl apply --server-side -f dist/fluxnetes.yaml)"
                ) from None
            raise CtlError(str(exc)) from None
        except OSError as exc:
            raise CtlError(f"cannot reach the API server: {exc}") from None
        finally:
            await kube.close()
        return view

    return asyncio.run(go())


def _api(
    conn: Conn,
    method: str,
    path: str,
    body: Any = None,
    content_type: str = "application/merge-patch+json",
) -> Any:
    import asyncio

    async def go() -> Any:
        from fluxnetes.k8s.kube import ApiError, Kube

        try:
            kube = await Kube.from_config(
                str(conn.kubeconfig) if conn.kubeconfig else None, conn.context, concurrency=2
            )
        except Exception as exc:
            raise CtlError(f"cannot load the Kubernetes configuration: {exc}") from None
        try:
            return await kube.request(method, path, body, content_type=content_type)
        except ApiError as exc:
            raise CtlError(str(exc)) from exc
        except OSError as exc:
            raise CtlError(f"cannot reach the API server: {exc}") from None
        finally:
            await kube.close()

    return asyncio.run(go())


# -- small helpers -----------------------------------------------------------------------------


def _parse_time(text: Any) -> datetime | None:
    if not isinstance(text, str) or not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None


def _relative(when: datetime | None, now: datetime) -> str:
    if when is None:
        return "-"
    secs = int((when - now).total_seconds())
    sign, secs = ("in ", secs) if secs >= 0 else ("", -secs)
    if secs < 90:
        text = f"{secs}s"
    elif secs < 90 * 60:
        text = f"{secs // 60}m"
    elif secs < 48 * 3600:
        text = f"{secs // 3600}h{(secs % 3600) // 60:02d}m"
    else:
        text = f"{secs // 86400}d{(secs % 86400) // 3600}h"
    return f"{sign}{text}" if sign else f"{text} ago"


def _name(obj: Mapping[str, Any]) -> str:
    md = obj.get("metadata") or {}
    return f"{md.get('namespace', '')}/{md.get('name', '')}"


def _request(fj: Mapping[str, Any]) -> dict[str, int]:
    req = (fj.get("spec") or {}).get("request") or {}
    return {str(k): int(v) for k, v in req.items() if isinstance(v, int | float)}


def _fmt_request(req: Mapping[str, int]) -> str:
    parts = []
    if req.get("cpu"):
        parts.append(f"{_cores(req['cpu'])}c")
    if req.get("memory"):
        parts.append(_fmt_bytes(req["memory"]))
    if req.get(GPU):
        parts.append(f"{req[GPU]}gpu")
    for k, v in sorted(req.items()):
        if k not in ("cpu", "memory", GPU) and v:
            parts.append(f"{v} {k}")
    return ",".join(parts) or "-"


def _cores(cpu_millis: int) -> int:
    """Whole cores the scheduler books for a cpu request (at least one per pod)."""
    return max(1, math.ceil(cpu_millis / 1000)) if cpu_millis > 0 else 0


def _fmt_bytes(n: int) -> str:
    gib = n / (1024 * MIB)
    if gib >= 1:
        return f"{gib:.4g}Gi"
    return f"{math.ceil(n / MIB)}Mi"


def queue_key(fj: Mapping[str, Any]) -> tuple[Any, ...]:
    """Scheduling order: priority (higher first), then submit time, then job id / name."""
    spec, st, md = fj.get("spec") or {}, fj.get("status") or {}, fj.get("metadata") or {}
    submitted = st.get("submitTime") or md.get("creationTimestamp") or ""
    jobid = st.get("jobid")
    return (
        -int(spec.get("priority") or 0),
        submitted,
        jobid if isinstance(jobid, int) else 2**62,
        _name(fj),
    )


# -- queue -------------------------------------------------------------------------------------


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
    running.sort(key=lambda f: ((f.get("status") or {}).get("startTime") or "", _name(f)))
    waiting.sort(key=queue_key)
    done.sort(key=lambda f: ((f.get("status") or {}).get("endTime") or "", _name(f)))
    order = running + waiting + (done if include_finished else [])
    rows = []
    for position, fj in enumerate(order, 1):
        spec, st, md = fj.get("spec") or {}, fj.get("status") or {}, fj.get("metadata") or {}
        phase = st.get("phase") or "Provisional"
        expected = _parse_time(st.get("expectedStart"))
        started = _parse_time(st.get("startTime"))
        rows.append(
            {
                "position": position,
                "namespace": md.get("namespace", ""),
                "name": md.get("name", ""),
                "state": phase,
                "size": spec.get("size"),
                "request": _fmt_request(_request(fj)),
                "priority": spec.get("priority") or 0,
                "duration": spec.get("duration") or 0,
                "jobid": st.get("jobid"),
                "submitted": st.get("submitTime") or md.get("creationTimestamp"),
                "expectedStart": st.get("expectedStart"),
                "startTime": st.get("startTime"),
                "start": _relative(started, now)
                if phase == "Running"
                else _relative(expected, now),
                "nodes": st.get("nodeList") or ",".join(sorted(set(st.get("nodes") or []))),
                "reason": st.get("reason") or "",
            }
        )
    return rows


# -- nodes -------------------------------------------------------------------------------------


@dataclass
class _Use:
    cpu: int = 0  # whole cores (scheduler's view)
    memory: int = 0  # bytes
    gpus: int = 0
    pods: int = 0

    def add(self, req: Mapping[str, int], times: int = 1) -> None:
        self.cpu += _cores(req.get("cpu", 0)) * times
        self.memory += req.get("memory", 0) * times
        self.gpus += req.get(GPU, 0) * times
        self.pods += times


def _pod_request(pod: Mapping[str, Any]) -> dict[str, int]:
    from fluxnetes.k8s.resources import ResourceError, pod_request

    try:
        return pod_request(pod.get("spec") or {}).as_dict()
    except ResourceError:
        return {}


def _is_fluxnetes_pod(pod: Mapping[str, Any]) -> bool:
    md = pod.get("metadata") or {}
    return (
        ANN_FLUXJOB in (md.get("annotations") or {})
        or (md.get("labels") or {}).get(LABEL_MANAGED) == "true"
    )


def node_rows(
    nodes: Sequence[Mapping[str, Any]],
    pods: Sequence[Mapping[str, Any]],
    fluxjobs: Sequence[Mapping[str, Any]],
) -> list[dict[str, Any]]:
    """Per node: allocatable, what fluxnetes' Running FluxJobs hold there, what foreign pods
    hold, what is free, and whether the FluxJobs agree with the fluxnetes pods bound there."""
    from fluxnetes.graph.builders import node_is_down
    from fluxnetes.k8s.resources import ResourceError, node_allocatable

    planned: dict[str, _Use] = {}
    for fj in fluxjobs:
        st = fj.get("status") or {}
        if st.get("phase") != "Running":
            continue
        req = _request(fj)
        for node in st.get("nodes") or []:
            planned.setdefault(node, _Use()).add(req)
    bound: dict[str, _Use] = {}
    foreign: dict[str, _Use] = {}
    for pod in pods:
        node = (pod.get("spec") or {}).get("nodeName")
        if not node or (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue
        target = bound if _is_fluxnetes_pod(pod) else foreign
        target.setdefault(node, _Use()).add(_pod_request(pod))
    rows = []
    for node in sorted(nodes, key=lambda n: (n.get("metadata") or {}).get("name", "")):
        name = (node.get("metadata") or {}).get("name", "")
        try:
            alloc = node_allocatable(node)
        except ResourceError:
            alloc = None
        cores = (alloc.cpu_millis // 1000) if alloc else 0
        memory = alloc.memory_bytes if alloc else 0
        gpus = alloc.gpus if alloc else 0
        mine, theirs, seen = (
            planned.get(name, _Use()),
            foreign.get(name, _Use()),
            bound.get(name, _Use()),
        )
        if (mine.pods, mine.cpu, mine.gpus) == (seen.pods, seen.cpu, seen.gpus):
            agrees = "yes"
        else:
            agrees = (
                f"no: FluxJobs place {mine.pods} pod(s) here ({mine.cpu} cores, {mine.gpus} gpus), "
                f"{seen.pods} bound ({seen.cpu} cores, {seen.gpus} gpus)"
            )
        rows.append(
            {
                "node": name,
                "status": "down" if node_is_down(dict(node)) else "up",
                "cores": cores,
                "coresUsed": mine.cpu,
                "coresForeign": theirs.cpu,
                "coresFree": cores - mine.cpu - theirs.cpu,
                "memory": memory,
                "memoryUsed": mine.memory,
                "memoryForeign": theirs.memory,
                "memoryFree": memory - mine.memory - theirs.memory,
                "gpus": gpus,
                "gpusUsed": mine.gpus,
                "gpusForeign": theirs.gpus,
                "gpusFree": gpus - mine.gpus - theirs.gpus,
                "fluxnetesPods": seen.pods,
                "foreignPods": theirs.pods,
                "agrees": agrees,
            }
        )
    return rows


# -- explain -----------------------------------------------------------------------------------


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
    req = _request(fj)
    out: dict[str, Any] = {
        "job": _name(fj),
        "state": phase,
        "reason": st.get("reason") or "",
        "size": size,
        "perPod": _fmt_request(req),
        "duration": spec.get("duration") or 0,
        "priority": spec.get("priority") or 0,
        "expectedStart": st.get("expectedStart"),
        "expectedStartIn": _relative(_parse_time(st.get("expectedStart")), now),
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
        others = [f for f in fluxjobs if _name(f) != _name(fj)]
        rows = node_rows(nodes, pods, others)
        need = {
            "cores": _cores(req.get("cpu", 0)),
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
        capacity_ok = _could_ever_fit(need, size, exclusive, nodes)
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
                "job": _name(f),
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
            start = _parse_time((f.get("status") or {}).get("startTime"))
            dur = int((f.get("spec") or {}).get("duration") or 0)
            if start and dur:
                ends.append((start.timestamp() + dur, _name(f)))
        out["runningEnds"] = [
            {
                "job": name,
                "expectedEnd": datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            }
            for t, name in sorted(ends)
        ]
    return out


def _could_ever_fit(
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


def emit(data: Any, output: Output, table: Any = None) -> None:
    import json

    import yaml

    if output is Output.json:
        typer.echo(json.dumps(data, indent=2, default=str))
    elif output is Output.yaml:
        typer.echo(yaml.safe_dump(data, sort_keys=False, default_flow_style=False).rstrip())
    else:
        from rich.console import Console

        Console().print(table)


def _table(title: str, columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> Any:
    from rich.table import Table

    t = Table(title=title, title_justify="left", box=None, header_style="bold", pad_edge=False)
    for c in columns:
        t.add_column(c, overflow="fold")
    for r in rows:
        t.add_row(*("" if v is None else str(v) for v in r))
    return t


def _fail(exc: Exception) -> typer.Exit:
    typer.echo(f"error: {exc}", err=True)
    return typer.Exit(1)


def _split_job(job: str, conn: Conn) -> tuple[str, str]:
    if "/" in job:
        ns, _, name = job.partition("/")
    else:
        ns, name = conn.resolved_namespace(), job
    if not ns or not name:
        raise CtlError(f"JOB: expected NAME or NAMESPACE/NAME, got {job!r}")
    return ns, name


def _find(view: ClusterView, ns: str, name: str) -> dict[str, Any]:
    for fj in view.fluxjobs:
        md = fj.get("metadata") or {}
        if md.get("namespace") == ns and md.get("name") == name:
            return fj
    known = sorted(
        (f.get("metadata") or {}).get("name", "")
        for f in view.fluxjobs
        if (f.get("metadata") or {}).get("namespace") == ns
    )
    hint = (
        f" (FluxJobs there: {', '.join(known[:10])})"
        if known
        else " (no FluxJob in that namespace)"
    )
    raise CtlError(f"FluxJob {ns}/{name} not found{hint}")


# -- commands ----------------------------------------------------------------------------------

ctl = typer.Typer(
    name="ctl",
    help="Inspect and steer fluxnetes in a cluster (the same as `kubectl fluxnetes`).",
    no_args_is_help=True,
)


@ctl.command("queue")
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
        raise _fail(exc) from None
    rows = queue_rows(view.fluxjobs, datetime.now(UTC), include_finished)
    where = "all namespaces" if all_namespaces else f"namespace {conn.resolved_namespace()}"
    table = _table(
        f"fluxnetes queue ({where}): {sum(r['state'] == 'Running' for r in rows)} running, "
        f"{sum(r['state'] in WAITING for r in rows)} waiting",
        ["#", "JOB", "STATE", "SIZE", "PER POD", "PRIO", "START", "NODES", "REASON"],
        (
            [
                r["position"],
                f"{r['namespace']}/{r['name']}" if all_namespaces else r["name"],
                r["state"],
                r["size"],
                r["request"],
                r["priority"],
                r["start"],
                r["nodes"],
                r["reason"],
            ]
            for r in rows
        ),
    )
    emit(rows, output, table)


@ctl.command("nodes")
def nodes_cmd(
    kubeconfig: KubeconfigOpt = None,
    context: ContextOpt = None,
    output: OutputOpt = Output.table,
) -> None:
    """Per-node use as the scheduler sees it: cores, memory, GPUs, foreign pods, agreement.

    Agreement: whether the running FluxJobs match the fluxnetes pods bound to the node.
    """
    conn = Conn(kubeconfig, context, None)
    try:
        view = fetch(conn, nodes=True, pods=True, fluxjobs="")
    except CtlError as exc:
        raise _fail(exc) from None
    rows = node_rows(view.nodes, view.pods, view.fluxjobs)
    table = _table(
        f"fluxnetes nodes: {len(rows)} node(s); used = fluxnetes jobs, foreign = other pods",
        [
            "NODE",
            "STATUS",
            "CORES used/foreign/free",
            "MEMORY used/foreign/free",
            "GPUS used/foreign/free",
            "PODS flux/foreign",
            "AGREES",
        ],
        (
            [
                r["node"],
                r["status"],
                f"{r['coresUsed']}/{r['coresForeign']}/{r['coresFree']} of {r['cores']}",
                f"{_fmt_bytes(r['memoryUsed'])}/{_fmt_bytes(r['memoryForeign'])}/{_fmt_bytes(max(0, r['memoryFree']))} of {_fmt_bytes(r['memory'])}",
                f"{r['gpusUsed']}/{r['gpusForeign']}/{r['gpusFree']} of {r['gpus']}",
                f"{r['fluxnetesPods']}/{r['foreignPods']}",
                r["agrees"],
            ]
            for r in rows
        ),
    )
    emit(rows, output, table)


@ctl.command("explain")
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
        ns, name = _split_job(job, conn)
        view = fetch(conn, nodes=True, pods=True, fluxjobs="")
        fj = _find(view, ns, name)
    except CtlError as exc:
        raise _fail(exc) from None
    info = explain_job(fj, view.nodes, view.pods, view.fluxjobs, datetime.now(UTC))
    if output is not Output.table:
        emit(info, output)
        return
    from rich.console import Console

    console = Console()
    console.print(
        f"[bold]{info['job']}[/]: {info['state']}  size {info['size']} x ({info['perPod']})"
        f"  priority {info['priority']}  duration {info['duration'] or 'unknown'}s"
    )
    if info["reason"]:
        console.print(f"reason: {info['reason']}")
    if info.get("expectedStart"):
        console.print(f"expected start: {info['expectedStart']} ({info['expectedStartIn']})")
    if info["nodes"]:
        console.print(f"nodes: {', '.join(info['nodes'])}")
    if "short" in info:
        console.print(f"short now: {info['short']}")
        if info["waitsBehind"]:
            console.print(f"waits behind reservation(s) of: {', '.join(info['waitsBehind'])}")
        if info["ahead"]:
            console.print(
                _table(
                    "ahead in the queue",
                    ["JOB", "STATE", "SIZE", "EXPECTED START"],
                    (
                        [a["job"], a["state"], a["size"], a["expectedStart"] or "-"]
                        for a in info["ahead"]
                    ),
                )
            )
        if info["runningEnds"]:
            console.print(
                _table(
                    "running jobs, by expected end",
                    ["JOB", "EXPECTED END"],
                    ([e["job"], e["expectedEnd"]] for e in info["runningEnds"]),
                )
            )
    if info["history"]:
        console.print(
            _table(
                "history",
                ["TIME", "STATE", "MESSAGE"],
                ([h["time"], h["state"], h["message"]] for h in info["history"]),
            )
        )


@ctl.command("graph")
def graph_cmd(
    kubeconfig: KubeconfigOpt = None,
    context: ContextOpt = None,
    out: Annotated[
        Path | None, typer.Option("--file", "-f", help="Write to FILE instead of stdout.")
    ] = None,
    rack_label: Annotated[
        str, typer.Option(help="Node label that names a node's rack.")
    ] = "fluxnetes.io/rack",
    output: Annotated[
        Output, typer.Option("--output", "-o", help="json (JGF, the default) or yaml (the same document).")
    ] = Output.json,
) -> None:
    """Export the resource graph built from the cluster's Nodes, as JGF (JSON)."""
    import json

    import yaml

    from fluxnetes.graph import GraphError, from_k8s_nodes, write_jgf

    if output is Output.table:
        raise _fail(CtlError("graph: --output must be json or yaml (a graph is no table; see `nodes`)"))

    conn = Conn(kubeconfig, context, None)
    try:
        view = fetch(conn, nodes=True)
        graph = from_k8s_nodes(view.nodes, rack_label=rack_label)
    except (CtlError, GraphError) as exc:
        raise _fail(exc) from None
    doc = write_jgf(graph)
    if output is Output.yaml:
        text = yaml.safe_dump(doc, sort_keys=False, default_flow_style=False).rstrip()
    else:
        text = json.dumps(doc, indent=1)
    if out is None:
        typer.echo(text)
    else:
        out.write_text(text + "\n")
        typer.echo(f"wrote {out} ({len(view.nodes)} node(s))", err=True)


@ctl.command("cancel")
def cancel_cmd(
    job: Annotated[str, typer.Argument(help="FluxJob NAME or NAMESPACE/NAME.")],
    kubeconfig: KubeconfigOpt = None,
    context: ContextOpt = None,
    namespace: NamespaceOpt = None,
    output: OutputOpt = Output.table,
) -> None:
    """Cancel JOB, queued or running, like scancel (deletes its workload or its pods).

    The operator then releases what the job held at once and marks the FluxJob Cancelled.
    """
    conn = Conn(kubeconfig, context, namespace)
    deleted: list[dict[str, str]] = []
    lines: list[str] = []
    try:
        ns, name = _split_job(job, conn)
        view = fetch(conn, fluxjobs=ns)
        fj = _find(view, ns, name)
        phase = (fj.get("status") or {}).get("phase")
        if phase in FINAL:
            raise CtlError(f"FluxJob {ns}/{name} is already {phase}")
        workload = (fj.get("spec") or {}).get("workload") or {}
        background = {
            "kind": "DeleteOptions",
            "apiVersion": "v1",
            "propagationPolicy": "Background",
        }
        if workload.get("kind") and workload.get("name"):
            _api(conn, "DELETE", _workload_path(ns, workload), background, "application/json")
            deleted.append({"kind": str(workload["kind"]), "name": str(workload["name"])})
            lines.append(f"deleted {workload['kind']} {ns}/{workload['name']}")
        else:
            pods = _api(conn, "GET", f"/api/v1/namespaces/{ns}/pods").get("items") or []
            members = [p for p in pods if group_name_of(p) == name]
            if not members:
                raise CtlError(
                    f"FluxJob {ns}/{name}: no workload and no pod of its group left to delete"
                )
            for p in members:
                pname = (p.get("metadata") or {}).get("name")
                _api(
                    conn,
                    "DELETE",
                    f"/api/v1/namespaces/{ns}/pods/{pname}",
                    background,
                    "application/json",
                )
                deleted.append({"kind": "Pod", "name": str(pname)})
            lines.append(f"deleted {len(members)} pod(s) of group {name}")
    except CtlError as exc:
        raise _fail(exc) from None
    if output is Output.table:
        for line in [*lines, f"fluxjob {ns}/{name} cancelled"]:
            typer.echo(line)
    else:
        emit({"job": f"{ns}/{name}", "phase": phase, "deleted": deleted, "cancelled": True}, output)


def group_name_of(pod: Mapping[str, Any]) -> str | None:
    """The FluxJob name a pod belongs to when its group is made of pods (not a workload)."""
    from fluxnetes.k8s.groups import GroupError, explicit_group, object_name

    md = pod.get("metadata") or {}
    placed = (md.get("annotations") or {}).get(ANN_FLUXJOB)
    if placed:
        return str(placed)
    try:
        explicit = explicit_group(md.get("labels") or {})
    except GroupError:
        return None
    if explicit is not None:
        return object_name(explicit[0])
    return object_name(f"pod-{md.get('name', '')}")


_WORKLOAD_PATHS = {
    "Job": "/apis/batch/v1",
    "Deployment": "/apis/apps/v1",
    "ReplicaSet": "/apis/apps/v1",
    "StatefulSet": "/apis/apps/v1",
    "Pod": "/api/v1",
}


def _workload_path(ns: str, workload: Mapping[str, Any]) -> str:
    kind = str(workload["kind"])
    base = _WORKLOAD_PATHS.get(kind)
    if base is None:
        raise CtlError(f"cancel: do not know how to delete a {kind}; delete it with kubectl")
    return f"{base}/namespaces/{ns}/{kind.lower()}s/{workload['name']}"


def register(app: typer.Typer) -> None:
    # `kubectl fluxnetes submit --dry-run FILE` too (the plugin is `fluxnetes ctl`): the very
    # command of `fluxnetes submit`, registered once into this group
    if not any(c.name == "submit" for c in ctl.registered_commands):
        from fluxnetes.cli import submit_cmd

        submit_cmd.register(ctl)
    app.add_typer(ctl, name="ctl")
