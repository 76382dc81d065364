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
"""

from __future__ import annotations

import asyncio
import logging
import random
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

    async def run(self) -> None:
        rv = ""
        while True:
            failed = False
            try:
                if not rv:
                    rv = await self._relist()  # (no reset: a list answered, its watch may still break)
                async for ev in self.kube.watch(self.resource, rv, label_selector=self.label_selector,
                                                field_selector=self.field_selector):
                    etype, obj = ev.get("type"), ev.get("object") or {}
                    if etype == "ERROR":
                        code = obj.get("code")
                        log.info("%s watch ended: %s", self.kind, obj.get("message"))
                        if code == 410:
                            rv = ""  # too old: re-list at once (its own failure, if any, backs off)
                        else:
                            failed = True  # the server's trouble: not again at once
                        break
                    self.backoff.reset()
                    rv = str((obj.get("metadata") or {}).get("resourceVersion", rv))
                    if etype == "BOOKMARK":
                        continue
                    uid = uid_of(obj)
                    if etype == "DELETED":
                        self.cache.pop(uid, None)
                    else:
                        self.cache[uid] = obj
                    await self._send((self.kind, str(etype), obj))
            except asyncio.CancelledError:
                raise
            except ApiError as exc:
                if exc.status == 410:
                    rv = ""
                    continue
                if exc.forbidden:
                    raise  # a missing permission: the operator reports it and exits (no silent hang)
                log.warning("%s watch failed: %s", self.kind, exc)
                failed = True
            except Exception as exc:  # dropped connection and the like: re-list and go on
                log.warning("%s watch interrupted: %r", self.kind, exc)
                rv = ""
                failed = True
            if failed:
                await self.sleep(self.backoff.next())
            else:
                self.backoff.reset()  # the watch worked until the server ended it
