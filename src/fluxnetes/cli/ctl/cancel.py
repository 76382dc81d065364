"""`kubectl fluxnetes cancel JOB`: cancel a job, queued or running (like scancel)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

import typer

from fluxnetes.cli.ctl.common import (
    ANN_FLUXJOB,
    FINAL,
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
    find_fluxjob,
    split_job,
)
from fluxnetes.cli.ctl.unrecorded import cancel_targets, group_pods, top_workload, workload_path


def cancel_cmd(
    job: Annotated[str, typer.Argument(help="FluxJob NAME or NAMESPACE/NAME, or a running group without a FluxJob.")],
    kubeconfig: KubeconfigOpt = None,
    context: ContextOpt = None,
    namespace: NamespaceOpt = None,
    output: OutputOpt = Output.table,
) -> None:
    """Cancel JOB, queued or running, like scancel (deletes its workload or its pods).

    The operator then releases what the job held at once and marks the FluxJob Cancelled.
    A group running without a FluxJob (the operator's --fluxjobs waiting) is cancelled the
    same way: its workload, found from its pods' owners, or its pods are deleted.
    """
    conn = Conn(kubeconfig, context, namespace)
    deleted: list[dict[str, str]] = []
    lines: list[str] = []
    has_fluxjob = True
    try:
        ns, name = split_job(job, conn)
        view = fetch(conn, fluxjobs=ns)
        try:
            fj: dict[str, Any] | None = find_fluxjob(view, ns, name)
        except CtlError as missing:
            members = group_pods(api(conn, "GET", f"/api/v1/namespaces/{ns}/pods").get("items") or [], ns, name)
            if not members:
                raise CtlError(f"{missing}; no running group of that name without a FluxJob either") from None
            fj, has_fluxjob = None, False
        if fj is not None:
            phase = (fj.get("status") or {}).get("phase")
            if phase in FINAL:
                raise CtlError(f"FluxJob {ns}/{name} is already {phase}")
            workload = (fj.get("spec") or {}).get("workload") or {}
            if workload.get("kind") and workload.get("name"):
                ref = {"kind": str(workload["kind"]), "name": str(workload["name"])}
                targets = [top_workload(ns, ref, f"the workload of FluxJob {ns}/{name} is",
                                        lambda path: _get_or_none(conn, path))]
            else:
                pods = api(conn, "GET", f"/api/v1/namespaces/{ns}/pods").get("items") or []
                targets = [{"kind": "Pod", "name": str((p.get("metadata") or {}).get("name"))}
                           for p in pods if group_name_of(p) == name]
                if not targets:
                    raise CtlError(
                        f"FluxJob {ns}/{name}: no workload and no pod of its group left to delete"
                    )
        else:
            phase = "Running"
            targets = cancel_targets(ns, name, members, lambda path: _get_or_none(conn, path))
            lines.append(f"group {ns}/{name} has no FluxJob (placed at once, --fluxjobs waiting)")
        paths = [workload_path(ns, t["kind"], t["name"]) for t in targets]  # refuse before deleting
        for t, path in zip(targets, paths, strict=True):
            api(conn, "DELETE", path, BACKGROUND, "application/json")
            deleted.append(t)
        pods_deleted = [t for t in deleted if t["kind"] == "Pod"]
        lines += [f"deleted {t['kind']} {ns}/{t['name']}" for t in deleted if t["kind"] != "Pod"]
        if pods_deleted:
            lines.append(f"deleted {len(pods_deleted)} pod(s) of group {name}")
    except CtlError as exc:
        raise fail(exc) from None
    done = f"fluxjob {ns}/{name} cancelled" if has_fluxjob else f"group {ns}/{name} cancelled"
    if output is Output.table:
        for line in [*lines, done]:
            typer.echo(line)
    else:
        emit({"job": f"{ns}/{name}", "phase": phase, "deleted": deleted, "cancelled": True}
             | ({} if has_fluxjob else {"fluxJob": False}), output)


BACKGROUND = {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Background"}


def _get_or_none(conn: Conn, path: str) -> Any:
    """GET ``path``; None when the object is gone (404)."""
    try:
        return api(conn, "GET", path)
    except CtlError as exc:
        if getattr(exc.__cause__, "status", None) == 404:
            return None
        raise


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


def register(ctl: typer.Typer) -> None:
    ctl.command("cancel")(cancel_cmd)
