"""What Python's cyclic garbage collector costs an operator-like process, and what gc.freeze()
after the informers' first sync or higher thresholds would save (issue #31, item 3, lever 2).

The process imports what the operator imports, decodes a cache of ``--nodes`` Node and
``--pods`` Pod objects (the initial list), then plays a stream of watch events for ``--new``
single-pod Jobs (4.6 Pod + 2.3 Job events each, as measured: docs/scale.md), each decoded
with orjson and stored in the cache as an informer does. Each variant runs in its own child
process (fresh heap); rounds alternate the variants. Reported per new pod: CPU ms, of which
collector ms (gc.callbacks), collections by generation, and the peak RSS.

    PYTHONPATH=src python bench/gc_cache.py --out bench/results/gc_cache.json
"""

from __future__ import annotations

import argparse
import gc
import json
import multiprocessing
import os
import resource
import statistics
import time
from pathlib import Path
from typing import Any

import orjson

VARIANTS = {
    "default": None,
    "freeze": "freeze",
    "threshold": (10000, 20, 10),
    "freeze+threshold": "both",
}


def node(i: int) -> bytes:
    return orjson.dumps({"type": "ADDED", "object": {
        "kind": "Node", "apiVersion": "v1",
        "metadata": {"name": f"kwok-node-{i}", "uid": f"n-{i}", "resourceVersion": str(i),
                     "labels": {f"label-{k}": f"value-{k}-{i}" for k in range(12)},
                     "annotations": {"node.alpha.kubernetes.io/ttl": "0", "kwok.x-k8s.io/node": "fake"}},
        "spec": {"taints": [{"key": "kwok.x-k8s.io/node", "value": "fake", "effect": "NoSchedule"}]},
        "status": {"capacity": {"cpu": "32", "memory": "256Gi", "pods": "110"},
                   "allocatable": {"cpu": "32", "memory": "256Gi", "pods": "110"},
                   "conditions": [{"type": t, "status": "False", "reason": "x", "message": "y" * 40,
                                   "lastHeartbeatTime": "2026-11-29T00:00:00Z"} for t in
                                  ("Ready", "MemoryPressure", "DiskPressure", "PIDPressure", "NetworkUnavailable")],
                   "addresses": [{"type": "InternalIP", "address": f"10.0.{i // 250}.{i % 250}"}],
                   "nodeInfo": {k: "v1.36.0" for k in ("kubeletVersion", "kubeProxyVersion", "osImage",
                                                        "kernelVersion", "containerRuntimeVersion")}}}})


def pod(i: int, phase: str) -> bytes:
    return orjson.dumps({"type": "MODIFIED", "object": {
        "kind": "Pod", "apiVersion": "v1",
        "metadata": {"name": f"job-{i}-abcde", "namespace": "bench", "uid": f"p-{i}",
                     "resourceVersion": str(10**6 + i), "labels": {"job-name": f"job-{i}",
                                                                   "batch.kubernetes.io/job-name": f"job-{i}"},
                     "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": f"job-{i}",
                                          "uid": f"j-{i}", "controller": True}],
                     "managedFields": [{"manager": m, "operation": "Update", "fieldsV1": {"f:status": {
                         f"f:{k}": {} for k in range(20)}}} for m in ("kube-controller-manager", "kwok")]},
        "spec": {"containers": [{"name": "c", "image": "busybox", "command": ["sleep", "1"],
                                 "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}],
                 "schedulerName": "fluxnetes", "nodeName": f"kwok-node-{i % 1000}",
                 "tolerations": [{"key": k, "operator": "Exists"} for k in ("a", "b", "c")]},
        "status": {"phase": phase, "conditions": [{"type": t, "status": "True", "lastTransitionTime": "x"}
                                                  for t in ("Initialized", "Ready", "ContainersReady",
                                                            "PodScheduled")]}}})


def job(i: int, n: int) -> bytes:
    return orjson.dumps({"type": "MODIFIED", "object": {
        "kind": "Job", "apiVersion": "batch/v1",
        "metadata": {"name": f"job-{i}", "namespace": "bench", "uid": f"j-{i}", "resourceVersion": str(n),
                     "labels": {"a": "b"}},
        "spec": {"parallelism": 1, "completions": 1, "template": {"spec": {"containers": [
            {"name": "c", "image": "busybox", "command": ["sleep", "1"]}], "schedulerName": "fluxnetes"}}},
        "status": {"active": 1, "ready": 1, "conditions": [{"type": "Complete", "status": "True"}]}}})


def run(variant: str, nodes: int, pods: int, new: int, out: Any) -> None:
    import kubernetes_asyncio.client  # noqa: F401

    import fluxnetes.k8s.controller  # noqa: F401  (the operator's heap of modules)

    spent = [0.0]
    counts = [0, 0, 0]
    start = [0.0]

    def on_gc(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            start[0] = time.perf_counter()
        else:
            spent[0] += time.perf_counter() - start[0]
            counts[info["generation"]] += 1

    cache: dict[str, dict[str, Any]] = {}
    for i in range(nodes):
        obj = orjson.loads(node(i))["object"]
        cache[obj["metadata"]["uid"]] = obj
    for i in range(pods):
        obj = orjson.loads(pod(-1 - i, "Succeeded"))["object"]
        cache[obj["metadata"]["uid"]] = obj
    mode = VARIANTS[variant]
    if mode in ("freeze", "both"):
        gc.freeze()
    if isinstance(mode, tuple):
        gc.set_threshold(*mode)
    if mode == "both":
        gc.set_threshold(10000, 20, 10)
    lines = [[pod(i, ph) for ph in ("Pending", "Pending", "Running", "Running", "Succeeded")] +
             [job(i, k) for k in range(2)] for i in range(new)]
    gc.callbacks.append(on_gc)
    t0 = time.process_time()
    for i, evs in enumerate(lines):
        for k, line in enumerate(evs):
            if k == 4 and i % 3:  # 4.6 Pod events per pod
                continue
            obj = orjson.loads(line)["object"]
            cache[obj["metadata"]["uid"]] = obj
            # the operator's own transient objects per event (a few small dicts and tuples)
            _ = [{"k": j, "v": (j, str(j))} for j in range(20)]
    cpu = time.process_time() - t0
    gc.callbacks.remove(on_gc)
    out.put({"cpu_ms_per_pod": cpu / new * 1e3, "gc_ms_per_pod": spent[0] / new * 1e3,
             "collections": counts, "maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
             "objects": len(gc.get_objects()), "frozen": gc.get_freeze_count()})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--pods", type=int, default=1000)
    ap.add_argument("--new", type=int, default=3000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", default="bench/results/gc_cache.json")
    args = ap.parse_args()
    load0 = os.getloadavg()
    mp = multiprocessing.get_context("spawn")
    samples: dict[str, list[dict[str, Any]]] = {v: [] for v in VARIANTS}
    for r in range(args.rounds):
        for v in (list(VARIANTS) if r % 2 == 0 else list(reversed(VARIANTS))):
            q = mp.Queue()
            p = mp.Process(target=run, args=(v, args.nodes, args.pods, args.new, q))
            p.start()
            samples[v].append(q.get(timeout=600))
            p.join()
    results = {v: {"cpu_ms_per_pod": round(statistics.median(s["cpu_ms_per_pod"] for s in ss), 3),
                   "gc_ms_per_pod": round(statistics.median(s["gc_ms_per_pod"] for s in ss), 3),
                   "maxrss_mb": round(statistics.median(s["maxrss_mb"] for s in ss), 1),
                   "rounds": ss} for v, ss in samples.items()}
    Path(args.out).write_text(json.dumps({"benchmark": "gc_cache", "parameters": vars(args), "variants":
                                          {k: str(v) for k, v in VARIANTS.items()}, "results": results,
                                          "load": {"before": load0, "after": os.getloadavg()}}, indent=1) + "\n")
    for v, r in results.items():
        print(v, r["cpu_ms_per_pod"], r["gc_ms_per_pod"], r["maxrss_mb"], r["rounds"][0]["collections"])


if __name__ == "__main__":
    main()
