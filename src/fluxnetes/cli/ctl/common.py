"""What every `kubectl fluxnetes` command shares: options, the connection, reading the
cluster, errors and output (tables, json, yaml) and small formatters.

Everything is computed from what the API server holds (Nodes, pods bound to nodes, FluxJob
objects), so the plugin works from any machine with a kubeconfig and needs no port to the
operator.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer

# FluxJob phases (fluxnetes.k8s.persistence.fluxjob.Phase), spelled here to keep `--help` import-light
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


def api(
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


def parse_time(text: Any) -> datetime | None:
    if not isinstance(text, str) or not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None


def relative(when: datetime | None, now: datetime) -> str:
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


def name_of(obj: Mapping[str, Any]) -> str:
    md = obj.get("metadata") or {}
    return f"{md.get('namespace', '')}/{md.get('name', '')}"


def placed_group(pod: Mapping[str, Any]) -> tuple[str, str] | None:
    """(namespace, FluxJob name) of the group fluxnetes placed ``pod`` for (its
    ``fluxnetes.io/fluxjob`` annotation: the name, or ``namespace/name``); None if none."""
    md = pod.get("metadata") or {}
    raw = str((md.get("annotations") or {}).get(ANN_FLUXJOB) or "")
    if not raw:
        return None
    ns = str(md.get("namespace") or "default")
    return ns, raw[len(ns) + 1:] if raw.startswith(ns + "/") else raw


def fluxjob_keys(fluxjobs: Iterable[Mapping[str, Any]]) -> set[tuple[str, str]]:
    return {(str((f.get("metadata") or {}).get("namespace") or "default"), str((f.get("metadata") or {}).get("name", "")))
            for f in fluxjobs}


def request_of(fj: Mapping[str, Any]) -> dict[str, int]:
    req = (fj.get("spec") or {}).get("request") or {}
    return {str(k): int(v) for k, v in req.items() if isinstance(v, int | float)}


def pod_sets(fj: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The FluxJob's pod sets, each with its own per-pod request: ``name``, ``count``,
    ``request`` (as ``spec.request``) and, once allocated, the ``nodes`` of its slots. A
    multi-role workload's come from ``status.podSets`` (the operator writes each set's
    request; a status written before it did: ``spec.request``, the largest set's), else from
    its jobspec; a one-template group is one set (``name`` "") of ``spec.size`` pods."""
    spec, st = fj.get("spec") or {}, fj.get("status") or {}
    nodes = [str(n) for n in st.get("nodes") or []]
    listed = [ps for ps in st.get("podSets") or [] if isinstance(ps, Mapping)]
    if not listed:
        listed = [{"name": name, "count": count} for name, count in _jobspec_sets(spec.get("jobspec"))]
    if not listed:
        return [{"name": "", "count": int(spec.get("size") or 1), "request": request_of(fj), "nodes": nodes}]
    out, at = [], 0
    for ps in listed:
        count = int(ps.get("count") or 0)
        req = ps.get("request")
        own = ps.get("nodes")
        out.append({
            "name": str(ps.get("name") or ""),
            "count": count,
            "request": {str(k): int(v) for k, v in req.items() if isinstance(v, int | float)}
            if isinstance(req, Mapping) else request_of(fj),
            # slots are numbered set after set (status.nodes is in slot order)
            "nodes": [str(n) for n in own] if isinstance(own, list) else nodes[at:at + count],
        })
        at += count
    return out


def _jobspec_sets(text: Any) -> list[tuple[str, int]]:
    from fluxnetes.jobspec import parse_jobspec
    from fluxnetes.jobspec.podsets import podsets_of_jobspec

    try:
        return podsets_of_jobspec(parse_jobspec(text or ""))
    except Exception:  # no jobspec, or one this version does not read: one set
        return []


def fmt_pod_sets(sets: Sequence[Mapping[str, Any]]) -> str:
    """``4 x (4c,4Gi)``, or per set: ``leader 1 x (2c,2Gi), worker 3 x (1c,1Gi)``."""
    return ", ".join(f"{ps['name'] + ' ' if ps['name'] else ''}{ps['count']} x ({fmt_request(ps['request'])})"
                     for ps in sets)


def fmt_request(req: Mapping[str, int]) -> str:
    parts = []
    if req.get("cpu"):
        parts.append(f"{cores(req['cpu'])}c")
    if req.get("memory"):
        parts.append(fmt_bytes(req["memory"]))
    if req.get(GPU):
        parts.append(f"{req[GPU]}gpu")
    for k, v in sorted(req.items()):
        if k not in ("cpu", "memory", GPU) and v:
            parts.append(f"{v} {k}")
    return ",".join(parts) or "-"


def cores(cpu_millis: int) -> int:
    """Whole cores the scheduler books for a cpu request (at least one per pod)."""
    return max(1, math.ceil(cpu_millis / 1000)) if cpu_millis > 0 else 0


def fmt_bytes(n: int) -> str:
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
        name_of(fj),
    )



# -- output ------------------------------------------------------------------------------------


def emit(data: Any, output: Output, rendered: Any = None) -> None:
    """Print ``data`` as json or yaml, or the rich ``rendered`` table."""
    import json

    import yaml

    if output is Output.json:
        typer.echo(json.dumps(data, indent=2, default=str))
    elif output is Output.yaml:
        typer.echo(yaml.safe_dump(data, sort_keys=False, default_flow_style=False).rstrip())
    else:
        console().print(rendered)


def console() -> Any:
    """A rich console for tables. Piped or redirected output (no terminal) is not cut to rich's
    default 80 columns: a row stays one line, so `| grep` and `> file` see whole rows. An
    explicit COLUMNS still wins, as it does on a terminal."""
    from rich.console import Console

    if sys.stdout.isatty() or os.environ.get("COLUMNS"):
        return Console()
    return Console(width=100_000, soft_wrap=True)


def table(title: str, columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> Any:
    from rich.table import Table

    t = Table(title=title, title_justify="left", box=None, header_style="bold", pad_edge=False)
    for c in columns:
        t.add_column(c, overflow="fold")
    for r in rows:
        t.add_row(*("" if v is None else str(v) for v in r))
    return t


def fail(exc: Exception) -> typer.Exit:
    typer.echo(f"error: {exc}", err=True)
    return typer.Exit(1)


def split_job(job: str, conn: Conn) -> tuple[str, str]:
    if "/" in job:
        ns, _, name = job.partition("/")
    else:
        ns, name = conn.resolved_namespace(), job
    if not ns or not name:
        raise CtlError(f"JOB: expected NAME or NAMESPACE/NAME, got {job!r}")
    return ns, name


def find_fluxjob(view: ClusterView, ns: str, name: str) -> dict[str, Any]:
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


