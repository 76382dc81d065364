"""The dev cluster's settings for big node counts and its node-readiness watch (no cluster)."""

from __future__ import annotations

import asyncio
import json
import os
import ssl
import time
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from fluxnetes.devcluster import components, procs, readiness, toolchain
from fluxnetes.devcluster.apicalls import Request, send_all
from fluxnetes.devcluster.nodes import NOT_READY_TAINT
from fluxnetes.devcluster.pki import ClusterPKI
from fluxnetes.devcluster.state import start_timeout

PORTS = {"etcd": 1, "etcd_peer": 2, "apiserver": 3, "controller_manager": 4, "scheduler": 5}


def _argv(name: str, nodes: int, tmp_path: Path) -> list[str]:
    return components.argv(
        name, toolchain(tmp_path), ports=PORTS, kubeconfig="kc", data_dir="d",
        advertise_address="10.1.1.1", pki=ClusterPKI(tmp_path / "pki"), run=tmp_path, nodes=nodes,
    )


def test_small_clusters_keep_kubelet_lease_and_default_grace(tmp_path: Path) -> None:
    assert "--node-lease-duration-seconds=40" in _argv("kwok", 1000, tmp_path)
    cm = _argv("kube-controller-manager", 1000, tmp_path)
    assert not [a for a in cm if a.startswith("--node-monitor-grace-period")]


def test_the_ttl_controller_is_off_kwok_nodes_have_no_kubelet(tmp_path: Path) -> None:
    assert "--controllers=*,-ttl-controller" in _argv("kube-controller-manager", 10, tmp_path)


def test_big_clusters_stretch_the_lease_and_the_grace_period_together(tmp_path: Path) -> None:
    assert "--node-lease-duration-seconds=200" in _argv("kwok", 5000, tmp_path)
    assert "--node-monitor-grace-period=210s" in _argv("kube-controller-manager", 5000, tmp_path)


@pytest.mark.parametrize("nodes", [0, 1, 999, 1000, 1001, 2500, 5000, 10000, 50000])
def test_lease_renewals_stay_bounded_and_leases_never_expire_before_grace(nodes: int) -> None:
    lease = components.node_lease_seconds(nodes)
    renew = lease / 4 * 1.04  # kwok renews every quarter of the duration, 4% jitter
    assert nodes / (lease / 4) <= components.LEASE_RENEWALS_PER_SECOND
    assert components.node_monitor_grace_seconds(nodes) > renew + 5
    assert lease >= components.NODE_LEASE_SECONDS


def test_start_timeout_grows_with_nodes_above_1000() -> None:
    assert start_timeout(3) == start_timeout(1000) == 300
    assert start_timeout(5000) == 700


def test_rss_of_a_live_and_of_a_gone_process() -> None:
    rss = procs.rss_mib(os.getpid())
    assert rss is not None and rss > 1
    assert procs.rss_mib(2**22 + 12345) is None  # above pid_max's default: never a process


def _node(name: str, rv: int, *, ready: bool, tainted: bool) -> dict[str, Any]:
    taints = [{"key": NOT_READY_TAINT, "effect": "NoSchedule"}] if tainted else []
    conds = [{"type": "Ready", "status": "True"}] if ready else []
    return {"metadata": {"name": name, "resourceVersion": str(rv)}, "spec": {"taints": taints},
            "status": {"conditions": conds}}


def test_tracker_untaints_each_version_once_and_follows_readiness() -> None:
    t = readiness.ReadyTracker({"a", "b"})
    assert t.see(_node("a", 1, ready=False, tainted=True)) is None  # not Ready yet: kwok's turn
    req = t.see(_node("a", 2, ready=True, tainted=True))
    assert req is not None and req.path == "/api/v1/nodes/a"
    assert t.see(_node("a", 2, ready=True, tainted=True)) is None  # same version: sent already
    assert t.see(_node("a", 3, ready=True, tainted=True)) is not None  # changed: test op failed
    assert t.waiting == {"a", "b"}
    assert t.see(_node("a", 4, ready=True, tainted=False)) is None
    assert t.waiting == {"b"}
    assert t.see(_node("zz", 1, ready=True, tainted=True)) is None  # not one of ours
    t.gone("a")
    assert t.waiting == {"a", "b"}


class FakeApi:
    """Just enough of the nodes API: LIST (rv 0), WATCH from a version (410 when asked for
    the too-old version "1"), POST and JSON-patch of taints; a node turns Ready (tainted)
    when created, as kwok makes it."""

    def __init__(self, *, gone_first: bool = False) -> None:
        self.nodes: dict[str, dict[str, Any]] = {}
        self.rv = 10
        self.events: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.patches = 0
        self.gone_first = gone_first
        self.lists = 0

    def _bump(self, etype: str, node: dict[str, Any]) -> None:
        self.rv += 1
        node["metadata"]["resourceVersion"] = str(self.rv)
        self.events.put_nowait({"type": etype, "object": json.loads(json.dumps(node))})

    async def nodes_handler(self, request: web.Request) -> web.StreamResponse:
        if request.method == "POST":
            body = await request.json()
            name = body["metadata"]["name"]
            node = _node(name, 0, ready=True, tainted=True)
            self.nodes[name] = node
            self._bump("ADDED", node)
            return web.json_response(node, status=201)
        if request.query.get("watch") != "1":
            self.lists += 1
            rv = "1" if self.gone_first and self.lists == 1 else str(self.rv)
            return web.json_response({"metadata": {"resourceVersion": rv},
                                      "items": list(self.nodes.values())})
        if request.query["resourceVersion"] == "1":
            return web.json_response({"kind": "Status", "code": 410}, status=410)
        resp = web.StreamResponse()
        await resp.prepare(request)
        while True:
            ev = await self.events.get()
            await resp.write(json.dumps(ev).encode() + b"\n")

    async def patch_handler(self, request: web.Request) -> web.Response:
        node = self.nodes[request.match_info["name"]]
        ops = await request.json()
        if ops[0]["value"] != node["spec"]["taints"]:
            return web.json_response({}, status=422)
        self.patches += 1
        node["spec"]["taints"] = ops[1]["value"]
        self._bump("MODIFIED", node)
        return web.json_response(node)


async def _serve(api: FakeApi) -> tuple[web.AppRunner, str]:
    app = web.Application()
    app.router.add_route("*", "/api/v1/nodes", api.nodes_handler)
    app.router.add_route("PATCH", "/api/v1/nodes/{name}", api.patch_handler)
    runner = web.AppRunner(app, shutdown_timeout=0.1)  # the watch handler never ends by itself
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    return runner, f"http://127.0.0.1:{port}"


@pytest.mark.parametrize("gone_first", [False, True])
def test_wait_ready_creates_untaints_and_returns_when_all_are_ready(gone_first: bool) -> None:
    async def main() -> FakeApi:
        api = FakeApi(gone_first=gone_first)
        runner, url = await _serve(api)
        names = {f"n{i}" for i in range(20)}
        reqs = [Request("POST", "/api/v1/nodes", {"metadata": {"name": n}}, n) for n in names]

        ctx = ssl.create_default_context()
        try:
            await readiness.wait_ready(url, ctx, names, deadline=time.monotonic() + 20, concurrency=4,
                                       check_alive=lambda: None,
                                       meanwhile=lambda: send_all(url, ctx, reqs, 4))
        finally:
            await runner.cleanup()
        return api

    api = asyncio.run(main())
    assert api.patches == 20
    assert all(not n["spec"]["taints"] for n in api.nodes.values())


def test_wait_ready_gives_up_at_the_deadline_naming_what_waits() -> None:
    async def main() -> None:
        api = FakeApi()
        runner, url = await _serve(api)
        try:
            await readiness.wait_ready(url, ssl.create_default_context(), {"never"},
                                       deadline=time.monotonic() + 1.5, concurrency=2,
                                       check_alive=lambda: None)
        finally:
            await runner.cleanup()

    with pytest.raises(readiness.NotReadyYet) as err:
        asyncio.run(main())
    assert err.value.waiting == {"never"}


def test_wait_ready_stops_when_a_component_dies() -> None:
    def dead() -> None:
        raise RuntimeError("kwok exited")

    async def main() -> None:
        runner, url = await _serve(FakeApi())
        try:
            await readiness.wait_ready(url, ssl.create_default_context(), {"x"},
                                       deadline=time.monotonic() + 30, concurrency=2, check_alive=dead)
        finally:
            await runner.cleanup()

    with pytest.raises(RuntimeError, match="kwok exited"):
        asyncio.run(main())


def test_running_per_namespace_counts_groups_placed_without_a_fluxjob() -> None:
    """The fair-share measurement (bench/fairshare_k8s.py, tests/test_k8s_fairshare.py) counts
    what runs per account: the Running FluxJobs and, under the operator's default
    ``--fluxjobs waiting``, the groups placed at once that have none, from their pods (it used
    to count FluxJobs only, so jobs placed at once ran unseen)."""
    from types import SimpleNamespace

    from fluxnetes.devcluster.apicalls import fluxjobs_per_namespace

    outputs = {
        "fluxjobs": "a job-1 Running\na job-2 Pending\nb job-3 Reserved\nb job-4 Completed\n",
        # job-1 has its FluxJob (counted once), job-5 and b's job-6 none; a foreign pod has no annotation
        "pods": "a job-1\na job-5\nb b/job-6\nb\n",
    }

    class Cluster:
        def kubectl(self, *args: str) -> SimpleNamespace:
            return SimpleNamespace(stdout=outputs[args[1]])

    running, waiting = fluxjobs_per_namespace(Cluster())
    assert running == {"a": 2, "b": 1} and waiting == {"a": 1, "b": 1}
