"""An agent's link to its parent in the tree: attach to the designated parent, or, while it
cannot be reached or goes silent, to the next live ancestor, and every ``retry`` seconds try
to go back to the designated one; a membership change (``Agent.set_tree``) re-evaluates the
parent at once. Upward messages (results, joins) wait in one queue and go out through
whichever parent is attached; one lost on a broken link is sent again through the next.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from typing import TYPE_CHECKING

from fluxnetes.agent import proto, tls
from fluxnetes.agent.link import Link, cancel_all
from fluxnetes.agent.proto import Header
from fluxnetes.agent.tree import ADDRESS_ANNOTATION, Member

if TYPE_CHECKING:
    from fluxnetes.agent.overlay import Agent

log = logging.getLogger(__name__)


class ParentLink:
    """The link to the parent (``link``, None while detached) and the upward queue."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        self.link: Link | None = None
        self.attach_count = 0  # how many times a parent link came up (tests, logs)
        self.changed = asyncio.Event()  # the membership changed: look at the parent again
        self._up: asyncio.Queue[tuple[Header, bytes]] = asyncio.Queue()
        self._said: set[tuple[str, ...]] = set()  # problems already logged once

    @property
    def name(self) -> str | None:
        return self.link.name if self.link else None

    def close(self) -> None:
        if self.link:
            self.link.close()

    async def _attach(self, member: Member) -> Link | None:
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(
                member.host, member.port, ssl=self.agent.client_ctx, limit=2 ** 22),
                self.agent.cfg.connect_timeout)
        except (OSError, TimeoutError, ssl.SSLError) as exc:
            log.debug("agent %s: cannot reach %s at %s: %s", self.agent.node, member.name, member.address, exc)
            return None
        link = Link(member.name, reader, writer)
        try:
            peer = tls.peer_identity(writer.get_extra_info("peercert"))
            if peer is None or peer != (member.name, tls.AGENT_ORG):
                link.close()
                self._wrong_peer(member, peer)
                return None
            transfers = self.agent.downward.missing()
            await link.send({"t": "hello", "role": "child", "name": self.agent.node,
                             "subtree": {self.agent.node: member.name, **self.agent.children.subtree},
                             "transfers": transfers})
            h, _ = await asyncio.wait_for(proto.recv(reader), self.agent.cfg.connect_timeout * 2)
            if h.get("t") != "welcome":
                raise proto.ProtocolError(f"{member.name} answered {h.get('t')}: {h.get('error', '')}")
        except (OSError, TimeoutError, asyncio.IncompleteReadError, proto.ProtocolError, ssl.SSLError) as exc:
            log.warning("agent %s: attaching to %s failed: %s", self.agent.node, member.name, exc)
            link.close()
            return None
        return link

    def _wrong_peer(self, member: Member, peer: tuple[str, str] | None) -> None:
        """Another agent (or none) answers at a member's address: said once, with what is
        missing, not at every retry."""
        key = ("peer", member.name, member.address, str(peer))
        if key in self._said:
            log.debug("agent %s: %s still answers as %s, not agent %s", self.agent.node, member.address, peer,
                      member.name)
            return
        self._said.add(key)
        who = f"agent {peer[0]}" if peer and peer[1] == tls.AGENT_ORG else f"{peer or 'a peer without a certificate'}"
        if member.origin == "node":
            hint = (f"its Node has no {ADDRESS_ANNOTATION} annotation, so the address is its InternalIP "
                    "and the agents' port; on fake (kwok) nodes, or for an agent behind NAT, annotate the "
                    "Node with its agent's HOST:PORT")
        elif member.origin == "annotation":
            hint = f"its Node's {ADDRESS_ANNOTATION} annotation names another agent's address"
        else:
            hint = "the peers list gives it another agent's address"
        log.warning("agent %s: member %s is unreachable: %s answers at %s, not agent %s (%s); "
                    "routing around it (said once)", self.agent.node, member.name, who, member.address, member.name,
                    hint)

    async def _first_reachable(self, cands: list[Member]) -> tuple[int, Link] | None:
        for i, m in enumerate(cands):
            link = await self._attach(m)
            if link is not None:
                return i, link
        return None

    async def run(self) -> None:
        pending: tuple[int, Link] | None = None
        while not self.agent.stopping:
            self.changed.clear()
            cands = self.agent.tree.ancestors(self.agent.node)
            if not cands:
                # rank 0, or not a member: nobody to attach to until the membership changes
                if pending:
                    pending[1].close()
                    pending = None
                await self.changed.wait()
                continue
            got = pending or await self._first_reachable(cands)
            pending = None
            if got is None:
                await self._wait_changed(self.agent.cfg.retry)
                continue
            index, link = got
            self.link = link
            self.attach_count += 1
            for h in self.agent.downward.answers.values():  # whatever was lost on the old way up
                self._up.put_nowait((h, b""))
            log.info("agent %s (rank %s): attached to %s%s", self.agent.node, self.agent.rank, link.name,
                     "" if index == 0 else f" (designated parent {cands[0].name} unreachable)")
            reader = asyncio.ensure_future(self._read_parent(link))
            sender = asyncio.ensure_future(self._send_up(link))
            try:
                while not self.agent.stopping:
                    timeout = None if index == 0 else self.agent.cfg.retry
                    changed = asyncio.ensure_future(self.changed.wait())
                    done, _ = await asyncio.wait({reader, sender, changed}, timeout=timeout,
                                                 return_when=asyncio.FIRST_COMPLETED)
                    changed.cancel()
                    if reader in done or sender in done:
                        log.warning("agent %s: lost parent %s", self.agent.node, link.name)
                        break
                    new = self.agent.tree.ancestors(self.agent.node)
                    names = [m.name for m in new]
                    if changed in done:
                        self.changed.clear()
                        if link.name not in names:
                            log.info("agent %s: parent %s left the membership", self.agent.node, link.name)
                            break
                        index = names.index(link.name)
                        if index == 0:
                            continue
                    better = await self._first_reachable(new[:index])
                    if better is not None:
                        pending = better
                        break
            finally:
                # closed first: a reader whose cancellation raced a frame arriving (3.11's
                # wait_for can swallow it) then ends on the closed connection instead of
                # reading on from a parent we left
                link.close()
                await cancel_all([reader, sender])
                self.link = None

    async def _wait_changed(self, timeout: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.changed.wait(), timeout)

    async def _read_parent(self, link: Link) -> None:
        try:
            while True:
                h, payload = await asyncio.wait_for(proto.recv(link.reader), self.agent.cfg.dead_after)
                await self.agent.downward.on_down(h, payload)
        except TimeoutError:
            log.warning("agent %s: parent %s silent for %.1f s", self.agent.node, link.name, self.agent.cfg.dead_after)
        except (OSError, asyncio.IncompleteReadError, proto.ProtocolError, ssl.SSLError):
            pass

    async def _send_up(self, link: Link) -> None:
        while True:
            h, payload = await self._up.get()
            try:
                await link.send(h, payload)
            except (OSError, ssl.SSLError):
                self._up.put_nowait((h, payload))  # resent through the next parent
                return
            except asyncio.CancelledError:  # the link is being replaced: keep the message
                self._up.put_nowait((h, payload))
                raise

    def push(self, h: Header, payload: bytes = b"") -> None:
        if self.agent.is_root:
            self.agent.requests.deliver(h)
        else:
            self._up.put_nowait((h, payload))
