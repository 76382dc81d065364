"""Talking to the dev cluster's apiserver from Python: many requests at once (aiohttp) and
simple GETs (urllib), never through an HTTP proxy from the environment."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import ssl
import urllib.error
import urllib.request
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

from fluxnetes.devcluster.errors import ClusterError

T = TypeVar("T")


def run_async(coro_fn: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run a coroutine to completion from sync code, even when the caller is inside a loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro_fn())
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(lambda: asyncio.run(coro_fn())).result()


def urlopen(url: str | urllib.request.Request, ctx: ssl.SSLContext | None, timeout: float) -> Any:
    """urlopen that never goes through an HTTP(S)_PROXY from the environment: loopback only."""
    handlers: list[urllib.request.BaseHandler] = [urllib.request.ProxyHandler({})]
    if ctx is not None:
        handlers.append(urllib.request.HTTPSHandler(context=ctx))
    return urllib.request.build_opener(*handlers).open(url, timeout=timeout)


def http_ok(url: str, ctx: ssl.SSLContext | None) -> bool:
    try:
        with urlopen(url, ctx, 2) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError, ValueError):
        return False


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    body: Any
    what: str  # for error messages
    content_type: str = "application/json"
    ignore: frozenset[int] = frozenset()  # statuses that are fine (e.g. a failed patch test)


RETRY = frozenset({429, 500, 502, 503, 504})


async def send_one(session: Any, api_url: str, req: Request, sem: asyncio.Semaphore) -> None:
    """One request on an aiohttp session (at most `sem` at once), retrying overload."""
    text = ""
    data = json.dumps(req.body)
    headers = {"Content-Type": req.content_type, "Accept": "application/json"}
    async with sem:
        for attempt in range(8):
            async with session.request(req.method, api_url + req.path, data=data, headers=headers) as resp:
                if resp.status < 300 or resp.status in req.ignore:
                    return
                text = await resp.text()
                if resp.status == 409 and req.method == "POST":
                    raise ClusterError(f"{req.what}: it already exists")
                if resp.status not in RETRY:
                    raise ClusterError(f"{req.what}: HTTP {resp.status}: {text[:300]}")
            await asyncio.sleep(0.1 * 2**attempt)
        raise ClusterError(f"{req.what}: the apiserver kept refusing ({text[:200]})")


async def send_all(
    api_url: str, ctx: ssl.SSLContext, reqs: list[Request], concurrency: int
) -> None:
    """Send every request over a small pool of keep-alive connections, retrying overload."""
    import aiohttp

    sem = asyncio.Semaphore(concurrency)
    conn = aiohttp.TCPConnector(ssl=ctx, limit=concurrency)
    async with aiohttp.ClientSession(connector=conn) as session:
        await asyncio.gather(*(send_one(session, api_url, r, sem) for r in reqs))


def create_jobs(kubeconfig: Any, jobs: list[dict[str, Any]], concurrency: int = 16) -> None:
    """Create batch/v1 Jobs (each naming its namespace) through the API with ``concurrency``
    requests in flight: kubectl's client-side rate limit (5 requests/s) would make the
    submission the bottleneck of a benchmark or a test."""
    from fluxnetes.k8s.kube import Kube, Resource

    jobs_res = Resource("batch/v1", "jobs")

    async def go() -> None:
        kube = await Kube.from_config(str(kubeconfig), None, concurrency)
        try:
            await asyncio.gather(*(kube.create(jobs_res, j, j["metadata"]["namespace"]) for j in jobs))
        finally:
            await kube.close()

    asyncio.run(go())


def fluxjobs_per_namespace(cluster: Any) -> tuple[dict[str, int], dict[str, int]]:
    """(groups Running, FluxJobs waiting: Pending or Reserved) per namespace, in two cheap
    requests (``cluster``: a dev cluster, through its kubectl). With one-core jobs, the cores
    the scheduler gave each account and its backlog. Running: the Running FluxJobs, and the
    groups placed at once that have none (the operator's default, ``--fluxjobs waiting``),
    from their bound, unfinished pods' ``fluxnetes.io/fluxjob`` annotation."""
    out = cluster.kubectl("get", "fluxjobs", "-A", "-o",
                          'jsonpath={range .items[*]}{.metadata.namespace} {.metadata.name} {.status.phase}'
                          '{"\\n"}{end}').stdout
    placed = cluster.kubectl("get", "pods", "-A", "--field-selector",
                             "spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed", "-o",
                             'jsonpath={range .items[*]}{.metadata.namespace} '
                             '{.metadata.annotations.fluxnetes\\.io/fluxjob}{"\\n"}{end}').stdout
    running: dict[str, int] = {}
    waiting: dict[str, int] = {}
    recorded: set[tuple[str, str]] = set()
    for row in (line.split() for line in out.splitlines()):
        if len(row) != 3:
            continue
        recorded.add((row[0], row[1]))
        table = running if row[2] == "Running" else waiting if row[2] in ("Pending", "Reserved") else None
        if table is not None:
            table[row[0]] = table.get(row[0], 0) + 1
    unrecorded = set()
    for row in (line.split() for line in placed.splitlines()):
        if len(row) == 2:  # (a pod fluxnetes did not place has no annotation: one field)
            ns, group = row[0], row[1].removeprefix(row[0] + "/")
            if (ns, group) not in recorded:
                unrecorded.add((ns, group))
    for ns, _ in unrecorded:
        running[ns] = running.get(ns, 0) + 1
    return running, waiting
