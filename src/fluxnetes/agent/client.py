"""The client side of ``nodes exec`` / ``nodes broadcast`` / ``agent status``: talks to rank 0.

The address is rank 0's agent port: given directly (``--address``, tests and on-node use), or
a local port that ``kubectl port-forward`` opened to the rank-0 agent pod (the plugin's way on
a cluster, see :mod:`fluxnetes.cli.ctl.agents`). A non-root agent answers with a redirect
to rank 0, which is followed once.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from pathlib import Path
from typing import Any

from fluxnetes.agent import proto, tls
from fluxnetes.agent.transfer import CHUNK_SIZE, TransferError, iter_chunks, make_manifest

EXEC_SLACK = 10.0  # rank 0 waits this much longer than an exec's command timeout
REPLY_SLACK = 30.0  # and the client this much longer than rank 0
STATUS_WAIT = 30.0


class ClientError(Exception):
    """The request could not be made or was refused; the message says why."""


class Client:
    def __init__(self, address: str, *, certs: tls.CertPaths | None = None, ca: Path | None = None,
                 token: str | None = None, connect_timeout: float = 10.0) -> None:
        self.address, self.certs, self.ca, self.token = address, certs, ca, token
        self.connect_timeout = connect_timeout
        self.user = ""

    async def _open(self, address: str, hops: int = 1) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit():
            raise ClientError(f"address {address!r}: expected HOST:PORT")
        try:
            ctx = tls.client_context(self.certs, self.ca)
            reader, writer = await asyncio.wait_for(asyncio.open_connection(
                host.strip("[]"), int(port), ssl=ctx, limit=2 ** 22), self.connect_timeout)
        except (OSError, TimeoutError, ssl.SSLError) as exc:
            raise ClientError(f"cannot connect to the agent at {address}: {exc}") from None
        hello: dict[str, Any] = {"t": "hello", "role": "client"}
        if self.token:
            hello["token"] = self.token
        try:
            await proto.send(writer, hello)
            h, _ = await proto.recv(reader)
        except (OSError, asyncio.IncompleteReadError, ssl.SSLError, proto.ProtocolError) as exc:
            writer.close()
            raise ClientError(f"the agent at {address} closed the connection (is your certificate "
                              f"from the agents' CA?): {exc!r}") from None
        if h.get("t") == "redirect" and h.get("address") and hops > 0:
            writer.close()
            return await self._open(str(h["address"]), hops - 1)
        if h.get("t") != "welcome":
            writer.close()
            raise ClientError(str(h.get("error") or f"unexpected answer {h.get('t')!r}"))
        self.user = str(h.get("user", ""))
        return reader, writer

    async def _call(self, request: dict[str, Any], body: Any = None,
                    wait: float = STATUS_WAIT) -> dict[str, Any]:
        """Send a request (and its body) and read the answer, which may come before the whole
        body was taken (rank 0 gave up at its deadline). Ends within ``wait`` seconds."""
        reader, writer = await self._open(self.address)
        sending: asyncio.Task[None] | None = None
        try:
            await proto.send(writer, request)
            if body is not None:
                sending = asyncio.ensure_future(body(writer))
            try:
                h, _ = await asyncio.wait_for(proto.recv(reader), wait)
            except TimeoutError:
                raise ClientError(f"no answer from the agents' tree within {wait:.0f} s") from None
        except (OSError, asyncio.IncompleteReadError, ssl.SSLError, proto.ProtocolError) as exc:
            why: BaseException = exc
            if sending is not None and sending.done() and not sending.cancelled() and sending.exception():
                why = sending.exception() or exc
            raise ClientError(f"connection to the agent lost: {why!r}") from None
        finally:
            if sending is not None:
                sending.cancel()
                with contextlib.suppress(BaseException):
                    await sending
            writer.close()
        if h.get("t") == "error":
            raise ClientError(str(h.get("error")))
        return h

    async def status(self) -> dict[str, Any]:
        return await self._call({"t": "status"})

    async def exec(self, argv: list[str], nodes: list[str] | None, timeout: float) -> dict[str, Any]:
        # rank 0 answers by the command's timeout + EXEC_SLACK, whatever happens below it
        return await self._call({"t": "exec", "argv": argv, "nodes": nodes, "timeout": timeout},
                                wait=timeout + EXEC_SLACK + REPLY_SLACK)

    async def broadcast(self, path: Path, dest: str, nodes: list[str] | None, *,
                        chunk_size: int = CHUNK_SIZE, timeout: float = 3600) -> dict[str, Any]:
        try:
            m = await asyncio.to_thread(make_manifest, path, dest, "pending", chunk_size=chunk_size)
        except TransferError as exc:
            raise ClientError(str(exc)) from None

        async def body(writer: asyncio.StreamWriter) -> None:
            for i, data in enumerate(iter_chunks(path, chunk_size)):
                await proto.send(writer, {"t": "chunk", "i": i}, data)
            if m.size == 0:
                await proto.send(writer, {"t": "chunk", "i": 0}, b"")

        return await self._call({"t": "broadcast", "manifest": m.to_json(), "nodes": nodes,
                                 "timeout": timeout}, body, wait=timeout + REPLY_SLACK)


def summarise_exec(reply: dict[str, Any]) -> tuple[dict[str, list[str]], int]:
    """Exit codes -> nodes, and the command's overall exit code (0 only when all succeeded)."""
    by_code: dict[str, list[str]] = {}
    for r in reply.get("results") or []:
        key = str(r["returncode"]) if r.get("returncode") is not None else "error"
        by_code.setdefault(key, []).append(str(r["node"]))
    for n in reply.get("missing") or {}:
        by_code.setdefault("no answer", []).append(str(n))
    worst = 0 if set(by_code) <= {"0"} else 1
    return by_code, worst
