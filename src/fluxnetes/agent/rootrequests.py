"""The requests of clients, served by rank 0: authentication (a client certificate or a
token), status, exec and broadcast. A request goes down the tree and its answers come back
up to rank 0 (``deliver``); it ends when every expected node answered or departed, or at its
deadline. Members that leave the membership while it runs are reported as departed at once,
and nodes detached from the tree for longer than a re-parenting takes as lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fluxnetes.agent import proto, tls
from fluxnetes.agent.authz import AuthError, Identity
from fluxnetes.agent.client import EXEC_SLACK
from fluxnetes.agent.proto import Header
from fluxnetes.agent.transfer import Manifest, TransferError

if TYPE_CHECKING:
    from fluxnetes.agent.overlay import Agent

log = logging.getLogger(__name__)

DEPARTED = "left the tree's membership during the request (its Node was deleted or is not Ready)"


@dataclass
class Op:
    """One request running at rank 0: the nodes expected to answer, their answers, and the
    nodes that will not answer (and why)."""

    kind: str
    expected: set[str]
    results: dict[str, dict[str, Any]] = field(default_factory=dict)
    departed: dict[str, str] = field(default_factory=dict)  # node -> why it will not answer
    done: asyncio.Event = field(default_factory=asyncio.Event)

    def add(self, node: str, result: dict[str, Any]) -> None:
        if node in self.expected and node not in self.departed:
            self.results[node] = result
            self._check()

    def depart(self, node: str, why: str) -> None:
        if node in self.expected and node not in self.results:
            self.departed[node] = why
            self._check()

    @property
    def owing(self) -> set[str]:
        return self.expected - set(self.results) - set(self.departed)

    def _check(self) -> None:
        if not self.owing:
            self.done.set()


class RequestError(Exception):
    """A client request that cannot be served (unknown nodes, exec disabled, ...)."""


class RootRequests:
    """The requests running at rank 0 (``ops``, by request id)."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        self.ops: dict[str, Op] = {}
        self.changed = asyncio.Event()  # the membership changed (running requests look)

    def deliver(self, h: Header) -> None:
        """Rank 0: an upward message reached the top."""
        op = self.ops.get(str(h.get("id")))
        if op is None:
            return
        if h.get("t") == "exec_result":
            op.add(str(h["node"]), h["result"])
        elif h.get("t") == "bcast_done":
            op.add(str(h["node"]), {"error": h.get("error", ""), "path": h.get("path", "")})

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                    hello: Header, peer: tuple[str, str] | None) -> None:
        if not self.agent.is_root:
            root = self.agent.tree.members[0] if len(self.agent.tree) else None
            await proto.send(writer, {"t": "redirect", "name": root.name if root else None,
                                      "address": root.address if root else None,
                                      "error": f"{self.agent.node} is not rank 0"})
            return
        try:
            if peer is not None and peer[1] in (tls.CLIENT_ORG, tls.AGENT_ORG):
                who = Identity(peer[0], (peer[1],), "certificate")
            elif hello.get("token"):
                who = await self.agent.authorizer.authenticate(str(hello["token"]))
            else:
                raise AuthError("no client certificate and no token: cannot tell who you are")
        except AuthError as exc:
            await proto.send(writer, {"t": "error", "error": str(exc)})
            return
        await proto.send(writer, {"t": "welcome", "name": self.agent.node, "user": who.user})
        h, _ = await proto.recv(reader)
        try:
            if h.get("t") == "status":
                await proto.send(writer, {"t": "reply", **self.agent.status()})
            elif h.get("t") == "exec":
                await self.agent.authorizer.allow(who, "exec")
                out = await self.exec_request(who, list(h.get("argv") or []), h.get("nodes"),
                                              float(h.get("timeout") or self.agent.cfg.exec_timeout))
                await proto.send(writer, {"t": "reply", **out})
            elif h.get("t") == "broadcast":
                await self.agent.authorizer.allow(who, "broadcast")
                out = await self.broadcast_request(who, h, reader)
                await proto.send(writer, {"t": "reply", **out})
            else:
                raise RequestError(f"unknown request {h.get('t')!r}")
        except (AuthError, RequestError, TransferError) as exc:
            await proto.send(writer, {"t": "error", "error": str(exc)})

    def _targets(self, nodes: list[str] | None) -> list[str]:
        if nodes is None:
            return self.agent.tree.names
        unknown = [n for n in nodes if self.agent.tree.rank(n) is None]
        if unknown:
            raise RequestError(f"unknown node(s): {', '.join(unknown)} (members: {len(self.agent.tree)}; "
                               "a node is a member when it is Ready and runs the agent)")
        return list(dict.fromkeys(nodes))

    async def exec_request(self, who: Identity, argv: list[str], nodes: list[str] | None,
                           timeout: float) -> dict[str, Any]:
        if not self.agent.cfg.exec_enabled:
            raise RequestError("nodes exec is disabled (enable it with chart value agent.exec.enabled "
                               "or `fluxnetes agent --exec-enabled`)")
        if not argv:
            raise RequestError("no command given (nodes exec -- CMD ARGS...)")
        targets = self._targets(nodes)
        await self.agent.authorizer.audit(who, "exec", self.agent.node,
                                    f"exec on {len(targets)} node(s): {' '.join(argv)[:500]}")
        results, missing = await self._run_op("exec", targets, timeout + EXEC_SLACK, {
            "t": "exec", "argv": argv, "targets": None if nodes is None else targets, "timeout": timeout,
            "user": who.user})
        return {"results": sorted(results.values(), key=lambda r: (r["rank"], r["node"])),
                "missing": missing}

    async def _run_op(self, kind: str, targets: list[str], timeout: float, msg: Header,
                      payloads: Callable[[str], Awaitable[None]] | None = None) -> tuple[dict[str, Any], dict[str, str]]:
        """Send a request down the tree and collect the answers. Ends by ``timeout`` seconds
        whatever happens below (sending the content included); members that leave the
        membership meanwhile are reported as departed at once."""
        op_id = str(msg.get("id") or uuid.uuid4().hex)
        msg["id"] = op_id
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        attached = self.agent.attached
        missing = {n: "agent not attached to the tree" for n in targets if n not in attached}
        op = Op(kind, {n for n in targets if n in attached})
        self.ops[op_id] = op
        watch = asyncio.ensure_future(self._watch_departures(op))
        try:
            if op.expected:
                async def send() -> None:
                    await self.agent.downward.on_down(msg, b"")
                    if payloads is not None:
                        await payloads(op_id)

                try:
                    await asyncio.wait_for(send(), max(0.0, deadline - loop.time()))
                except TimeoutError:
                    log.warning("agent %s: %s %s: the request could not be sent down within %.0f s",
                                self.agent.node, kind, op_id, timeout)
                else:
                    await self._wait_op(op, deadline)
            missing.update(op.departed)
            for n in op.owing:
                missing[n] = f"no answer within {timeout:.0f} s (lost on the way, or too slow)"
            return dict(op.results), missing
        finally:
            watch.cancel()
            self.ops.pop(op_id, None)
            if kind == "exec":  # (a broadcast sends its own end: the transfer's)
                self.agent.spawn(self.agent.downward.on_down({"t": "end", "id": op_id}, b""))

    async def _watch_departures(self, op: Op) -> None:
        """Members that leave the membership (Node deleted, not Ready) while a request runs
        will not answer: say so at once instead of waiting for them."""
        while not op.done.is_set():
            members = set(self.agent.tree.names)
            for n in list(op.owing):
                if n not in members:
                    op.depart(n, DEPARTED)
            self.changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), 1.0)

    async def _wait_op(self, op: Op, deadline: float) -> None:
        """Until every expected node answered or departed, the deadline, or every node still
        owing an answer has been detached from the tree for a while (lost: its children had
        time to re-parent)."""
        loop = asyncio.get_running_loop()
        grace = self.agent.cfg.dead_after + 2 * self.agent.cfg.retry
        gone_since: dict[str, float] = {}
        while not op.done.is_set():
            now = loop.time()
            if now >= deadline:
                return
            attached = self.agent.attached
            owing = op.owing
            for n in owing:
                if n in attached:
                    gone_since.pop(n, None)
                else:
                    gone_since.setdefault(n, now)
            if owing and all(n in gone_since and now - gone_since[n] >= grace for n in owing):
                for n in owing:
                    op.depart(n, "agent detached from the tree during the request and did not come back")
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(op.done.wait(), min(0.25, deadline - now))

    async def broadcast_request(self, who: Identity, h: Header, reader: asyncio.StreamReader) -> dict[str, Any]:
        nodes = h.get("nodes")
        targets = self._targets(nodes)
        raw = dict(h.get("manifest") or {})
        raw["id"] = uuid.uuid4().hex[:16]
        raw["targets"] = None if nodes is None else targets
        m = Manifest.from_json(raw)
        await self.agent.authorizer.audit(who, "broadcast", self.agent.node,
                                    f"broadcast of {m.size} bytes to {m.dest} on {len(targets)} node(s)")

        async def chunks(tid: str) -> None:
            for _ in range(m.n_chunks):
                ch, payload = await proto.recv(reader)
                if ch.get("t") != "chunk":
                    raise RequestError("expected a chunk")
                await self.agent.downward.on_chunk({"t": "chunk", "id": tid, "i": int(ch["i"])}, payload)

        try:
            results, missing = await self._run_op("broadcast", targets, float(h.get("timeout") or 3600), {
                "t": "manifest", "id": m.id, "manifest": m.to_json()}, chunks)
        finally:
            await self.agent.downward.on_down({"t": "end", "id": m.id}, b"")
        out = [{"node": n, "rank": self.agent.tree.rank(n), **r} for n, r in results.items()]
        return {"id": m.id, "size": m.size, "sha256": m.sha256, "chunks": m.n_chunks,
                "results": sorted(out, key=lambda r: r["rank"]), "missing": missing}
