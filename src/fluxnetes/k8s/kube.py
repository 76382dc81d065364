"""A small asyncio Kubernetes REST client that speaks plain dicts (aiohttp).

Why not the generated clients' models: the operator reads thousands of pods and only needs a
few fields; plain JSON avoids model (de)serialisation and keeps patches exactly as written.
Credentials come from kubernetes_asyncio's kubeconfig / in-cluster loaders.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import threading
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlencode

import aiohttp
import orjson

log = logging.getLogger(__name__)

JSON_PATCH = "application/json-patch+json"
MERGE_PATCH = "application/merge-patch+json"


def transient(exc: BaseException) -> bool:
    """An outage that passes (connection refused or reset, timeout, 5xx, 429): the request is
    worth sending again later. A missing permission or a refused object is not."""
    if isinstance(exc, ApiError):
        return exc.status >= 500 or exc.status == 429
    # not every OSError: a missing kubeconfig file is configuration, not an outage
    return isinstance(exc, ConnectionError | aiohttp.ClientError | asyncio.TimeoutError)


def short(exc: BaseException) -> str:
    """One line naming the error, for logs."""
    return f"{type(exc).__name__}: {exc}".splitlines()[0][:200]


class ApiError(Exception):
    def __init__(self, status: int, body: Any, method: str, path: str) -> None:
        self.status, self.body, self.method, self.path = status, body, method, path
        msg = body.get("message") if isinstance(body, Mapping) else str(body)[:300]
        super().__init__(f"{method} {path}: HTTP {status}: {msg}")

    @property
    def reason(self) -> str:
        return str(self.body.get("reason", "")) if isinstance(self.body, Mapping) else ""

    @property
    def namespace_terminating(self) -> bool:
        """Refused because the namespace is being deleted (no new object may be made there)."""
        if self.status != 403 or not isinstance(self.body, Mapping):
            return False
        causes = (self.body.get("details") or {}).get("causes") or []
        return any(isinstance(c, Mapping) and c.get("reason") == "NamespaceTerminating" for c in causes) \
            or "because it is being terminated" in str(self.body.get("message", ""))

    @property
    def forbidden(self) -> bool:
        """The identity lacks a permission (403) or is not recognised (401): retrying won't help."""
        return self.status in (401, 403)

    def permission_hint(self) -> str:
        """A one-line explanation for the log: what was refused and what to grant."""
        msg = self.body.get("message") if isinstance(self.body, Mapping) else str(self.body)[:300]
        return (f"permission denied: {self.method} {self.path} was refused ({msg}). The operator's identity "
                "needs this permission: install or upgrade the chart's RBAC (deploy/chart/templates/rbac.yaml, "
                "docs/configuration.md \"RBAC\") or grant it to the identity given by --kubeconfig")


class Fenced(ApiError):
    """A write refused by this process itself: it is not (surely) the leader any more."""

    def __init__(self, method: str, path: str, why: str) -> None:
        super().__init__(0, {"message": why, "reason": "Fenced"}, method, path)


class Fence:
    """Until when this process may write as the leader (a monotonic time, shared by threads).

    The elector (leader.py) extends it after every renewal of the Lease and closes it when
    the lease is lost or the process shuts down; :class:`Kube` refuses every write once it
    has passed and caps a write's timeout at what is left, so no write of a leader that
    could not renew reaches the API server after another replica may have taken over."""

    def __init__(self) -> None:
        self._until = 0.0
        self._revoked = False
        self._lock = threading.Lock()

    def extend(self, until: float) -> None:
        with self._lock:
            if not self._revoked:
                self._until = max(self._until, until)

    def close(self) -> None:
        """No writes until the next ``extend`` (the lease is lost; it may be won again)."""
        with self._lock:
            self._until = 0.0

    def revoke(self) -> None:
        """No writes ever again (shutting down): a renewal still in flight cannot reopen it."""
        with self._lock:
            self._revoked, self._until = True, 0.0

    def remaining(self) -> float:
        return self._until - time.monotonic()

    def check(self, method: str, path: str) -> float:
        """Seconds left to write, or Fenced."""
        left = self.remaining()
        if left <= 0:
            raise Fenced(method, path, "not the leader (lease not renewed in time, or shutting down): write refused")
        return left


@dataclass(frozen=True)
class Resource:
    """A REST collection: api group/version/plural, namespaced or not."""

    api_version: str  # "v1", "batch/v1"
    plural: str
    namespaced: bool = True

    def path(self, namespace: str | None = None, name: str | None = None, sub: str | None = None) -> str:
        base = "/api/v1" if self.api_version == "v1" else f"/apis/{self.api_version}"
        if self.namespaced and namespace:
            base += f"/namespaces/{namespace}"
        base += f"/{self.plural}"
        if name:
            base += f"/{name}"
        if sub:
            base += f"/{sub}"
        return base


PODS = Resource("v1", "pods")
NODES = Resource("v1", "nodes", namespaced=False)
NAMESPACES = Resource("v1", "namespaces", namespaced=False)
EVENTS = Resource("v1", "events")
SECRETS = Resource("v1", "secrets")
PRIORITY_CLASSES = Resource("scheduling.k8s.io/v1", "priorityclasses", namespaced=False)
LEASES = Resource("coordination.k8s.io/v1", "leases")
CRDS = Resource("apiextensions.k8s.io/v1", "customresourcedefinitions", namespaced=False)
MUTATING = Resource("admissionregistration.k8s.io/v1", "mutatingwebhookconfigurations", namespaced=False)
VALIDATING = Resource("admissionregistration.k8s.io/v1", "validatingwebhookconfigurations", namespaced=False)
FLUXJOBS = Resource("fluxnetes.io/v1alpha1", "fluxjobs")
POLICIES = Resource("admissionregistration.k8s.io/v1", "validatingadmissionpolicies", namespaced=False)
POLICY_BINDINGS = Resource("admissionregistration.k8s.io/v1", "validatingadmissionpolicybindings", namespaced=False)


# A live watch sends each event as it happens, each its own TLS record: reading them one by one
# costs the operator ~130-180 µs of CPU per event, against ~10 µs per event read in bulk
# (bench/watch_encoding.py). After each read the watch stops reading its connection for this
# long, so what arrives meanwhile is decrypted and parsed in one go (~40 % less CPU per event
# at one event per ms: bench/results/watch_coalesce.json). It delays an event by at most this
# much; the operator's cycle waits longer (coalesce_seconds) to batch arrivals anyway.
WATCH_WAIT = 0.01


class Pausable(Protocol):
    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...


async def read_watch_batches(stream: aiohttp.StreamReader, wait: float,
                             transport: Pausable | None = None) -> AsyncIterator[list[bytes]]:
    """The non-empty lines of a newline-delimited stream, in order, as lists: one list per read.

    After each read, it pauses ``transport`` (the stream's connection, if given), waits ``wait``
    seconds (0: not at all) and takes everything that arrived meanwhile in the same read. A line
    split across reads is joined; a last line without its newline when the stream ends is
    dropped (the server closed the stream mid-event). A connection that breaks during the pause
    is raised after the lines read before it are handed over."""
    buf = b""
    while True:
        chunk = await stream.readany()
        if not chunk:
            return
        broke: BaseException | None = None
        if wait > 0:
            if transport is not None:
                # not read meanwhile: the records that arrive wait in the socket, to be decrypted
                # together (asyncio reads a running transport eagerly, whoever awaits it)
                transport.pause_reading()
                try:
                    await asyncio.sleep(wait)
                finally:
                    transport.resume_reading()
                await asyncio.sleep(0)  # the transport hands over what it holds on its next turn
            else:
                await asyncio.sleep(wait)
            try:
                chunk += stream.read_nowait()
            except Exception as exc:  # aiohttp raises the break, dropping what it held
                broke = exc
        # one split per read (a read may hold hundreds of events in a burst)
        *lines, buf = (buf + chunk).split(b"\n")
        lines = [line for line in lines if line.strip()]
        if lines:
            yield lines
        if broke is not None:
            raise broke


def crd_established(crd: Mapping[str, Any] | None) -> bool:
    """Does this CustomResourceDefinition say it is Established (its resources are served)?"""
    conds = ((crd or {}).get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Established" and c.get("status") == "True" for c in conds)


class Kube:
    """Minimal async client; ``qps`` bounds concurrent requests (not a rate)."""

    def __init__(self, host: str, ssl_ctx: ssl.SSLContext | bool, headers: dict[str, str],
                 concurrency: int = 64) -> None:
        self.host = host.rstrip("/")
        self._ssl = ssl_ctx
        self._headers = headers
        self._session: aiohttp.ClientSession | None = None
        self._sem = asyncio.Semaphore(concurrency)
        # status and Event writes queue behind placements: they never delay a pod start
        self._bg = asyncio.Semaphore(max(1, concurrency // 8))
        # set on the leader's client (leader.py): every write checks it just before it is sent
        self.fence: Fence | None = None
        # how long a watch waits after each read so the next read takes several events at once
        self.watch_wait = WATCH_WAIT

    def clone(self) -> Kube:
        """A client with the same credentials and its own connections (for another thread)."""
        return Kube(self.host, self._ssl, dict(self._headers), concurrency=4)

    @classmethod
    async def from_config(cls, kubeconfig: str | None = None, context: str | None = None,
                          concurrency: int = 64) -> Kube:
        from kubernetes_asyncio import config
        from kubernetes_asyncio.client import Configuration

        cfg = Configuration()
        if kubeconfig:
            await config.load_kube_config(config_file=kubeconfig, context=context, client_configuration=cfg)
        else:
            try:
                config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
            except config.ConfigException:
                await config.load_kube_config(context=context, client_configuration=cfg)
        ctx: ssl.SSLContext | bool
        if cfg.verify_ssl:
            ctx = ssl.create_default_context(cafile=cfg.ssl_ca_cert) if cfg.ssl_ca_cert else ssl.create_default_context()
        else:
            ctx = False
        if cfg.cert_file and isinstance(ctx, ssl.SSLContext):
            ctx.load_cert_chain(cfg.cert_file, cfg.key_file)
        headers = {"Accept": "application/json"}
        token = (cfg.api_key or {}).get("authorization") or (cfg.api_key or {}).get("BearerToken")
        if token:
            headers["Authorization"] = token if token.startswith("Bearer ") else f"Bearer {token}"
        return cls(str(cfg.host), ctx, headers, concurrency)

    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                headers=self._headers,
                connector=aiohttp.TCPConnector(ssl=self._ssl, limit=128),
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def request(self, method: str, path: str, body: Any = None, *, params: Mapping[str, Any] | None = None,
                      content_type: str = "application/json", timeout: float = 30,
                      background: bool = False) -> Any:
        if background:  # (the request proper is made once inside: body and URL built there)
            async with self._bg:
                return await self.request(method, path, body, params=params, content_type=content_type,
                                          timeout=timeout)
        url = self.host + path
        if params:
            url += "?" + urlencode({k: v for k, v in params.items() if v is not None})
        data = None if body is None else orjson.dumps(body, option=orjson.OPT_NON_STR_KEYS)
        async with self._sem:
            if self.fence is not None and method != "GET":
                # checked once a connection slot is ours, right before sending; the write may
                # not outlive the fence either
                timeout = min(timeout, self.fence.check(method, path))
            return await self._send(method, url, path, data, content_type, timeout)

    async def _send(self, method: str, url: str, path: str, data: bytes | None, content_type: str,
                    timeout: float) -> Any:
        async with self.session().request(
            method, url, data=data, headers={"Content-Type": content_type},
            timeout=aiohttp.ClientTimeout(total=timeout),
        ) as resp:
            raw = await resp.read()
            try:
                payload = orjson.loads(raw) if raw else {}
            except orjson.JSONDecodeError:
                payload = raw.decode(errors="replace")
            if resp.status >= 400:
                raise ApiError(resp.status, payload, method, path)
            return payload

    async def request_text(self, path: str, timeout: float = 30) -> str:
        """GET a non-JSON document (e.g. /metrics)."""
        async with self._sem, self.session().get(self.host + path, headers={"Accept": "text/plain"},
                                                 timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
            text = await resp.text()
            if resp.status >= 400:
                raise ApiError(resp.status, text, "GET", path)
            return text

    # --- conveniences -------------------------------------------------------------------
    async def get(self, res: Resource, name: str, namespace: str | None = None) -> dict[str, Any]:
        out: dict[str, Any] = await self.request("GET", res.path(namespace, name))
        return out

    async def get_or_none(self, res: Resource, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        try:
            return await self.get(res, name, namespace)
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    async def list(self, res: Resource, namespace: str | None = None, *, label_selector: str | None = None,
                   field_selector: str | None = None) -> tuple[list[dict[str, Any]], str]:
        items: list[dict[str, Any]] = []
        cont: str | None = None
        while True:
            page = await self.request("GET", res.path(namespace), params={
                "labelSelector": label_selector, "fieldSelector": field_selector, "limit": 2000,
                "continue": cont}, timeout=120)
            items.extend(page.get("items") or [])
            cont = (page.get("metadata") or {}).get("continue")
            if not cont:
                return items, str((page.get("metadata") or {}).get("resourceVersion", ""))

    async def list_version(self, res: Resource, *, label_selector: str | None = None,
                           field_selector: str | None = None) -> str:
        """The collection's current resourceVersion, read from etcd (a quorum read: no
        resourceVersion asked) with at most one object: cheap at any size."""
        page = await self.request("GET", res.path(), params={
            "labelSelector": label_selector, "fieldSelector": field_selector, "limit": 1})
        return str((page.get("metadata") or {}).get("resourceVersion", ""))

    async def create(self, res: Resource, body: Mapping[str, Any], namespace: str | None = None, *,
                     background: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = await self.request("POST", res.path(namespace), body, background=background)
        return out

    async def patch(self, res: Resource, name: str, body: Any, namespace: str | None = None, *,
                    content_type: str = MERGE_PATCH, sub: str | None = None,
                    background: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = await self.request("PATCH", res.path(namespace, name, sub), body,
                                                 content_type=content_type, background=background)
        return out

    async def replace(self, res: Resource, name: str, body: Mapping[str, Any], namespace: str | None = None) -> dict[str, Any]:
        out: dict[str, Any] = await self.request("PUT", res.path(namespace, name), body)
        return out

    async def delete(self, res: Resource, name: str, namespace: str | None = None) -> None:
        try:
            await self.request("DELETE", res.path(namespace, name))
        except ApiError as exc:
            if exc.status != 404:
                raise

    async def watch(self, res: Resource, resource_version: str, *, label_selector: str | None = None,
                    field_selector: str | None = None, timeout_seconds: int = 290,
                    opened: Callable[[], None] | None = None) -> AsyncIterator[dict[str, Any]]:
        """Yield watch events ({"type", "object"}) until the server closes the stream, read
        ``watch_wait`` seconds apart (:func:`read_watch_batches`). ``opened`` is called once
        the server has accepted the watch (an informer's proof that it is live)."""
        params = {"watch": "true", "resourceVersion": resource_version, "allowWatchBookmarks": "true",
                  "timeoutSeconds": timeout_seconds, "labelSelector": label_selector,
                  "fieldSelector": field_selector}
        url = self.host + res.path() + "?" + urlencode({k: v for k, v in params.items() if v is not None})
        async with self.session().get(url, timeout=aiohttp.ClientTimeout(total=timeout_seconds + 30,
                                                                         sock_read=timeout_seconds + 30)) as resp:
            if resp.status >= 400:
                raise ApiError(resp.status, await resp.text(), "WATCH", res.path())
            if opened is not None:
                opened()
            transport = resp.connection.transport if resp.connection is not None else None
            async for lines in read_watch_batches(resp.content, self.watch_wait, transport):
                for line in lines:
                    yield orjson.loads(line)
