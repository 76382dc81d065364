"""The Mutating/ValidatingWebhookConfiguration the operator keeps in place itself.

Scope: only namespaces labelled ``fluxnetes.io/enabled=true`` (configurable), never
kube-system, kube-public, kube-node-lease or the operator's own namespace; objects labelled
``fluxnetes.io/enabled=false`` are skipped.

failurePolicy: Fail (default), the outage story. Opted-in namespaces must never run work
that bypasses the queue, so while no replica answers, the API server refuses to create pods
and workloads there ("failed calling webhook \"pods.mutate.fluxnetes.io\" ... connection
refused"); every other namespace, kube-system included, is never called and never
affected. Every replica serves the webhook, leader or not (the chart runs 2 replicas behind
one Service with a PodDisruptionBudget; replicas on one host share the port), so a leader
crash or a rolling update does not close the namespaces. Controllers (the Job controller,
ReplicaSets) retry refused creates by themselves. ``--failure-policy Ignore`` trades this
for availability: work created during an outage then runs unmanaged and fluxnetes counts it
as foreign pods. The gate-protecting validating webhook (only used without
ValidatingAdmissionPolicy) stays Ignore: it guards updates, and kube-controller-manager
must be able to update pods (finalizers) during an outage.

The gate's guard (the ValidatingAdmissionPolicy, or the validating webhook where policies are
not served) selects fluxnetes' pods but the ones labelled ``fluxnetes.io/hold=scheduler-name``:
those are held by the scheduler name and have no gate (:func:`gated_pods_selector`).

Pods bound by hand (``spec.nodeName`` at creation) in an opted-in namespace, even ones
labelled ``fluxnetes.io/enabled=false``, reach the pod webhook (``matchConditions``) and
are refused there (admission.py): they would skip both schedulers and take resources the
queue promised to others.

Lifetime: these objects are created by the running operator, not by the chart, so nothing
would delete them when the installation is removed (``helm uninstall``, ``kubectl delete -f
dist/fluxnetes.yaml``). Each one therefore carries an ownerReference to the installation's
ClusterRole (``Owner``; ``fluxnetes run --owner-cluster-role``): when that ClusterRole goes,
the garbage collector of kube-controller-manager deletes them. Without an owner (an
out-of-cluster run with no such ClusterRole) they stay until deleted by hand.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fluxnetes.k8s import names

if TYPE_CHECKING:
    from fluxnetes.k8s.workloads.base import WorkloadKind

NAME = "fluxnetes.io"
MUTATE_PODS_PATH = "/mutate-pods"
MUTATE_WORKLOADS_PATH = "/mutate-workloads"
VALIDATE_PODS_PATH = "/validate-pods"
_SYSTEM_NAMESPACES = ["kube-system", "kube-public", "kube-node-lease"]
OWNER_API_VERSION = "rbac.authorization.k8s.io/v1"
OWNER_KIND = "ClusterRole"


@dataclass(frozen=True)
class Owner:
    """The cluster-scoped object whose deletion takes the operator's own objects with it: the
    installation's ClusterRole (the chart and dist/fluxnetes.yaml create it, the uninstall
    deletes it). Cluster-scoped dependents may only name a cluster-scoped owner."""

    name: str
    uid: str

    def reference(self) -> dict[str, Any]:
        # no blockOwnerDeletion: it would need delete rights on the ClusterRole, and nothing
        # has to wait for these objects to go
        return {"apiVersion": OWNER_API_VERSION, "kind": OWNER_KIND, "name": self.name, "uid": self.uid}


def owned(body: dict[str, Any], owner: Owner | None) -> dict[str, Any]:
    """``body`` with its ownerReferences set to ``owner`` (or removed when there is none)."""
    meta = body.setdefault("metadata", {})
    if owner is None:
        meta.pop("ownerReferences", None)
    else:
        meta["ownerReferences"] = [owner.reference()]
    return body


@dataclass(frozen=True)
class WebhookTarget:
    """Where the API server reaches the webhook: a URL base (out of cluster) or a Service."""

    url: str | None = None  # e.g. https://127.0.0.1:9443
    service_name: str | None = None
    service_namespace: str | None = None
    service_port: int = 443

    def client_config(self, path: str, ca_bundle: bytes) -> dict[str, Any]:
        cfg: dict[str, Any] = {"caBundle": base64.b64encode(ca_bundle).decode()}
        if self.url:
            cfg["url"] = self.url.rstrip("/") + path
        else:
            cfg["service"] = {"name": self.service_name, "namespace": self.service_namespace,
                              "port": self.service_port, "path": path}
        return cfg


@dataclass(frozen=True)
class Scope:
    namespace_label: str = f"{names.LABEL_ENABLED}=true"
    own_namespace: str = "fluxnetes-system"
    failure_policy: str = "Fail"
    timeout_seconds: int = 5
    extra_excluded: list[str] = field(default_factory=list)
    # pods made from a template the workload webhook already gated and labelled (Jobs,
    # ReplicaSets, StatefulSets) carry fluxnetes.io/managed=true and the gate at birth: they
    # skip the pod webhook (one admission call less per pod; the pod-creation rate of the Job
    # controller was the operator's bottleneck). True sends them through it anyway.
    admit_template_pods: bool = False

    def namespace_selector(self) -> dict[str, Any]:
        key, _, value = self.namespace_label.partition("=")
        excluded = sorted({*_SYSTEM_NAMESPACES, self.own_namespace, *self.extra_excluded})
        return {"matchExpressions": [
            {"key": key, "operator": "In", "values": [value or "true"]},
            {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": excluded},
        ]}


def _common(scope: Scope, failure_policy: str | None = None) -> dict[str, Any]:
    return {
        "admissionReviewVersions": ["v1"],
        "sideEffects": "None",
        "failurePolicy": failure_policy or scope.failure_policy,
        "timeoutSeconds": scope.timeout_seconds,
        "namespaceSelector": scope.namespace_selector(),
    }


def _label_is(key: str, value: str) -> str:
    return (f"(has(object.metadata.labels) && {json.dumps(key)} in object.metadata.labels "
            f"&& object.metadata.labels[{json.dumps(key)}] == {json.dumps(value)})")


def pod_match_conditions(scope: Scope) -> list[dict[str, str]]:
    """Which pods the pod webhook sees (CEL, evaluated by the API server): every pod bound by
    hand (``spec.nodeName``: refused there), otherwise not the ones opted out with
    ``fluxnetes.io/enabled=false`` nor, unless ``admit_template_pods``, the ones born held
    from a template the workload webhook already mutated (``fluxnetes.io/managed=true``; a
    pod labelled so by hand is not held: kube-scheduler places it and fluxnetes counts it
    as foreign), unless such a pod carries fluxnetes' gate and the label
    ``fluxnetes.io/hold=scheduler-name`` together (:func:`gated_pods_selector`)."""
    skipped = [_label_is(names.LABEL_ENABLED, "false")]
    if not scope.admit_template_pods:
        # but a gated pod also labelled as held by the scheduler name (which the gate's
        # guard skips) is not one the workload webhook made: the pod webhook drops the label
        gated = (f"(has(object.spec.schedulingGates) && object.spec.schedulingGates.exists(g, g.name == "
                 f"{json.dumps(names.GATE)}))")
        forged = f"({gated} && {_label_is(names.LABEL_HOLD, names.HOLD_SCHEDULER_NAME)})"
        skipped.append(f"({_label_is(names.LABEL_MANAGED, 'true')} && !{forged})")
    bound = '(has(object.spec.nodeName) && object.spec.nodeName != "")'
    return [{"name": "bound-by-hand-or-not-held-yet", "expression": f"{bound} || !({' || '.join(skipped)})"}]


MULTI_ROLE_WEBHOOK = "multirole.mutate.fluxnetes.io"


def multi_role_rules(kinds: Sequence[WorkloadKind]) -> list[dict[str, Any]]:
    """CREATE rules for the multi-role kinds that are on (workloads.enabled_kinds), one per
    API group and version, in a stable order."""
    by_gv: dict[tuple[str, str], set[str]] = {}
    for k in kinds:
        by_gv.setdefault((k.group, k.version), set()).add(k.plural)
    return [{"apiGroups": [g], "apiVersions": [v], "operations": ["CREATE"],
             "resources": sorted(plurals), "scope": "Namespaced"}
            for (g, v), plurals in sorted(by_gv.items())]


def mutating(target: WebhookTarget, scope: Scope, ca_bundle: bytes,
             multi_role: Sequence[WorkloadKind] = ()) -> dict[str, Any]:
    """The mutating webhooks: pods, the built-in workload kinds and, when ``multi_role`` names
    any (the multi-role kinds whose CRD is served), a third webhook for those, on the same
    handler as the built-in kinds."""
    not_disabled = {"matchExpressions": [{"key": names.LABEL_ENABLED, "operator": "NotIn", "values": ["false"]}]}
    config: dict[str, Any] = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": NAME, "labels": {"app.kubernetes.io/managed-by": "fluxnetes"}},
        "webhooks": [
            {
                "name": "pods.mutate.fluxnetes.io",
                "clientConfig": target.client_config(MUTATE_PODS_PATH, ca_bundle),
                "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                           "resources": ["pods"], "scope": "Namespaced"}],
                "matchConditions": pod_match_conditions(scope),
                "reinvocationPolicy": "Never",
                **_common(scope),
            },
            {
                "name": "workloads.mutate.fluxnetes.io",
                "clientConfig": target.client_config(MUTATE_WORKLOADS_PATH, ca_bundle),
                "rules": [
                    {"apiGroups": ["batch"], "apiVersions": ["v1"], "operations": ["CREATE"],
                     "resources": ["jobs"], "scope": "Namespaced"},
                    {"apiGroups": ["apps"], "apiVersions": ["v1"], "operations": ["CREATE"],
                     "resources": ["deployments", "replicasets", "statefulsets"], "scope": "Namespaced"},
                ],
                "objectSelector": not_disabled,
                "reinvocationPolicy": "Never",
                **_common(scope),
            },
        ],
    }
    rules = multi_role_rules([k for k in multi_role if k.addon])
    if rules:
        config["webhooks"].append({
            "name": MULTI_ROLE_WEBHOOK,
            "clientConfig": target.client_config(MUTATE_WORKLOADS_PATH, ca_bundle),
            "rules": rules,
            "objectSelector": not_disabled,
            "reinvocationPolicy": "Never",
            **_common(scope),
        })
    return config


def gated_pods_selector() -> dict[str, Any]:
    """The pods whose updates the gate's guard (the policy, or the validating webhook) sees:
    fluxnetes' pods but the ones held by its scheduler name only (``fluxnetes.io/hold``, which
    the webhook never leaves on a gated pod). On an update the API server matches the old and
    the new object, either suffices: a pod gaining that label is still seen. Pods admitted
    before the label existed lack it and stay guarded, unless their user wrote it (a webhook
    that did not know the label kept it): the operator takes it off a gated pod it sees
    (Controller._unforge_hold_label)."""
    return {"matchExpressions": [
        {"key": names.LABEL_MANAGED, "operator": "In", "values": ["true"]},
        {"key": names.LABEL_HOLD, "operator": "NotIn", "values": [names.HOLD_SCHEDULER_NAME]},
    ]}


def validating(target: WebhookTarget, scope: Scope, ca_bundle: bytes) -> dict[str, Any]:
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": NAME, "labels": {"app.kubernetes.io/managed-by": "fluxnetes"}},
        "webhooks": [
            {
                "name": "pods.validate.fluxnetes.io",
                "clientConfig": target.client_config(VALIDATE_PODS_PATH, ca_bundle),
                "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["UPDATE"],
                           "resources": ["pods"], "scope": "Namespaced"}],
                # only pods fluxnetes may have gated: other pod updates never reach the webhook
                "objectSelector": gated_pods_selector(),
                # Ignore whatever --failure-policy says: kube-controller-manager updates these
                # pods (finalizers) and must not be stopped by an outage (see the docstring)
                **_common(scope, "Ignore"),
            },
        ],
    }


POLICY_NAME = "fluxnetes.io-gate"


def gate_policy(scope: Scope, operators: list[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The gate rule as a ValidatingAdmissionPolicy (CEL, evaluated inside the API server: no
    webhook round trip on the several updates every pod gets, and nothing that can be down).
    Used when the API server serves admissionregistration.k8s.io/v1 policies (1.30+); the
    validating webhook is the fallback."""

    gate = json.dumps(names.GATE)
    who = ", ".join(json.dumps(o) for o in sorted(operators)) or '""'
    has_gate = "has({o}.spec.schedulingGates) && {o}.spec.schedulingGates.exists(g, g.name == " + gate + ")"
    operator = f"request.userInfo.username in [{who}]"
    expression = f"!({has_gate.format(o='oldObject')}) || ({has_gate.format(o='object')}) || {operator}"
    message = ("'fluxnetes: only the fluxnetes operator may remove the scheduling gate " + names.GATE
               + " (user ' + request.userInfo.username + ' may not); delete the pod to cancel it'")
    # a gated pod labelled as held by the scheduler name would leave the policy's selector,
    # and its gate with it: only the operator may label it so
    hold_key, hold_value = json.dumps(names.LABEL_HOLD), json.dumps(names.HOLD_SCHEDULER_NAME)
    held_by_name = ("(has({o}.metadata.labels) && " + hold_key + " in {o}.metadata.labels && {o}.metadata.labels["
                    + hold_key + "] == " + hold_value + ")")
    label_rule = (f"!({has_gate.format(o='object')}) || !{held_by_name.format(o='object')} "
                  f"|| {held_by_name.format(o='oldObject')} || {operator}")
    label_message = ("'fluxnetes: only the fluxnetes operator may label a gated pod " + names.LABEL_HOLD + "="
                     + names.HOLD_SCHEDULER_NAME + " (user ' + request.userInfo.username + ' may not)'")
    policy = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": POLICY_NAME, "labels": {"app.kubernetes.io/managed-by": "fluxnetes"}},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["UPDATE"],
                                   "resources": ["pods"]}],
                "namespaceSelector": scope.namespace_selector(),
                "objectSelector": gated_pods_selector(),
            },
            "validations": [{"expression": expression, "messageExpression": message, "reason": "Forbidden"},
                            {"expression": label_rule, "messageExpression": label_message, "reason": "Forbidden"}],
        },
    }
    binding = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": POLICY_NAME, "labels": {"app.kubernetes.io/managed-by": "fluxnetes"}},
        "spec": {"policyName": POLICY_NAME, "validationActions": ["Deny"]},
    }
    return policy, binding
