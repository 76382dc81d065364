"""What each kind of API request costs the local control plane, in CPU milliseconds.

The operator benchmark is CPU-bound on a small machine: every request fluxnetes adds to a
pod's path is paid by the API server and etcd. This measures N requests of each kind fluxnetes
(or the default path) makes, one kind at a time, and reports the CPU the API server and etcd
used per request (psutil deltas), so that a change to the operator's write path can be weighed
before it is built.

    .venv/bin/python bench/apiserver_costs.py --requests 400

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
from fluxnetes.k8s import certs, fluxjob, webhook_config
from fluxnetes.k8s.kube import JSON_PATCH, MUTATING, NAMESPACES, PODS, Kube, Resource
from fluxnetes.k8s.webhook import WebhookServer

RESULTS = Path(__file__).resolve().parent / "results" / "apiserver_costs.json"
JOBS = Resource("batch/v1", "jobs")
EVENTS = Resource("v1", "events")
CRDS = Resource("apiextensions.k8s.io/v1", "customresourcedefinitions", namespaced=False)
FLUXJOBS = Resource("fluxnetes.io/v1alpha1", "fluxjobs")
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


async def run(cluster: Cluster, n: int, conc: int) -> dict[str, Any]:
    kube = await Kube.from_config(str(cluster.kubeconfig))
    PIDS.update(cluster.pids)
    out: dict[str, Any] = {}
    try:
        crd = fluxjob.crd_manifest()
        await kube.create(CRDS, crd)
        await asyncio.sleep(3)  # established
        ns = "cost"
        await kube.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
        group_spec = {"size": 1, "jobspec": "version: 1\nresources: []\n" * 4, "duration": 0, "priority": 0,
                      "matchPolicy": "lonode", "exclusive": False, "request": {"cpu": 1000}}
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
            ("fluxjobs POST", lambda i: kube.create(FLUXJOBS, {
                "apiVersion": "fluxnetes.io/v1alpha1", "kind": "FluxJob", "metadata": {"name": f"f{i}"},
                "spec": group_spec}, ns)),
            ("fluxjobs PATCH (status)", lambda i: kube.patch(FLUXJOBS, f"f{i}", {"status": fluxjob.status(
                fluxjob.Phase.RUNNING, reason="allocated", jobid=i, submit_time=1, expected_start=None,
                start_time=2, end_time=None, nodes=[node], pods_seen=1, now=3, previous=None)}, ns)),
            ("jobs POST (suspended)", lambda i: kube.create(JOBS, {
                "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": f"j{i}"},
                "spec": {"suspend": True, "template": {"spec": {"restartPolicy": "Never", "containers": [
                    {"name": "c", "image": "busybox"}]}}}}, ns)),
        ]
        for name, make in kinds:
            out[name] = await measure(n, conc, make)
            print(name, out[name], flush=True)
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
    ap.add_argument("--output", default=str(RESULTS))
    args = ap.parse_args()
    result: dict[str, Any] = {
        "benchmark": "apiserver_costs",
        "parameters": {"requests": args.requests, "concurrency": args.concurrency, "nodes": args.nodes},
        "machine": {"cpu_count": os.cpu_count(), "python": platform.python_version(),
                    "platform": platform.platform()},
    }
    with tempfile.TemporaryDirectory(prefix="fx-cost-") as tmp:
        cluster = Cluster.up(ClusterOptions(nodes=NodeShape(count=args.nodes, cpu="32", memory="256Gi"),
                                            dir=Path(tmp) / "cluster", die_with_parent=True))
        try:
            result["per_request"] = asyncio.run(run(cluster, args.requests, args.concurrency))
        finally:
            cluster.down()
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
