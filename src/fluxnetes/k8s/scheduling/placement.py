"""Exact placement of a held pod on the node the matcher chose (pure builders).

Placement ``bind`` (k8s/admission/hold.py): the pod carries fluxnetes' scheduler name and is bound
with a Binding (:func:`binding`). Placement ``affinity`` (the default), below:

Choice: while the pod is gated, add a *required* node affinity ``metadata.name In [node]``
(matchFields, so it does not depend on a hostname label) and remove fluxnetes' gate in the
same JSON patch. KEP-3838 (GA 1.30) allows adding node-affinity requirements to a gated pod,
and one update may add them and drop the last gate atomically, so the pod never becomes
schedulable anywhere else. kube-scheduler then binds it — it can only pick that node, and it
still runs its own checks (taints, ports, volumes) and the kubelet's admission.

Why not a Binding: the Binding subresource refuses gated pods, so we would have to ungate
first and win a race against kube-scheduler, or make fluxnetes the pod's ``schedulerName``
(then pods of a stopped operator are never scheduled, and fluxnetes would duplicate every
kube-scheduler check). With affinity + ungate the default scheduler keeps doing binding.

The patch starts with a ``test`` of the gate's position, so a concurrent change fails the
whole patch (HTTP 422) instead of removing someone else's gate.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fluxnetes.k8s import names
from fluxnetes.k8s.workloads.base import JsonPatch, _escape

ANN_SLOT = f"{names.DOMAIN}/slot"


def node_term(node: str) -> dict[str, Any]:
    return {"key": "metadata.name", "operator": "In", "values": [node]}


def affinity_ops(spec: Mapping[str, Any], node: str) -> JsonPatch:
    aff = spec.get("affinity")
    req = {"nodeSelectorTerms": [{"matchFields": [node_term(node)]}]}
    if not aff:
        return [{"op": "add", "path": "/spec/affinity",
                 "value": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": req}}}]
    na = aff.get("nodeAffinity")
    if not na:
        return [{"op": "add", "path": "/spec/affinity/nodeAffinity",
                 "value": {"requiredDuringSchedulingIgnoredDuringExecution": req}}]
    required = na.get("requiredDuringSchedulingIgnoredDuringExecution")
    base = "/spec/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution"
    if not required or not required.get("nodeSelectorTerms"):
        return [{"op": "add", "path": base, "value": req}]
    ops: JsonPatch = []
    # terms are ORed: the node requirement must be added to every one of them
    for i, term in enumerate(required["nodeSelectorTerms"]):
        if term.get("matchFields"):
            ops.append({"op": "add", "path": f"{base}/nodeSelectorTerms/{i}/matchFields/-", "value": node_term(node)})
        else:
            ops.append({"op": "add", "path": f"{base}/nodeSelectorTerms/{i}/matchFields", "value": [node_term(node)]})
    return ops


def place_patch(pod: Mapping[str, Any], node: str, *, jobid: object, fluxjob: str, slot: int,
                allocation: str | None = None) -> JsonPatch | None:
    """JSON patch pinning ``pod`` to ``node`` and removing fluxnetes' gate; None if not gated.
    ``allocation``: the group's allocation note (allocation_note.py), written with the rest."""
    spec = pod.get("spec") or {}
    gates = spec.get("schedulingGates") or []
    index = next((i for i, g in enumerate(gates) if g.get("name") == names.GATE), None)
    if index is None:
        return None
    meta = pod.get("metadata") or {}
    ops: JsonPatch = [
        {"op": "test", "path": f"/spec/schedulingGates/{index}/name", "value": names.GATE},
        *affinity_ops(spec, node),
        {"op": "remove", "path": f"/spec/schedulingGates/{index}"},
    ]
    notes = {names.ANN_FLUXJOB: fluxjob, ANN_SLOT: str(slot)}
    if allocation is not None:
        notes[names.ANN_ALLOCATION] = allocation
    if not meta.get("annotations"):
        ops.append({"op": "add", "path": "/metadata/annotations", "value": notes})
    else:
        ops.extend({"op": "add", "path": f"/metadata/annotations/{_escape(k)}", "value": v} for k, v in notes.items())
    if not meta.get("labels"):
        ops.append({"op": "add", "path": "/metadata/labels", "value": {names.LABEL_JOBID: str(jobid)}})
    else:
        ops.append({"op": "add", "path": f"/metadata/labels/{_escape(names.LABEL_JOBID)}", "value": str(jobid)})
    return ops


def binding(pod: Mapping[str, Any], node: str, *, jobid: object, fluxjob: str, slot: int,
            allocation: str | None = None) -> dict[str, Any]:
    """The Binding of a pod held by fluxnetes' scheduler name (placement ``bind``) to ``node``.
    Its annotations land on the pod (the API server copies them), so the pod says which
    FluxJob, matcher job and slot placed it, as the affinity patch does with a label."""
    meta = pod.get("metadata") or {}
    notes = {names.ANN_FLUXJOB: fluxjob, ANN_SLOT: str(slot), names.LABEL_JOBID: str(jobid)}
    if allocation is not None:
        notes[names.ANN_ALLOCATION] = allocation
    return {"apiVersion": "v1", "kind": "Binding",
            "metadata": {"name": meta.get("name"), "namespace": meta.get("namespace"), "uid": meta.get("uid"),
                         "annotations": notes},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node}}


def placed_jobid(pod: Mapping[str, Any]) -> str | None:
    """The matcher job id a placed pod records (label after an affinity patch, annotation
    after a Binding)."""
    meta = pod.get("metadata") or {}
    jid = (meta.get("labels") or {}).get(names.LABEL_JOBID)
    return jid if jid is not None else (meta.get("annotations") or {}).get(names.LABEL_JOBID)


def assigned_node(pod: Mapping[str, Any]) -> str | None:
    """The node a pod is pinned to by fluxnetes (bound or not yet), from its affinity."""
    spec = pod.get("spec") or {}
    if spec.get("nodeName"):
        return str(spec["nodeName"])
    na = (spec.get("affinity") or {}).get("nodeAffinity") or {}
    req = na.get("requiredDuringSchedulingIgnoredDuringExecution") or {}
    for term in req.get("nodeSelectorTerms") or []:
        for f in term.get("matchFields") or []:
            if f.get("key") == "metadata.name" and f.get("operator") == "In" and len(f.get("values") or []) == 1:
                return str(f["values"][0])
    return None
