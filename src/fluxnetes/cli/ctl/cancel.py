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
        ns, name = split_job(job, conn)
        view = fetch(conn, fluxjobs=ns)
        fj = find_fluxjob(view, ns, name)
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
            api(conn, "DELETE", workload_path(ns, workload), background, "application/json")
            deleted.append({"kind": str(workload["kind"]), "name": str(workload["name"])})
            lines.append(f"deleted {workload['kind']} {ns}/{workload['name']}")
        else:
            pods = api(conn, "GET", f"/api/v1/namespaces/{ns}/pods").get("items") or []
            members = [p for p in pods if group_name_of(p) == name]
            if not members:
                raise CtlError(
                    f"FluxJob {ns}/{name}: no workload and no pod of its group left to delete"
                )
            for p in members:
                pname = (p.get("metadata") or {}).get("name")
                api(
                    conn,
                    "DELETE",
                    f"/api/v1/namespaces/{ns}/pods/{pname}",
                    background,
                    "application/json",
                )
                deleted.append({"kind": "Pod", "name": str(pname)})
            lines.append(f"deleted {len(members)} pod(s) of group {name}")
    except CtlError as exc:
        raise fail(exc) from None
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


WORKLOAD_PATHS = {
    "Job": "/apis/batch/v1",
    "Deployment": "/apis/apps/v1",
    "ReplicaSet": "/apis/apps/v1",
    "StatefulSet": "/apis/apps/v1",
    "Pod": "/api/v1",
}


def workload_path(ns: str, workload: Mapping[str, Any]) -> str:
    kind = str(workload["kind"])
    base = WORKLOAD_PATHS.get(kind)
    if base is None:
        raise CtlError(f"cancel: do not know how to delete a {kind}; delete it with kubectl")
    return f"{base}/namespaces/{ns}/{kind.lower()}s/{workload['name']}"


def register(ctl: typer.Typer) -> None:
    ctl.command("cancel")(cancel_cmd)
