"""The Mutating/ValidatingWebhookConfiguration the operator keeps in place itself.

Scope: only namespaces labelled ``fluxnetes.io/enabled=true`` (configurable), never
kube-system, kube-public, kube-node-lease or the operator's own namespace; objects labelled
``fluxnetes.io/enabled=false`` are skipped.

failurePolicy: Ignore (default). If the operator is down, the API server admits objects
unmutated after the short timeout instead of refusing them: nothing in the cluster can be
blocked by a fluxnetes outage. The cost is that work created during an outage is not gated;
it is then scheduled by kube-scheduler and fluxnetes counts it like any other foreign pod
(nothing is double-booked). ``--failure-policy Fail`` is available for namespaces that must
never run unqueued work; even then only opted-in namespaces are affected.

Lifetime: these objects are created by the running operator, not by the chart, so nothing
would delete them when the installation is removed (``helm uninstall``, ``kubectl delete -f
dist/fluxnetes.yaml``). Each one therefore carries an ownerReference to the installation's
ClusterRole (``Owner``; ``fluxnetes run --owner-cluster-role``): when that ClusterRole goes,
the garbage collector of kube-controller-manager deletes them. Without an owner (an
out-of-cluster run with no such ClusterRole) they stay until deleted by hand.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any

from fluxnetes.k8s import names

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
    failure_policy: str = "Ignore"
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


def _common(scope: Scope) -> dict[str, Any]:
    return {
        "admissionReviewVersions": ["v1"],
        "sideEffects": "None",
        "failurePolicy": scope.failure_policy,
        "timeoutSeconds": scope.timeout_seconds,
        "namespaceSelector": scope.namespace_selector(),
    }


def mutating(target: WebhookTarget, scope: Scope, ca_bundle: bytes) -> dict[str, Any]:
    not_disabled = {"matchExpressions": [{"key": names.LABEL_ENABLED, "operator": "NotIn", "values": ["false"]}]}
    pods_selector = not_disabled if scope.admit_template_pods else {"matchExpressions": [
        *not_disabled["matchExpressions"],
        # already gated at birth (template mutated at the workload's admission). A pod labelled
        # so by hand is not gated: kube-scheduler places it and fluxnetes counts it as foreign.
        {"key": names.LABEL_MANAGED, "operator": "NotIn", "values": ["true"]},
    ]}
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": NAME, "labels": {"app.kubernetes.io/managed-by": "fluxnetes"}},
        "webhooks": [
            {
                "name": "pods.mutate.fluxnetes.io",
                "clientConfig": target.client_config(MUTATE_PODS_PATH, ca_bundle),
                "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                           "resources": ["pods"], "scope": "Namespaced"}],
                "objectSelector": pods_selector,
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
                # only pods fluxnetes gated: other pod updates never reach the webhook
                "objectSelector": {"matchLabels": {names.LABEL_MANAGED: "true"}},
                **_common(scope),
            },
        ],
    }


POLICY_NAME = "fluxnetes.io-gate"


def gate_policy(scope: Scope, operators: list[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The gate rule as a ValidatingAdmissionPolicy (CEL, evaluated inside the API server: no
    webhook round trip on the several updates every pod gets, and nothing that can be down).
    Used when the API server serves admissionregistration.k8s.io/v1 policies (1.30+); the
    validating webhook is the fallback."""
    import json

    gate = json.dumps(names.GATE)
    who = ", ".join(json.dumps(o) for o in sorted(operators)) or '""'
    has_gate = "has({o}.spec.schedulingGates) && {o}.spec.schedulingGates.exists(g, g.name == " + gate + ")"
    expression = (f"!({has_gate.format(o='oldObject')}) || ({has_gate.format(o='object')}) "
                  f"|| request.userInfo.username in [{who}]")
    message = ("'fluxnetes: only the fluxnetes operator may remove the scheduling gate " + names.GATE
               + " (user ' + request.userInfo.username + ' may not); delete the pod to cancel it'")
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
                "objectSelector": {"matchLabels": {names.LABEL_MANAGED: "true"}},
            },
            "validations": [{"expression": expression, "messageExpression": message, "reason": "Forbidden"}],
        },
    }
    binding = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": POLICY_NAME, "labels": {"app.kubernetes.io/managed-by": "fluxnetes"}},
        "spec": {"policyName": POLICY_NAME, "validationActions": ["Deny"]},
    }
    return policy, binding
