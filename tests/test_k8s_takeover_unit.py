"""Unit level (no cluster): a standby taking over makes each informer's cache at least as
fresh as the cluster is when it takes the lease (Controller.take_over -> catch_up ->
Informer.catch_up). A watch stuck backing off after an API server outage is re-listed before
the caches are handed over; a current one costs one quorum read, no re-list."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from fluxnetes.k8s.informer import Informer
from fluxnetes.k8s.kube import PODS
from test_k8s_prune import make_controller, pod
from test_k8s_standby_unit import _nothing, with_rv


class ServerKube:
    """An API server's view of one collection: ``items`` at version ``rv``. Its watch sends
    what the test puts in ``changes``; an exception put there breaks the stream (an outage)."""

    def __init__(self, items: list[dict[str, Any]], rv: str) -> None:
        self.items, self.rv = items, rv
        self.lists = self.version_reads = 0
        self.changes: asyncio.Queue[Any] = asyncio.Queue()

    async def list(self, res: Any, **_: Any) -> tuple[list[dict[str, Any]], str]:
        self.lists += 1
        return list(self.items), self.rv

    async def list_version(self, res: Any, **_: Any) -> str:
        self.version_reads += 1
        return self.rv

    async def watch(self, res: Any, rv: str, *, opened: Callable[[], None] | None = None,
                    **_: Any) -> AsyncIterator[dict[str, Any]]:
        if opened is not None:
            opened()
        while True:
            ev = await self.changes.get()
            if isinstance(ev, BaseException):
                raise ev
            yield ev


def bound(p: dict[str, Any], node: str) -> dict[str, Any]:
    return {**p, "spec": {**p["spec"], "schedulingGates": [], "nodeName": node}}


async def standby_of(kube: ServerKube) -> tuple[Any, Informer]:
    c, _ = make_controller()
    inf = Informer(kube, PODS, "Pod", c.queue)  # type: ignore[arg-type]
    c.informers = [inf]
    c.podsets.start_addons = _nothing  # type: ignore[method-assign]
    await c.watch(standby=True)
    await asyncio.sleep(0.01)  # its watch opens
    return c, inf


def handed(c: Any) -> list[tuple[str, str, str, str | None]]:
    return [(k, t, o["metadata"]["name"], o["spec"].get("nodeName"))
            for k, t, o in (c.queue.get_nowait() for _ in range(c.queue.qsize()))]


def stop(c: Any) -> None:
    for t in list(c._tasks):
        t.cancel()


def test_a_standby_whose_watch_backs_off_sees_the_pod_bound_before_it_leads(caplog: Any) -> None:
    """The old leader bound pod a while the standby's watch was down (backing off after an
    outage): its cache still holds a gated. Taking over re-lists it: the controller is handed
    a bound, so its first cycle does not match a's group again."""
    async def main() -> None:
        a = with_rv(pod("a"), "5")
        kube = ServerKube([a], "5")
        c, inf = await standby_of(kube)
        backing_off = asyncio.Event()

        async def long_backoff(_: float) -> None:  # the 10 s backoff, held for the test
            backing_off.set()
            await asyncio.Event().wait()

        inf.sleep = long_backoff
        await kube.changes.put(ConnectionResetError("the API server restarts"))
        await backing_off.wait()
        kube.items, kube.rv = [with_rv(bound(a, "n1"), "7")], "7"  # the old leader's placement
        with caplog.at_level(logging.INFO, logger="fluxnetes.k8s.controller"):
            await c.take_over()
        assert handed(c) == [("Pod", "ADDED", "a", "n1")]
        assert kube.lists == 2 and not c.standby and not inf.muted
        assert "Pod re-listed" in caplog.text
        # its watch runs again from the new list: later changes follow
        await kube.changes.put({"type": "DELETED", "object": with_rv(bound(a, "n1"), "8")})
        await asyncio.sleep(0.01)
        assert handed(c) == [("Pod", "DELETED", "a", "n1")]
        assert inf.task in c._informer_runs
        stop(c)

    asyncio.run(main())


def test_a_current_standby_takes_over_without_a_re_list(caplog: Any) -> None:
    async def main() -> None:
        a = with_rv(pod("a"), "5")
        kube = ServerKube([a], "5")
        c, inf = await standby_of(kube)
        await kube.changes.put({"type": "MODIFIED", "object": with_rv(bound(a, "n2"), "6")})
        await asyncio.sleep(0.01)
        kube.rv = "6"
        with caplog.at_level(logging.INFO, logger="fluxnetes.k8s.controller"):
            await c.take_over()
        assert handed(c) == [("Pod", "ADDED", "a", "n2")]
        assert kube.lists == 1 and kube.version_reads == 1 and not inf.muted
        assert "Pod current" in caplog.text
        stop(c)

    asyncio.run(main())


@pytest.mark.parametrize("late", [True, False])
def test_a_lagging_open_watch_is_waited_for_not_re_listed(late: bool) -> None:
    """The collection's version is ahead of the cache: an open watch that delivers up to it
    soon has caught up; one that stays silent saw nothing of its own collection change (one
    etcd numbers every collection's writes together). Neither is re-listed."""
    async def main() -> None:
        a = with_rv(pod("a"), "5")
        kube = ServerKube([a], "5")
        c, inf = await standby_of(kube)
        kube.rv = "9"  # other collections' writes, or this one's on their way

        async def deliver() -> None:
            while kube.version_reads == 0:  # once the version is read, catch_up waits for the watch
                await asyncio.sleep(0)
            await kube.changes.put({"type": "MODIFIED", "object": with_rv(bound(a, "n3"), "9")})

        later = asyncio.ensure_future(deliver()) if late else None
        path = await inf.catch_up()
        assert (path, kube.lists) == ("caught-up" if late else "quiet", 1)
        if later is not None:
            await later
        stop(c)

    asyncio.run(main())


def test_an_opaque_version_is_re_listed() -> None:
    async def main() -> None:
        kube = ServerKube([with_rv(pod("a"), "5")], "5")
        c, inf = await standby_of(kube)
        kube.rv = "v5-opaque"
        assert await inf.catch_up() == "re-listed" and kube.lists == 2
        stop(c)

    asyncio.run(main())
