"""Unit level (no cluster): the watch reader (``read_watch_batches``, ``Kube.watch``) yields
every event once, in order, whatever the byte boundaries of the reads, and waits between reads
with its connection paused so events that arrive meanwhile are taken in one read."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import orjson
from aiohttp import web

from fluxnetes.k8s.kube import PODS, Kube, read_watch_batches


class FakeStream:
    """What read_watch_batches uses of aiohttp's StreamReader: chunks put by the test."""

    def __init__(self) -> None:
        self.chunks: list[bytes] = []
        self.eof = False
        self.arrived = asyncio.Event()

    def feed(self, data: bytes) -> None:
        self.chunks.append(data)
        self.arrived.set()

    def end(self) -> None:
        self.eof = True
        self.arrived.set()

    async def readany(self) -> bytes:
        while not self.chunks and not self.eof:
            self.arrived.clear()
            await self.arrived.wait()
        return self.chunks.pop(0) if self.chunks else b""

    def read_nowait(self) -> bytes:
        out, self.chunks = b"".join(self.chunks), []
        return out


class FakeTransport:
    def __init__(self) -> None:
        self.paused = False
        self.pauses = 0

    def pause_reading(self) -> None:
        assert not self.paused
        self.paused, self.pauses = True, self.pauses + 1

    def resume_reading(self) -> None:
        assert self.paused
        self.paused = False


async def collect(stream: Any, wait: float, transport: Any = None) -> list[list[bytes]]:
    return [batch async for batch in read_watch_batches(stream, wait, transport)]


def test_lines_split_across_reads_are_joined_in_order_and_a_cut_last_line_is_dropped() -> None:
    async def main() -> list[list[bytes]]:
        s = FakeStream()
        for piece in (b'{"a":1}\n{"b"', b":2}", b"\n\n", b'{"c":3}\n{"d":4}\n{"e', b""):
            if piece:
                s.feed(piece)
        s.end()
        return await collect(s, 0)

    batches = asyncio.run(main())
    assert batches == [[b'{"a":1}'], [b'{"b":2}'], [b'{"c":3}', b'{"d":4}']]


def test_events_arriving_during_the_wait_come_in_the_same_read_with_the_connection_paused() -> None:
    async def main() -> tuple[list[list[bytes]], FakeTransport, list[bool]]:
        s, t = FakeStream(), FakeTransport()
        paused_when_fed: list[bool] = []
        first_read = asyncio.Event()

        async def writer() -> None:
            s.feed(b"1\n")
            # inside the reader's 0.2 s wait after its first read (even if the loop stalls, this
            # earlier timer runs first)
            await asyncio.sleep(0.01)
            for i in range(2, 6):
                paused_when_fed.append(t.paused)
                s.feed(f"{i}\n".encode())
            await first_read.wait()  # a state, not a time: the next event comes in a new read
            s.feed(b"6\n")
            s.end()

        task = asyncio.ensure_future(writer())
        batches: list[list[bytes]] = []
        async for batch in read_watch_batches(s, 0.2, t):  # type: ignore[arg-type]
            batches.append(batch)
            first_read.set()
        await task
        return batches, t, paused_when_fed

    batches, t, paused_when_fed = asyncio.run(main())
    assert batches == [[b"1", b"2", b"3", b"4", b"5"], [b"6"]]
    assert paused_when_fed == [True] * 4
    assert t.pauses == 2 and not t.paused  # once per read, and never left paused


def test_kube_watch_yields_every_event_in_order_from_a_real_stream_cut_anywhere() -> None:
    """A local HTTP server writes 300 events cut into random pieces, a few ms apart; the
    client's watch (with its pause between reads) must yield each once, in order."""
    events = [{"type": "MODIFIED", "object": {"metadata": {"name": f"p{i}", "resourceVersion": str(i)},
                                              "pad": "x" * (i % 50)}} for i in range(300)]
    data = b"".join(orjson.dumps(e) + b"\n" for e in events)
    rng = random.Random(7)
    cuts = sorted(rng.sample(range(1, len(data)), 400))
    pieces = [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]

    async def handler(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()
        await resp.prepare(request)
        for i, piece in enumerate(pieces):
            await resp.write(piece)
            if i % 20 == 0:
                await asyncio.sleep(0.002)
        await resp.write_eof()
        return resp

    async def main() -> list[dict[str, Any]]:
        app = web.Application()
        app.router.add_get("/api/v1/pods", handler)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        kube = Kube(f"http://127.0.0.1:{port}", False, {})
        try:
            return [ev async for ev in kube.watch(PODS, "0")]
        finally:
            await kube.close()
            await runner.cleanup()

    assert asyncio.run(main()) == events
