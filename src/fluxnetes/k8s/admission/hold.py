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

Placement ``auto`` (the default) chooses per pod (or pod template) at admission: the
scheduler-name hold, unless the pod needs a check only kube-scheduler makes (:func:`needs_kube_scheduler`:
a volume claim to bind, a host port, inter-pod affinity, topology spread, resource claims),
then the gate. The operator places each pod by the hold it carries (k8s/scheduling/allocation.py), so
one cluster, even one group, may have both.

A pod (or template) held by the scheduler name only is also labelled ``fluxnetes.io/hold:
scheduler-name`` (:func:`hold_label_ops`); the gate's guard (webhook_config.gate_policy) skips
pods so labelled, since they have no gate: otherwise every update of such a pod (the Job
controller's finalizer patch, for one) would cost the API server a CEL evaluation of the whole
old and new pod. A gated pod never keeps that label: the webhook drops it, and only the
operator may add it.

The webhook writes a hold at admission (pods and pod templates); the operator asks
:func:`is_held` which pods are waiting for it. A pod or template whose user wrote
``schedulerName: fluxnetes`` is held already, in any namespace and without the webhook
(:func:`is_ours`): the webhook, where it runs, only checks it and adds the label.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fluxnetes.k8s import names

GATE = "gate"
SCHEDULER = "scheduler"
AUTO = "auto"  # per pod: SCHEDULER unless it needs kube-scheduler's checks, then GATE
PLACEMENTS = {"auto": AUTO, "affinity": GATE, "bind": SCHEDULER}  # --placement -> hold

JsonPatch = list[dict[str, Any]]


def needs_kube_scheduler(spec: Mapping[str, Any]) -> str | None:
    """What in this pod spec only kube-scheduler checks (the matcher and nodefit.py do not),
    or None. Such a pod is held with the gate and bound by kube-scheduler (placement
    ``affinity``) even when the operator could bind it: a claim of a WaitForFirstConsumer
    volume is bound only once kube-scheduler picked the node, and host ports, inter-pod
    affinity and topology spread depend on other pods."""
    for vol in spec.get("volumes") or []:
        if vol.get("persistentVolumeClaim") or vol.get("ephemeral"):
            return f"volume {vol.get('name')!r} is a claim (kube-scheduler binds it)"
    for c in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
        if any(p.get("hostPort") for p in c.get("ports") or []):
            return f"container {c.get('name')!r} asks for a host port"
    affinity = spec.get("affinity") or {}
    if affinity.get("podAffinity") or affinity.get("podAntiAffinity"):
        return "inter-pod affinity"
    if spec.get("topologySpreadConstraints"):
        return "topology spread constraints"
    if spec.get("resourceClaims"):
        return "resource claims"
    return None


def names_fluxnetes(spec: Mapping[str, Any]) -> bool:
    """Does this pod (or pod template) spec name fluxnetes as its scheduler? Its user opted
    in (as with Volcano's or YuniKorn's scheduler name): it is held by that name whatever
    ``--placement`` says, and the operator binds it."""
    return spec.get("schedulerName") == names.SCHEDULER_NAME


def is_ours(meta: Mapping[str, Any], spec: Mapping[str, Any]) -> bool:
    """Is this pod (or pod template, by its metadata and spec) fluxnetes' to place: admitted
    by its webhook (the managed label) or naming fluxnetes as its scheduler (no webhook
    needed: any namespace, a cluster without the webhook)?"""
    return (meta.get("labels") or {}).get(names.LABEL_MANAGED) == "true" or names_fluxnetes(spec)


def template_is_ours(template: Mapping[str, Any]) -> bool:
    """:func:`is_ours` for a workload's pod template."""
    return is_ours(template.get("metadata") or {}, template.get("spec") or {})


def resolve(spec: Mapping[str, Any], hold: str) -> str:
    """The hold for this pod spec: ``hold`` itself, or for AUTO the one it needs."""
    if hold != AUTO:
        return hold
    return GATE if needs_kube_scheduler(spec) else SCHEDULER


def hold_ops(spec: Mapping[str, Any], base: str, hold: str) -> JsonPatch:
    """JSON patch ops holding the pod (or pod template) whose spec is ``spec`` at ``base``
    (``""`` for a pod, ``/spec/template`` for a template)."""
    if names_fluxnetes(spec):
        return []  # held by its own scheduler name, whatever --placement says
    hold = resolve(spec, hold)
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


# The label's JSON pointer below a pod (RFC 6901 escapes; workloads.base._escape, which
# imports this module, cannot be imported here).
_HOLD_LABEL_PATH = "/metadata/labels/" + names.LABEL_HOLD.replace("~", "~0").replace("/", "~1")


def hold_label_ops(labels: Mapping[str, str], spec: Mapping[str, Any], base: str, hold: str) -> JsonPatch:
    """JSON patch ops for the label ``fluxnetes.io/hold`` of the pod (or pod template) at
    ``base`` whose labels and spec are ``labels`` and ``spec`` (before :func:`hold_ops`; its
    labels map must exist when these ops run): ``scheduler-name`` when it is held by
    fluxnetes' scheduler name only, and no such label (one its user wrote is removed) when it
    carries or gets fluxnetes' gate, so the gate's policy always sees a gated pod."""
    gets_gate = gated({"spec": spec}) or (not names_fluxnetes(spec) and resolve(spec, hold) == GATE)
    path = f"{base}{_HOLD_LABEL_PATH}"
    if gets_gate:
        return [{"op": "remove", "path": path}] if names.LABEL_HOLD in labels else []
    return [{"op": "add", "path": path, "value": names.HOLD_SCHEDULER_NAME}]


def forged_hold_label_patch(pod: Mapping[str, Any]) -> JsonPatch | None:
    """JSON patch taking ``fluxnetes.io/hold=scheduler-name`` off a gated pod (None when the
    pod is not both): the gate's guard skips pods so labelled. The webhook never leaves it
    on a gated pod, but one admitted by a webhook that did not know the label (before an
    upgrade, or by an old replica while a new one had installed the guard's selector) may
    carry its user's; the operator, which alone may, takes it off. The ``test`` makes the
    write a no-op if the label changed meanwhile."""
    labels = (pod.get("metadata") or {}).get("labels") or {}
    if not gated(pod) or labels.get(names.LABEL_HOLD) != names.HOLD_SCHEDULER_NAME:
        return None
    path = _HOLD_LABEL_PATH
    return [{"op": "test", "path": path, "value": names.HOLD_SCHEDULER_NAME}, {"op": "remove", "path": path}]


def gated(pod: Mapping[str, Any]) -> bool:
    gates = (pod.get("spec") or {}).get("schedulingGates") or []
    return any(g.get("name") == names.GATE for g in gates)


def is_held(pod: Mapping[str, Any]) -> bool:
    """Is the pod waiting for fluxnetes to place it (either hold)?"""
    spec = pod.get("spec") or {}
    if gated(pod):
        return True
    return spec.get("schedulerName") == names.SCHEDULER_NAME and not spec.get("nodeName")
