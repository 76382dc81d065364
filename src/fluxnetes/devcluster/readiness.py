"""Waiting for new kwok nodes to be Ready with one LIST and a WATCH, lifting their not-ready
taint as they turn Ready.

Polling a full node list costs the API server a serialisation of every node (about 3 KB each:
15 MB a poll at 5,000 nodes) and this process a JSON parse of it, every second, on a machine
where the API server is already the busiest process. A watch sends each node's changes once.

kwok marks a node Ready; kube-controller-manager then lifts the not-ready taint that admission
put on the new node, but only ~20 nodes/s on a busy 2-core machine. The waiter lifts it itself
for every Ready node it sees still tainted (a JSON patch with a `test` op, so a concurrent
change by the controller is never overwritten: such a patch fails with 422 and the node's next
event decides again).
"""

from __future__ import annotations

import asyncio
import json
import ssl
import time
from collections.abc import Awaitable, Callable
from typing import Any

from fluxnetes.devcluster.apicalls import Request, send_one
from fluxnetes.devcluster.nodes import (
    DEV_NODE_LABEL,
    NOT_READY_TAINT,
    has_ready_condition,
    is_ready,
    not_ready_tainted,
)

SELECTOR = f"labelSelector={DEV_NODE_LABEL}%3Dtrue"
WATCH_SECONDS = 60  # one watch request's server-side timeout; the loop starts another


class NotReadyYet(Exception):
    """The deadline passed; `waiting` names the nodes that were not Ready."""

    def __init__(self, waiting: set[str]) -> None:
        super().__init__(f"{len(waiting)} nodes not Ready")
        self.waiting = waiting


class ReadyTracker:
    """Which of `names` are Ready, fed with Node objects; says which need their taint lifted."""

    def __init__(self, names: set[str]) -> None:
        self.names = set(names)
        self.waiting = set(names)
        self._patched: dict[str, str] = {}  # node -> resourceVersion its untaint patch tested

    def see(self, node: dict[str, Any]) -> Request | None:
        """Record one node's state; the untaint patch to send for it, if any (once per
        version of the node)."""
        meta = node.get("metadata") or {}
        name = str(meta.get("name", ""))
        if name not in self.names:
            return None
        if is_ready(node):
            self.waiting.discard(name)
            return None
        self.waiting.add(name)
        if has_ready_condition(node) and not_ready_tainted(node):
            rv = str(meta.get("resourceVersion", ""))
            if self._patched.get(name) != rv:
                self._patched[name] = rv
                return untaint_request(node)
        return None

    def gone(self, name: str) -> None:
        if name in self.names:
            self.waiting.add(name)
            self._patched.pop(name, None)


def untaint_request(node: dict[str, Any]) -> Request:
    taints = node["spec"]["taints"]
    kept = [t for t in taints if t.get("key") != NOT_READY_TAINT]
    patch = [
        {"op": "test", "path": "/spec/taints", "value": taints},
        {"op": "replace", "path": "/spec/taints", "value": kept},
    ]
    name = node["metadata"]["name"]
    return Request(
        "PATCH",
        f"/api/v1/nodes/{name}",
        patch,
        f"lifting the not-ready taint of node {name}",
        content_type="application/json-patch+json",
        ignore=frozenset({404, 409, 422}),  # gone, or changed meanwhile: its next event decides
    )


async def wait_ready(
    api_url: str,
    ctx: ssl.SSLContext,
    names: set[str],
    *,
    deadline: float,
    concurrency: int,
    check_alive: Callable[[], None],
    meanwhile: Callable[[], Awaitable[None]] | None = None,
) -> float:
    """Wait until every node of `names` is Ready and untainted; returns the monotonic time at
    which `meanwhile()` (creating the nodes, run while the watch already follows them) ended.

    `check_alive` is called every second and raises if a component died; past `deadline`
    NotReadyYet is raised.
    """
    import aiohttp

    tracker = ReadyTracker(names)
    sem = asyncio.Semaphore(concurrency)
    conn = aiohttp.TCPConnector(ssl=ctx, limit=concurrency + 2)
    patches: set[asyncio.Task[None]] = set()
    errors: list[BaseException] = []
    started = time.monotonic()
    meanwhile_end = started

    async with aiohttp.ClientSession(connector=conn) as session:

        def feed(node: dict[str, Any]) -> None:
            req = tracker.see(node)
            if req is not None:
                task = asyncio.create_task(send_one(session, api_url, req, sem))
                patches.add(task)
                task.add_done_callback(_collect(patches, errors))

        async def relist() -> str:
            async with session.get(f"{api_url}/api/v1/nodes?{SELECTOR}&resourceVersion=0",
                                   headers={"Accept": "application/json"}) as resp:
                resp.raise_for_status()
                body = await resp.json()
            seen = set()
            for node in body.get("items") or []:
                seen.add(node["metadata"]["name"])
                feed(node)
            for name in tracker.names - seen:
                tracker.gone(name)
            return str(body["metadata"]["resourceVersion"])

        async def follow() -> None:
            rv = await relist()
            while tracker.waiting:
                url = (f"{api_url}/api/v1/nodes?{SELECTOR}&watch=1&allowWatchBookmarks=true"
                       f"&resourceVersion={rv}&timeoutSeconds={WATCH_SECONDS}")
                async with session.get(url, timeout=aiohttp.ClientTimeout(total=None)) as resp:
                    if resp.status == 410:
                        rv = await relist()
                        continue
                    resp.raise_for_status()
                    async for line in resp.content:
                        if not line.strip():
                            continue
                        event = json.loads(line)
                        etype, obj = event.get("type"), event.get("object") or {}
                        if etype == "ERROR":  # 410 Gone: our version was compacted away
                            rv = await relist()
                            break
                        rv = str((obj.get("metadata") or {}).get("resourceVersion", rv))
                        if etype == "DELETED":
                            tracker.gone(str(obj["metadata"]["name"]))
                        elif etype in ("ADDED", "MODIFIED"):
                            feed(obj)
                        if not tracker.waiting:
                            break
                if errors:
                    raise errors[0]

        async def create_meanwhile() -> None:
            nonlocal meanwhile_end
            if meanwhile is not None:
                await meanwhile()
            meanwhile_end = time.monotonic()

        async def watchdog() -> None:
            while True:
                await asyncio.sleep(1.0)
                check_alive()
                if errors:
                    raise errors[0]
                if time.monotonic() > deadline:
                    raise NotReadyYet(set(tracker.waiting))

        follower = asyncio.create_task(follow())
        creator = asyncio.create_task(create_meanwhile())
        dog = asyncio.create_task(watchdog())
        try:
            pending: set[asyncio.Task[None]] = {follower, creator, dog}
            while not follower.done():  # any error (a refused create, a dead component) ends it
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    task.result()
        finally:
            for task in (follower, creator, dog, *patches):
                task.cancel()
            await asyncio.gather(follower, creator, dog, *patches, return_exceptions=True)
    return meanwhile_end


def _collect(tasks: set[asyncio.Task[None]], errors: list[BaseException]) -> Callable[[asyncio.Task[None]], None]:
    def done(task: asyncio.Task[None]) -> None:
        tasks.discard(task)
        exc = None if task.cancelled() else task.exception()
        if exc is not None:
            errors.append(exc)

    return done
