"""One agent of the tree: a TLS server for its children and clients, a link to its parent.

Each agent attaches to its designated parent (:mod:`fluxnetes.agent.tree`); when that parent
cannot be reached or goes silent it attaches to the next live ancestor instead, and every few
seconds tries to go back to the designated one. Membership changes (``set_tree``) take effect
at once, without restarting anything.

Downward messages (exec requests, broadcast manifests and chunks) are handled locally and
forwarded to every attached child; upward messages (results, joins) are relayed towards rank 0.
Each agent keeps the list of agents below it (``subtree``), so rank 0 knows who is attached
and a request to a node that is not attached fails at once instead of timing out.

An :class:`Agent` is its server, its lifecycle and four parts, each holding its own state:
``up`` (:mod:`.parentlink`: the link to the parent, the upward queue), ``children``
(:mod:`.children`: the attached children, the agents below), ``downward`` (:mod:`.downward`:
exec requests and transfers coming down, this agent's answers) and ``requests``
(:mod:`.rootrequests`: the clients' requests at rank 0).
"""

from __future__ import annotations

import asyncio
import logging
import os
import ssl
from collections.abc import Awaitable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fluxnetes.agent import proto, tls
from fluxnetes.agent.authz import Authorizer, LocalAuthorizer
from fluxnetes.agent.children import Children
from fluxnetes.agent.downward import Downward
from fluxnetes.agent.link import Link, Pacer
from fluxnetes.agent.parentlink import ParentLink
from fluxnetes.agent.rootrequests import RootRequests
from fluxnetes.agent.tree import DEFAULT_FANOUT, DEFAULT_PORT, Tree

log = logging.getLogger(__name__)


@dataclass
class AgentConfig:
    node: str
    certs: tls.CertPaths
    state_dir: Path
    data_dir: Path
    listen_host: str = "0.0.0.0"
    listen_port: int = DEFAULT_PORT
    fanout: int = DEFAULT_FANOUT
    exec_enabled: bool = False
    exec_user: str | None = None
    exec_timeout: float = 300.0
    heartbeat: float = 1.0  # a parent pings its children this often
    dead_after: float = 10.0  # a child gives up on a silent parent after this long
    retry: float = 2.0  # an adopted child retries its designated parent this often
    connect_timeout: float = 2.0
    send_timeout: float = 60.0  # a child that takes longer to accept a frame is dropped
    upload_rate: float | None = None  # bytes/s cap on data sent to children (benchmarks: a NIC)


class Agent:
    def __init__(self, cfg: AgentConfig, tree: Tree, authorizer: Authorizer | None = None) -> None:
        self.cfg = cfg
        self.tree = tree
        self.authorizer: Authorizer = authorizer or LocalAuthorizer()
        self.stopping = False
        self._server: asyncio.base_events.Server | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._server_ctx = tls.server_context(cfg.certs)
        self.client_ctx = tls.client_context(cfg.certs)
        self.up = ParentLink(self)
        self.children = Children(self, Pacer(cfg.upload_rate) if cfg.upload_rate else None)
        self.downward = Downward(self)
        self.requests = RootRequests(self)

    # -- lifecycle ------------------------------------------------------------------------------
    @property
    def node(self) -> str:
        return self.cfg.node

    @property
    def rank(self) -> int | None:
        return self.tree.rank(self.node)

    @property
    def is_root(self) -> bool:
        return self.rank == 0

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    @property
    def parent_name(self) -> str | None:
        return self.up.name

    @property
    def attached(self) -> set[str]:
        """Agents attached to the tree below (and including) this one."""
        return {self.node, *self.children.subtree}

    async def start(self) -> None:
        self.cfg.state_dir.mkdir(parents=True, exist_ok=True)
        self._server = await asyncio.start_server(self._on_conn, self.cfg.listen_host, self.cfg.listen_port,
                                                  ssl=self._server_ctx, limit=2 ** 22, backlog=1024)
        self.spawn(self.up.run())
        self.spawn(self.children.heartbeat())
        log.info("agent %s listening on %s:%d (rank %s of %d, fanout %d)", self.node, self.cfg.listen_host,
                 self.port, self.rank, len(self.tree), self.tree.fanout)

    async def stop(self) -> None:
        self.stopping = True
        if self._server is not None:
            self._server.close()
        # cancel until done: a cancellation racing a completing wait_for can be lost (3.11)
        for _ in range(20):
            tasks = [t for t in self._tasks if not t.done()]
            if not tasks:
                break
            for t in tasks:
                t.cancel()
            await asyncio.wait(tasks, timeout=0.5)
        self.up.close()
        self.children.close()
        self.downward.close()

    def set_tree(self, tree: Tree) -> None:
        """New membership: re-evaluate the parent now (no restart)."""
        if tree != self.tree:
            old_rank = self.rank
            self.tree = tree
            self.requests.changed.set()
            if self.rank != old_rank:
                log.info("agent %s: rank %s -> %s (%d members)", self.node, old_rank, self.rank, len(tree))
            self.up.changed.set()

    def spawn(self, coro: Awaitable[Any]) -> asyncio.Task[Any]:
        task: asyncio.Task[Any] = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("agent %s: task failed: %r", self.node, task.exception())

    # -- connections: children and clients --------------------------------------------------
    async def _on_conn(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = tls.peer_identity(writer.get_extra_info("peercert"))
        try:
            h, _ = await asyncio.wait_for(proto.recv(reader), 10)
        except (OSError, TimeoutError, asyncio.IncompleteReadError, proto.ProtocolError, ssl.SSLError):
            writer.close()
            return
        try:
            if h.get("t") == "hello" and h.get("role") == "child":
                name = str(h.get("name", ""))
                if peer != (name, tls.AGENT_ORG):
                    await proto.send(writer, {"t": "error", "error": f"certificate {peer} does not name agent {name!r}"})
                    return
                await self.children.serve(Link(name, reader, writer), h)
            elif h.get("t") == "hello" and h.get("role") == "client":
                await self.requests.serve(reader, writer, h, peer)
            else:
                await proto.send(writer, {"t": "error", "error": "expected a hello"})
        except (OSError, asyncio.IncompleteReadError, proto.ProtocolError, ssl.SSLError) as exc:
            log.debug("agent %s: connection ended: %r", self.node, exc)
        finally:
            writer.close()

    def status(self) -> dict[str, Any]:
        members = set(self.tree.names)
        return {"root": self.node, "fanout": self.tree.fanout, "members": self.tree.names,
                "attached": sorted(self.attached & members),
                # agents still attached whose node is no member (any more): they leave once
                # their own view of the membership catches up
                "strays": sorted(self.attached - members),
                "parents": {n: p for n, p in sorted(self.children.subtree.items()) if n in members}}


def default_state_dir() -> Path:
    return Path(os.environ.get("FLUXNETES_AGENT_STATE", "/var/lib/fluxnetes-agent"))
