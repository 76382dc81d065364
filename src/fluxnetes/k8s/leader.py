"""Leader election on a coordination.k8s.io/v1 Lease, renewed from a thread of its own.

Several replicas may run: every one serves the webhook (stateless), only the holder of the
Lease watches, schedules and writes.

Why a thread: the scheduling cycle runs on the operator's event loop and can hold it for
seconds with a large backlog. A renewal that waits for the loop lets the Lease lapse while
the leader still acts (issue #11: 5-10 s cycles, renewals 24-27 s apart against a 15 s
lease). The elector runs its own event loop and HTTP client (``Kube.clone``) in a thread,
so a renewal waits for no cycle, only for the interpreter lock, which a busy thread hands
over every few milliseconds.

Fencing (why the leader stops acting before anyone else can start): a renewal that began
at monotonic time ``t`` and succeeded lets this process write until ``t +
renew_deadline`` (``Fence``; ``renew_deadline = lease_seconds - margin``). Every write of
the operator's client checks the fence just before it is sent and its timeout is capped at
what is left (kube.py), so nothing this process writes reaches the API server after that.
A follower takes the lease only when the record has not changed for ``lease_seconds`` by
its own monotonic clock (no clock agreement needed), or when the record's renewTime is
``lease_seconds`` old by its wall clock (the fast path after a lone replica restarts; safe
while the replicas' clocks agree within ``margin`` seconds, as NTP keeps them). Either way
that is at least ``margin`` seconds after the old leader's fence closed.

Renewing from a thread must not keep a wedged process in charge: the operator's loop beats
``heartbeat`` every second, and a leader whose loop has not beaten for ``STALL_SECONDS`` stops
renewing, so the lease runs out and a follower takes over.

Failover after a crash takes at most ``lease_seconds + retry_seconds`` (+ the new leader's
start): the lease runs out ``lease_seconds`` after the last renewal, and a follower due to see
it run out looks just after that moment (``next_look``) instead of at its next one-second
look. A clean shutdown releases the lease and a follower takes it at its next look, within a
second.

Lifetime: the Lease is made by the operator, not by the chart, so nothing else would delete it
on uninstall. Given ``owner`` (an ownerReference to the installation's ClusterRole, as the
webhook configurations get: admission/webhook_config.py ``Owner``), the Lease carries it, set
when the Lease is created or taken (a Lease left by a release without owners gains it), and
the garbage collector deletes the Lease with the ClusterRole. Without one (an operator run
from a shell) the Lease stays until deleted by hand, as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from fluxnetes.k8s.kube import LEASES, ApiError, Fence, Kube

log = logging.getLogger(__name__)

# defaults (client-go's are 15 / 10 / 2): a crashed leader is replaced within about 12 s
LEASE_SECONDS = 10
RENEW_DEADLINE_SECONDS = 7.0
RETRY_SECONDS = 2.0
# a loop that has not run for this long is wedged, not busy (a cycle of a huge backlog takes seconds)
STALL_SECONDS = 120.0
# after a failed renewal, ask again this soon (not at once: a refused connection fails at once)
RENEW_RETRY_SECONDS = 0.25
# a follower due to see the lease run out looks this long after the moment (clock granularity)
EXPIRY_SLACK_SECONDS = 0.05


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
    """``run()`` (on the operator's loop) starts the elector thread and returns at once;
    ``leading`` is set when this process holds the lease and ``lost`` when it lost it (the
    fence has closed by then). ``fence`` is what the operator's client checks."""

    def __init__(self, kube: Kube, namespace: str, name: str, identity: str, *,
                 lease_seconds: int = LEASE_SECONDS, renew_deadline: float = RENEW_DEADLINE_SECONDS,
                 retry_seconds: float = RETRY_SECONDS, owner: dict[str, Any] | None = None) -> None:
        if not 0 < renew_deadline < lease_seconds:
            raise ValueError(f"the renew deadline ({renew_deadline} s) must be shorter than the lease "
                             f"({lease_seconds} s)")
        if not 0 < retry_seconds < renew_deadline:
            raise ValueError(f"the retry period ({retry_seconds} s) must be shorter than the renew deadline "
                             f"({renew_deadline} s)")
        self.kube, self.namespace, self.name, self.identity = kube, namespace, name, identity
        self.lease_seconds, self.renew_deadline, self.retry_seconds = lease_seconds, renew_deadline, retry_seconds
        self.owner = owner  # the Lease's ownerReference (module docstring, "Lifetime")
        self.fence = Fence()
        self.leading = asyncio.Event()
        self.lost = asyncio.Event()
        self.error: BaseException | None = None  # what ended the thread (a missing permission)
        self._outer: asyncio.AbstractEventLoop | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        self._thread: threading.Thread | None = None
        self._client: Kube | None = None
        self._stopped = threading.Event()
        # the record as last seen: (resourceVersion, monotonic time it was first seen so)
        self._observed: tuple[str, float] | None = None
        # seconds until the holder's lease runs out, as of the last look (None: not known)
        self.expires_in: float | None = None
        self.renewals = 0
        # monotonic time the operator's event loop last ran (None: not watched)
        self.heartbeat: float | None = None

    # ------------------------------------------------------------------ the lease record
    def _spec(self, acquire: datetime | None, transitions: int) -> dict[str, Any]:
        now = _now()
        return {"holderIdentity": self.identity, "leaseDurationSeconds": self.lease_seconds,
                "acquireTime": _fmt(acquire or now), "renewTime": _fmt(now),
                "leaseTransitions": transitions}

    def _expired(self, lease: dict[str, Any]) -> bool:
        spec = lease.get("spec") or {}
        duration = int(spec.get("leaseDurationSeconds") or self.lease_seconds)
        version = str((lease.get("metadata") or {}).get("resourceVersion", ""))
        now = time.monotonic()
        if self._observed is None or self._observed[0] != version:
            self._observed = (version, now)
        unchanged = now - self._observed[1]
        renew = _parse(spec.get("renewTime"))
        age = None if renew is None else (_now() - renew).total_seconds()
        # when the first of the two rules below will say expired (``next_look``)
        self.expires_in = duration - max(unchanged, age if age is not None else unchanged)
        if unchanged > duration:
            return True  # unchanged for a whole lease by our own clock
        return age is None or age > duration

    def next_look(self) -> float:
        """Seconds until a follower looks at the Lease again: every ``min(retry, 1 s)``, and
        just after the moment the holder's lease runs out when that comes sooner (a crashed
        leader is replaced then, not up to a second later at the next regular look)."""
        pause = min(self.retry_seconds, 1.0)
        if self.expires_in is not None and self.expires_in < pause:
            pause = max(0.0, self.expires_in) + EXPIRY_SLACK_SECONDS
        return pause

    async def try_acquire(self, kube: Kube, timeout: float = 10) -> bool:
        """Take or renew the lease; True when this process holds it now."""
        lease = await asyncio.wait_for(kube.get_or_none(LEASES, self.name, self.namespace), timeout)
        if lease is None:
            meta: dict[str, Any] = {"name": self.name, "namespace": self.namespace}
            if self.owner is not None:
                meta["ownerReferences"] = [self.owner]
            body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta,
                    "spec": self._spec(None, 0)}
            try:
                await asyncio.wait_for(kube.create(LEASES, body, self.namespace), timeout)
                return True
            except ApiError as exc:
                if exc.status == 409:
                    return False
                raise
        spec = lease.get("spec") or {}
        holder = spec.get("holderIdentity")
        mine = holder == self.identity
        if not mine and holder and not self._expired(lease):
            return False
        transitions = int(spec.get("leaseTransitions") or 0) + (0 if mine else 1)
        acquire = _parse(spec.get("acquireTime")) if mine else None
        lease["spec"] = self._spec(acquire, transitions)
        meta = lease.setdefault("metadata", {})
        if self.owner is not None and meta.get("ownerReferences") != [self.owner]:
            meta["ownerReferences"] = [self.owner]  # a Lease of an older release (or install)
        try:
            # resourceVersion guards races: of two replicas taking an expired lease one wins
            await asyncio.wait_for(kube.replace(LEASES, self.name, lease, self.namespace), timeout)
            return True
        except ApiError as exc:
            if exc.status == 409:
                return False
            raise

    # ------------------------------------------------------------------ the thread
    async def run(self) -> None:
        """Start the elector thread (once); returns at once."""
        if self._thread is not None:
            return
        self._outer = asyncio.get_running_loop()
        started = threading.Event()

        def done(task: asyncio.Task[None]) -> None:
            if not task.cancelled() and task.exception() is not None:
                self.error = task.exception()  # e.g. a permission is missing: the operator exits
                self.fence.revoke()
                self._signal(self.lost)

        def main() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            self._client = self.kube.clone()
            self._task = loop.create_task(self._elect())
            self._task.add_done_callback(done)
            started.set()
            try:
                loop.run_forever()
            finally:
                pending = asyncio.all_tasks(loop)
                for t in pending:
                    t.cancel()
                with contextlib.suppress(Exception):
                    loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
                with contextlib.suppress(Exception):
                    loop.run_until_complete(self._client.close())
                loop.close()
                self._stopped.set()

        self._thread = threading.Thread(target=main, name="fluxnetes-lease", daemon=True)
        self._thread.start()
        await asyncio.get_running_loop().run_in_executor(None, started.wait)

    def _signal(self, event: asyncio.Event) -> None:
        if self._outer is not None and not self._outer.is_closed():
            with contextlib.suppress(RuntimeError):  # the operator's loop is gone: nobody waits
                self._outer.call_soon_threadsafe(event.set)

    async def _elect(self) -> None:
        assert self._client is not None
        kube = self._client
        while True:
            await self._acquire(kube)
            await self._renew(kube)

    async def _acquire(self, kube: Kube) -> None:
        while True:
            start = time.monotonic()
            self.expires_in = None
            try:
                if await self.try_acquire(kube, timeout=self.retry_seconds * 2):
                    self.fence.extend(start + self.renew_deadline)
                    log.info("leader election: %s leads (lease %s/%s)", self.identity, self.namespace, self.name)
                    self._signal(self.leading)
                    return
            except ApiError as exc:
                if exc.forbidden:
                    raise
                log.warning("leader election: %r", exc)
            except Exception as exc:
                log.warning("leader election: %r", exc)
            # a follower looks at least every second (one GET): a released lease is taken at once,
            # an expiring one just after it runs out
            await asyncio.sleep(self.next_look())

    async def _renew(self, kube: Kube) -> None:
        """Renew every ``retry_seconds``; once the fence has closed unrenewed the lease is lost."""
        failed = False
        while True:
            pause = min(RENEW_RETRY_SECONDS, self.retry_seconds) if failed else self.retry_seconds
            wait = min(pause, self.fence.remaining() - 0.05)
            if wait <= 0 and failed:
                # failing in the fence's last moments: let it run out instead of asking in a
                # tight loop (a refused connection fails at once)
                wait = self.fence.remaining()
            await asyncio.sleep(max(0.0, wait))
            failed = False
            left = self.fence.remaining()
            if self.heartbeat is not None and time.monotonic() - self.heartbeat > STALL_SECONDS:
                log.error("leader election: the event loop has not run for %.0f s; no longer renewing the lease",
                          time.monotonic() - self.heartbeat)
                left = 0
            if left > 0:
                start = time.monotonic()
                try:
                    if await self.try_acquire(kube, timeout=left):
                        self.fence.extend(start + self.renew_deadline)
                        self.renewals += 1
                        continue
                    # someone else holds it: we were too slow, stop at once
                    self.fence.close()
                except ApiError as exc:
                    if exc.forbidden:
                        self.fence.close()
                        raise
                    log.warning("lease renewal failed: %r", exc)
                    failed = True
                except Exception as exc:
                    log.warning("lease renewal failed: %r", exc)
                    failed = True
            if self.fence.remaining() <= 0:
                self.fence.close()
                log.error("leader election: lease %s/%s not renewed within %.1f s; stepping down",
                          self.namespace, self.name, self.renew_deadline)
                self._signal(self.lost)
                # compete again only once the operator has stepped down (``rejoin``)
                while self.leading.is_set():
                    await asyncio.sleep(0.1)
                return

    def rejoin(self) -> None:
        """The operator stepped down (after ``lost``): compete for the lease again."""
        self.leading.clear()
        self.lost.clear()

    # ------------------------------------------------------------------ shutdown
    async def _release(self) -> None:
        assert self._client is not None
        self.fence.revoke()
        if self._task is not None:
            self._task.cancel()  # no renewal after this
        lease = await self._client.get_or_none(LEASES, self.name, self.namespace)
        if lease and (lease.get("spec") or {}).get("holderIdentity") == self.identity:
            lease["spec"]["holderIdentity"] = ""
            lease["spec"]["renewTime"] = _fmt(_now() - timedelta(days=1))
            await self._client.replace(LEASES, self.name, lease, self.namespace)
            log.info("lease %s/%s released", self.namespace, self.name)

    def release_blocking(self, timeout: float = 1.0) -> None:
        """Close the fence for good and give the lease up, so that another replica takes
        over at once (from any thread; on shutdown)."""
        self.fence.revoke()
        loop = self._loop
        if loop is None or self._stopped.is_set():
            return
        try:
            fut = asyncio.run_coroutine_threadsafe(self._release(), loop)
            fut.result(timeout)
        except Exception as exc:
            log.info("lease release: %r", exc)

    async def release(self, timeout: float = 1.0) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self.release_blocking, timeout)

    def stop(self, timeout: float = 1.0) -> None:
        """Close the fence for good and end the thread (the lease is not released)."""
        self.fence.revoke()
        loop = self._loop
        if loop is not None and not self._stopped.is_set():
            with contextlib.suppress(RuntimeError):  # already closed
                loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(timeout)
