"""How fluxnetes holds a pod until its group is placed.

Two holds, one per placement mode (``fluxnetes run --placement``):

- ``gate`` (placement ``affinity``, the default): the scheduling gate ``fluxnetes.io/gate``.
  When the group is allocated the operator pins each pod to its node with a required node
  affinity and removes the gate in the same update; kube-scheduler then binds it and still
  runs its own checks. A ValidatingAdmissionPolicy stops anyone else from lifting the gate.
- ``scheduler`` (placement ``bind``): the pod's ``spec.schedulerName`` becomes ``fluxnetes``,
  so kube-scheduler never looks at it, and the operator binds it itself (a Binding, one API
  write per pod, like any scheduler). No gate: the Binding subresource refuses gated pods,
  and the scheduler name is immutable, so nothing else can release the pod. This skips the
  extra pod update and kube-scheduler's pass of the affinity mode — about half of what the
  API server spends per pod on fluxnetes' path (see the README's operator benchmark) — at the
  price of kube-scheduler's own checks (host ports, volume topology): the matcher and the
  kubelet's admission are the only ones left.

The webhook writes a hold at admission (pods and pod templates); the operator asks
:func:`is_held` which pods are waiting for it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fluxnetes.k8s import names

GATE = "gate"
SCHEDULER = "scheduler"
PLACEMENTS = {"affinity": GATE, "bind": SCHEDULER}  # --placement -> hold

JsonPatch = list[dict[str, Any]]


def hold_ops(spec: Mapping[str, Any], base: str, hold: str) -> JsonPatch:
    """JSON patch ops holding the pod (or pod template) whose spec is ``spec`` at ``base``
    (``""`` for a pod, ``/spec/template`` for a template)."""
    if hold == SCHEDULER:
        return [{"op": "add", "path": f"{base}/spec/schedulerName", "value": names.SCHEDULER_NAME}]
    if hold != GATE:
        raise ValueError(f"unknown hold {hold!r}")
    gates = spec.get("schedulingGates")
    if not gates:
        return [{"op": "add", "path": f"{base}/spec/schedulingGates", "value": [{"name": names.GATE}]}]
    if not any(g.get("name") == names.GATE for g in gates):
        return [{"op": "add", "path": f"{base}/spec/schedulingGates/-", "value": {"name": names.GATE}}]
    return []


def gated(pod: Mapping[str, Any]) -> bool:
    gates = (pod.get("spec") or {}).get("schedulingGates") or []
    return any(g.get("name") == names.GATE for g in gates)


def is_held(pod: Mapping[str, Any]) -> bool:
    """Is the pod waiting for fluxnetes to place it (either hold)?"""
    spec = pod.get("spec") or {}
    if gated(pod):
        return True
    return spec.get("schedulerName") == names.SCHEDULER_NAME and not spec.get("nodeName")
