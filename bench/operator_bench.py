"""Operator benchmark on the local control plane (kwok nodes).

For each workload (single-pod Jobs, Jobs of 10 pods) it measures the time from the first
Job create to the moment every pod of the workload has been bound to a node, first through
the default kube-scheduler alone (a namespace fluxnetes does not manage), then through
fluxnetes (an opted-in namespace), in the same cluster and run, and reports pods/s and the
ratio. The admission webhook's latency (p50/p99) is measured separately by sending pod
AdmissionReviews to the webhook server over TLS, as the API server does. Each run also
counts the watch events its Pods and Jobs cause until the last pod is bound (what the operator's
informers receive and decode for the workload; ``operator_watch_events_per_pod``), a MODIFIED
split by what changed.

    .venv/bin/python bench/operator_bench.py --nodes 100 --jobs 1000 --gang-jobs 100

Writes bench/results/operator_bench.json.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import shutil
import signal
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import aiohttp

from fluxnetes.devcluster import Cluster, ClusterOptions, NodeShape
from fluxnetes.k8s import certs
from fluxnetes.k8s.admission.webhook import WebhookServer
from fluxnetes.k8s.kube import NAMESPACES, PODS, Kube, Resource

JOBS = Resource("batch/v1", "jobs")
RESULTS = Path(__file__).resolve().parent / "results" / "operator_bench.json"
WRITE_VERBS = ("POST", "PUT", "PATCH", "DELETE")


def job_body(name: str, size: int, scheduler: str | None = None) -> dict[str, Any]:
    """A Job of ``size`` pods; ``scheduler``: its pod template's ``schedulerName``."""
    body: dict[str, Any] = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {
            "parallelism": size,
            "completions": size,
            "ttlSecondsAfterFinished": 3600,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [
                        {
                            "name": "c",
                            "image": "busybox",
                            "resources": {"requests": {"cpu": "1", "memory": "64Mi"}},
                        }
                    ],
                }
            },
        },
    }
    if scheduler:
        body["spec"]["template"]["spec"]["schedulerName"] = scheduler
    return body


async def run_workload(kube: Kube, ns: str, jobs: int, size: int, timeout: float,
                       scheduler: str | None = None) -> dict[str, Any]:
    """Create ``jobs`` Jobs of ``size`` pods in ``ns``; wait until jobs*size pods were bound."""
    total = jobs * size
    bound: set[str] = set()
    _, rv = await kube.list(PODS, ns)
    done = asyncio.Event()
    t_bound: list[float] = []
    # per Job: when its last pod was first seen and when its last pod was bound (a group's
    # latency, last pod created -> all its pods bound, as scheduler_perf reports it per pod)
    seen: dict[str, set[str]] = {}
    last_seen: dict[str, float] = {}
    bound_of: dict[str, int] = {}
    group_latency: list[float] = []
    # the stages of each Job (local clock): its create call sent and answered, its first pod
    # seen, its last pod bound (``stages`` in the result: where the time goes on each path)
    create_sent: dict[str, float] = {}
    create_done: dict[str, float] = {}
    first_seen: dict[str, float] = {}
    all_bound: dict[str, float] = {}

    # the watch events the workload's objects cause (what the operator's Pod and Job informers
    # receive and decode for it), until its last pod is bound: per type, a MODIFIED split by
    # what changed (a Pod's spec or its status/metadata only; a Job's spec (generation) or not)
    events: dict[str, int] = {}
    # how often the benchmark's own watches were opened (a watch the API server closes, e.g. a
    # watcher it found too slow, is opened again: more than 1 each says the benchmark's reader
    # was one of the watchers apiserver_terminated_watchers_total counts)
    opened = {"Pod": 0, "Job": 0}
    pod_spec: dict[str, Any] = {}
    job_gen: dict[str, Any] = {}

    def count(kind: str, etype: str, obj: dict[str, Any], before: dict[str, Any], now: Any) -> None:
        uid = obj.get("metadata", {}).get("uid", "")
        if etype == "MODIFIED":
            etype = "MODIFIED spec" if before.get(uid) != now else "MODIFIED status/metadata"
        before[uid] = now
        events[f"{kind} {etype}"] = events.get(f"{kind} {etype}", 0) + 1

    async def watch_jobs() -> None:
        jrv = rv
        while not done.is_set():
            try:
                opened["Job"] += 1
                async for ev in kube.watch(JOBS, jrv, field_selector=f"metadata.namespace={ns}", timeout_seconds=60):
                    obj = ev.get("object") or {}
                    jrv = obj.get("metadata", {}).get("resourceVersion", jrv)
                    if ev.get("type") != "BOOKMARK" and not done.is_set():
                        count("Job", str(ev.get("type")), obj, job_gen, obj.get("metadata", {}).get("generation"))
            except Exception as exc:  # re-watch
                print("job watch:", exc, file=sys.stderr)
                await asyncio.sleep(0.2)

    async def watch() -> None:
        nonlocal rv
        while not done.is_set():
            try:
                opened["Pod"] += 1
                async for ev in kube.watch(
                    Resource("v1", "pods"),
                    rv,
                    field_selector=f"metadata.namespace={ns}",
                    timeout_seconds=60,
                ):
                    obj = ev.get("object") or {}
                    rv = obj.get("metadata", {}).get("resourceVersion", rv)
                    uid = obj.get("metadata", {}).get("uid", "")
                    if ev.get("type") != "BOOKMARK":
                        count("Pod", str(ev.get("type")), obj, pod_spec, obj.get("spec"))
                    job = (obj.get("metadata", {}).get("labels") or {}).get("batch.kubernetes.io/job-name", "")
                    if uid not in seen.setdefault(job, set()):
                        seen[job].add(uid)
                        last_seen[job] = time.monotonic()
                        first_seen.setdefault(job, last_seen[job])
                    if obj.get("spec", {}).get("nodeName") and uid not in bound:
                        bound.add(uid)
                        now = time.monotonic()
                        t_bound.append(now)
                        bound_of[job] = bound_of.get(job, 0) + 1
                        if bound_of[job] == size:
                            group_latency.append(now - last_seen[job])
                            all_bound[job] = now
                        if len(bound) >= total:
                            done.set()
                            return
            except Exception as exc:  # re-watch
                print("watch:", exc, file=sys.stderr)
                await asyncio.sleep(0.2)

    watcher = asyncio.ensure_future(watch())
    job_watcher = asyncio.ensure_future(watch_jobs())
    t0 = time.monotonic()
    sem = asyncio.Semaphore(32)

    async def create(i: int) -> None:
        async with sem:
            create_sent[f"j{i}"] = time.monotonic()
            await kube.create(JOBS, job_body(f"j{i}", size, scheduler), ns)
            create_done[f"j{i}"] = time.monotonic()

    await asyncio.gather(*(create(i) for i in range(jobs)))
    t_created = time.monotonic() - t0
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(done.wait(), timeout)
    watcher.cancel()
    job_watcher.cancel()
    elapsed = (t_bound[-1] - t0) if len(bound) >= total else None
    return {
        "jobs": jobs,
        "pods_per_job": size,
        "pods": total,
        "bound": len(bound),
        "create_seconds": round(t_created, 3),
        "seconds_to_all_bound": None if elapsed is None else round(elapsed, 3),
        "pods_per_second": None if elapsed is None else round(total / elapsed, 1),
        "group_latency_s": _percentiles(group_latency),
        "stages": _stages(create_sent, create_done, first_seen, last_seen, all_bound),
        "operator_watch_events_per_pod": {k: round(v / total, 2) for k, v in sorted(events.items())},
        "operator_watch_events_per_pod_total": round(sum(events.values()) / total, 2),
        "bench_watches_opened": opened,
    }


def _stages(sent: dict[str, float], done: dict[str, float], first: dict[str, float], last: dict[str, float],
            bound: dict[str, float]) -> dict[str, Any]:
    """Per Job, the time of each step of its path (p50/p99/max over the Jobs, seconds):
    ``create_call`` (the Job POST: admission, the webhook's round trip included),
    ``created_to_first_pod`` (the Job controller, through the informers, creating its first pod:
    the watch shows it), ``first_to_last_pod`` (a gang's other pods), ``last_pod_to_bound`` (the
    scheduler: its informer, its cycle, the binding, until the watch shows the last pod bound)."""
    steps: dict[str, list[float]] = {"create_call": [], "created_to_first_pod": [], "first_to_last_pod": [],
                                     "last_pod_to_bound": []}
    for job, t_done in done.items():
        steps["create_call"].append(t_done - sent[job])
        if job in first:
            steps["created_to_first_pod"].append(max(0.0, first[job] - t_done))
            steps["first_to_last_pod"].append(last[job] - first[job])
        if job in bound:
            steps["last_pod_to_bound"].append(bound[job] - last[job])
    return {k: _percentiles(v) for k, v in steps.items()}


def _round_digest(r: dict[str, Any]) -> dict[str, Any]:
    """What each round says about where the time went (the median round keeps the rest): its
    rate, load, stage medians, the API server's latency means, CPU seconds per component."""
    return {
        "pods_per_second": r["pods_per_second"],
        "load_average_1m_before": r["load_average_1m_before"],
        "stages_p50_s": {k: (v or {}).get("p50") for k, v in r.get("stages", {}).items()},
        "apiserver_latency_mean_ms": {k: v["mean_ms"] for k, v in r.get("apiserver_latency", {}).items()},
        "cpu_seconds": {**r.get("component_cpu_seconds", {}),
                        **({"operator": r["operator_cpu_seconds"]} if "operator_cpu_seconds" in r else {})},
        "api_writes_per_pod": r.get("api_writes_per_pod"),
        "cpu_ms_per_pod_raw": r.get("cpu_ms_per_pod_raw"),
        "cpu_ms_per_pod_corrected": r.get("cpu_ms_per_pod_corrected"),
        "operator_gc_ms_per_pod": r.get("operator_gc_ms_per_pod"),
        "operator_rss_mb": r.get("operator_rss_mb"),
        "operator_watch_events_per_pod_total": r.get("operator_watch_events_per_pod_total"),
        "evidence": r.get("evidence"),
    }


def _percentiles(xs: list[float]) -> dict[str, float] | None:
    """p50/p99/max (and how many) of ``xs``, in seconds."""
    if not xs:
        return None
    xs = sorted(xs)
    return {"groups": len(xs), "p50": round(statistics.median(xs), 3),
            "p99": round(xs[max(0, int(len(xs) * 0.99) - 1)], 3), "max": round(xs[-1], 3)}


# the API server's watch counters, per resource kind: events sent to watchers and their bytes
WATCH_METRICS = {"apiserver_watch_events_total{": "WATCH_EVENTS", "apiserver_watch_events_sizes_sum{": "WATCH_BYTES"}


async def api_requests(kube: Kube) -> dict[str, float]:
    """The API server's request counters: {"resource verb": count} (watch requests excluded),
    and the events (and bytes) its watches sent: {"Kind WATCH_EVENTS" / "Kind WATCH_BYTES": n}."""
    out: dict[str, float] = {}
    for line in (await kube.request_text("/metrics")).splitlines():
        watch = next((w for prefix, w in WATCH_METRICS.items() if line.startswith(prefix)), None)
        if not line.startswith("apiserver_request_total{") and watch is None:
            continue
        labels, value = line.rsplit(" ", 1)
        f = dict(kv.split("=", 1) for kv in labels[labels.index("{") + 1 : -1].split(","))
        if watch is not None:  # labelled by kind (older servers) or resource
            key = f"{(f.get('kind') or f.get('resource') or '').strip(chr(34))} {watch}"
            out[key] = out.get(key, 0) + float(value)
            continue
        verb, res = f.get("verb", "").strip('"'), f.get("resource", "").strip('"')
        sub = f.get("subresource", "").strip('"')
        if verb == "WATCH":
            continue
        key = f"{res}{'/' + sub if sub else ''} {verb}"
        out[key] = out.get(key, 0) + float(value)
    return out


# the API server's own latency histograms (sum and count) the stages read: fluxnetes' webhook
# calls, and the requests on each path's way from Job to bound pod
LATENCY_SUMS = {"apiserver_admission_webhook_admission_duration_seconds_": "name",
                "apiserver_request_duration_seconds_": "request"}
LATENCY_REQUESTS = {("POST", "jobs", ""), ("POST", "pods", ""), ("POST", "pods", "binding"),
                    ("PATCH", "pods", ""), ("POST", "fluxjobs", ""), ("PATCH", "fluxjobs", ""),
                    ("PUT", "jobs", "status")}


async def latency_sums(kube: Kube) -> dict[str, list[float]]:
    """{"webhook NAME" / "VERB resource[/sub]": [seconds summed, calls]} from the API server's
    histograms (calls since it started: a run's figure is the difference)."""
    out: dict[str, list[float]] = {}
    for line in (await kube.request_text("/metrics")).splitlines():
        prefix = next((p for p in LATENCY_SUMS if line.startswith(p + "sum{") or line.startswith(p + "count{")), None)
        if prefix is None:
            continue
        labels, value = line.rsplit(" ", 1)
        f = {k: v.strip('"') for k, v in (kv.split("=", 1) for kv in labels[labels.index("{") + 1 : -1].split(","))}
        if LATENCY_SUMS[prefix] == "name":
            if "fluxnetes" not in f.get("name", ""):
                continue
            key = f"webhook {f['name']}"
        else:
            req = (f.get("verb", ""), f.get("resource", ""), f.get("subresource", ""))
            if req not in LATENCY_REQUESTS:
                continue
            key = f"{req[0]} {req[1]}{'/' + req[2] if req[2] else ''}"
        entry = out.setdefault(key, [0.0, 0.0])
        entry[0 if line[len(prefix):].startswith("sum{") else 1] += float(value)
    return out


def latency_means(before: dict[str, list[float]], after: dict[str, list[float]]) -> dict[str, dict[str, float]]:
    """Calls and mean milliseconds per kind over a run (the difference of two ``latency_sums``)."""
    out: dict[str, dict[str, float]] = {}
    for key, (total, calls) in sorted(after.items()):
        t0, c0 = before.get(key, [0.0, 0.0])
        if calls - c0 >= 1:
            out[key] = {"calls": int(calls - c0), "mean_ms": round(1000 * (total - t0) / (calls - c0), 1)}
    return out


# the API server's own view of why its requests may wait (issue #31: fluxnetes' paths saw every
# request 2.5-3x slower without more API server CPU): watchers closed for not reading (a slow
# watcher holds up the dispatch of its resource's events to every watcher first), the time
# requests queued in API Priority and Fairness, etcd's latency; with the machine's CPU pressure
EVIDENCE_METRICS = {
    "apiserver_terminated_watchers_total{": "terminated_watchers",
    "apiserver_flowcontrol_request_wait_duration_seconds_sum{": "apf_wait_sum",
    "apiserver_flowcontrol_request_wait_duration_seconds_count{": "apf_wait_count",
    # (the dev cluster's clients are all system:masters: their requests are exempt from APF,
    # never queued; counted per priority level to show it)
    "apiserver_flowcontrol_dispatched_requests_total{": "apf_dispatched",
    "etcd_request_duration_seconds_sum{": "etcd_sum",
    "etcd_request_duration_seconds_count{": "etcd_count",
}
# what an operator's log says when a watch of its informers restarts (k8s/informer.py)
WATCH_RESTART_MARKS = (b" watch ended", b" watch failed", b" watch interrupted")


async def evidence_counters(kube: Kube) -> dict[str, float]:
    """{"<what> <resource, priority level or etcd type>": value} from the API server's metrics."""
    out: dict[str, float] = {}
    for line in (await kube.request_text("/metrics")).splitlines():
        what = next((w for prefix, w in EVIDENCE_METRICS.items() if line.startswith(prefix)), None)
        if what is None and line.startswith("apiserver_request_total{") and 'verb="WATCH"' in line:
            what = "watch_requests"  # a watch closed by the server is opened again: counted here
        if what is None:
            continue
        labels, value = line.rsplit(" ", 1)
        f = {k: v.strip('"') for k, v in (kv.split("=", 1) for kv in labels[labels.index("{") + 1 : -1].split(","))}
        if what.startswith("apf_wait") and f.get("execute") != "true":
            continue  # (rejected requests: none expected; their wait is not a request's latency)
        key = f"{what} {f.get('resource') or f.get('priority_level') or f.get('type', '')}"
        out[key] = out.get(key, 0.0) + float(value)
    return out


def cpu_pressure_us() -> float | None:
    """The machine's CPU pressure (PSI "some": µs in which a runnable task waited for a core)."""
    try:
        first = Path("/proc/pressure/cpu").read_text().splitlines()[0]
    except OSError:
        return None
    return float(first.rsplit("total=", 1)[1])


def watch_restarts(log: Path) -> int:
    """How many times the operator's informers' watches ended or broke, by its log so far."""
    try:
        text = log.read_bytes()
    except OSError:
        return 0
    return sum(text.count(mark) for mark in WATCH_RESTART_MARKS)


def evidence(before: dict[str, float], after: dict[str, float], seconds: float,
             psi: tuple[float | None, float | None], restarts: int | None) -> dict[str, Any]:
    """One run's evidence: watchers terminated per resource, APF mean wait per priority level
    (ms, with the requests), etcd mean latency per type (ms; pods, jobs and all), the share of
    the run in which some task waited for a core, the operator's watch restarts."""
    d = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
    out: dict[str, Any] = {
        "terminated_watchers": {k.split(" ", 1)[1]: int(v) for k, v in d.items()
                                if k.startswith("terminated_watchers ") and v > 0},
        "apf_wait_ms": {}, "etcd_ms": {},
        "apf_dispatched": {k.split(" ", 1)[1]: int(v) for k, v in d.items() if k.startswith("apf_dispatched ") and v > 0},
        "watch_requests": {k.split(" ", 1)[1]: int(v) for k, v in d.items() if k.startswith("watch_requests ") and v > 0},
    }
    for k, n in d.items():
        what, _, name = k.partition(" ")
        if what == "apf_wait_count" and n > 0:
            out["apf_wait_ms"][name] = {"mean": round(1000 * d.get(f"apf_wait_sum {name}", 0.0) / n, 2),
                                        "requests": int(n)}
    etcd_n = sum(v for k, v in d.items() if k.startswith("etcd_count "))
    etcd_s = sum(v for k, v in d.items() if k.startswith("etcd_sum "))
    if etcd_n > 0:
        out["etcd_ms"]["all"] = {"mean": round(1000 * etcd_s / etcd_n, 3), "requests": int(etcd_n)}
    for k, n in d.items():
        if k.startswith("etcd_count ") and n > 0 and k.split(" ", 1)[1] in ("pods", "jobs"):
            name = k.split(" ", 1)[1]
            out["etcd_ms"][name] = {"mean": round(1000 * d.get(f"etcd_sum {name}", 0.0) / n, 3), "requests": int(n)}
    if psi[0] is not None and psi[1] is not None and seconds > 0:
        out["cpu_pressure_some_pct"] = round(100 * (psi[1] - psi[0]) / 1e6 / seconds, 1)
    if restarts is not None:
        out["operator_watch_restarts"] = restarts
    return out


async def profile_windows(args: argparse.Namespace, cluster: Cluster, stem: str, done: asyncio.Event) -> list[str]:
    """The API server's CPU profile in consecutive windows of --pprof-seconds from now until
    ``done`` is set (the run is over: the window then running is the last), one file each:
    together they cover the whole run (read them merged: ``go tool pprof -top FILES``)."""
    files: list[str] = []
    while not done.is_set():
        out = Path(args.pprof) / f"{stem}-w{len(files)}.pprof"
        out.parent.mkdir(parents=True, exist_ok=True)
        with out.open("wb") as fh:
            prof = await asyncio.create_subprocess_exec(
                str(cluster.tools.binary("kubectl")), f"--kubeconfig={cluster.kubeconfig}", "get",
                "--raw", f"/debug/pprof/profile?seconds={args.pprof_seconds}", stdout=fh)
            await prof.wait()
        files.append(str(out))
    return files


async def wait_gone(kube: Kube, ns: str, timeout: float) -> float | None:
    """Seconds until namespace ``ns`` was gone (None: still there after ``timeout``)."""
    start = time.monotonic()
    while time.monotonic() < start + timeout:
        if await kube.get_or_none(NAMESPACES, ns) is None:
            return round(time.monotonic() - start, 1)
        await asyncio.sleep(1)
    print(f"namespace {ns} still terminating after {timeout:.0f} s", file=sys.stderr)
    return None


async def webhook_latency(n: int) -> dict[str, Any]:
    bundle = certs.make_bundle(["127.0.0.1"])
    server = WebhookServer("127.0.0.1", 0, bundle, lambda: {"operator"})
    port = await server.start()
    ctx = ssl.create_default_context(cadata=bundle.ca_crt.decode())
    lat: list[float] = []
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx, limit=1)) as s:
            for i in range(n):
                pod = {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {
                        "name": f"p{i}",
                        "namespace": "ns",
                        "labels": {"app": "x"},
                        "ownerReferences": [
                            {
                                "apiVersion": "batch/v1",
                                "kind": "Job",
                                "name": "j",
                                "uid": "u",
                                "controller": True,
                            }
                        ],
                    },
                    "spec": {
                        "containers": [
                            {
                                "name": "c",
                                "image": "busybox",
                                "resources": {"requests": {"cpu": "1", "memory": "64Mi"}},
                            }
                        ]
                    },
                }
                review = {
                    "apiVersion": "admission.k8s.io/v1",
                    "kind": "AdmissionReview",
                    "request": {
                        "uid": str(i),
                        "operation": "CREATE",
                        "kind": {"kind": "Pod"},
                        "object": pod,
                    },
                }
                t = time.perf_counter()
                async with s.post(f"https://127.0.0.1:{port}/mutate-pods", json=review) as r:
                    await r.read()
                lat.append((time.perf_counter() - t) * 1000)
    finally:
        await server.stop()
    lat = lat[min(50, n // 10) :]  # warm-up (TLS handshake, first imports)
    lat.sort()
    return {
        "requests": len(lat),
        "p50_ms": round(statistics.median(lat), 3),
        "p99_ms": round(lat[int(len(lat) * 0.99) - 1], 3),
        "max_ms": round(lat[-1], 3),
    }


async def apiserver_webhook_view(kube: Kube) -> dict[str, Any]:
    """The API server's own histogram of fluxnetes' webhook calls (network + TLS + handler):
    calls, and the share answered within 5 ms / 25 ms (the histogram's bucket bounds)."""
    text = await kube.request_text("/metrics")
    out: dict[str, Any] = {}
    for line in text.splitlines():
        if not line.startswith("apiserver_admission_webhook_admission_duration_seconds_bucket{"):
            continue
        labels, value = line.rsplit(" ", 1)
        fields = dict(kv.split("=", 1) for kv in labels[labels.index("{") + 1 : -1].split(","))
        name = fields.get("name", "").strip('"')
        if "fluxnetes" not in name:
            continue
        le = fields.get("le", "").strip('"')
        entry = out.setdefault(name, {})
        entry[le] = entry.get(le, 0) + float(value)
    view: dict[str, Any] = {}
    for name, buckets in out.items():
        total = buckets.get("+Inf", 0)
        if not total:
            continue
        view[name] = {
            "calls": int(total),
            "within_5ms": round(buckets.get("0.005", 0) / total, 4),
            "within_25ms": round(buckets.get("0.025", 0) / total, 4),
        }
    return view


async def start_operator(
    args: argparse.Namespace, cluster: Cluster, mode: str, extra: list[str] | None = None,
    label: str | None = None, src: str | None = None,
) -> subprocess.Popen[bytes]:
    label = label or mode
    log = open(Path(args.workdir) / f"operator-{label}.log", "wb")  # noqa: SIM115
    argv = [
        sys.executable,
        "-m",
        "fluxnetes.k8s",
        "run",
        "--kubeconfig",
        str(cluster.kubeconfig),
        "--webhook-port",
        "0",
        "--log-level",
        "INFO",
        "--job-mode",
        mode,
        "--metrics-port",  # (its collector's seconds: operator_gc_seconds)
        str(_free_port()),
        *(extra or []),
    ]
    env = {**os.environ, "PYTHONPATH": src} if src else None  # another checkout's code
    for item in args.variant_env:  # LABEL=NAME=VALUE: e.g. a compiled build's switch
        which, _, setting = item.partition("=")
        if f"fluxnetes_{which}" == label and env is not None:
            name, _, value = setting.partition("=")
            env[name] = value
    # a --variant-nice operator runs at a lower CPU priority (a diagnostic: does its CPU, on the
    # cores it shares with etcd and the API server, set their latency?)
    nice = next((int(v.partition("=")[2]) for v in args.variant_nice
                 if f"fluxnetes_{v.partition('=')[0]}" == label), 0)
    op = subprocess.Popen((["nice", "-n", str(nice)] if nice else []) + argv,  # (nice execs: same pid)
                          stdout=log, stderr=subprocess.STDOUT, env=env)
    op.metrics_port = int(argv[argv.index("--metrics-port") + 1])  # type: ignore[attr-defined]
    path = Path(args.workdir) / f"operator-{label}.log"
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and "operator ready" not in path.read_text():
        await asyncio.sleep(0.5)
    return op


def _spy(args: argparse.Namespace, op: subprocess.Popen[bytes], name: str) -> subprocess.Popen[bytes]:
    """py-spy recording the operator (and its webhook process) from now until it is sent
    SIGINT: the measured window only, not the start-up's imports or the namespace's deletion
    after it. Its own CPU is not counted as the operator's (it attaches by pid)."""
    out = Path(args.profile_operator) / f"operator-{name}.txt"
    out.parent.mkdir(parents=True, exist_ok=True)
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    return subprocess.Popen([spy, "record", "--pid", str(op.pid), "--format", "raw", "--nonblocking", "--gil",
                             "--subprocesses", "--rate", "50", "--output", str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


COMPONENTS = ("kube-apiserver", "etcd", "kube-controller-manager", "kube-scheduler", "kwok")


def _component_cpu(cluster: Cluster) -> dict[str, float]:
    """CPU seconds used so far by each of this cluster's processes (all share this machine's
    cores: the split shows where a workload's time goes)."""
    import psutil

    out: dict[str, float] = {}
    for name, pid in cluster.pids.items():
        if name in COMPONENTS:
            with contextlib.suppress(psutil.Error):
                t = psutil.Process(pid).cpu_times()
                out[name] = t.user + t.system
    return out


def _schedstat(pid: int) -> float:
    """Seconds the threads of process ``pid`` have spent runnable but waiting for a core
    (/proc/PID/task/*/schedstat, second field; 0 where it cannot be read)."""
    waited = 0
    for f in Path(f"/proc/{pid}/task").glob("*/schedstat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            waited += int(f.read_text().split()[1])
    return waited / 1e9


def runqueue_wait(cluster: Cluster, op: subprocess.Popen[bytes] | None) -> dict[str, float]:
    """Seconds each component (and the operator with its webhook process) has waited for a
    core so far: on shared cores a request's latency grows by its handlers' waits, not their CPU."""
    out = {name: _schedstat(pid) for name, pid in cluster.pids.items() if name in COMPONENTS}
    if op is not None:
        import psutil

        with contextlib.suppress(psutil.Error):
            out["operator"] = sum(_schedstat(p.pid) for p in [psutil.Process(op.pid),
                                                              *psutil.Process(op.pid).children(recursive=True)])
    return out


def _cpu_seconds(op: subprocess.Popen[bytes] | None) -> float:
    if op is None:
        return 0.0
    import psutil

    try:
        proc = psutil.Process(op.pid)
        procs = [proc, *proc.children(recursive=True)]
        return sum(p.cpu_times().user + p.cpu_times().system for p in procs)
    except psutil.Error:
        return 0.0


async def idle_rates(cluster: Cluster, op: subprocess.Popen[bytes] | None, seconds: float) -> dict[str, float]:
    """CPU seconds per second of each component (and the operator, webhook included) while the
    cluster is idle (same nodes, no workload): the background a run's CPU figures include
    (node Lease renewals, controllers' resyncs, the operator's own timers)."""
    t0, comp0, op0 = time.monotonic(), _component_cpu(cluster), _cpu_seconds(op)
    await asyncio.sleep(seconds)
    dt, comp1 = time.monotonic() - t0, _component_cpu(cluster)
    rates = {k: (comp1.get(k, 0.0) - comp0.get(k, 0.0)) / dt for k in COMPONENTS}
    if op is not None:
        rates["operator"] = (_cpu_seconds(op) - op0) / dt
    return rates


def baseline_corrected(r: dict[str, Any], idle: list[dict[str, float]], seconds: float, pods: int) -> None:
    """Adds to run ``r`` the idle CPU rates (mean of the windows before and after it) and each
    component's CPU ms per pod with that rate x the run's ``seconds`` subtracted, beside the raw
    figure: a slower run no longer looks costlier per pod for the background it sat through."""
    rates = {k: statistics.mean(w.get(k, 0.0) for w in idle) for k in idle[0]}
    raw = {**r["component_cpu_seconds"], **({"operator": r["operator_cpu_seconds"]}
                                           if "operator_cpu_seconds" in r else {})}
    r["idle_cpu_rates"] = {k: round(v, 4) for k, v in rates.items()}
    r["measured_seconds"] = round(seconds, 2)
    r["cpu_ms_per_pod_raw"] = {k: round(1000 * v / pods, 2) for k, v in raw.items()}
    r["cpu_ms_per_pod_corrected"] = {k: round(1000 * (v - rates.get(k, 0.0) * seconds) / pods, 2)
                                     for k, v in raw.items()}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _gc_seconds(op: subprocess.Popen[bytes] | None) -> float | None:
    """The operator's cyclic garbage collector's seconds so far (its fluxnetes_gc_seconds_total,
    main process), None when it cannot be read."""
    port = getattr(op, "metrics_port", None)
    if port is None:
        return None
    try:
        async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{port}/metrics",
                                                       timeout=aiohttp.ClientTimeout(total=10)) as resp:
            text = await resp.text()
    except (TimeoutError, aiohttp.ClientError):
        return None
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("fluxnetes_gc_seconds_total{"))


def _rss_mb(op: subprocess.Popen[bytes]) -> float | None:
    """The operator's resident memory now (MB), its webhook process included."""
    import psutil

    try:
        proc = psutil.Process(op.pid)
        return round(sum(p.memory_info().rss for p in [proc, *proc.children(recursive=True)]) / 2**20, 1)
    except psutil.Error:
        return None


async def bench(args: argparse.Namespace, cluster: Cluster) -> dict[str, Any]:
    kube = await Kube.from_config(str(cluster.kubeconfig))
    # the benchmark's own watches (it counts the bound pods) read at once by default, not with
    # the operator's 10 ms pause after each read: this loop also sends the Jobs, and a watcher
    # that falls behind holds up the API server's dispatch of that resource's events to every
    # other watcher until it is closed (Pod watchers were closed in kube-scheduler's runs only,
    # 2026-11-30, s41e; ``bench_watches_opened`` in each run says whether it was this one)
    kube.watch_wait = args.bench_watch_wait
    results: dict[str, Any] = {}
    per_round: dict[str, dict[str, list[dict[str, Any]]]] = {}
    workloads = [("single_pod_jobs", args.jobs, 1), ("gang_jobs_of_10", args.gang_jobs, 10)]
    runs: list[tuple[str, str, list[str], str | None]] = [("default_scheduler", "", [], None)]
    if args.variant or args.variant_src:  # e.g. before/after a change, in the same run
        for v in args.variant:  # label=operator args
            label, _, extra = v.partition("=")
            runs.append((f"fluxnetes_{label}", args.job_modes[0], extra.split(), None))
        extra_of = dict(v.partition("=")[::2] for v in args.variant_args)
        for v in args.variant_src:  # label=a checkout's src/
            label, _, src = v.partition("=")
            runs.append((f"fluxnetes_{label}", args.job_modes[0], extra_of.get(label, "").split(),
                         str(Path(src).resolve())))
    else:
        runs += [
            (f"fluxnetes_{mode}" if len(args.job_modes) > 1 else "fluxnetes", mode, [], None)
            for mode in args.job_modes
        ]
    op = None
    try:
        # rounds alternate the runs so that a change of the machine's load (shared cores)
        # hits every label alike; each label reports its median round
        for label, mode, extra, src in runs * args.rounds:
            if op is not None:  # each mode gets a fresh operator
                op.send_signal(signal.SIGTERM)
                op.wait(timeout=30)
                op = None
            if mode:
                op = await start_operator(args, cluster, mode, extra, label, src)
            for name, jobs, size in workloads:
                if jobs <= 0:
                    continue
                ns = f"bench-{uuid.uuid4().hex[:6]}"
                # a --named variant: a namespace not opted in (no webhook call), the Jobs'
                # pod template naming fluxnetes as its scheduler (the operator still binds them)
                named = label.removeprefix("fluxnetes_") in args.named
                # a --beside variant: its operator runs, idle, while kube-scheduler places the
                # Jobs (a namespace not opted in, no scheduler name): does its presence alone
                # (its watches, its CPU) slow kube-scheduler's path?
                beside = label.removeprefix("fluxnetes_") in args.beside
                labels = {"fluxnetes.io/enabled": "true"} if mode and not named and not beside else {}
                body = {
                    "apiVersion": "v1",
                    "kind": "Namespace",
                    "metadata": {"name": ns, "labels": labels},
                }
                await kube.create(NAMESPACES, body)
                await asyncio.sleep(1)
                idle_ev = await evidence_counters(kube)
                idle = [await idle_rates(cluster, op, args.idle_seconds)] if args.idle_seconds > 0 else []
                load = os.getloadavg()[0]
                cpu0 = _cpu_seconds(op)
                gc0 = await _gc_seconds(op)
                comp0 = _component_cpu(cluster)
                wait0 = runqueue_wait(cluster, op)
                t_cpu0 = time.monotonic()
                req0 = await api_requests(kube)
                lat0 = await latency_sums(kube)
                ev0 = await evidence_counters(kube)
                psi0, t_psi0 = cpu_pressure_us(), time.monotonic()
                oplog = Path(args.workdir) / f"operator-{label}.log"
                restarts0 = watch_restarts(oplog) if op is not None else None
                prof = None
                run_over = asyncio.Event()
                if args.pprof:  # the API server's CPU profile over the whole run, in windows
                    stem = f"apiserver-{label}-{name}-r{len(per_round.get(name, {}).get(label, []))}"
                    prof = asyncio.ensure_future(profile_windows(args, cluster, stem, run_over))
                spy = _spy(args, op, f"{label}-{name}-{len(per_round.get(name, {}).get(label, []))}") \
                    if args.profile_operator and op is not None else None
                r = await run_workload(kube, ns, jobs, size, args.timeout, "fluxnetes" if named else None)
                if spy is not None:
                    spy.send_signal(signal.SIGINT)  # it writes its file and exits
                    await asyncio.get_running_loop().run_in_executor(None, spy.wait, 60)
                run_over.set()
                if prof is not None:
                    r["pprof_files"] = await prof
                comp1 = _component_cpu(cluster)
                t_cpu1 = time.monotonic()
                req1 = await api_requests(kube)
                r["apiserver_latency"] = latency_means(lat0, await latency_sums(kube))
                psi1, t_psi1 = cpu_pressure_us(), time.monotonic()  # (its own window: the scrapes between)
                r["evidence"] = evidence(ev0, await evidence_counters(kube), t_psi1 - t_psi0, (psi0, psi1),
                                         None if restarts0 is None else watch_restarts(oplog) - restarts0)
                wait1 = runqueue_wait(cluster, op)
                r["evidence"]["runqueue_wait_s"] = {k: round(v - wait0.get(k, 0.0), 2) for k, v in wait1.items()}
                # etcd's latency on the same cluster with no workload (the idle window before it)
                r["evidence"]["etcd_ms_idle_before"] = evidence(idle_ev, ev0, 1.0, (None, None), None)["etcd_ms"].get("all")
                pods = jobs * size
                per_pod = {k: round((v - req0.get(k, 0)) / pods, 2) for k, v in req1.items()}
                watch = {k: v for k, v in per_pod.items() if " WATCH_" in k}
                per_pod = {k: v for k, v in per_pod.items() if k not in watch}
                r["api_requests_per_pod"] = dict(sorted(((k, v) for k, v in per_pod.items() if v >= 0.05),
                                                        key=lambda kv: -kv[1]))
                # the streams that carry the workload (>= 1 event per pod): events and bytes sent
                busy = {k.split()[0] for k, v in watch.items() if k.endswith("WATCH_EVENTS") and v >= 1}
                r["watch_per_pod"] = {k: v for k, v in sorted(watch.items()) if k.split()[0] in busy}
                # writes per pod the workload causes: Lease renewals are left out (node and
                # component heartbeats: they follow the run's length, not its pods)
                r["api_writes_per_pod"] = round(sum(
                    v for k, v in per_pod.items()
                    if k.split()[-1] in WRITE_VERBS and not k.startswith("leases")), 2)
                r["component_cpu_seconds"] = {k: round(comp1.get(k, 0.0) - comp0.get(k, 0.0), 2) for k in COMPONENTS}
                r["load_average_1m_before"] = round(load, 2)
                if op is not None:
                    r["operator_cpu_seconds"] = round(_cpu_seconds(op) - cpu0, 2)  # incl. webhook process
                    r["operator_cpu_ms_per_pod"] = round(1000 * r["operator_cpu_seconds"] / pods, 2)
                    r["operator_rss_mb"] = _rss_mb(op)
                    gc1 = await _gc_seconds(op)
                    if gc0 is not None and gc1 is not None:
                        r["operator_gc_ms_per_pod"] = round(1000 * (gc1 - gc0) / pods, 3)
                r["namespace"] = ns  # (to find the run in an audit log: FLUXNETES_DEV_AUDIT)
                per_round.setdefault(name, {}).setdefault(label, []).append(r)
                await kube.delete(NAMESPACES, ns)
                # the next run starts on a quiet cluster: the namespace controller deleting
                # thousands of objects would otherwise load the API server during it
                # (10,000 Jobs took over 300 s to go at 5,000 nodes; recorded with the run)
                r["namespace_deleted_s"] = await wait_gone(kube, ns, max(300.0, 0.15 * pods))
                await asyncio.sleep(2)
                if idle:  # the idle window after the run, once its namespace is gone
                    idle.append(await idle_rates(cluster, op, args.idle_seconds))
                    baseline_corrected(r, idle, t_cpu1 - t_cpu0, pods)
                print(label, name, r, flush=True)
        for name, labels in per_round.items():
            for label, rs in labels.items():
                ordered = sorted(rs, key=lambda x: x["pods_per_second"] or 0.0)  # (None: timed out)
                median = dict(ordered[len(ordered) // 2])  # the upper median with an even count
                if len(rs) > 1:
                    median["pods_per_second_rounds"] = [x["pods_per_second"] for x in rs]
                    median["load_average_1m_rounds"] = [x["load_average_1m_before"] for x in rs]
                    median["rounds"] = [_round_digest(x) for x in rs]
                    for kind in ("raw", "corrected"):  # each component's median over the rounds
                        per = [x[f"cpu_ms_per_pod_{kind}"] for x in rs if f"cpu_ms_per_pod_{kind}" in x]
                        if per:
                            median[f"cpu_ms_per_pod_{kind}_median"] = {
                                k: round(statistics.median(p[k] for p in per), 2) for k in per[0]}
                results.setdefault(name, {})[label] = median
        results["apiserver_webhook_latency"] = await apiserver_webhook_view(kube)
    finally:
        if op is not None:
            op.send_signal(signal.SIGTERM)
            op.wait(timeout=30)
        await kube.close()
    for key, res in results.items():
        if key == "apiserver_webhook_latency":
            continue
        d = res.get("default_scheduler", {})
        for label, f in list(res.items()):
            if (
                label.startswith("fluxnetes")
                and d.get("pods_per_second")
                and f.get("pods_per_second")
            ):
                res[f"ratio_{label}_over_default"] = round(
                    f["pods_per_second"] / d["pods_per_second"], 2
                )
                if "api_writes_per_pod" in f and "api_writes_per_pod" in d:
                    res[f"extra_writes_per_pod_{label}"] = round(f["api_writes_per_pod"] - d["api_writes_per_pod"], 2)
                # rounds pair each fluxnetes run with the default run just before it (same load
                # on the shared cores): the per-round ratios and their median are the robust figure
                fr, dr = f.get("pods_per_second_rounds"), d.get("pods_per_second_rounds")
                if fr and dr and len(fr) == len(dr):
                    ratios = [round(a / b, 2) for a, b in zip(fr, dr, strict=True)]
                    res[f"ratio_{label}_over_default_rounds"] = ratios
                    res[f"ratio_{label}_over_default_median"] = round(statistics.median(ratios), 2)
    return results


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--nodes", type=int, default=100)
    ap.add_argument("--jobs", type=int, default=1000, help="single-pod Jobs")
    ap.add_argument("--gang-jobs", type=int, default=100, help="Jobs of 10 pods")
    ap.add_argument("--webhook-requests", type=int, default=2000)
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument(
        "--job-modes",
        default="auto",
        type=lambda t: t.split(","),
        help="operator --job-mode values to run, comma separated (auto: the operator's default; suspend; gate); "
        "--variant and --variant-src runs use the first",
    )
    ap.add_argument(
        "--variant",
        action="append",
        default=[],
        help="LABEL=ARGS: run the operator with these extra `fluxnetes run` arguments as "
        "fluxnetes_LABEL (repeatable; replaces --job-modes but for its first value, the job mode), e.g. before/after in one run",
    )
    ap.add_argument(
        "--variant-src",
        action="append",
        default=[],
        metavar="LABEL=DIR",
        help="run the operator from the checkout whose src/ is DIR as fluxnetes_LABEL (repeatable; "
        "with the first --job-modes value), e.g. --variant-src before=/tmp/wt/src --variant-src after=src",
    )
    ap.add_argument(
        "--variant-args",
        action="append",
        default=[],
        metavar="LABEL=ARGS",
        help="extra `fluxnetes run` arguments for the --variant-src of that label, e.g. "
        "--variant-args 'after=--fluxjobs waiting'",
    )
    ap.add_argument(
        "--variant-env",
        action="append",
        default=[],
        metavar="LABEL=NAME=VALUE",
        help="an environment variable for the operator of the --variant-src of that label "
        "(repeatable), e.g. --variant-env compiled=FLUXNETES_NATIVE_OPERATOR=1",
    )
    ap.add_argument("--variant-nice", action="append", default=[], metavar="LABEL=N",
                    help="run the operator of that --variant-src label at nice N (a diagnostic: the "
                    "operator's CPU against the control plane's on shared cores), e.g. --variant-nice nice10=10")
    ap.add_argument("--idle-seconds", type=float, default=5, help="length of the idle windows (no workload) "
                    "sampled before and after each run for the baseline-corrected CPU per pod (0: none)")
    ap.add_argument("--named", action="append", default=[], metavar="LABEL",
                    help="run the variant of that label without the webhook: its namespace not opted in, "
                    "the Jobs' pod template with schedulerName: fluxnetes (repeatable)")
    ap.add_argument("--beside", action="append", default=[], metavar="LABEL",
                    help="run the variant of that label as a control: its operator runs idle while "
                    "kube-scheduler places the Jobs (namespace not opted in, no scheduler name) (repeatable)")
    ap.add_argument("--bench-watch-wait", type=float, default=0.0, metavar="SECONDS",
                    help="the benchmark's own watches pause this long after each read (the operator's "
                    "WATCH_WAIT is 0.01; 0: read at once)")
    ap.add_argument("--rounds", type=int, default=1, help="repeat all runs, alternating")
    ap.add_argument("--output", default=str(RESULTS))
    ap.add_argument("--pprof", metavar="DIR", help="save the API server's CPU profile of each run here "
                    "(needs FLUXNETES_DEV_PROFILING=1; read with `go tool pprof -top FILE`)")
    ap.add_argument("--keep-logs", metavar="DIR", help="copy the operators' logs here at the end")
    ap.add_argument("--pprof-seconds", type=int, default=10, help="length of each profile window (windows "
                    "follow each other until the run is over)")
    ap.add_argument("--profile-operator", metavar="DIR", help="record each operator process with "
                    "py-spy (pip install py-spy; not a dependency) (GIL-holding samples: CPU) as collapsed stacks in "
                    "DIR/operator-LABEL-WORKLOAD-ROUND.txt, over each measured run only")
    args = ap.parse_args()
    if args.pprof:
        os.environ["FLUXNETES_DEV_PROFILING"] = "1"
    out: dict[str, Any] = {
        "benchmark": "operator_bench",
        "parameters": {
            "nodes": args.nodes,
            "node_shape": {"cpu": "32", "memory": "256Gi"},
            "jobs": args.jobs,
            "gang_jobs": args.gang_jobs,
            "gang_size": 10,
            "webhook_requests": args.webhook_requests,
            "rounds": args.rounds,
            "idle_seconds": args.idle_seconds,
            "job_modes": args.job_modes if not args.variant else None,
            "variants": dict(v.partition("=")[::2] for v in args.variant) or None,
            "variant_src": dict(v.partition("=")[::2] for v in args.variant_src) or None,
            "variant_args": dict(v.partition("=")[::2] for v in args.variant_args) or None,
            "variant_env": args.variant_env or None,
            "variant_nice": args.variant_nice or None,
            "named_no_webhook": args.named or None,
            "beside_kube_scheduler": args.beside or None,
            "bench_watch_wait": args.bench_watch_wait,
        },
        "machine": {
            "cpu_count": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
        },
        "targets": {"webhook_p99_ms": 5, "fluxnetes_pods_per_second": ">= default scheduler's",
                    "extra_writes_per_pod": "<= 1 (api_writes_per_pod: POST/PUT/PATCH/DELETE but Leases)"},
    }
    if args.webhook_requests > 0:  # (0: the admission handler's own latency is not measured)
        out["webhook"] = asyncio.run(webhook_latency(args.webhook_requests))
        print("webhook", out["webhook"], flush=True)
    with tempfile.TemporaryDirectory(prefix="fx-bench-") as tmp:
        args.workdir = tmp
        cluster = Cluster.up(
            ClusterOptions(
                nodes=NodeShape(count=args.nodes, cpu="32", memory="256Gi"),
                dir=Path(tmp) / "cluster",
                die_with_parent=True,
            )
        )
        try:
            out["workloads"] = asyncio.run(bench(args, cluster))
        finally:
            cluster.down()
            if args.keep_logs:
                Path(args.keep_logs).mkdir(parents=True, exist_ok=True)
                for log in Path(tmp).glob("operator-*.log"):
                    shutil.copy(log, Path(args.keep_logs) / log.name)
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
