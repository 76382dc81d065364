"""Unit level (no cluster): the watch's fault windows, on a real local HTTP stream (aiohttp),
through the operator's own client and informer (``Kube.watch`` with its pause between reads,
``read_watch_batches``, ``Informer.run``).

The windows: the connection hits EOF, or breaks, while the reader pauses (``watch_wait``)
with events read but not yet handed over; an ERROR event (410 Gone, or another code) arrives
in the same read as ordinary events. In each, the informer's consumer must see every change
exactly once, in order: events read before the fault are delivered; after a clean end the
watch resumes from the last resourceVersion (no re-list); after a break or a 410 it re-lists
and the re-list's diff sends only what it had not seen (no duplicate, nothing lost).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import orjson
from aiohttp import web

from fluxnetes.k8s.informer import Backoff, Event, Informer
from fluxnetes.k8s.kube import PODS, Kube, read_watch_batches

PAUSE = 0.2  # the reader's pause after each read: long, so the faults below land inside it


def obj(name: str, rv: int) -> dict[str, Any]:
    return {"metadata": {"name": name, "uid": f"uid-{name}", "resourceVersion": str(rv)}}


def line(etype: str, o: dict[str, Any]) -> bytes:
    return orjson.dumps({"type": etype, "object": o}) + b"\n"


Step = Callable[[web.StreamResponse, web.Request], Awaitable[None]]


class ApiServer:
    """Serves scripted list answers and watch streams, in order, and records what was asked
    (each watch's resourceVersion). The last watch sends an "end" object and is held open
    until the test ends: every event it and the earlier streams sent comes before that one."""

    def __init__(self, lists: list[list[dict[str, Any]]], list_rvs: list[str], watches: list[list[Any]]) -> None:
        self.lists, self.list_rvs, self.watches = lists, list_rvs, watches
        self.listed = 0
        self.watched: list[str] = []
        self.done = asyncio.Event()  # the test is over: held streams end

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if request.query.get("watch") != "true":
            items, rv = self.lists[self.listed], self.list_rvs[self.listed]
            self.listed += 1
            return web.json_response({"items": items, "metadata": {"resourceVersion": rv}})
        self.watched.append(request.query.get("resourceVersion", ""))
        resp = web.StreamResponse()
        await resp.prepare(request)
        script = self.watches[len(self.watched) - 1] if len(self.watched) <= len(self.watches) else ["hold"]
        for step in script:
            if step == "hold":
                await resp.write(line("ADDED", obj("end", 99)))
                await self.done.wait()
                return resp
            elif step == "eof":
                await resp.write_eof()
                return resp
            elif step == "abort":  # the connection breaks (no end of the chunked body)
                assert request.transport is not None
                request.transport.abort()
                return resp
            elif isinstance(step, float):
                await asyncio.sleep(step)
            else:
                await resp.write(step)
        await resp.write_eof()
        return resp


async def run_informer(server: ApiServer) -> list[Event]:
    """Run an informer against ``server`` until it sends the last watch's "end" object: the
    events it sent before that one."""
    app = web.Application()
    app.router.add_get("/api/v1/pods", server.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    kube = Kube(f"http://127.0.0.1:{port}", False, {})
    kube.watch_wait = PAUSE
    out: asyncio.Queue[Event] = asyncio.Queue()
    inf = Informer(kube, PODS, "Pod", out)
    task = asyncio.ensure_future(inf.run())
    events = []
    try:
        # a state, not a time: the last stream's "end" comes after everything the informer
        # will ever send from the scripted streams and lists
        while True:
            ev = await asyncio.wait_for(out.get(), timeout=60)
            if ev[2]["metadata"]["name"] == "end":
                break
            events.append(ev)
        assert not task.done(), task
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        server.done.set()
        await kube.close()
        await runner.cleanup()
    return events


def seen(events: list[Event]) -> list[tuple[str, str, str]]:
    return [(etype, o["metadata"]["name"], o["metadata"]["resourceVersion"]) for _, etype, o in events]


def test_eof_during_the_pause_delivers_what_was_read_and_resumes_from_its_version() -> None:
    """The server ends the stream (its timeout) while the reader pauses after a read: the
    events of that read are delivered, a cut last line is dropped (it comes again), and the
    next watch starts from the last delivered version, without a re-list."""
    server = ApiServer(
        lists=[[obj("a", 1)]], list_rvs=["1"],
        watches=[[line("MODIFIED", obj("a", 2)), 0.02, line("ADDED", obj("b", 3)) + b'{"type":"MODI', "eof"],
                 [line("MODIFIED", obj("b", 4)), "hold"]])
    events = asyncio.run(run_informer(server))
    assert seen(events) == [("ADDED", "a", "1"), ("MODIFIED", "a", "2"), ("ADDED", "b", "3"), ("MODIFIED", "b", "4")]
    assert server.listed == 1 and server.watched == ["1", "3"]


def test_a_connection_broken_during_the_pause_loses_nothing_and_duplicates_nothing() -> None:
    """The connection breaks while the reader pauses with events read: those events are
    delivered; the informer re-lists, and the re-list's diff sends only the changes it had not
    seen (b's newer version, c created, a deleted), never one it sent already."""
    server = ApiServer(
        lists=[[obj("a", 1)], [obj("b", 4), obj("c", 5)]], list_rvs=["1", "5"],
        watches=[[line("MODIFIED", obj("a", 2)) + line("ADDED", obj("b", 3)), 0.02,
                  b'{"type":"MODIFIED","object":{"metadata":{"na', "abort"]])
    events = asyncio.run(run_informer(server))
    assert seen(events) == [("ADDED", "a", "1"), ("MODIFIED", "a", "2"), ("ADDED", "b", "3"),
                            ("MODIFIED", "b", "4"), ("ADDED", "c", "5"), ("DELETED", "a", "2")]
    assert server.listed == 2 and server.watched == ["1", "5"]


def test_a_410_gone_in_a_batch_relists_after_the_events_before_it() -> None:
    """An ERROR 410 (the version is too old) arrives in one read with ordinary events: those
    before it are delivered, the informer re-lists and the diff sends only what changed since
    (no duplicate of a's version 2), and it watches again from the list's version."""
    gone = {"kind": "Status", "status": "Failure", "code": 410, "reason": "Expired", "message": "too old"}
    server = ApiServer(
        lists=[[obj("a", 1), obj("b", 1)], [obj("a", 2), obj("b", 6)]], list_rvs=["1", "6"],
        # (the API server ends the stream after an ERROR)
        watches=[[line("MODIFIED", obj("a", 2)) + line("ERROR", gone), "eof"]])
    events = asyncio.run(run_informer(server))
    assert seen(events) == [("ADDED", "a", "1"), ("ADDED", "b", "1"), ("MODIFIED", "a", "2"), ("MODIFIED", "b", "6")]
    assert server.listed == 2 and server.watched == ["1", "6"]


def test_another_error_event_resumes_the_watch_from_the_last_version() -> None:
    """An ERROR that is not 410 (the server's own trouble): the events before it are kept and
    the watch starts again from the last delivered version; no re-list, nothing twice."""
    err = {"kind": "Status", "status": "Failure", "code": 500, "reason": "InternalError", "message": "etcd"}
    server = ApiServer(
        lists=[[obj("a", 1)]], list_rvs=["1"],
        watches=[[line("MODIFIED", obj("a", 2)) + line("ERROR", err), "eof"],
                 [line("MODIFIED", obj("a", 3)), "hold"]])
    events = asyncio.run(run_informer(server))
    assert seen(events) == [("ADDED", "a", "1"), ("MODIFIED", "a", "2"), ("MODIFIED", "a", "3")]
    assert server.listed == 1 and server.watched == ["1", "2"]


class BreakingStream:
    """A stream whose connection breaks after its first read, while the reader pauses: aiohttp's
    StreamReader then raises from ``read_nowait`` (and drops what it buffered)."""

    def __init__(self, first: bytes) -> None:
        self.first: bytes | None = first

    async def readany(self) -> bytes:
        if self.first is None:
            raise ConnectionResetError("reset")
        out, self.first = self.first, None
        return out

    def read_nowait(self) -> bytes:
        raise ConnectionResetError("reset while paused")


def test_the_reader_hands_over_the_read_before_a_break_then_raises() -> None:
    async def main() -> tuple[list[list[bytes]], BaseException | None]:
        got: list[list[bytes]] = []
        try:
            async for batch in read_watch_batches(BreakingStream(b"1\n2\n3"), 0.01):  # type: ignore[arg-type]
                got.append(batch)
        except ConnectionResetError as exc:
            return got, exc
        return got, None

    got, exc = asyncio.run(main())
    assert got == [[b"1", b"2"]]  # the complete lines read before the break; "3" was cut
    assert exc is not None  # the break is still reported (the informer re-lists)


class ErroringKube:
    """Lists nothing; each watch sends what ``streams`` says next (a list of events), then ends;
    past the last stream, its watch blocks. Counts the watches."""

    def __init__(self, streams: list[list[dict[str, Any]]]) -> None:
        self.streams = streams
        self.watched = 0
        self.lists = 0

    async def list(self, res: Any, **_: Any) -> tuple[list[dict[str, Any]], str]:
        self.lists += 1
        return [], "1"

    async def watch(self, res: Any, rv: str, **_: Any) -> AsyncIterator[dict[str, Any]]:
        self.watched += 1
        if self.watched > len(self.streams):
            await asyncio.Event().wait()
        for ev in self.streams[self.watched - 1]:
            yield ev


def test_error_events_back_off_exponentially_with_jitter_and_reset_after_an_event() -> None:
    """A watch ERROR that is not 410 (an API server in trouble) is not watched again at once:
    each one in a row waits longer (0.5 s doubled, capped at 10 s, up to half of it taken off
    at random), and the first event delivered resets the wait."""
    err = {"type": "ERROR", "object": {"kind": "Status", "code": 500, "message": "etcd"}}
    ok = {"type": "ADDED", "object": obj("a", 2)}
    streams = [[err]] * 7 + [[ok, err], [err]]
    kube = ErroringKube(streams)
    waits: list[float] = []

    async def main() -> None:
        out: asyncio.Queue[Event] = asyncio.Queue()
        inf = Informer(kube, PODS, "Pod", out)  # type: ignore[arg-type]
        inf.backoff = Backoff(rand=lambda: 1.0)  # the most jitter takes off: half

        async def sleep(s: float) -> None:
            waits.append(s)

        inf.sleep = sleep
        task = asyncio.ensure_future(inf.run())
        for _ in range(1000):
            if kube.watched > len(streams):
                break
            await asyncio.sleep(0)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(main())
    assert kube.watched == len(streams) + 1 and kube.lists == 1
    assert waits == [0.25, 0.5, 1.0, 2.0, 4.0, 5.0, 5.0, 0.25, 0.5]


def test_backoff_jitter_stays_within_half_of_the_wait() -> None:
    b = Backoff(rand=lambda: 0.0)
    assert [b.next() for _ in range(7)] == [0.5, 1.0, 2.0, 4.0, 8.0, 10.0, 10.0]
    b.reset()
    assert b.next() == 0.5
    import random
    b = Backoff(rand=random.Random(4).random)
    for want in [0.5, 1.0, 2.0, 4.0, 8.0, 10.0]:
        assert want / 2 <= b.next() <= want


class DroppingKube(ErroringKube):
    """Lists fine; each of the first ``drops`` watches breaks at once (a dropped connection),
    then its watch blocks."""

    def __init__(self, drops: int) -> None:
        super().__init__([])
        self.drops = drops

    async def watch(self, res: Any, rv: str, **_: Any) -> AsyncIterator[dict[str, Any]]:
        self.watched += 1
        if self.watched > self.drops:
            await asyncio.Event().wait()
        raise ConnectionResetError("dropped")
        yield {}  # (an async generator)


def test_dropped_watches_back_off_though_each_relist_succeeds() -> None:
    """A watch that breaks makes the informer re-list, and the list may well succeed (the API
    server answers, its watches break: a proxy or load balancer in between). The re-list
    does not reset the wait: each break in a row waits longer, or every informer re-listed
    everything twice a second for as long as it lasted (a full re-list is the costliest
    request an informer makes). Only a watch that works (an event delivered, or a watch
    ended cleanly) resets it."""
    kube = DroppingKube(7)
    waits: list[float] = []

    async def main() -> None:
        out: asyncio.Queue[Event] = asyncio.Queue()
        inf = Informer(kube, PODS, "Pod", out)  # type: ignore[arg-type]
        inf.backoff = Backoff(rand=lambda: 1.0)

        async def sleep(s: float) -> None:
            waits.append(s)

        inf.sleep = sleep
        task = asyncio.ensure_future(inf.run())
        for _ in range(1000):
            if kube.watched > kube.drops:
                break
            await asyncio.sleep(0)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(main())
    assert kube.watched == 8 and kube.lists == 8
    assert waits == [0.25, 0.5, 1.0, 2.0, 4.0, 5.0, 5.0]
