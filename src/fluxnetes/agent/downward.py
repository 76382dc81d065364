"""What comes down the tree to an agent: exec requests (run here when this node is a target),
broadcast transfers (manifest and chunks, received into ``Receiver``s, the file written here
when this node is a target), and the end of a request; each is handled here and forwarded to
the children. This agent's own answers are sent up and kept until the request ends, to be
sent again after a re-attach (one relayed by an agent that then left is lost on the way).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from fluxnetes.agent import execute
from fluxnetes.agent.proto import Header
from fluxnetes.agent.transfer import Manifest, Receiver, TransferError

if TYPE_CHECKING:
    from fluxnetes.agent.overlay import Agent

log = logging.getLogger(__name__)

KEPT_RESULTS = 64  # an agent's own latest results, re-sent after it re-attaches


class Downward:
    """Running transfers (``receivers``), ended requests, exec requests seen, own answers."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        self.receivers: dict[str, Receiver] = {}
        self.ended: set[str] = set()
        self.seen_exec: set[str] = set()
        # this agent's own answers to requests still running (op id -> upward message): one
        # relayed by an agent that then left, or written to a connection that broke, is lost
        # on the way; re-sent after every re-attach, dropped at the request's end
        self.answers: dict[str, Header] = {}

    def running(self) -> list[tuple[str, Receiver]]:
        """The transfers still running (not ended), by id."""
        return [(tid, r) for tid, r in self.receivers.items() if tid not in self.ended]

    def missing(self) -> dict[str, list[int]]:
        """The chunks each running transfer still misses (told to a new parent)."""
        return {tid: r.missing() for tid, r in self.running()}

    def close(self) -> None:
        for r in self.receivers.values():
            r.close()
        self.receivers.clear()

    async def on_down(self, h: Header, payload: bytes) -> None:
        t = h.get("t")
        if t == "ping":
            return
        if t == "exec":
            if h["id"] in self.seen_exec or h["id"] in self.ended:
                return
            self.seen_exec.add(h["id"])
            await self.agent.children.forward(h)
            targets = h.get("targets")
            if targets is None or self.agent.node in targets:
                self.agent.spawn(self._run_exec(h))
        elif t == "manifest":
            await self._on_manifest(h)
        elif t == "chunk":
            await self.on_chunk(h, payload)
        elif t == "end":
            tid = str(h["id"])
            self.ended.add(tid)
            self.answers.pop(tid, None)
            await self.agent.children.forward(h)
            r = self.receivers.pop(tid, None)
            if r:
                r.close()

    async def _run_exec(self, h: Header) -> None:
        rank = self.agent.rank if self.agent.rank is not None else -1
        if not self.agent.cfg.exec_enabled:
            res = execute.ExecResult(self.agent.node, rank, None, error="exec is disabled on this agent")
        else:
            timeout = min(float(h.get("timeout") or self.agent.cfg.exec_timeout), self.agent.cfg.exec_timeout)
            res = await execute.run(self.agent.node, rank, list(h["argv"]), self.agent.cfg.exec_user, timeout)
        self._answer({"t": "exec_result", "id": h["id"], "node": self.agent.node, "result": res.to_json()})

    async def _on_manifest(self, h: Header) -> None:
        try:
            m = Manifest.from_json(h["manifest"])
        except TransferError as exc:
            log.error("agent %s: %s", self.agent.node, exc)
            return
        if m.id in self.receivers or m.id in self.ended:
            return
        target = m.targets is None or self.agent.node in m.targets
        try:
            r = Receiver.open(m, self.agent.cfg.state_dir / "transfers", self.agent.cfg.data_dir if target else None)
        except (OSError, TransferError) as exc:
            log.error("agent %s: transfer %s: %s", self.agent.node, m.id, exc)
            self._answer({"t": "bcast_done", "id": m.id, "node": self.agent.node, "error": str(exc)})
            return
        self.receivers[m.id] = r
        await self.agent.children.forward(h)
        if r.complete:
            self._finish(r, target)

    async def on_chunk(self, h: Header, payload: bytes) -> None:
        r = self.receivers.get(str(h["id"]))
        if r is None:
            return
        try:
            new = r.add(int(h["i"]), payload)
        except TransferError as exc:
            log.error("agent %s: %s", self.agent.node, exc)
            return  # not forwarded: the child asks for it again from a healthy parent
        if not new:
            return
        await self.agent.children.forward(h, payload)
        if r.complete:
            m = r.manifest
            self._finish(r, m.targets is None or self.agent.node in m.targets)

    def _finish(self, r: Receiver, target: bool) -> None:
        err = r.finish()
        if err:
            log.error("agent %s: transfer %s: %s", self.agent.node, r.manifest.id, err)
        if target:
            self._answer({"t": "bcast_done", "id": r.manifest.id, "node": self.agent.node, "error": err,
                          "path": str(r.dest)})

    def _answer(self, h: Header) -> None:
        """This agent's answer to a request: sent up now, and kept until the request ends."""
        op_id = str(h["id"])
        if op_id in self.ended:
            return
        self.answers[op_id] = h
        while len(self.answers) > KEPT_RESULTS:  # requests whose end never reached us
            self.answers.pop(next(iter(self.answers)))
        self.agent.up.push(h)
