"""An agent's children in the tree and the agents below them: the links of the attached
children, every agent below this one with its parent (``subtree``) and the child it is reached
through (``via``), kept from the children's joins and leaves and reported upward; downward
messages forwarded to every child that is up to date, and a child that (re)attaches brought
up to date on running transfers first.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from typing import TYPE_CHECKING

from fluxnetes.agent import proto
from fluxnetes.agent.link import Link, Pacer
from fluxnetes.agent.proto import Header

if TYPE_CHECKING:
    from fluxnetes.agent.overlay import Agent

log = logging.getLogger(__name__)


class Children:
    """The attached children (``links``) and the agents below (``subtree``, ``via``)."""

    def __init__(self, agent: Agent, pacer: Pacer | None) -> None:
        self.agent = agent
        self.pacer = pacer
        self.links: dict[str, Link] = {}
        self.subtree: dict[str, str] = {}  # agent below me -> its parent
        self.via: dict[str, str] = {}  # agent below me -> my child it is reached through

    def close(self) -> None:
        for link in list(self.links.values()):
            link.close()

    async def heartbeat(self) -> None:
        while not self.agent.stopping:
            await asyncio.sleep(self.agent.cfg.heartbeat)
            for link in list(self.links.values()):
                link.try_ping()

    async def forward(self, h: Header, payload: bytes = b"") -> None:
        links = [c for c in self.links.values() if c.ready]
        if not links:
            return
        if self.pacer and payload:
            await self.pacer.take(len(payload) * len(links))
        await asyncio.gather(*(self._send_child(c, h, payload) for c in links))

    async def _send_child(self, link: Link, h: Header, payload: bytes) -> None:
        try:
            await asyncio.wait_for(link.send(h, payload), self.agent.cfg.send_timeout)
        except (OSError, TimeoutError, ssl.SSLError) as exc:
            log.warning("agent %s: dropping child %s: %r", self.agent.node, link.name, exc)
            link.close()

    async def serve(self, link: Link, hello: Header) -> None:
        old = self.links.get(link.name)
        if old is not None:
            old.close()
        link.ready = False
        self.links[link.name] = link
        await link.send({"t": "welcome", "name": self.agent.node})
        entries = {str(k): str(v) for k, v in (hello.get("subtree") or {}).items()}
        # a child coming back: whatever it no longer reports below it has gone elsewhere (or away)
        stale = {n: self.subtree[n] for n, v in list(self.via.items()) if v == link.name and n not in entries}
        for n in stale:
            self.subtree.pop(n, None)
            self.via.pop(n, None)
        if stale:
            self.agent.up.push({"t": "left", "entries": stale})
        for n, p in entries.items():
            self.subtree[n], self.via[n] = p, link.name
        self.agent.up.push({"t": "joined", "entries": entries})
        try:
            await self._catch_up(link, hello.get("transfers") or {})
            while True:
                h, _payload = await proto.recv(link.reader)
                self.on_up(link.name, h)
        finally:
            if self.links.get(link.name) is link:
                del self.links[link.name]
                gone = {n: self.subtree[n] for n, v in list(self.via.items()) if v == link.name}
                for n in gone:
                    self.subtree.pop(n, None)
                    self.via.pop(n, None)
                if gone:
                    self.agent.up.push({"t": "left", "entries": gone, "via": self.agent.node})
                log.info("agent %s: child %s detached", self.agent.node, link.name)

    async def _catch_up(self, link: Link, theirs: dict[str, list[int]]) -> None:
        """Bring a (re)attached child up to date on running transfers: the manifest and the
        chunks it misses that this agent has. Chunks arriving meanwhile are sent in later
        rounds; the child joins normal forwarding once nothing is left (no await in between)."""
        sent: dict[str, set[int]] = {}
        while True:
            work = []
            for tid, r in self.agent.downward.running():
                missing = set(theirs.get(tid, range(r.manifest.n_chunks)))
                todo = (missing & r.have) - sent.get(tid, set())
                if tid not in sent or todo:
                    work.append((tid, r, todo))
            if not work:
                link.ready = True
                return
            for tid, r, todo in work:
                if tid not in sent:
                    sent[tid] = set()
                    if tid not in theirs:
                        await self._send_bounded(link, {"t": "manifest", "manifest": r.manifest.to_json()})
                for i in sorted(todo):
                    await self._send_bounded(link, {"t": "chunk", "id": tid, "i": i}, r.read(i))
                    sent[tid].add(i)

    async def _send_bounded(self, link: Link, h: Header, payload: bytes = b"") -> None:
        """A send to a child that must not hang on a child that stopped reading."""
        try:
            await asyncio.wait_for(link.send(h, payload), self.agent.cfg.send_timeout)
        except TimeoutError:
            link.close()
            raise ConnectionResetError(f"child {link.name} took over {self.agent.cfg.send_timeout:.0f} s") from None

    def on_up(self, child: str, h: Header) -> None:
        t = h.get("t")
        if t == "joined":
            for n, p in (h.get("entries") or {}).items():
                self.subtree[n], self.via[n] = p, child
            self.agent.up.push(h)
        elif t == "left":
            gone = {}
            for n, p in (h.get("entries") or {}).items():
                if self.via.get(n) == child and self.subtree.get(n) == p:
                    self.subtree.pop(n)
                    self.via.pop(n)
                    gone[n] = p
            if gone:
                self.agent.up.push({"t": "left", "entries": gone})
        elif t in ("exec_result", "bcast_done"):
            self.agent.up.push(h)
