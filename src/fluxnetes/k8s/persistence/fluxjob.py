"""The FluxJob custom resource: one per group, the user's window on the queue."""

from __future__ import annotations

import enum
import functools
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import yaml

from fluxnetes.k8s import names
from fluxnetes.k8s.groups import GroupSpec

CRD_FILE = "fluxjobs.fluxnetes.io.yaml"
# status.history keeps the latest transitions (a group requeued for days stays one object)
HISTORY_LIMIT = 50


class Phase(enum.StrEnum):
    PROVISIONAL = "Provisional"  # group not complete yet (pods still arriving)
    PENDING = "Pending"  # in the queue
    RESERVED = "Reserved"  # in the queue, with a reservation (expected start)
    RUNNING = "Running"  # allocated and placed
    COMPLETED = "Completed"
    FAILED = "Failed"
    CANCELLED = "Cancelled"
    UNSATISFIABLE = "Unsatisfiable"
    # evicted to let higher-QoS work start (k8s/scheduling/preemption.py): its pods are going; once they
    # are gone it is queued again (Pending) or failed, by --preemption-on-preempt
    PREEMPTED = "Preempted"

    @property
    def final(self) -> bool:
        return self in _FINAL  # (a set: asked for every group in the hot paths)


_FINAL = frozenset({Phase.COMPLETED, Phase.FAILED, Phase.CANCELLED, Phase.UNSATISFIABLE})


def crd_manifest() -> dict[str, Any]:
    """The FluxJob CRD. Its one source is inside the package (``fluxnetes/k8s/crds/``), so an
    installed wheel can install it; deploy/crds and the chart's crds/ are copies made by
    hack/sync-chart-crds.sh."""
    from importlib.resources import files

    doc: dict[str, Any] = yaml.safe_load((files("fluxnetes.k8s") / "crds" / CRD_FILE).read_text())
    return doc


def rfc3339(seconds: int | float) -> str:
    # whole seconds (the operator's clock, Context.now) are formatted once each: a group's
    # phase changes write several per Job (history, conditions) within the same few seconds,
    # and strftime costs ~10 us (bench/event_handlers.py)
    if type(seconds) is int:
        return _rfc3339_whole(seconds)
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@functools.lru_cache(maxsize=64)
def _rfc3339_whole(seconds: int) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def write_meta(uid: str = "") -> dict[str, Any]:
    """The metadata every operator write of a FluxJob carries. Only the operator writes
    FluxJobs, so there is no other field manager to keep apart: ``managedFields: [{}]`` makes
    the API server drop them at each patch (a create still records its writer). A create and
    its patch then cost it about a tenth less CPU and the stored object is a third smaller
    (bench/apiserver_costs.py --only fluxjobs). ``uid``: the precondition that the write lands on this
    group's FluxJob only."""
    meta: dict[str, Any] = {"managedFields": [{}]}
    if uid:
        meta["uid"] = uid
    return meta


def manifest(group: GroupSpec, *, jobspec: str, match_policy: str) -> dict[str, Any]:
    """The FluxJob object for a group (spec only; the status is written by the operator)."""
    spec: dict[str, Any] = {
        "size": group.size,
        "jobspec": jobspec,
        "duration": group.duration,
        "priority": group.priority,
        "matchPolicy": match_policy,
        "exclusive": group.exclusive,
        "request": {k: v for k, v in group.request.as_dict().items() if v},
    }
    meta: dict[str, Any] = {"name": group.name, "namespace": group.namespace,
                            "labels": {names.LABEL_MANAGED: "true"}, **write_meta()}
    if group.owner is not None:
        spec["workload"] = group.owner.as_dict()
        if group.owner.uid:
            # deleting the owner garbage-collects the FluxJob (and the operator cancels it)
            meta["ownerReferences"] = [{**group.owner.as_dict(), "blockOwnerDeletion": False}]
    else:
        spec["group"] = group.name
    return {"apiVersion": f"{names.API_GROUP}/{names.API_VERSION}", "kind": names.FLUXJOB_KIND,
            "metadata": meta, "spec": spec}


def status(
    phase: Phase,
    *,
    reason: str = "",
    jobid: int | None = None,
    submit_time: int | None = None,
    expected_start: int | None = None,
    start_time: int | None = None,
    end_time: int | None = None,
    nodes: Sequence[str] = (),
    pods_seen: int | None = None,
    now: int,
    previous: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A full status block; a condition per phase change keeps the decision history."""
    st: dict[str, Any] = {"phase": str(phase), "reason": reason}
    if jobid is not None:
        st["jobid"] = jobid
    for key, value in (("submitTime", submit_time), ("expectedStart", expected_start),
                       ("startTime", start_time), ("endTime", end_time)):
        if value is not None:
            st[key] = rfc3339(value)
    if nodes:
        st["nodes"] = list(nodes)
        st["nodeList"] = ",".join(sorted(set(nodes)))
    if pods_seen is not None:
        st["podsSeen"] = pods_seen
    # one condition per phase reached (so `kubectl wait --for=condition=Running` works); the
    # current phase's is True, earlier ones False, each keeping its last message and time
    conditions = {c.get("type"): dict(c) for c in (previous or {}).get("conditions") or []}
    for c in conditions.values():
        if c.get("type") != str(phase) and c.get("status") == "True":
            c["status"] = "False"
    cur = conditions.get(str(phase))
    if cur is None or cur.get("status") != "True" or cur.get("message") != reason:
        conditions[str(phase)] = {"type": str(phase), "status": "True", "reason": str(phase),
                                  "message": reason, "lastTransitionTime": rfc3339(now)}
    st["conditions"] = list(conditions.values())
    st["history"] = with_history(history_of(previous), phase, reason, now)
    return st


def history_of(st: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """The phases a status shows the group entered, oldest first: its ``history`` or, where
    it has none (written before it was kept, or without a repeated phase: see
    ``sent_status``), its conditions in time order."""
    st = st or {}
    history = st.get("history")
    if isinstance(history, list):
        return [dict(h) for h in history if isinstance(h, Mapping)]
    conds = [c for c in st.get("conditions") or [] if isinstance(c, Mapping)]
    return [{"time": c.get("lastTransitionTime"), "phase": c.get("type"), "message": c.get("message") or ""}
            for c in sorted(conds, key=lambda c: str(c.get("lastTransitionTime") or ""))]


def with_history(history: list[dict[str, Any]], phase: Phase, reason: str, at: int | float) -> list[dict[str, Any]]:
    """``status.history``: every phase the group entered, in time order, a phase entered
    again being a new entry (the conditions keep one per phase: Pending, Unsatisfiable,
    Pending again shows one Pending). The latest entry takes the phase's latest reason."""
    out = [dict(h) for h in history]
    if out and out[-1].get("phase") == str(phase):
        out[-1]["message"] = reason
    else:
        out.append({"time": rfc3339(at), "phase": str(phase), "message": reason})
    return out[-HISTORY_LIMIT:]


def sent_status(st: Mapping[str, Any]) -> dict[str, Any]:
    """What a FluxJob write carries of a full status: its history only once a phase was
    entered twice. Until then the conditions, one per phase, tell the same story, and most
    groups never repeat a phase: their FluxJob writes stay as small as before (the API
    server's cost per write grows with the object). A merge patch without it keeps what was
    written, so a history written once is written again each time."""
    history = st.get("history") or []
    phases = [h.get("phase") for h in history]
    if len(phases) != len(set(phases)):
        return dict(st)
    return {k: v for k, v in st.items() if k != "history"}
