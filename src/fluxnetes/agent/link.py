"""One connection of an agent (to its parent, a child or a client), the pacing of an agent's
sends to its children (a benchmark's model of a NIC), and the cancellation of tasks that
must really stop."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from fluxnetes.agent import proto
from fluxnetes.agent.proto import Header

log = logging.getLogger(__name__)


class Link:
    """One connection; sends are serialised so frames never interleave."""

    def __init__(self, name: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.name, self.reader, self.writer = name, reader, writer
        self.lock = asyncio.Lock()
        self.ready = True  # False while a new child is being brought up to date

    async def send(self, header: Header, payload: bytes = b"") -> None:
        async with self.lock:
            if self.writer.is_closing():
                raise ConnectionResetError(f"connection to {self.name} is closed")
            try:
                await proto.send(self.writer, header, payload)
            except AttributeError:  # asyncio's SSL transport after connection_lost (3.11)
                raise ConnectionResetError(f"connection to {self.name} is closed") from None

    def try_ping(self) -> None:
        if not self.lock.locked() and not self.writer.is_closing():
            self.writer.write(proto.encode({"t": "ping"}))

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.writer.close()
        with contextlib.suppress(Exception):
            self.writer.transport.abort()  # at once, even with unsent data queued to a slow peer


class Pacer:
    """Token bucket pacing an agent's sends (used by the benchmark to model a NIC)."""

    def __init__(self, rate: float) -> None:
        self.rate = rate
        self.free_at = 0.0

    async def take(self, n: int) -> None:
        loop = asyncio.get_running_loop()
        now = loop.time()
        self.free_at = max(self.free_at, now) + n / self.rate
        if self.free_at - now > 0.001:
            await asyncio.sleep(self.free_at - now)


async def cancel_all(tasks: list[asyncio.Future[Any]]) -> None:
    """Cancel until done (a cancellation racing a completing wait_for can be lost on 3.11)."""
    for _ in range(50):
        pending = [t for t in tasks if not t.done()]
        if not pending:
            return
        for t in pending:
            t.cancel()
        await asyncio.wait(pending, timeout=0.2)
    log.error("tasks would not stop: %s", [t for t in tasks if not t.done()])
