"""What the operator puts into the cluster when it starts (before leading): its namespace, the
CRDs, the webhook's certificate Secret and configurations, and their owner; and what
``fluxnetes run --cleanup`` takes away. Each step is idempotent: every replica runs it."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
from typing import Any

from fluxnetes.k8s import certs
from fluxnetes.k8s.admission import webhook_config
from fluxnetes.k8s.admission.hold import is_held
from fluxnetes.k8s.config import OperatorConfig
from fluxnetes.k8s.kube import (
    CRDS,
    MUTATING,
    NAMESPACES,
    POLICIES,
    POLICY_BINDINGS,
    SECRETS,
    VALIDATING,
    ApiError,
    Kube,
    Resource,
    crd_established,
    short,
    transient,
)
from fluxnetes.k8s.persistence import fluxjob

log = logging.getLogger("fluxnetes.k8s.operator")

SECRET_NAME = "fluxnetes-webhook-cert"
CLUSTER_ROLES = Resource("rbac.authorization.k8s.io/v1", "clusterroles", namespaced=False)


async def find_owner(kube: Kube, name: str | None) -> webhook_config.Owner | None:
    """The installation's ClusterRole (see webhook_config.Owner), or None (logged) when it is
    not named, does not exist or may not be read: the operator then works as before and its
    webhook configurations, certificate Secret and leader Lease outlive it until deleted by hand."""
    if not name:
        log.info("no owner ClusterRole (--owner-cluster-role ''): the webhook configurations and the "
                 "leader Lease will outlive the operator")
        return None
    try:
        role = await kube.get_or_none(CLUSTER_ROLES, name)
    except ApiError as exc:
        if not exc.forbidden:
            raise
        log.warning("cannot read ClusterRole %s (HTTP %d): the webhook configurations get no owner and "
                    "will outlive the installation (grant `get` on clusterroles/%s, as the chart does)",
                    name, exc.status, name)
        return None
    if role is None:
        log.warning("ClusterRole %s not found: the webhook configurations get no owner and will outlive "
                    "the operator (normal out of cluster without the chart; see --owner-cluster-role)", name)
        return None
    owner = webhook_config.Owner(name=name, uid=str(role["metadata"]["uid"]))
    log.info("webhook configurations and the leader Lease owned by ClusterRole %s (deleted with it)", name)
    return owner


async def ensure_namespace(kube: Kube, name: str) -> None:
    if await kube.get_or_none(NAMESPACES, name) is None:
        with contextlib.suppress(ApiError):
            await kube.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})


async def ensure_crd(kube: Kube) -> None:
    crd = fluxjob.crd_manifest()
    name = crd["metadata"]["name"]
    current = await kube.get_or_none(CRDS, name)
    if current is None:
        await kube.create(CRDS, crd)
    elif current.get("spec", {}).get("versions") != crd["spec"]["versions"]:
        crd["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
        with contextlib.suppress(ApiError):
            await kube.replace(CRDS, name, crd)
    elif crd_established(current):
        return  # (every restart: one round trip, not two)
    for _ in range(100):
        if crd_established(await kube.get(CRDS, name)):
            return
        await asyncio.sleep(0.1)
    raise RuntimeError(f"CRD {name} did not become Established")


async def ensure_accounts_crd(kube: Kube, cfg: OperatorConfig) -> None:
    """Fair share watches FluxAccounts: their CRD (installed by the chart) is created when it
    is missing and may be; otherwise fair share is off for this run (logged), since a watch
    of a resource the API server does not serve would never sync."""
    from fluxnetes.k8s.fairshare import accounts

    crd = accounts.crd_manifest()
    name = crd["metadata"]["name"]
    try:
        if await kube.get_or_none(CRDS, name) is None:
            with contextlib.suppress(ApiError):
                await kube.create(CRDS, crd)  # 409: another replica made it
            for _ in range(100):
                if crd_established(await kube.get_or_none(CRDS, name)):
                    return
                await asyncio.sleep(0.1)
            log.warning("fair share off: the FluxAccount CRD %s did not become Established", name)
            cfg.fairshare = "off"
    except ApiError as exc:
        if transient(exc):
            raise  # set-up is tried again
        log.warning("fair share off: the FluxAccount CRD %s is not installed and cannot be (%s); "
                    "install deploy/crds/%s and restart, or pass --fairshare off", name, short(exc), name)
        cfg.fairshare = "off"


async def ensure_cert(kube: Kube, namespace: str, hosts: list[str],
                      owner: webhook_config.Owner | None = None) -> certs.CertBundle:
    """The serving certificate from the Secret (made or renewed if needed); replicas share it."""
    secret = await kube.get_or_none(SECRETS, SECRET_NAME, namespace)
    if secret is not None:
        data = {k: base64.b64decode(v) for k, v in (secret.get("data") or {}).items()}
        try:
            bundle = certs.CertBundle.from_secret_data(data)
            if not certs.needs_renewal(bundle, hosts):
                return bundle
            bundle = certs.renew(bundle, hosts)
        except (KeyError, ValueError):
            bundle = certs.make_bundle(hosts)
        secret["data"] = {k: base64.b64encode(v).decode() for k, v in bundle.as_secret_data().items()}
        try:
            await kube.replace(SECRETS, SECRET_NAME, secret, namespace)
            return bundle
        except ApiError as exc:
            if exc.status != 409:
                raise
            return await ensure_cert(kube, namespace, hosts, owner)  # another replica renewed it
    bundle = certs.make_bundle(hosts)
    body = {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {"name": SECRET_NAME, "namespace": namespace,
                         "labels": {"app.kubernetes.io/managed-by": "fluxnetes"}},
            "data": {k: base64.b64encode(v).decode() for k, v in bundle.as_secret_data().items()}}
    try:
        await kube.create(SECRETS, webhook_config.owned(body, owner), namespace)
        return bundle
    except ApiError as exc:
        if exc.status != 409:
            raise
        return await ensure_cert(kube, namespace, hosts, owner)


async def apply_config(kube: Kube, res: Any, body: dict[str, Any]) -> None:
    name = body["metadata"]["name"]
    current = await kube.get_or_none(res, name)
    if current is None:
        await kube.create(res, body)
        return
    body["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
    await kube.replace(res, name, body)


async def whoami(kube: Kube) -> str:
    review = await kube.request("POST", "/apis/authentication.k8s.io/v1/selfsubjectreviews",
                                {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"})
    return str(((review.get("status") or {}).get("userInfo") or {}).get("username", ""))


async def wait_webhook_ready(kube: Kube, namespace_label: str, timeout: float = 20,
                             owner: webhook_config.Owner | None = None) -> None:
    """The API server picks webhook configurations up through an informer: wait until a
    dry-run pod create in an opted-in namespace comes back held (gated, or with fluxnetes'
    scheduler name in placement ``bind``)."""
    key, _, value = namespace_label.partition("=")
    ns = "fluxnetes-probe"
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "probe", "namespace": ns},
           "spec": {"containers": [{"name": "c", "image": "probe"}]}}
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while loop.time() < end:
        # (re)made each round: one left by an earlier installation may still be terminating
        if await kube.get_or_none(NAMESPACES, ns) is None:
            with contextlib.suppress(ApiError):
                # owned like the webhook configurations: it goes with the installation
                await kube.create(NAMESPACES, webhook_config.owned(
                    {"apiVersion": "v1", "kind": "Namespace",
                     "metadata": {"name": ns, "labels": {key: value or "true"}}}, owner))
        try:
            out = await kube.request("POST", f"/api/v1/namespaces/{ns}/pods", pod, params={"dryRun": "All"})
            if is_held(out):
                return
        except ApiError as exc:
            log.debug("webhook probe: %s", exc)
        await asyncio.sleep(0.2)
    log.warning("webhook not observed active after %.0fs; continuing", timeout)


async def remove_webhooks(kube: Kube) -> None:
    """Delete the webhook configurations (``fluxnetes run --cleanup`` on the way out)."""
    await kube.delete(MUTATING, webhook_config.NAME)
    await kube.delete(VALIDATING, webhook_config.NAME)
    await kube.delete(POLICY_BINDINGS, webhook_config.POLICY_NAME)
    await kube.delete(POLICIES, webhook_config.POLICY_NAME)
