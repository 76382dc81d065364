"""List-then-watch of one resource, feeding (kind, event type, object) into a queue.

The informer keeps a cache (uid -> object) so that after a watch expires (410 Gone) or the
connection drops, a re-list can be turned into exactly the ADDED / MODIFIED / DELETED events
that were missed. ``synced`` is set once the first list has been delivered. A ``muted``
informer keeps its cache and sends nothing (a standby replica's: ``Controller.watch``).

A failure (a watch ERROR event other than 410 Gone, a refused request, a dropped connection)
waits before the next try, longer after each failure in a row (:class:`Backoff`: doubling from
0.5 s up to 10 s, with jitter so the informers of every replica do not return together); the
first event delivered, or a watch the server ends cleanly, resets it (a re-list does not: an
API server that answers lists while every watch breaks would be re-listed in full twice a
second). Without the wait, an API server answering every
watch with an ERROR would be asked again at once, in a tight loop.

A standby's cache can be stale when it takes over (its watch backing off after an API server
outage, just when the lease changes hands): :meth:`Informer.currency` tells whether its watch
has caught up with the collection's current version (a quorum read), so that the controller
re-lists only the informers that have not (``Controller.catch_up``).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any

from fluxnetes.k8s.kube import ApiError, Kube, Resource

log = logging.getLogger(__name__)

Event = tuple[str, str, dict[str, Any]]


def uid_of(obj: dict[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("uid", ""))


class Backoff:
    """The wait before the next try after ``failures`` failures in a row: ``first`` doubled
    each time up to ``cap``, then a random part of it (``jitter``: up to half) taken off."""

    def __init__(self, first: float = 0.5, cap: float = 10.0, jitter: float = 0.5,
                 rand: Callable[[], float] = random.random) -> None:
        self.first, self.cap, self.jitter, self.rand = first, cap, jitter, rand
        self.failures = 0

    def next(self) -> float:
        base = min(self.first * 2 ** min(self.failures, 30), self.cap)
        self.failures += 1
        return float(base * (1 - self.jitter * self.rand()))

    def reset(self) -> None:
        self.failures = 0


class Informer:
    def __init__(self, kube: Kube, resource: Resource, kind: str, out: asyncio.Queue[Event], *,
                 label_selector: str | None = None, field_selector: str | None = None) -> None:
        self.kube, self.resource, self.kind, self.out = kube, resource, kind, out
        self.label_selector, self.field_selector = label_selector, field_selector
        self.cache: dict[str, dict[str, Any]] = {}
        self.synced = asyncio.Event()
        self.muted = False
        self.backoff = Backoff()
        self.sleep: Callable[[float], Awaitable[None]] = asyncio.sleep  # a test's to replace
        self.rv = ""  # the version the cache is at: the last list's or watch event's ("": none)
        # when its watch stream last opened; None while it is down (failed, backing off, re-listing)
        self.live_since: float | None = None
        self.moved = asyncio.Event()  # set at each watch event: a catch-up waits on it
        self.task: asyncio.Task[None] | None = None  # its run (start)

    async def _send(self, ev: Event) -> None:
        if not self.muted:
            await self.out.put(ev)

    async def _relist(self) -> str:
        items, rv = await self.kube.list(self.resource, label_selector=self.label_selector,
                                         field_selector=self.field_selector)
        seen = set()
        for obj in items:
            uid = uid_of(obj)
            seen.add(uid)
            old = self.cache.get(uid)
            if old is None:
                await self._send((self.kind, "ADDED", obj))
            elif (old.get("metadata") or {}).get("resourceVersion") != (obj.get("metadata") or {}).get("resourceVersion"):
                await self._send((self.kind, "MODIFIED", obj))
            self.cache[uid] = obj
        for uid in [u for u in self.cache if u not in seen]:
            await self._send((self.kind, "DELETED", self.cache.pop(uid)))
        self.synced.set()
        return rv

    def start(self) -> asyncio.Task[None]:
        self.task = asyncio.ensure_future(self.run())
        return self.task

    def _opened(self) -> None:
        if self.live_since is None:
            self.live_since = time.monotonic()

    async def run(self) -> None:
        """List (unless ``rv`` is set: a re-list made for it, ``Controller.catch_up``), then
        watch from there; re-list after a 410 Gone or a broken connection."""
        while True:
            failed = False
            try:
                if not self.rv:
                    self.rv = await self._relist()  # (no reset: a list answered, its watch may still break)
                async for ev in self.kube.watch(self.resource, self.rv, label_selector=self.label_selector,
                                                field_selector=self.field_selector, opened=self._opened):
                    etype, obj = ev.get("type"), ev.get("object") or {}
                    if etype == "ERROR":
                        code = obj.get("code")
                        log.info("%s watch ended: %s", self.kind, obj.get("message"))
                        if code == 410:
                            self.rv = ""  # too old: re-list at once (its own failure, if any, backs off)
                        else:
                            failed = True  # the server's trouble: not again at once
                        break
                    self._opened()  # (an event is proof too, where the watch does not say)
                    self.backoff.reset()
                    self.rv = str((obj.get("metadata") or {}).get("resourceVersion", self.rv))
                    self.moved.set()
                    if etype == "BOOKMARK":
                        continue
                    uid = uid_of(obj)
                    if etype == "DELETED":
                        self.cache.pop(uid, None)
                    else:
                        self.cache[uid] = obj
                    await self._send((self.kind, str(etype), obj))
                self.live_since = None  # the stream ended (its timeout): open again
            except asyncio.CancelledError:
                self.live_since = None
                raise
            except ApiError as exc:
                self.live_since = None
                if exc.status == 410:
                    self.rv = ""
                    continue
                if exc.forbidden:
                    raise  # a missing permission: the operator reports it and exits (no silent hang)
                log.warning("%s watch failed: %s", self.kind, exc)
                failed = True
            except Exception as exc:  # dropped connection and the like: re-list and go on
                self.live_since = None
                log.warning("%s watch interrupted: %r", self.kind, exc)
                self.rv = ""
                failed = True
            if failed:
                self.live_since = None
                await self.sleep(self.backoff.next())
            else:
                self.backoff.reset()  # the watch worked until the server ended it

    async def currency(self, bound: float = 2.0, quiet: float = 0.3) -> str:
        """Whether the cache is as fresh as the collection now is: ``current`` (its version is
        the collection's current one or later), ``caught-up`` (its watch delivered up to it
        within ``bound`` seconds), ``quiet`` (its watch is open and stayed silent for ``quiet``
        seconds: the current version is newer only by other collections' writes, which one
        etcd numbers together), or ``stale`` (its watch is down or backing off, did not catch
        up in time, or a version is not a number): the caller re-lists it."""
        if self.live_since is None or not self.rv:
            return "stale"  # a down watch catches up only after its backoff: not worth waiting
        now = await self.kube.list_version(self.resource, label_selector=self.label_selector,
                                           field_selector=self.field_selector)
        target, mine = _version(now), _version(self.rv)
        if target is None or mine is None:
            return "stale"  # versions are opaque strings in principle: then only a list is sure
        if mine >= target:
            return "current"
        loop = asyncio.get_running_loop()
        end = loop.time() + bound
        while True:
            left = end - loop.time()
            if left <= 0:
                return "stale"
            self.moved.clear()
            try:
                await asyncio.wait_for(self.moved.wait(), min(quiet, left))
            except TimeoutError:
                return "quiet" if self.live_since is not None and left >= quiet else "stale"
            mine = _version(self.rv)
            if self.live_since is None or mine is None:
                return "stale"
            if mine >= target:
                return "caught-up"

    async def catch_up(self) -> str:
        """Made as fresh as the collection is now (``currency``); a stale one is re-listed at
        once, its run stopped meanwhile (as after a 410 Gone: the cache replaced, muted ones
        sending nothing) and started again from the new list. Returns the path it took. A
        re-list that fails is tried again after the backoff: leading from a stale view is what
        this prevents."""
        try:
            path = await self.currency()
        except ApiError as exc:
            if exc.forbidden:
                raise
            log.warning("%s: reading the current version failed (%s); re-listing", self.kind, exc)
            path = "stale"
        if path != "stale":
            return path
        if self.task is not None:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)
        self.live_since = None
        while True:
            try:
                self.rv = await self._relist()
                break
            except Exception as exc:  # refused, unreachable: not again at once
                if isinstance(exc, ApiError) and exc.forbidden:
                    raise
                log.warning("%s: re-list at takeover failed (%r)", self.kind, exc)
            await self.sleep(self.backoff.next())
        self.backoff.reset()
        self.start()
        return "re-listed"


def _version(rv: str) -> int | None:
    try:
        return int(rv)
    except ValueError:
        return None
