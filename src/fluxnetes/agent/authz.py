"""Who may run ``nodes exec`` / ``nodes broadcast``, and the audit trail.

Two ways to prove who you are to rank 0:

- a client certificate from the agents' CA (organisation ``fluxnetes:client``; agents'
  certificates count too): the CN is the user name. Holding such a certificate is itself the
  permission (it is made from the operator's CA key); no API call is needed, so this is also
  how the tests and local trials work.
- a Kubernetes bearer token (OIDC, cloud IAM, service-account token): rank 0 asks the API
  server who it is (TokenReview) and whether that user may use the verb
  (SubjectAccessReview: verb ``exec`` or ``broadcast`` on resource ``nodes`` of API group
  ``fluxnetes.io``), which the chart's ``<release>-agent-exec`` ClusterRole grants.

Every request is logged with the user, and recorded as an Event on rank 0's Node when the
agent has API access.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

log = logging.getLogger("fluxnetes.agent.audit")

API_GROUP = "fluxnetes.io"
RESOURCE = "nodes"


@dataclass(frozen=True)
class Identity:
    user: str
    groups: tuple[str, ...] = ()
    via: str = "certificate"  # or "token"


class AuthError(Exception):
    """Not authenticated or not allowed; the message is shown to the caller."""


class Authorizer(Protocol):
    async def authenticate(self, token: str) -> Identity: ...

    async def allow(self, who: Identity, verb: str) -> None: ...

    async def audit(self, who: Identity, verb: str, node: str, detail: str) -> None: ...


@dataclass
class LocalAuthorizer:
    """No API server (static ``--peers``): certificate clients only; audit to the log."""

    async def authenticate(self, token: str) -> Identity:
        raise AuthError("this agent has no Kubernetes API access to check a token; connect with "
                        "a client certificate from the agents' CA (--cert-dir)")

    async def allow(self, who: Identity, verb: str) -> None:
        if who.via != "certificate":
            raise AuthError(f"{who.user}: only certificate clients are accepted here")

    async def audit(self, who: Identity, verb: str, node: str, detail: str) -> None:
        log.info("audit: user %s (%s) %s on %s: %s", who.user, who.via, verb, node, detail)


@dataclass
class KubeAuthorizer:
    kube: Any  # fluxnetes.k8s.kube.Kube
    namespace: str = field(default_factory=lambda: os.environ.get("POD_NAMESPACE", "default"))

    async def authenticate(self, token: str) -> Identity:
        from fluxnetes.k8s.kube import ApiError

        try:
            review = await self.kube.request("POST", "/apis/authentication.k8s.io/v1/tokenreviews", {
                "apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token}})
        except ApiError as exc:
            raise AuthError(f"cannot check the token: {exc}") from None
        st = review.get("status") or {}
        if not st.get("authenticated"):
            raise AuthError(f"token not accepted by the API server: {st.get('error') or 'unauthenticated'}")
        user = st.get("user") or {}
        return Identity(str(user.get("username", "")), tuple(user.get("groups") or ()), "token")

    async def allow(self, who: Identity, verb: str) -> None:
        if who.via == "certificate":
            return
        from fluxnetes.k8s.kube import ApiError

        body = {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
                "spec": {"user": who.user, "groups": list(who.groups),
                         "resourceAttributes": {"group": API_GROUP, "resource": RESOURCE, "verb": verb}}}
        try:
            sar = await self.kube.request("POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews", body)
        except ApiError as exc:
            raise AuthError(f"cannot check permission: {exc}") from None
        if not (sar.get("status") or {}).get("allowed"):
            raise AuthError(f"user {who.user!r} may not {verb} {RESOURCE}.{API_GROUP} (grant it with "
                            "the chart's agent-exec ClusterRole: docs/agent.md)")

    async def audit(self, who: Identity, verb: str, node: str, detail: str) -> None:
        from fluxnetes.k8s.kube import EVENTS, ApiError

        log.info("audit: user %s (%s) %s on %s: %s", who.user, who.via, verb, node, detail)
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        event = {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"generateName": f"{node}.fluxnetes-{verb}.", "namespace": self.namespace},
            "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": node},
            "reason": "FluxnetesNode" + verb.capitalize(), "type": "Normal",
            "message": f"user {who.user} ({who.via}): {detail}"[:1000],
            "source": {"component": "fluxnetes-agent", "host": node},
            "firstTimestamp": now, "lastTimestamp": now, "count": 1,
        }
        try:
            await self.kube.create(EVENTS, event, self.namespace)
        except (ApiError, OSError) as exc:
            log.warning("audit Event not written: %s", exc)
