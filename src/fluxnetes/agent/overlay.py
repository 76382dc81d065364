"""One agent of the tree: a TLS server for its children and clients, a link to its parent.

Each agent attaches to its designated parent (:mod:`fluxnetes.agent.tree`); when that parent
cannot be reached or goes silent it attaches to the next live ancestor instead, and every few
seconds tries to go back to the designated one. Membership changes (``set_tree``) take effect
at once, without restarting anything.

Downward messages (exec requests, broadcast manifests and chunks) are handled locally and
forwarded to every attached child; upward messages (results, joins) are relayed towards rank 0.
Each agent keeps the list of agents below it (``subtree``), so rank 0 knows who is attached
and a request to a node that is not attached fails at once instead of timing out.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import ssl
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fluxnetes.agent import execute, proto, tls
from fluxnetes.agent.authz import AuthError, Authorizer, Identity, LocalAuthorizer
from fluxnetes.agent.client import EXEC_SLACK
from fluxnetes.agent.proto import Header
from fluxnetes.agent.transfer import Manifest, Receiver, TransferError
from fluxnetes.agent.tree import ADDRESS_ANNOTATION, DEFAULT_FANOUT, DEFAULT_PORT, Member, Tree

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


DEPARTED = "left the tree's membership during the request (its Node was deleted or is not Ready)"
KEPT_RESULTS = 64  # an agent's own latest results, re-sent after it re-attaches


@dataclass
class _Op:
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


class Agent:
    def __init__(self, cfg: AgentConfig, tree: Tree, authorizer: Authorizer | None = None) -> None:
        self.cfg = cfg
        self.tree = tree
        self.authorizer: Authorizer = authorizer or LocalAuthorizer()
        self.parent: Link | None = None
        self.children: dict[str, Link] = {}
        self.subtree: dict[str, str] = {}  # agent below me -> its parent
        self.via: dict[str, str] = {}  # agent below me -> my child it is reached through
        self.receivers: dict[str, Receiver] = {}
        self.ended: set[str] = set()
        self.ops: dict[str, _Op] = {}
        self.seen_exec: set[str] = set()
        # this agent's own answers to requests still running (op id -> upward message): one
        # relayed by an agent that then left, or written to a connection that broke, is lost
        # on the way; re-sent after every re-attach, dropped at the request's end
        self.answers: dict[str, Header] = {}
        self._said: set[tuple[str, ...]] = set()  # problems already logged once
        self.attach_count = 0  # how many times a parent link came up (tests, logs)
        self._up: asyncio.Queue[tuple[Header, bytes]] = asyncio.Queue()
        self._changed = asyncio.Event()
        self._changed_op = asyncio.Event()  # the membership changed (running requests look)
        self._stopping = False
        self._server: asyncio.base_events.Server | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._server_ctx = tls.server_context(cfg.certs)
        self._client_ctx = tls.client_context(cfg.certs)
        self._bucket = _Bucket(cfg.upload_rate) if cfg.upload_rate else None

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

    async def start(self) -> None:
        self.cfg.state_dir.mkdir(parents=True, exist_ok=True)
        self._server = await asyncio.start_server(self._on_conn, self.cfg.listen_host, self.cfg.listen_port,
                                                  ssl=self._server_ctx, limit=2 ** 22, backlog=1024)
        self._spawn(self._parent_loop())
        self._spawn(self._heartbeat_loop())
        log.info("agent %s listening on %s:%d (rank %s of %d, fanout %d)", self.node, self.cfg.listen_host,
                 self.port, self.rank, len(self.tree), self.tree.fanout)

    async def stop(self) -> None:
        self._stopping = True
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
        if self.parent:
            self.parent.close()
        for link in list(self.children.values()):
            link.close()
        for r in self.receivers.values():
            r.close()
        self.receivers.clear()

    def set_tree(self, tree: Tree) -> None:
        """New membership: re-evaluate the parent now (no restart)."""
        if tree != self.tree:
            old_rank = self.rank
            self.tree = tree
            self._changed_op.set()
            if self.rank != old_rank:
                log.info("agent %s: rank %s -> %s (%d members)", self.node, old_rank, self.rank, len(tree))
            self._changed.set()

    def _spawn(self, coro: Awaitable[Any]) -> asyncio.Task[Any]:
        task: asyncio.Task[Any] = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("agent %s: task failed: %r", self.node, task.exception())

    # -- the link to the parent -----------------------------------------------------------------
    @property
    def parent_name(self) -> str | None:
        return self.parent.name if self.parent else None

    async def _attach(self, member: Member) -> Link | None:
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(
                member.host, member.port, ssl=self._client_ctx, limit=2 ** 22), self.cfg.connect_timeout)
        except (OSError, TimeoutError, ssl.SSLError) as exc:
            log.debug("agent %s: cannot reach %s at %s: %s", self.node, member.name, member.address, exc)
            return None
        link = Link(member.name, reader, writer)
        try:
            peer = tls.peer_identity(writer.get_extra_info("peercert"))
            if peer is None or peer != (member.name, tls.AGENT_ORG):
                link.close()
                self._wrong_peer(member, peer)
                return None
            transfers = {tid: r.missing() for tid, r in self.receivers.items() if tid not in self.ended}
            await link.send({"t": "hello", "role": "child", "name": self.node,
                             "subtree": {self.node: member.name, **self.subtree}, "transfers": transfers})
            h, _ = await asyncio.wait_for(proto.recv(reader), self.cfg.connect_timeout * 2)
            if h.get("t") != "welcome":
                raise proto.ProtocolError(f"{member.name} answered {h.get('t')}: {h.get('error', '')}")
        except (OSError, TimeoutError, asyncio.IncompleteReadError, proto.ProtocolError, ssl.SSLError) as exc:
            log.warning("agent %s: attaching to %s failed: %s", self.node, member.name, exc)
            link.close()
            return None
        return link

    def _wrong_peer(self, member: Member, peer: tuple[str, str] | None) -> None:
        """Another agent (or none) answers at a member's address: said once, with what is
        missing, not at every retry."""
        key = ("peer", member.name, member.address, str(peer))
        if key in self._said:
            log.debug("agent %s: %s still answers as %s, not agent %s", self.node, member.address, peer,
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
                    "routing around it (said once)", self.node, member.name, who, member.address, member.name,
                    hint)

    async def _first_reachable(self, cands: list[Member]) -> tuple[int, Link] | None:
        for i, m in enumerate(cands):
            link = await self._attach(m)
            if link is not None:
                return i, link
        return None

    async def _parent_loop(self) -> None:
        pending: tuple[int, Link] | None = None
        while not self._stopping:
            self._changed.clear()
            cands = self.tree.ancestors(self.node)
            if not cands:
                # rank 0, or not a member: nobody to attach to until the membership changes
                if pending:
                    pending[1].close()
                    pending = None
                await self._changed.wait()
                continue
            got = pending or await self._first_reachable(cands)
            pending = None
            if got is None:
                await self._wait_changed(self.cfg.retry)
                continue
            index, link = got
            self.parent = link
            self.attach_count += 1
            for h in self.answers.values():  # whatever was lost on the old way up
                self._up.put_nowait((h, b""))
            log.info("agent %s (rank %s): attached to %s%s", self.node, self.rank, link.name,
                     "" if index == 0 else f" (designated parent {cands[0].name} unreachable)")
            reader = asyncio.ensure_future(self._read_parent(link))
            sender = asyncio.ensure_future(self._send_up(link))
            try:
                while not self._stopping:
                    timeout = None if index == 0 else self.cfg.retry
                    changed = asyncio.ensure_future(self._changed.wait())
                    done, _ = await asyncio.wait({reader, sender, changed}, timeout=timeout,
                                                 return_when=asyncio.FIRST_COMPLETED)
                    changed.cancel()
                    if reader in done or sender in done:
                        log.warning("agent %s: lost parent %s", self.node, link.name)
                        break
                    new = self.tree.ancestors(self.node)
                    names = [m.name for m in new]
                    if changed in done:
                        self._changed.clear()
                        if link.name not in names:
                            log.info("agent %s: parent %s left the membership", self.node, link.name)
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
                await _cancel_all([reader, sender])
                self.parent = None

    async def _wait_changed(self, timeout: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._changed.wait(), timeout)

    async def _read_parent(self, link: Link) -> None:
        try:
            while True:
                h, payload = await asyncio.wait_for(proto.recv(link.reader), self.cfg.dead_after)
                await self._on_down(h, payload)
        except TimeoutError:
            log.warning("agent %s: parent %s silent for %.1f s", self.node, link.name, self.cfg.dead_after)
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

    def _push_up(self, h: Header, payload: bytes = b"") -> None:
        if self.is_root:
            self._deliver(h)
        else:
            self._up.put_nowait((h, payload))

    async def _heartbeat_loop(self) -> None:
        while not self._stopping:
            await asyncio.sleep(self.cfg.heartbeat)
            for link in list(self.children.values()):
                link.try_ping()

    # -- downward traffic ---------------------------------------------------------------------
    async def _forward(self, h: Header, payload: bytes = b"") -> None:
        links = [c for c in self.children.values() if c.ready]
        if not links:
            return
        if self._bucket and payload:
            await self._bucket.take(len(payload) * len(links))
        await asyncio.gather(*(self._send_child(c, h, payload) for c in links))

    async def _send_child(self, link: Link, h: Header, payload: bytes) -> None:
        try:
            await asyncio.wait_for(link.send(h, payload), self.cfg.send_timeout)
        except (OSError, TimeoutError, ssl.SSLError) as exc:
            log.warning("agent %s: dropping child %s: %r", self.node, link.name, exc)
            link.close()

    async def _on_down(self, h: Header, payload: bytes) -> None:
        t = h.get("t")
        if t == "ping":
            return
        if t == "exec":
            if h["id"] in self.seen_exec or h["id"] in self.ended:
                return
            self.seen_exec.add(h["id"])
            await self._forward(h)
            targets = h.get("targets")
            if targets is None or self.node in targets:
                self._spawn(self._run_exec(h))
        elif t == "manifest":
            await self._on_manifest(h)
        elif t == "chunk":
            await self._on_chunk(h, payload)
        elif t == "end":
            tid = str(h["id"])
            self.ended.add(tid)
            self.answers.pop(tid, None)
            await self._forward(h)
            r = self.receivers.pop(tid, None)
            if r:
                r.close()

    async def _run_exec(self, h: Header) -> None:
        rank = self.rank if self.rank is not None else -1
        if not self.cfg.exec_enabled:
            res = execute.ExecResult(self.node, rank, None, error="exec is disabled on this agent")
        else:
            timeout = min(float(h.get("timeout") or self.cfg.exec_timeout), self.cfg.exec_timeout)
            res = await execute.run(self.node, rank, list(h["argv"]), self.cfg.exec_user, timeout)
        self._answer({"t": "exec_result", "id": h["id"], "node": self.node, "result": res.to_json()})

    async def _on_manifest(self, h: Header) -> None:
        try:
            m = Manifest.from_json(h["manifest"])
        except TransferError as exc:
            log.error("agent %s: %s", self.node, exc)
            return
        if m.id in self.receivers or m.id in self.ended:
            return
        target = m.targets is None or self.node in m.targets
        try:
            r = Receiver.open(m, self.cfg.state_dir / "transfers", self.cfg.data_dir if target else None)
        except (OSError, TransferError) as exc:
            log.error("agent %s: transfer %s: %s", self.node, m.id, exc)
            self._answer({"t": "bcast_done", "id": m.id, "node": self.node, "error": str(exc)})
            return
        self.receivers[m.id] = r
        await self._forward(h)
        if r.complete:
            self._finish(r, target)

    async def _on_chunk(self, h: Header, payload: bytes) -> None:
        r = self.receivers.get(str(h["id"]))
        if r is None:
            return
        try:
            new = r.add(int(h["i"]), payload)
        except TransferError as exc:
            log.error("agent %s: %s", self.node, exc)
            return  # not forwarded: the child asks for it again from a healthy parent
        if not new:
            return
        await self._forward(h, payload)
        if r.complete:
            m = r.manifest
            self._finish(r, m.targets is None or self.node in m.targets)

    def _finish(self, r: Receiver, target: bool) -> None:
        err = r.finish()
        if err:
            log.error("agent %s: transfer %s: %s", self.node, r.manifest.id, err)
        if target:
            self._answer({"t": "bcast_done", "id": r.manifest.id, "node": self.node, "error": err,
                          "path": str(r.dest)})

    def _answer(self, h: Header) -> None:
        """This agent's answer to a request: sent up now, and kept until the request ends."""
        op_id = str(h["id"])
        if op_id in self.ended:
            return
        self.answers[op_id] = h
        while len(self.answers) > KEPT_RESULTS:  # requests whose end never reached us
            self.answers.pop(next(iter(self.answers)))
        self._push_up(h)

    # -- children and clients -------------------------------------------------------------------
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
                await self._serve_child(Link(name, reader, writer), h)
            elif h.get("t") == "hello" and h.get("role") == "client":
                await self._serve_client(reader, writer, h, peer)
            else:
                await proto.send(writer, {"t": "error", "error": "expected a hello"})
        except (OSError, asyncio.IncompleteReadError, proto.ProtocolError, ssl.SSLError) as exc:
            log.debug("agent %s: connection ended: %r", self.node, exc)
        finally:
            writer.close()

    async def _serve_child(self, link: Link, hello: Header) -> None:
        old = self.children.get(link.name)
        if old is not None:
            old.close()
        link.ready = False
        self.children[link.name] = link
        await link.send({"t": "welcome", "name": self.node})
        entries = {str(k): str(v) for k, v in (hello.get("subtree") or {}).items()}
        # a child coming back: whatever it no longer reports below it has gone elsewhere (or away)
        stale = {n: self.subtree[n] for n, v in list(self.via.items()) if v == link.name and n not in entries}
        for n in stale:
            self.subtree.pop(n, None)
            self.via.pop(n, None)
        if stale:
            self._push_up({"t": "left", "entries": stale})
        for n, p in entries.items():
            self.subtree[n], self.via[n] = p, link.name
        self._push_up({"t": "joined", "entries": entries})
        try:
            await self._catch_up(link, hello.get("transfers") or {})
            while True:
                h, _payload = await proto.recv(link.reader)
                self._on_up(link.name, h)
        finally:
            if self.children.get(link.name) is link:
                del self.children[link.name]
                gone = {n: self.subtree[n] for n, v in list(self.via.items()) if v == link.name}
                for n in gone:
                    self.subtree.pop(n, None)
                    self.via.pop(n, None)
                if gone:
                    self._push_up({"t": "left", "entries": gone, "via": self.node})
                log.info("agent %s: child %s detached", self.node, link.name)

    async def _catch_up(self, link: Link, theirs: dict[str, list[int]]) -> None:
        """Bring a (re)attached child up to date on running transfers: the manifest and the
        chunks it misses that this agent has. Chunks arriving meanwhile are sent in later
        rounds; the child joins normal forwarding once nothing is left (no await in between)."""
        sent: dict[str, set[int]] = {}
        while True:
            work = []
            for tid, r in self.receivers.items():
                if tid in self.ended:
                    continue
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
            await asyncio.wait_for(link.send(h, payload), self.cfg.send_timeout)
        except TimeoutError:
            link.close()
            raise ConnectionResetError(f"child {link.name} took over {self.cfg.send_timeout:.0f} s") from None

    def _on_up(self, child: str, h: Header) -> None:
        t = h.get("t")
        if t == "joined":
            for n, p in (h.get("entries") or {}).items():
                self.subtree[n], self.via[n] = p, child
            self._push_up(h)
        elif t == "left":
            gone = {}
            for n, p in (h.get("entries") or {}).items():
                if self.via.get(n) == child and self.subtree.get(n) == p:
                    self.subtree.pop(n)
                    self.via.pop(n)
                    gone[n] = p
            if gone:
                self._push_up({"t": "left", "entries": gone})
        elif t in ("exec_result", "bcast_done"):
            self._push_up(h)

    def _deliver(self, h: Header) -> None:
        """Rank 0: an upward message reached the top."""
        op = self.ops.get(str(h.get("id")))
        if op is None:
            return
        if h.get("t") == "exec_result":
            op.add(str(h["node"]), h["result"])
        elif h.get("t") == "bcast_done":
            op.add(str(h["node"]), {"error": h.get("error", ""), "path": h.get("path", "")})

    @property
    def attached(self) -> set[str]:
        """Agents attached to the tree below (and including) this one."""
        return {self.node, *self.subtree}

    # -- client requests (rank 0) --------------------------------------------------------------
    async def _serve_client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                            hello: Header, peer: tuple[str, str] | None) -> None:
        if not self.is_root:
            root = self.tree.members[0] if len(self.tree) else None
            await proto.send(writer, {"t": "redirect", "name": root.name if root else None,
                                      "address": root.address if root else None,
                                      "error": f"{self.node} is not rank 0"})
            return
        try:
            if peer is not None and peer[1] in (tls.CLIENT_ORG, tls.AGENT_ORG):
                who = Identity(peer[0], (peer[1],), "certificate")
            elif hello.get("token"):
                who = await self.authorizer.authenticate(str(hello["token"]))
            else:
                raise AuthError("no client certificate and no token: cannot tell who you are")
        except AuthError as exc:
            await proto.send(writer, {"t": "error", "error": str(exc)})
            return
        await proto.send(writer, {"t": "welcome", "name": self.node, "user": who.user})
        h, _ = await proto.recv(reader)
        try:
            if h.get("t") == "status":
                await proto.send(writer, {"t": "reply", **self.status()})
            elif h.get("t") == "exec":
                await self.authorizer.allow(who, "exec")
                out = await self.exec_request(who, list(h.get("argv") or []), h.get("nodes"),
                                              float(h.get("timeout") or self.cfg.exec_timeout))
                await proto.send(writer, {"t": "reply", **out})
            elif h.get("t") == "broadcast":
                await self.authorizer.allow(who, "broadcast")
                out = await self.broadcast_request(who, h, reader)
                await proto.send(writer, {"t": "reply", **out})
            else:
                raise RequestError(f"unknown request {h.get('t')!r}")
        except (AuthError, RequestError, TransferError) as exc:
            await proto.send(writer, {"t": "error", "error": str(exc)})

    def status(self) -> dict[str, Any]:
        members = set(self.tree.names)
        return {"root": self.node, "fanout": self.tree.fanout, "members": self.tree.names,
                "attached": sorted(self.attached & members),
                # agents still attached whose node is no member (any more): they leave once
                # their own view of the membership catches up
                "strays": sorted(self.attached - members),
                "parents": {n: p for n, p in sorted(self.subtree.items()) if n in members}}

    def _targets(self, nodes: list[str] | None) -> list[str]:
        if nodes is None:
            return self.tree.names
        unknown = [n for n in nodes if self.tree.rank(n) is None]
        if unknown:
            raise RequestError(f"unknown node(s): {', '.join(unknown)} (members: {len(self.tree)}; "
                               "a node is a member when it is Ready and runs the agent)")
        return list(dict.fromkeys(nodes))

    async def exec_request(self, who: Identity, argv: list[str], nodes: list[str] | None,
                           timeout: float) -> dict[str, Any]:
        if not self.cfg.exec_enabled:
            raise RequestError("nodes exec is disabled (enable it with chart value agent.exec.enabled "
                               "or `fluxnetes agent --exec-enabled`)")
        if not argv:
            raise RequestError("no command given (nodes exec -- CMD ARGS...)")
        targets = self._targets(nodes)
        await self.authorizer.audit(who, "exec", self.node,
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
        attached = self.attached
        missing = {n: "agent not attached to the tree" for n in targets if n not in attached}
        op = _Op(kind, {n for n in targets if n in attached})
        self.ops[op_id] = op
        watch = asyncio.ensure_future(self._watch_departures(op))
        try:
            if op.expected:
                async def send() -> None:
                    await self._on_down(msg, b"")
                    if payloads is not None:
                        await payloads(op_id)

                try:
                    await asyncio.wait_for(send(), max(0.0, deadline - loop.time()))
                except TimeoutError:
                    log.warning("agent %s: %s %s: the request could not be sent down within %.0f s",
                                self.node, kind, op_id, timeout)
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
                self._spawn(self._on_down({"t": "end", "id": op_id}, b""))

    async def _watch_departures(self, op: _Op) -> None:
        """Members that leave the membership (Node deleted, not Ready) while a request runs
        will not answer: say so at once instead of waiting for them."""
        while not op.done.is_set():
            members = set(self.tree.names)
            for n in list(op.owing):
                if n not in members:
                    op.depart(n, DEPARTED)
            self._changed_op.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed_op.wait(), 1.0)

    async def _wait_op(self, op: _Op, deadline: float) -> None:
        """Until every expected node answered or departed, the deadline, or every node still
        owing an answer has been detached from the tree for a while (lost: its children had
        time to re-parent)."""
        loop = asyncio.get_running_loop()
        grace = self.cfg.dead_after + 2 * self.cfg.retry
        gone_since: dict[str, float] = {}
        while not op.done.is_set():
            now = loop.time()
            if now >= deadline:
                return
            attached = self.attached
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
        await self.authorizer.audit(who, "broadcast", self.node,
                                    f"broadcast of {m.size} bytes to {m.dest} on {len(targets)} node(s)")

        async def chunks(tid: str) -> None:
            for _ in range(m.n_chunks):
                ch, payload = await proto.recv(reader)
                if ch.get("t") != "chunk":
                    raise RequestError("expected a chunk")
                await self._on_chunk({"t": "chunk", "id": tid, "i": int(ch["i"])}, payload)

        try:
            results, missing = await self._run_op("broadcast", targets, float(h.get("timeout") or 3600), {
                "t": "manifest", "id": m.id, "manifest": m.to_json()}, chunks)
        finally:
            await self._on_down({"t": "end", "id": m.id}, b"")
        out = [{"node": n, "rank": self.tree.rank(n), **r} for n, r in results.items()]
        return {"id": m.id, "size": m.size, "sha256": m.sha256, "chunks": m.n_chunks,
                "results": sorted(out, key=lambda r: r["rank"]), "missing": missing}


async def _cancel_all(tasks: list[asyncio.Future[Any]]) -> None:
    """Cancel until done (a cancellation racing a completing wait_for can be lost on 3.11)."""
    for _ in range(50):
        pending = [t for t in tasks if not t.done()]
        if not pending:
            return
        for t in pending:
            t.cancel()
        await asyncio.wait(pending, timeout=0.2)
    log.error("tasks would not stop: %s", [t for t in tasks if not t.done()])


class _Bucket:
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


def default_state_dir() -> Path:
    return Path(os.environ.get("FLUXNETES_AGENT_STATE", "/var/lib/fluxnetes-agent"))
