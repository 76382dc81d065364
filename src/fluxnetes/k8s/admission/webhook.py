"""HTTPS server for the admission webhooks (aiohttp); handlers are the pure functions of
:mod:`fluxnetes.k8s.admission.review` — no API calls in the request path."""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import socket
import ssl
import tempfile
import threading
import time
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web

from fluxnetes.k8s.admission import review as admission
from fluxnetes.k8s.admission import webhook_config
from fluxnetes.k8s.certs import CertBundle

log = logging.getLogger("fluxnetes.k8s.webhook")  # its name from before the sub-packages

Observe = Callable[[str, str, float], None]  # (object kind, webhook, seconds)


def _observe_here(kind: str, webhook: str, seconds: float) -> None:
    from fluxnetes.metrics import METRICS

    METRICS.webhook_seconds.labels(kind=kind, webhook=webhook).observe(seconds)


def _loads(raw: bytes) -> Any:
    """orjson (several times faster on a pod; the API server sends int64 or float64 numbers,
    which it reads exactly); what only the json module reads (NaN) is still read."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return json.loads(raw)


def _dumps(obj: Any) -> bytes | str:
    try:
        return orjson.dumps(obj, option=orjson.OPT_NON_STR_KEYS)
    except TypeError:  # (e.g. an integer beyond 64 bits) as before
        return json.dumps(obj)


def ssl_context(bundle: CertBundle) -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    # load_cert_chain wants files; they live only as long as this call
    with tempfile.TemporaryDirectory() as tmp:
        crt, key = Path(tmp) / "tls.crt", Path(tmp) / "tls.key"
        crt.write_bytes(bundle.tls_crt)
        key.write_bytes(bundle.tls_key)
        key.chmod(0o600)
        ctx.load_cert_chain(str(crt), str(key))
    # no TLS 1.3 session tickets: the API server's webhook client keeps no session cache, so it
    # never resumes one, and each new connection it opens (it opens many: bench/webhook_latency.py)
    # would cost the webhook two tickets' encryption for nothing (~15 % of a handshake here,
    # bench/http_costs.py)
    ctx.num_tickets = 0
    return ctx


def make_app(operators: Callable[[], Collection[str]], job_mode: str = "suspend",
             observe: Observe = _observe_here, hold: str = "gate") -> web.Application:
    def handler(path: str, fn: Callable[[dict[str, Any]], dict[str, Any]]) -> Any:
        webhook = "validate" if path == "validate" else "mutate"

        async def handle(request: web.Request) -> web.Response:
            t0 = time.perf_counter()
            try:
                review = _loads(await request.read())
                if not isinstance(review, dict):
                    raise ValueError("not an object")
            except ValueError:
                return web.Response(status=400, text="body is not an AdmissionReview JSON object")
            try:
                body = _dumps(fn(review))
            except Exception:  # never let a bug turn into a blocked create: answer "allowed"
                log.exception("admission handler failed on %s", path)
                uid = str((review.get("request") or {}).get("uid", ""))
                body = json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                                   "response": {"uid": uid, "allowed": True}})
            kind = str(((review.get("request") or {}).get("kind") or {}).get("kind") or "unknown")
            observe(kind, webhook, time.perf_counter() - t0)
            return web.Response(body=body, content_type="application/json")

        return handle

    app = web.Application()
    app.router.add_post(webhook_config.MUTATE_PODS_PATH,
                        handler("pods", lambda r: admission.mutate(r, hold=hold)))
    app.router.add_post(webhook_config.MUTATE_WORKLOADS_PATH,
                        handler("workloads", lambda r: admission.mutate(r, job_mode=job_mode, hold=hold)))
    app.router.add_post(webhook_config.VALIDATE_PODS_PATH,
                        handler("validate", lambda r: admission.validate(r, operators())))

    async def healthz(_request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app.router.add_get("/healthz", healthz)
    return app


class WebhookPortError(RuntimeError):
    """The webhook's port cannot be used (taken, or shared with something that is not us)."""


def port_holder(host: str, port: int, ca_crt: bytes) -> str:
    """Who listens on ``port``: "free", "ours" (a TLS server whose certificate our own CA
    signed: a replica of this operator, same installation, same cluster — the CA lives in
    that cluster's Secret) or "other" (anything else: another cluster's operator, another
    program)."""
    target = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)
    try:
        sock = socket.create_connection((target, port), timeout=5)
    except OSError:
        return "free"
    ctx = ssl.create_default_context(cadata=ca_crt.decode())
    ctx.check_hostname = False  # the chain is the proof; the name may be a Service's
    try:
        with ctx.wrap_socket(sock, server_hostname=target):
            return "ours"
    except (OSError, ssl.SSLError):
        return "other"
    finally:
        sock.close()


def check_sharing(port: int, holder: str, share_port: bool) -> bool:
    """Whether to bind with SO_REUSEPORT. Two processes share a port only when both said so
    and the one there proves it is a replica of this operator: otherwise the kernel would
    hand this cluster's admission calls to another cluster's operator (issue #29 item 7)."""
    if holder == "other":
        raise WebhookPortError(
            f"--webhook-port {port} is held by a process that is not a replica of this operator "
            "(its TLS certificate is not signed by this cluster's fluxnetes CA): choose another port")
    if holder == "ours" and not share_port:
        raise WebhookPortError(
            f"--webhook-port {port} is served by another replica of this operator; replicas on "
            "one host share it only when asked: --webhook-share-port on each, or another port")
    return share_port


class WebhookServer:
    def __init__(self, host: str, port: int, bundle: CertBundle,
                 operators: Callable[[], Collection[str]], *, job_mode: str = "suspend", hold: str = "gate",
                 observe: Observe = _observe_here, share_port: bool = False) -> None:
        self.host, self.port, self.bundle = host, port, bundle
        self.share_port = share_port
        self.job_mode, self.hold = job_mode, hold
        self._app = make_app(operators, job_mode, observe, hold)
        self._runner = web.AppRunner(self._app, access_log=None)
        self._thread: threading.Thread | None = None
        self._proc: Any = None
        self._operators = operators
        self._loop: asyncio.AbstractEventLoop | None = None

    async def start(self) -> int:
        reuse = False
        if self.port != 0:
            holder = await asyncio.to_thread(port_holder, self.host, self.port, self.bundle.ca_crt)
            reuse = check_sharing(self.port, holder, self.share_port)
        await self._runner.setup()
        # SO_REUSEPORT only when asked for (--webhook-share-port) and the port is free or held
        # by a replica of this very operator (check_sharing): then replicas on one host (out
        # of cluster) share the port the webhook configuration names, and the kernel sends
        # each connection to a live one (the outage story: webhook_config)
        site = web.TCPSite(self._runner, self.host, self.port, ssl_context=ssl_context(self.bundle),
                           reuse_port=reuse)
        try:
            await site.start()
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise
            raise WebhookPortError(
                f"--webhook-port {self.port} is in use by another process"
                + ("" if reuse else " (replicas of one operator on one host may share it: "
                   "--webhook-share-port on each)")) from None
        server: Any = site._server
        if self.port == 0 and server is not None and getattr(server, "sockets", None):
            self.port = int(server.sockets[0].getsockname()[1])
        log.info("webhook serving on https://%s:%d", self.host, self.port)
        return self.port

    async def stop(self) -> None:
        if self._proc is not None:
            self._proc.terminate()
            self._proc.join(timeout=5)
            self._proc = None
            return
        if self._thread is not None and self._loop is not None:
            fut = asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop)
            await asyncio.wrap_future(fut)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=5)
            self._thread = None
            return
        await self._runner.cleanup()

    async def start_in_process(self) -> int:
        """Serve from a child process: its own interpreter lock, so the operator's CPU work
        (watch events, cycles) can never delay an admission answer. The child exits with us."""
        import multiprocessing as mp

        ctx = mp.get_context("spawn")
        parent, child = ctx.Pipe()
        self._proc = ctx.Process(
            target=_serve_child,
            args=(self.host, self.port, self.bundle.as_secret_data(), sorted(self._operators()), child,
                  self.job_mode, self.hold, self.share_port),
            name="fluxnetes-webhook", daemon=True,
        )
        self._proc.start()
        loop = asyncio.get_running_loop()
        msg = await loop.run_in_executor(None, parent.recv)
        if isinstance(msg, tuple):  # (exception class name, message)
            if msg[0] == WebhookPortError.__name__:
                raise WebhookPortError(msg[1])
            raise RuntimeError(f"webhook process failed: {msg[0]}: {msg[1]}")
        self.port = int(msg)
        log.info("webhook serving on https://%s:%d (process %d)", self.host, self.port, self._proc.pid)
        # the child sends its answer times in batches; they land in this process's metrics
        threading.Thread(target=_relay_observations, args=(parent,), name="fluxnetes-webhook-metrics",
                         daemon=True).start()
        return self.port

    async def start_in_thread(self) -> int:
        """Serve from a thread with its own event loop: the operator's work (cycles, watch
        events) then never sits between the API server and an admission answer."""
        ready: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        outer = asyncio.get_running_loop()

        def serve() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            asyncio.set_event_loop(loop)
            self._runner = web.AppRunner(self._app, access_log=None)
            try:
                port = loop.run_until_complete(self.start())
            except Exception as exc:
                outer.call_soon_threadsafe(ready.set_exception, exc)
                return
            outer.call_soon_threadsafe(ready.set_result, port)
            loop.run_forever()
            loop.close()

        self._thread = threading.Thread(target=serve, name="fluxnetes-webhook", daemon=True)
        self._thread.start()
        return await ready


def _serve_child(host: str, port: int, data: dict[str, bytes], operators: list[str], conn: Any,
                 job_mode: str = "suspend", hold: str = "gate", share_port: bool = False) -> None:
    """Entry point of the webhook process (see ``WebhookServer.start_in_process``)."""
    import os
    import signal

    pending: list[tuple[str, str, float]] = []

    async def main() -> None:
        server = WebhookServer(host, port, CertBundle.from_secret_data(data), lambda: frozenset(operators),
                               job_mode=job_mode, hold=hold, share_port=share_port,
                               observe=lambda k, w, s: pending.append((k, w, s)))
        try:
            conn.send(await server.start())
        except Exception as exc:
            conn.send((type(exc).__name__, str(exc)))
            return
        parent = os.getppid()
        while os.getppid() == parent:  # the operator is gone (even SIGKILLed): stop serving
            await asyncio.sleep(0.5)
            if pending:
                batch = pending[:]
                del pending[:len(batch)]
                try:
                    conn.send(batch)
                except OSError:
                    return

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    asyncio.run(main())


def _relay_observations(conn: Any) -> None:
    """Parent side: record the webhook process's answer times until the pipe closes."""
    while True:
        try:
            batch = conn.recv()
        except (EOFError, OSError):
            return
        for kind, webhook, seconds in batch:
            _observe_here(kind, webhook, seconds)
