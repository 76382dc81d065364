"""Leader election on a coordination.k8s.io/v1 Lease (as client-go's leaderelection does).

Several replicas may run: every one serves the webhook (stateless), only the holder of the
Lease watches, schedules and writes. A leader that cannot renew before ``lease_seconds``
steps down by exiting (``lost`` is set): the next leader rebuilds everything from the
cluster, which is the same path as a restart.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime, timedelta
from typing import Any

from fluxnetes.k8s.kube import LEASES, ApiError, Kube

log = logging.getLogger(__name__)


def _now() -> datetime:
    return datetime.now(UTC)


def _fmt(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _parse(s: str | None) -> datetime | None:
    if not s:
        return None
    s = s.replace("Z", "+00:00")
    try:
        return datetime.fromisoformat(s)
    except ValueError:
        return None


class LeaderElector:
    def __init__(self, kube: Kube, namespace: str, name: str, identity: str, *,
                 lease_seconds: int = 15, renew_seconds: float = 5) -> None:
        self.kube, self.namespace, self.name, self.identity = kube, namespace, name, identity
        self.lease_seconds, self.renew_seconds = lease_seconds, renew_seconds
        self.leading = asyncio.Event()
        self.lost = asyncio.Event()

    def _spec(self, acquire: datetime | None, transitions: int) -> dict[str, Any]:
        now = _now()
        return {"holderIdentity": self.identity, "leaseDurationSeconds": self.lease_seconds,
                "acquireTime": _fmt(acquire or now), "renewTime": _fmt(now),
                "leaseTransitions": transitions}

    async def try_acquire(self) -> bool:
        lease = await self.kube.get_or_none(LEASES, self.name, self.namespace)
        if lease is None:
            body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                    "metadata": {"name": self.name, "namespace": self.namespace},
                    "spec": self._spec(None, 0)}
            try:
                await self.kube.create(LEASES, body, self.namespace)
                return True
            except ApiError as exc:
                if exc.status == 409:
                    return False
                raise
        spec = lease.get("spec") or {}
        holder = spec.get("holderIdentity")
        renew = _parse(spec.get("renewTime"))
        duration = int(spec.get("leaseDurationSeconds") or self.lease_seconds)
        mine = holder == self.identity
        expired = renew is None or _now() - renew > timedelta(seconds=duration)
        if not mine and holder and not expired:
            return False
        transitions = int(spec.get("leaseTransitions") or 0) + (0 if mine else 1)
        acquire = _parse(spec.get("acquireTime")) if mine else None
        lease["spec"] = self._spec(acquire, transitions)
        try:
            await self.kube.replace(LEASES, self.name, lease, self.namespace)  # resourceVersion guards races
            return True
        except ApiError as exc:
            if exc.status == 409:
                return False
            raise

    async def run(self) -> None:
        """Acquire, then keep renewing; sets ``lost`` if renewal fails for a whole lease."""
        while not self.leading.is_set():
            try:
                if await self.try_acquire():
                    log.info("leader election: %s leads (lease %s/%s)", self.identity, self.namespace, self.name)
                    self.leading.set()
                    break
            except ApiError as exc:
                if exc.forbidden:
                    raise
                log.warning("leader election: %r", exc)
            except Exception as exc:
                log.warning("leader election: %r", exc)
            await asyncio.sleep(self.renew_seconds)
        last_ok = _now()
        while True:
            await asyncio.sleep(self.renew_seconds)
            try:
                if await self.try_acquire():
                    last_ok = _now()
                    continue
            except Exception as exc:
                log.warning("lease renewal failed: %r", exc)
            if _now() - last_ok > timedelta(seconds=self.lease_seconds):
                log.error("leader election: lost the lease; stepping down")
                self.lost.set()
                return

    async def release(self) -> None:
        """Give the lease up on a clean shutdown so another replica takes over at once."""
        try:
            lease = await self.kube.get_or_none(LEASES, self.name, self.namespace)
            if lease and (lease.get("spec") or {}).get("holderIdentity") == self.identity:
                lease["spec"]["holderIdentity"] = ""
                lease["spec"]["renewTime"] = _fmt(_now() - timedelta(days=1))
                await self.kube.replace(LEASES, self.name, lease, self.namespace)
        except Exception as exc:
            log.info("lease release: %r", exc)
