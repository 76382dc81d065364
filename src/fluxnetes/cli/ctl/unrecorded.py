"""Groups without a FluxJob, for `explain`, `cancel` and `queue --all`.

With the operator's ``--fluxjobs waiting`` (its default) a group placed at once (it never
waited) that completes gets no FluxJob; its bound pods are its only record: each carries the
``fluxnetes.io/fluxjob`` annotation naming the group it was placed for (``queue`` and
``nodes`` read it too), and keeps it once it has finished. Here: the pods of one such group,
running or finished, what ``explain`` says about it, and which workload ``cancel`` deletes
for it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

from fluxnetes.cli.ctl.common import (
    GPU,
    MIB,
    CtlError,
    cores,
    fmt_request,
    parse_time,
    placed_group,
    relative,
)

NO_FLUXJOB = "placed at once, no FluxJob (--fluxjobs waiting); shown from its pods"
# the same group once its pods have all finished (it never got a FluxJob: it did not wait)
NO_FLUXJOB_DONE = "placed at once and finished, no FluxJob (--fluxjobs waiting); shown from its pods"
FINISHED = ("Succeeded", "Failed")
# kinds `cancel` deletes, and where (the same table serves FluxJobs' spec.workload)
WORKLOAD_PATHS = {
    "Job": "/apis/batch/v1",
    "Deployment": "/apis/apps/v1",
    "ReplicaSet": "/apis/apps/v1",
    "StatefulSet": "/apis/apps/v1",
    "Pod": "/api/v1",
}


def group_pods(pods: Sequence[Mapping[str, Any]], ns: str, name: str,
               include_finished: bool = False) -> list[Mapping[str, Any]]:
    """The bound, unfinished pods fluxnetes placed for group ``ns/name``, by name (with
    ``include_finished``, its bound pods that have finished too)."""
    members = [
        p for p in pods
        if placed_group(p) == (ns, name)
        and (p.get("spec") or {}).get("nodeName")
        and (include_finished or (p.get("status") or {}).get("phase") not in FINISHED)
    ]
    return sorted(members, key=lambda p: str((p.get("metadata") or {}).get("name", "")))


def state_of(members: Sequence[Mapping[str, Any]]) -> str:
    """What a group without a FluxJob is, from its bound pods: Running while one of them runs
    (or is about to), else Completed when every one succeeded, else Failed."""
    phases = [(p.get("status") or {}).get("phase") for p in members]
    if any(ph not in FINISHED for ph in phases):
        return "Running"
    return "Completed" if all(ph == "Succeeded" for ph in phases) else "Failed"


def groups_of_workload(pods: Sequence[Mapping[str, Any]], ns: str, name: str) -> set[str]:
    """The groups fluxnetes placed the pods of workload ``name`` for (their controlling owner,
    or the pod itself, has that name): a user names their Job ``quick``, its group is
    ``job-quick``."""
    found = set()
    for p in pods:
        key = placed_group(p)
        if key is None or key[0] != ns:
            continue
        ref = controller_ref(p)
        if (ref["name"] if ref else str((p.get("metadata") or {}).get("name", ""))) == name:
            found.add(key[1])
    return found


def _request(pod: Mapping[str, Any]) -> dict[str, int]:
    from fluxnetes.k8s.resources import ResourceError, pod_request

    try:
        return pod_request(pod.get("spec") or {}).as_dict()
    except ResourceError:  # a request the operator would have refused; it placed the pod all the same
        return {}


def controller_ref(pod: Mapping[str, Any]) -> dict[str, str] | None:
    """The pod's controlling owner (``kind``, ``name``), None for a bare pod."""
    for ref in (pod.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("controller"):
            return {"kind": str(ref.get("kind", "")), "name": str(ref.get("name", ""))}
    return None


def explain_unrecorded(ns: str, name: str, members: Sequence[Mapping[str, Any]], now: datetime) -> dict[str, Any]:
    """``explain`` of a group without a FluxJob, from its pods: the same keys as a FluxJob's
    explanation where they apply (state, reason, size, per-pod request, nodes), plus its
    pods, its share of each node (``shares``: cores, memory in MiB, GPUs, as a FluxJob's
    ``status.shares``; for a finished group, what it held while it ran) and the workload its
    pods belong to. No priority, duration, expected start or history: only a FluxJob records
    those."""
    pods: list[dict[str, Any]] = []
    shares: dict[str, dict[str, Any]] = {}
    for p in members:
        md, spec = p.get("metadata") or {}, p.get("spec") or {}
        req = _request(p)
        node = str(spec.get("nodeName"))
        pods.append({"name": str(md.get("name", "")), "node": node, "request": fmt_request(req),
                     "phase": (p.get("status") or {}).get("phase") or ""})
        sh = shares.setdefault(node, {"node": node, "pods": 0, "cores": 0, "memory": 0, "gpus": 0})
        sh["pods"] += 1
        sh["cores"] += cores(req.get("cpu", 0))
        sh["memory"] += -(-req.get("memory", 0) // MIB)
        sh["gpus"] += req.get(GPU, 0)
    starts = [str((p.get("status") or {}).get("startTime") or "") for p in members]
    start = min((s for s in starts if s), default=None)
    owners = {(r["kind"], r["name"]) for r in map(controller_ref, members) if r is not None}
    requests = sorted({pp["request"] for pp in pods})
    state = state_of(members)
    return {
        "job": f"{ns}/{name}",
        "state": state,
        "fluxJob": False,
        "reason": NO_FLUXJOB if state == "Running" else NO_FLUXJOB_DONE,
        "size": len(members),
        "perPod": "; ".join(requests),
        "startTime": start,
        "started": relative(parse_time(start), now),
        "nodes": sorted(shares),
        "pods": pods,
        "shares": [shares[n] for n in sorted(shares)],
        "workloads": [{"kind": k, "name": n} for k, n in sorted(owners)],
    }


def print_unrecorded(info: Mapping[str, Any], out: Any) -> None:
    from fluxnetes.cli.ctl.common import table

    out.print(f"[bold]{info['job']}[/]: {info['state']} (no FluxJob)  size {info['size']} x ({info['perPod']})"
              + (f"  started {info['started']}" if info["startTime"] else ""))
    out.print(f"reason: {info['reason']}")
    if info["workloads"]:
        out.print("workload: " + ", ".join(f"{w['kind']}/{w['name']}" for w in info["workloads"]))
    out.print(f"nodes: {', '.join(info['nodes'])}")
    held = "share of each node" + (" (held while it ran)" if info["state"] != "Running" else "")
    out.print(table(held, ["NODE", "PODS", "CORES", "MEMORY", "GPUS"],
                    ([s["node"], s["pods"], s["cores"], f"{s['memory']}Mi", s["gpus"]] for s in info["shares"])))
    out.print(table("pods", ["POD", "NODE", "REQUEST", "PHASE"],
                    ([p["name"], p["node"], p["request"], p["phase"]] for p in info["pods"])))


def workload_path(ns: str, kind: str, name: str) -> str:
    base = WORKLOAD_PATHS.get(kind)
    if base is None:
        raise CtlError(f"cancel: do not know how to delete a {kind}; delete it with kubectl")
    return f"{base}/namespaces/{ns}/{kind.lower()}s/{name}"


# owners that do not recreate a child deleted under them: a CronJob's Job is the one run
# to cancel, not the schedule
KEEPS_DELETED = ("CronJob",)


def top_workload(ns: str, ref: Mapping[str, str], what: str,
                 get: Callable[[str], Mapping[str, Any] | None]) -> dict[str, str]:
    """The object ``cancel`` deletes for the workload ``ref`` (``kind``, ``name``): ``ref``
    itself, or, when a controller would only recreate it (a Deployment its ReplicaSet), that
    controller, followed up. ``get``: GET an API path, None when it is gone. CtlError when
    the top is a kind cancel does not delete (a JobSet's Job, an MPIJob's pods: deleting the
    part would only make the owner recreate or fail it): ``what`` (a phrase ending in "belong
    to" or "is") then the owner, and the kubectl command that deletes it."""
    chain = [dict(ref)]
    top = chain[0]
    while top["kind"] in WORKLOAD_PATHS and top["kind"] != "Pod":
        owner = get(workload_path(ns, top["kind"], top["name"]))
        up = controller_ref(owner) if owner is not None else None
        if up is None or up["kind"] in KEEPS_DELETED:
            break
        top = up
        chain.append(top)
    if top["kind"] not in WORKLOAD_PATHS:
        under = ", ".join(f"{r['kind']} {r['name']}" for r in reversed(chain[:-1]))
        raise CtlError(
            f"{what} {top['kind']} {top['name']}" + (f" (controlling {under})" if under else "")
            + "; cancel deletes only "
            f"{', '.join(k for k in WORKLOAD_PATHS if k != 'Pod')} and bare pods, nothing was deleted: "
            f"kubectl delete {top['kind'].lower()} {top['name']} -n {ns}")
    return top


def cancel_targets(ns: str, name: str, members: Sequence[Mapping[str, Any]],
                   get: Callable[[str], Mapping[str, Any] | None]) -> list[dict[str, str]]:
    """What ``cancel`` deletes for a group without a FluxJob, as a FluxJob's cancel would:
    the workload that owns its pods (``top_workload``), or the pods themselves when nothing
    controls them (a labelled pod group)."""
    targets: dict[tuple[str, str], dict[str, str]] = {}
    bare = []
    for p in members:
        ref = controller_ref(p)
        if ref is None:
            bare.append({"kind": "Pod", "name": str((p.get("metadata") or {}).get("name", ""))})
            continue
        top = top_workload(ns, ref, f"the pods of group {ns}/{name} (no FluxJob) belong to", get)
        targets[(top["kind"], top["name"])] = top
    return [targets[k] for k in sorted(targets)] + bare
