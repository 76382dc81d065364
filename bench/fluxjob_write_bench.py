"""What one FluxJob costs the API server, and what makes it cheaper.

A single-pod Job through fluxnetes writes its FluxJob twice (created with its status, then
patched Completed); issue 17's profiles put the FluxJob requests at 11 % of the API server's
CPU and, measured by leaving them out, at a quarter to a third of single-pod throughput on a
2-core machine. This benchmark isolates them: on a local control plane (few nodes, nothing
else running) it creates N FluxJobs shaped like the operator's (``fluxjob.manifest`` and
``fluxjob.status`` of a one-pod Job), patches each Completed, and records the API server's
and etcd's CPU seconds per FluxJob, with a watch on FluxJobs open as the operator keeps one.
Variants run alternately in rounds (each label reports its median round):

- ``untracked``: the bodies the operator sends (``metadata`` from ``fluxjob.write_meta``:
  ``managedFields: [{}]``, the API server keeps no managed fields; only the operator writes
  FluxJobs, so there is no other field manager to track);
- ``tracked``: the same without that reset (the operator's writes before it): the API
  server records the operator's fields in ``managedFields`` at each write.

    .venv/bin/python bench/fluxjob_write_bench.py --fluxjobs 2000 --rounds 3

Writes bench/results/fluxjob_write_bench.json.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from fluxnetes.devcluster import Cluster, ClusterOptions, NodeShape
from fluxnetes.k8s import fluxjob
from fluxnetes.k8s.fluxjob import Phase
from fluxnetes.k8s.groups import GroupSpec, OwnerRef
from fluxnetes.k8s.install import ensure_crd
from fluxnetes.k8s.kube import FLUXJOBS, NAMESPACES, Kube
from fluxnetes.k8s.resources import PodResources

RESULTS = Path(__file__).resolve().parent / "results" / "fluxjob_write_bench.json"
VARIANTS = ("tracked", "untracked")
JOBSPEC = ("version: 9999\nresources:\n- type: slot\n  count: 1\n  label: job-j\n  with:\n  - type: core\n"
           "    count: 1\ntasks:\n- command:\n  - job-j\n  slot: job-j\n  count:\n    per_slot: 1\n"
           "attributes:\n  system:\n    duration: 0\n")


def bodies(name: str, ns: str, variant: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The create (with its Running status) and the Completed patch of a one-pod Job's FluxJob."""
    now = int(time.time())
    spec = GroupSpec(namespace=ns, name=f"job-{name}", size=1, request=PodResources(cpu_millis=1000, memory_bytes=64 << 20),
                     owner=OwnerRef("batch/v1", "Job", name, str(uuid.uuid4())))
    body = fluxjob.manifest(spec, jobspec=JOBSPEC, match_policy="lonode")
    # no owner here (the garbage collector would delete a FluxJob whose Job does not exist)
    body["metadata"].pop("ownerReferences", None)
    running = fluxjob.status(Phase.RUNNING, reason="allocated on kwok-node-0", jobid=1, submit_time=now,
                             start_time=now, nodes=["kwok-node-0"], pods_seen=1, now=now)
    body["status"] = running | {"shares": [{"node": "kwok-node-0", "cores": 1, "gpus": 0, "memory": 64}],
                                "released": []}
    done = fluxjob.status(Phase.COMPLETED, reason="all pods finished", jobid=1, submit_time=now, start_time=now,
                          end_time=now, nodes=["kwok-node-0"], pods_seen=0, now=now, previous=running)
    patch: dict[str, Any] = {"status": done | {"shares": None, "released": None}, "metadata": fluxjob.write_meta()}
    if variant == "tracked":
        body["metadata"].pop("managedFields")
        patch["metadata"].pop("managedFields")
    return body, patch


def _cpu(cluster: Cluster) -> dict[str, float]:
    import psutil

    out: dict[str, float] = {}
    for name in ("kube-apiserver", "etcd"):
        with contextlib.suppress(psutil.Error, KeyError):
            t = psutil.Process(cluster.pids[name]).cpu_times()
            out[name] = t.user + t.system
    return out


async def run(kube: Kube, cluster: Cluster, variant: str, n: int, concurrency: int) -> dict[str, Any]:
    ns = f"fj-{uuid.uuid4().hex[:6]}"
    await kube.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    seen = 0
    _, rv = await kube.list(FLUXJOBS, ns)

    async def watch() -> None:  # the operator keeps one open: each write is an event to encode
        nonlocal seen
        with contextlib.suppress(asyncio.CancelledError):
            async for _ev in kube.watch(FLUXJOBS, rv, timeout_seconds=600):
                seen += 1

    watcher = asyncio.ensure_future(watch())
    await asyncio.sleep(0.5)
    load = os.getloadavg()[0]
    cpu0, t0 = _cpu(cluster), time.monotonic()
    sem = asyncio.Semaphore(concurrency)
    sizes: list[int] = []

    async def one(i: int) -> None:
        body, patch = bodies(f"j{i}", ns, variant)
        async with sem:
            created = await kube.create(FLUXJOBS, body, ns)
            sizes.append(len(json.dumps(created)))
            patch["metadata"]["uid"] = created["metadata"]["uid"]
            await kube.patch(FLUXJOBS, body["metadata"]["name"], patch, ns)

    await asyncio.gather(*(one(i) for i in range(n)))
    for _ in range(100):  # the watch has every event (2 per FluxJob)
        if seen >= 2 * n:
            break
        await asyncio.sleep(0.1)
    wall = time.monotonic() - t0
    cpu1 = _cpu(cluster)
    watcher.cancel()
    sample = await kube.get(FLUXJOBS, "job-j0", ns)
    await kube.delete(NAMESPACES, ns)
    for _ in range(600):
        if await kube.get_or_none(NAMESPACES, ns) is None:
            break
        await asyncio.sleep(0.5)
    return {
        "fluxjobs": n,
        "wall_s": round(wall, 2),
        "apiserver_cpu_ms_per_fluxjob": round(1000 * (cpu1["kube-apiserver"] - cpu0["kube-apiserver"]) / n, 2),
        "etcd_cpu_ms_per_fluxjob": round(1000 * (cpu1["etcd"] - cpu0["etcd"]) / n, 2),
        "watch_events": seen,
        "stored_object_bytes": len(json.dumps(sample)),
        "created_response_bytes_median": int(statistics.median(sizes)),
        "managed_fields_entries": len(sample["metadata"].get("managedFields") or []),
        "load_average_1m_before": round(load, 2),
    }


async def bench(args: argparse.Namespace, cluster: Cluster) -> dict[str, Any]:
    kube = await Kube.from_config(str(cluster.kubeconfig))
    try:
        await ensure_crd(kube)
        rounds: dict[str, list[dict[str, Any]]] = {}
        for _ in range(args.rounds):
            for v in args.variants:
                r = await run(kube, cluster, v, args.fluxjobs, args.concurrency)
                print(v, r, flush=True)
                rounds.setdefault(v, []).append(r)
                await asyncio.sleep(2)
        out: dict[str, Any] = {}
        for v, rs in rounds.items():
            ordered = sorted(rs, key=lambda x: x["apiserver_cpu_ms_per_fluxjob"])
            out[v] = dict(ordered[len(ordered) // 2]) | {
                "apiserver_cpu_ms_per_fluxjob_rounds": [x["apiserver_cpu_ms_per_fluxjob"] for x in rs]}
        return out
    finally:
        await kube.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fluxjobs", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    ap.add_argument("--output", default=str(RESULTS))
    args = ap.parse_args()
    out: dict[str, Any] = {
        "benchmark": "fluxjob_write_bench",
        "parameters": {"fluxjobs": args.fluxjobs, "rounds": args.rounds, "concurrency": args.concurrency,
                       "variants": args.variants, "writes_per_fluxjob": 2, "nodes": 4},
        "machine": {"cpu_count": os.cpu_count(), "python": platform.python_version(),
                    "platform": platform.platform()},
    }
    with tempfile.TemporaryDirectory(prefix="fx-fjbench-") as tmp:
        cluster = Cluster.up(ClusterOptions(nodes=NodeShape(count=4, cpu="32", memory="256Gi"),
                                            dir=Path(tmp) / "cluster", die_with_parent=True))
        try:
            out["results"] = asyncio.run(bench(args, cluster))
        finally:
            cluster.down()
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out["results"], indent=2))


if __name__ == "__main__":
    main()
