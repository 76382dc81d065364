"""Unit level (no cluster): a replica waiting to lead lists and watches the cluster with its
informers muted (cache only, nothing queued, k8s/informer.py); when it leads, every cached
object is handed to the controller once, as a fresh list would (Controller.end_standby), and
later changes follow it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from fluxnetes.k8s.informer import Event, Informer
from fluxnetes.k8s.kube import PODS
from test_k8s_prune import make_controller, pod


class ListingKube:
    """Lists ``items``; its watch sends what the test puts in ``changes``."""

    def __init__(self, items: list[dict[str, Any]]) -> None:
        self.items = items
        self.changes: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

    async def list(self, res: Any, **_: Any) -> tuple[list[dict[str, Any]], str]:
        return list(self.items), "1"

    async def watch(self, res: Any, rv: str, **_: Any) -> AsyncIterator[dict[str, Any]]:
        while True:
            yield await self.changes.get()


def with_rv(p: dict[str, Any], rv: str) -> dict[str, Any]:
    return {**p, "metadata": {**p["metadata"], "resourceVersion": rv}}


def test_a_muted_informer_keeps_its_cache_and_queues_nothing() -> None:
    async def main() -> None:
        a, b = with_rv(pod("a"), "1"), with_rv(pod("b"), "1")
        kube = ListingKube([a, b])
        out: asyncio.Queue[Event] = asyncio.Queue()
        inf = Informer(kube, PODS, "Pod", out)  # type: ignore[arg-type]
        inf.muted = True
        task = asyncio.ensure_future(inf.run())
        await inf.synced.wait()
        await kube.changes.put({"type": "DELETED", "object": a})
        await asyncio.sleep(0.01)
        assert out.empty() and set(inf.cache) == {"pod-b"}
        inf.muted = False
        await kube.changes.put({"type": "MODIFIED", "object": with_rv(pod("b"), "2")})
        await asyncio.sleep(0.01)
        assert out.get_nowait()[:2] == ("Pod", "MODIFIED")
        task.cancel()

    asyncio.run(main())


def test_leading_hands_over_each_cached_object_once_then_follows_changes() -> None:
    async def main() -> None:
        c, _ = make_controller()
        a, b = with_rv(pod("a"), "1"), with_rv(pod("b"), "1")
        kube = ListingKube([a, b])
        inf = Informer(kube, PODS, "Pod", c.queue)  # type: ignore[arg-type]
        c.informers = [inf]
        c.podsets.start_addons = _nothing  # type: ignore[method-assign]
        await c.watch(standby=True)
        assert c.standby and inf.muted and c.queue.empty()
        await kube.changes.put({"type": "DELETED", "object": a})  # while it waits to lead
        await asyncio.sleep(0.01)
        c.end_standby()
        assert not c.standby and not inf.muted
        handed = [c.queue.get_nowait() for _ in range(c.queue.qsize())]
        assert [(k, t, o["metadata"]["uid"]) for k, t, o in handed] == [("Pod", "ADDED", "pod-b")]
        await kube.changes.put({"type": "ADDED", "object": with_rv(pod("c"), "3")})
        await asyncio.sleep(0.01)
        assert c.queue.get_nowait()[2]["metadata"]["uid"] == "pod-c"
        for t in list(c._tasks):
            t.cancel()

    asyncio.run(main())


async def _nothing() -> None:
    return None


def test_a_stop_while_the_first_lists_run_leaves_no_future_unretrieved(caplog: Any) -> None:
    """SIGTERM while the informers still list (a leader's start, a standby's watch): the
    controller's run is cancelled and stopped. Nothing is left for asyncio to report when the
    loop closes ("_GatheringFuture exception was never retrieved": the wait for every
    informer's first list, cancelled with them, that nobody awaited)."""
    import gc
    import logging

    class HangingKube(ListingKube):
        async def list(self, res: Any, **_: Any) -> tuple[list[dict[str, Any]], str]:
            await asyncio.Event().wait()
            raise AssertionError("never listed")

    async def main() -> None:
        c, _ = make_controller()
        kube = HangingKube([])
        for inf in c.informers:
            inf.kube = kube  # type: ignore[assignment]
        c.podsets.start_addons = _nothing  # type: ignore[method-assign]
        run = asyncio.ensure_future(c.watch())
        await asyncio.sleep(0.01)
        assert not run.done()
        run.cancel()  # as operator._lead's finally does at the stop signal
        await c.stop()
        await asyncio.gather(run, return_exceptions=True)

    caplog.set_level(logging.ERROR, logger="asyncio")
    asyncio.run(main())
    gc.collect()
    assert not [r for r in caplog.records if "never retrieved" in r.getMessage()], caplog.text
