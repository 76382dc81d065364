"""`kubectl fluxnetes nodes`: per-node use as the scheduler sees it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import typer

from fluxnetes.cli.ctl.common import (
    ANN_FLUXJOB,
    GPU,
    LABEL_MANAGED,
    Conn,
    ContextOpt,
    CtlError,
    KubeconfigOpt,
    Output,
    OutputOpt,
    cores,
    emit,
    fail,
    fetch,
    fluxjob_keys,
    fmt_bytes,
    placed_group,
    pod_sets,
    table,
)


@dataclass
class _Use:
    cpu: int = 0  # whole cores (scheduler's view)
    memory: int = 0  # bytes
    gpus: int = 0
    pods: int = 0

    def add(self, req: Mapping[str, int], times: int = 1) -> None:
        self.cpu += cores(req.get("cpu", 0)) * times
        self.memory += req.get("memory", 0) * times
        self.gpus += req.get(GPU, 0) * times
        self.pods += times


def _add_shares(planned: dict[str, _Use], st: Mapping[str, Any]) -> None:
    """What a FluxJob's group still holds, node by node (``status.shares``, in the scheduler's
    units), and its pods there (slots not released). Also for a group that ended while some
    of its pods run on (a lost node): they keep their room until they go."""
    released = {int(i) for i in st.get("released") or []}
    slots = [n for i, n in enumerate(st.get("nodes") or []) if i not in released]
    for sh in st.get("shares") or []:
        node = str(sh.get("node", ""))
        use = planned.setdefault(node, _Use())
        use.cpu += int(sh.get("cores", 0))
        use.memory += int(sh.get("memory", 0)) * 1024 * 1024  # MiB
        use.gpus += int(sh.get("gpus", 0))
        use.pods += slots.count(node)


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
    """Per node: allocatable, what fluxnetes' Running FluxJobs hold there (and the pods of
    groups without a FluxJob, ``--fluxjobs waiting``), what foreign pods hold, what is free,
    and whether the FluxJobs agree with the fluxnetes pods bound there."""
    from fluxnetes.graph.builders import node_is_down
    from fluxnetes.k8s.resources import ResourceError, node_allocatable

    planned: dict[str, _Use] = {}
    for fj in fluxjobs:
        st = fj.get("status") or {}
        if st.get("shares"):
            _add_shares(planned, st)
            continue
        if st.get("phase") != "Running":
            continue
        for ps in pod_sets(fj):  # each set at its own shape (an MPIJob's launcher is small)
            for node in ps["nodes"]:
                planned.setdefault(node, _Use()).add(ps["request"])
    bound: dict[str, _Use] = {}
    foreign: dict[str, _Use] = {}
    known = fluxjob_keys(fluxjobs)
    for pod in pods:
        node = (pod.get("spec") or {}).get("nodeName")
        if not node or (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue
        target = bound if _is_fluxnetes_pod(pod) else foreign
        target.setdefault(node, _Use()).add(_pod_request(pod))
        group = placed_group(pod)
        if group is not None and group not in known:
            # a group placed at once has no FluxJob (--fluxjobs waiting): its pod is the record
            planned.setdefault(node, _Use()).add(_pod_request(pod))
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
        raise fail(exc) from None
    rows = node_rows(view.nodes, view.pods, view.fluxjobs)
    tbl = table(
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
                f"{fmt_bytes(r['memoryUsed'])}/{fmt_bytes(r['memoryForeign'])}/{fmt_bytes(max(0, r['memoryFree']))} of {fmt_bytes(r['memory'])}",
                f"{r['gpusUsed']}/{r['gpusForeign']}/{r['gpusFree']} of {r['gpus']}",
                f"{r['fluxnetesPods']}/{r['foreignPods']}",
                r["agrees"],
            ]
            for r in rows
        ),
    )
    emit(rows, output, tbl)


def register(ctl: typer.Typer) -> None:
    from fluxnetes.cli.ctl.agents import hook  # nodes exec / broadcast / tree (the agents)

    ctl.add_typer(hook(nodes_cmd), name="nodes")
