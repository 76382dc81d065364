"""What each kind of API request costs the local control plane, in CPU milliseconds.

The operator benchmark is CPU-bound on a small machine: every request fluxnetes adds to a
pod's path is paid by the API server and etcd. This measures N requests of each kind fluxnetes
(or the default path) makes, one kind at a time, and reports the CPU the API server and etcd
used per request (psutil deltas), so that a change to the operator's write path can be weighed
before it is built.

    .venv/bin/python bench/apiserver_costs.py --requests 400
    .venv/bin/python bench/apiserver_costs.py --only fluxjobs --requests 2000 --rounds 3 \
        --output bench/results/apiserver_costs_fluxjobs.json   # the operator's FluxJob writes,
        # with and without managed fields (fluxjob.write_meta)

Writes bench/results/apiserver_costs.json.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import psutil

from fluxnetes.devcluster import Cluster, ClusterOptions, NodeShape
from fluxnetes.k8s import certs
from fluxnetes.k8s.admission import webhook_config
from fluxnetes.k8s.admission.webhook import WebhookServer
from fluxnetes.k8s.groups import GroupSpec, OwnerRef
from fluxnetes.k8s.kube import JSON_PATCH, MUTATING, NAMESPACES, PODS, Kube, Resource
from fluxnetes.k8s.persistence import fluxjob
from fluxnetes.k8s.resources import PodResources

RESULTS = Path(__file__).resolve().parent / "results" / "apiserver_costs.json"
JOBS = Resource("batch/v1", "jobs")
EVENTS = Resource("v1", "events")
CRDS = Resource("apiextensions.k8s.io/v1", "customresourcedefinitions", namespaced=False)
FLUXJOBS = Resource("fluxnetes.io/v1alpha1", "fluxjobs")
JOBSPEC = ("version: 9999\nresources:\n- type: slot\n  count: 1\n  label: job-j\n  with:\n  - type: core\n"
           "    count: 1\ntasks:\n- command:\n  - job-j\n  slot: job-j\n  count:\n    per_slot: 1\n"
           "attributes:\n  system:\n    duration: 0\n")  # a one-pod Job's, as the operator writes it
BINDINGS = Resource("v1", "pods")  # POST .../pods/NAME/binding
WATCHED = ("kube-apiserver", "etcd")


PIDS: dict[str, int] = {}  # this run's cluster only (others may run on the machine)


def cpu() -> dict[str, float]:
    out: dict[str, float] = {}
    for name, pid in PIDS.items():
        if name in WATCHED:
            with contextlib.suppress(psutil.Error):
                t = psutil.Process(pid).cpu_times()
                out[name] = t.user + t.system
    return out


def pod(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": {"app": "cost"}},
        # a scheduler nobody runs: the pod stays put, only this benchmark writes to it
        "spec": {"schedulerName": "nobody", "containers": [{"name": "c", "image": "busybox", "resources": {
            "requests": {"cpu": "1", "memory": "64Mi"}}}]},
    }


async def measure(n: int, conc: int, make: Callable[[int], Awaitable[Any]]) -> dict[str, float]:
    sem = asyncio.Semaphore(conc)

    async def one(i: int) -> None:
        async with sem:
            await make(i)

    await asyncio.sleep(1.0)  # let the previous kind's watch fan-out settle
    c0, t0 = cpu(), time.monotonic()
    await asyncio.gather(*(one(i) for i in range(n)))
    await asyncio.sleep(0.5)
    c1, wall = cpu(), time.monotonic() - t0
    per = {k: round((c1.get(k, 0) - c0.get(k, 0)) / n * 1000, 3) for k in WATCHED}
    return {"apiserver_cpu_ms": per["kube-apiserver"], "etcd_cpu_ms": per["etcd"],
            "wall_ms_per_request": round(wall / n * 1000, 3)}


def fluxjob_pair(name: str, ns: str, node: str, untracked: bool) -> tuple[dict[str, Any], dict[str, Any]]:
    """A one-pod Job's FluxJob as the operator writes it: created with its Running status
    (``fluxjob.manifest``), then patched Completed. ``untracked``: with ``fluxjob.write_meta``'s
    managed-fields reset, as the operator sends them; otherwise without it (before that)."""
    spec = GroupSpec(namespace=ns, name=name, size=1, request=PodResources(cpu_millis=1000, memory_bytes=64 << 20),
                     owner=OwnerRef("batch/v1", "Job", name))  # (no uid: no owner reference to collect it)
    body = fluxjob.manifest(spec, jobspec=JOBSPEC, match_policy="lonode")
    running = fluxjob.status(fluxjob.Phase.RUNNING, reason=f"allocated on {node}", jobid=1, submit_time=1,
                             start_time=2, nodes=[node], pods_seen=1, now=3)
    body["status"] = running | {"shares": [{"node": node, "cores": 1, "gpus": 0, "memory": 64}], "released": []}
    done = fluxjob.status(fluxjob.Phase.COMPLETED, reason="all pods finished", jobid=1, submit_time=1,
                          start_time=2, end_time=4, nodes=[node], pods_seen=0, now=4, previous=running)
    patch: dict[str, Any] = {"status": done | {"shares": None, "released": None}, "metadata": fluxjob.write_meta()}
    if not untracked:
        body["metadata"].pop("managedFields")
        patch["metadata"].pop("managedFields")
    return body, patch


def fluxjob_kinds(kube: Kube, ns: str, node: str, rnd: int) -> list[tuple[str, Callable[[int], Awaitable[Any]]]]:
    """The operator's two FluxJob writes per one-pod Job, with and without managed fields
    (names unique per round, so that rounds can repeat them)."""
    out: list[tuple[str, Callable[[int], Awaitable[Any]]]] = []
    for label, untracked in (("managed fields kept", False), ("untracked", True)):
        prefix = f"r{rnd}-{'u' if untracked else 't'}"

        def create(i: int, prefix: str = prefix, untracked: bool = untracked) -> Awaitable[Any]:
            return kube.create(FLUXJOBS, fluxjob_pair(f"{prefix}-{i}", ns, node, untracked)[0], ns)

        def patch(i: int, prefix: str = prefix, untracked: bool = untracked) -> Awaitable[Any]:
            return kube.patch(FLUXJOBS, f"{prefix}-{i}", fluxjob_pair(f"{prefix}-{i}", ns, node, untracked)[1], ns)

        out += [(f"fluxjobs POST (operator's body, {label})", create),
                (f"fluxjobs PATCH (Completed, {label})", patch)]
    return out


async def run(cluster: Cluster, n: int, conc: int, only: str | None = None, rounds: int = 1) -> dict[str, Any]:
    kube = await Kube.from_config(str(cluster.kubeconfig))
    PIDS.update(cluster.pids)
    out: dict[str, Any] = {}
    try:
        crd = fluxjob.crd_manifest()
        await kube.create(CRDS, crd)
        await asyncio.sleep(3)  # established
        ns = "cost"
        await kube.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
        node = "fx-node-0"
        nodes = (await kube.list(Resource("v1", "nodes", namespaced=False)))[0]
        if nodes:
            node = nodes[0]["metadata"]["name"]
        kinds: list[tuple[str, Callable[[int], Awaitable[Any]]]] = [
            ("pods POST", lambda i: kube.create(PODS, pod(f"p{i}"), ns)),
            ("pods PATCH (affinity, json patch)", lambda i: kube.patch(PODS, f"p{i}", [
                {"op": "add", "path": "/metadata/annotations", "value": {"fluxnetes.io/slot": "0"}}],
                ns, content_type=JSON_PATCH)),
            ("pods/binding POST", lambda i: kube.request("POST", PODS.path(ns, f"p{i}", "binding"), {
                "apiVersion": "v1", "kind": "Binding", "metadata": {"name": f"p{i}"},
                "target": {"apiVersion": "v1", "kind": "Node", "name": node}})),
            ("events POST", lambda i: kube.create(EVENTS, {
                "apiVersion": "v1", "kind": "Event", "metadata": {"generateName": "e.", "namespace": ns},
                "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": f"p{i}", "namespace": ns},
                "type": "Normal", "reason": "Cost", "message": "x", "source": {"component": "cost"}}, ns)),
            ("jobs POST (suspended)", lambda i: kube.create(JOBS, {
                "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": f"j{i}"},
                "spec": {"suspend": True, "template": {"spec": {"restartPolicy": "Never", "containers": [
                    {"name": "c", "image": "busybox"}]}}}}, ns)),
        ]
        # rounds alternate the kinds (a change of the machine's load hits each alike); each
        # kind reports its median round
        per_round: dict[str, list[dict[str, float]]] = {}
        for rnd in range(rounds):
            for name, make in [*kinds, *fluxjob_kinds(kube, ns, node, rnd)]:
                if only is not None and only not in name:
                    continue
                r = await measure(n, conc, make)
                print(name, r, flush=True)
                per_round.setdefault(name, []).append(r)
        for name, rs in per_round.items():
            ordered = sorted(rs, key=lambda r: r["apiserver_cpu_ms"])
            out[name] = dict(ordered[len(ordered) // 2])
            if len(rs) > 1:
                out[name]["apiserver_cpu_ms_rounds"] = [r["apiserver_cpu_ms"] for r in rs]
        if only is not None and "webhook" not in only:
            return out
        # the same creates through fluxnetes' mutating webhook (served in a child process, as
        # the operator does): the difference is what an admission call costs the API server
        bundle = certs.make_bundle(["127.0.0.1"])
        server = WebhookServer("127.0.0.1", 0, bundle, lambda: {"operator"})
        port = await server.start_in_process()
        try:
            await kube.create(MUTATING, webhook_config.mutating(
                webhook_config.WebhookTarget(url=f"https://127.0.0.1:{port}"), webhook_config.Scope(),
                bundle.ca_crt))
            hooked = "hooked"
            await kube.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {
                "name": hooked, "labels": {"fluxnetes.io/enabled": "true"}}})
            await asyncio.sleep(3)  # the API server's webhook informer
            for name, make in [
                ("pods POST via webhook", lambda i: kube.create(PODS, pod(f"p{i}"), hooked)),
                ("jobs POST (suspended) via webhook", lambda i: kube.create(JOBS, {
                    "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": f"j{i}"},
                    "spec": {"suspend": True, "template": {"spec": {"restartPolicy": "Never", "containers": [
                        {"name": "c", "image": "busybox"}]}}}}, hooked)),
            ]:
                out[name] = await measure(n, conc, make)
                print(name, out[name], flush=True)
        finally:
            await server.stop()
    finally:
        await kube.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=400)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--nodes", type=int, default=10)
    ap.add_argument("--only", metavar="TEXT", help="only the request kinds whose name contains TEXT "
                    "(e.g. fluxjobs; the webhook kinds run only when TEXT names them)")
    ap.add_argument("--rounds", type=int, default=1, help="repeat the kinds, alternating; medians reported")
    ap.add_argument("--output", default=str(RESULTS))
    args = ap.parse_args()
    result: dict[str, Any] = {
        "benchmark": "apiserver_costs",
        "parameters": {"requests": args.requests, "concurrency": args.concurrency, "nodes": args.nodes,
                       "only": args.only, "rounds": args.rounds},
        "machine": {"cpu_count": os.cpu_count(), "python": platform.python_version(),
                    "platform": platform.platform()},
    }
    with tempfile.TemporaryDirectory(prefix="fx-cost-") as tmp:
        cluster = Cluster.up(ClusterOptions(nodes=NodeShape(count=args.nodes, cpu="32", memory="256Gi"),
                                            dir=Path(tmp) / "cluster", die_with_parent=True))
        try:
            load = os.getloadavg()[0]
            result["per_request"] = asyncio.run(run(cluster, args.requests, args.concurrency, args.only,
                                                    args.rounds))
            result["load_average_1m_before"] = round(load, 2)
        finally:
            cluster.down()
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
