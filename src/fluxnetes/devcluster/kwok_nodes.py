"""The kwok nodes of a running dev cluster: create many at once, add or delete one, and wait
until they are Ready and untainted (readiness.py follows them with one LIST and a WATCH)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import NamedTuple

from fluxnetes.devcluster import procs, readiness
from fluxnetes.devcluster.apicalls import Request, run_async, send_all
from fluxnetes.devcluster.client import ClusterClient
from fluxnetes.devcluster.errors import ClusterError
from fluxnetes.devcluster.nodes import RACK_LABEL, ZONE_LABEL, NodeShape


class Created(NamedTuple):
    names: list[str]  # sorted
    create_s: float  # seconds until the last create was answered
    ready_s: float  # seconds from then until every node was Ready


class KwokNodes:
    """Node objects made through `client`; `processes` gives the cluster's process records now
    (a wait fails early, with its log, when one of them exited)."""

    def __init__(self, client: ClusterClient,
                 processes: Callable[[], list[procs.ProcessRecord]]) -> None:
        self._client = client
        self._processes = processes

    def create(
        self,
        shape: NodeShape,
        timeout: float = 300.0,
        log: Callable[[str], None] | None = None,
        concurrency: int = 32,
    ) -> Created:
        """Create `shape.count` kwok nodes (concurrent API calls) and wait until all are Ready.

        A watch of the dev nodes follows them from before the first create, so their not-ready
        taints are lifted while the others are still being created (readiness.py)."""
        shape.validate()
        say = log or (lambda _msg: None)
        bodies = shape.manifests()
        reqs = [
            Request("POST", "/api/v1/nodes", b, f"creating node {b['metadata']['name']}")
            for b in bodies
        ]
        names = {b["metadata"]["name"] for b in bodies}
        if reqs:
            say(f"creating {len(reqs)} nodes (and waiting for them to be Ready)")
        started = time.monotonic()
        created = self._wait_nodes(names, time.monotonic() + timeout, concurrency,
                                   create=reqs, what=f"{len(names)} nodes to be Ready")
        return Created(sorted(names), created - started, time.monotonic() - created)

    def add(
        self,
        shape: NodeShape,
        name: str,
        zone: str | None = None,
        rack: str | None = None,
        timeout: float = 120.0,
    ) -> None:
        """Create one more kwok node of `shape` named `name` (in `zone`/`rack`, default those of
        node 0 of the shape) and wait until it is Ready."""
        body = shape.manifest(0)
        labels = body["metadata"]["labels"]
        body["metadata"]["name"] = labels["kubernetes.io/hostname"] = name
        if zone is not None:
            labels[ZONE_LABEL] = zone
        if rack is not None:
            labels[RACK_LABEL] = rack
        self._wait_nodes({name}, time.monotonic() + timeout, 1,
                         create=[Request("POST", "/api/v1/nodes", body, f"creating node {name}")],
                         what=f"node {name} to be Ready")

    def delete(self, name: str) -> bool:
        """Delete a Node object (its kwok node disappears with it). False if it was not there."""
        req = Request("DELETE", f"/api/v1/nodes/{name}", {}, f"deleting node {name}",
                      ignore=frozenset({404}))
        existed = self._client.exists(f"/api/v1/nodes/{name}")
        self._send([req], 1)
        return existed

    def _send(self, reqs: list[Request], concurrency: int) -> None:
        client = self._client
        run_async(lambda: send_all(client.api_url, client.ssl_context(), reqs, concurrency))

    def _wait_nodes(self, names: set[str], deadline: float, concurrency: int, *,
                    create: list[Request] | None = None, what: str) -> float:
        """Send `create` (at most `concurrency` at once) while watching `names` until all are
        Ready and untainted; returns when the creates ended (monotonic). Fails early, with its
        log, if a component dies; at `deadline` with the nodes still waiting and kwok's log."""
        reqs = create or []
        client = self._client

        def check_alive() -> None:
            procs.raise_if_exited(self._processes(), what)

        async def creating() -> None:
            if reqs:
                await send_all(client.api_url, client.ssl_context(), reqs, concurrency)

        try:
            return run_async(lambda: readiness.wait_ready(
                client.api_url, client.ssl_context(), names, deadline=deadline,
                concurrency=concurrency, check_alive=check_alive, meanwhile=creating))
        except readiness.NotReadyYet as exc:
            shown = ", ".join(sorted(exc.waiting)[:3])
            logs = "".join(
                f"\n--- {r.name} ({r.log}):\n{procs.log_tail(r.log, 8)}"
                for r in self._processes() if r.name == "kwok"
            )
            raise ClusterError(
                f"timed out waiting for {what}: {len(exc.waiting)} not Ready (e.g. {shown}); "
                f"a bigger cluster needs a longer --timeout{logs}"
            ) from None
