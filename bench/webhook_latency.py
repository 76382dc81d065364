"""Where the time of a Job's admission webhook call goes (issue #31 item 3).

The API server reported ~170 ms per call to fluxnetes' Job webhook in the 1,000-node profile
runs, against a handler that answers in about a millisecond. This benchmark splits that time,
on a running dev cluster (``fluxnetes dev cluster up --dir DIR``), in one run, alternating:

* ``via_apiserver``: N Jobs created with 1 and with 32 creates in flight, into
  - an opted-in namespace (fluxnetes' webhook, served by the operator started here),
  - namespaces whose Jobs go to a minimal Go webhook (bench/webhook_control, one JSON-patch
    operation), served over HTTP/2 and over HTTP/1.1 only: the floor any webhook pays here,
  - a namespace without any webhook (the POST's own time).
  For each: the API server's own histogram (apiserver_admission_webhook_admission_duration_seconds)
  per call, fluxnetes' handler histogram, the CPU and run-queue wait (/proc/PID/task/*/schedstat)
  of the webhook process and of kube-apiserver per call, and the distinct TCP connections the
  API server held to the webhook (new TLS handshakes).
* ``direct``: the same Job AdmissionReview POSTed straight to the fluxnetes webhook from Python,
  one at a time and 32 at a time, on kept-alive connections and on a new connection each.
* ``strace`` (when strace exists): for 32-in-flight creates, the time inside the webhook
  process from a request's first bytes read to its answer written.

    .venv/bin/python bench/webhook_latency.py --cluster-dir /tmp/dev --jobs 100 --rounds 3

Writes bench/results/webhook_latency.json.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import glob
import json
import os
import re
import shutil
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

from fluxnetes.k8s import certs
from fluxnetes.k8s.kube import MUTATING, NAMESPACES, Kube, Resource

JOBS = Resource("batch/v1", "jobs")
HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "webhook_latency.json"
FLUX_HOOK = "workloads.mutate.fluxnetes.io"
CONTROL_CONFIG = "bench-webhook-control"


def job_body(name: str) -> dict[str, Any]:
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
            "spec": {"parallelism": 1, "completions": 1, "ttlSecondsAfterFinished": 60,
                     "template": {"spec": {"restartPolicy": "Never", "containers": [
                         {"name": "c", "image": "busybox",
                          "resources": {"requests": {"cpu": "1", "memory": "64Mi"}}}]}}}}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def sched(pid: int) -> tuple[float, float]:
    """(ms on CPU, ms runnable but waiting for a CPU) summed over the process's threads."""
    run = wait = 0
    for f in glob.glob(f"/proc/{pid}/task/*/schedstat"):
        with contextlib.suppress(OSError, ValueError):
            a, b, _ = Path(f).read_text().split()
            run, wait = run + int(a), wait + int(b)
    return run / 1e6, wait / 1e6


def connections(port: int) -> set[str]:
    out = subprocess.run(["ss", "-Htn", "state", "established", f"( sport = :{port} )"],
                         capture_output=True, text=True, check=False).stdout
    return {line.split()[-1] for line in out.splitlines() if line.strip()}


async def hook_sums(kube: Kube) -> dict[str, tuple[float, float]]:
    """{webhook name: (seconds summed, calls)} from the API server's admission histogram."""
    out: dict[str, list[float]] = {}
    for line in (await kube.request_text("/metrics")).splitlines():
        if not line.startswith("apiserver_admission_webhook_admission_duration_seconds_"):
            continue
        m = re.search(r'name="([^"]+)"', line)
        if not m or not (line.startswith(
                "apiserver_admission_webhook_admission_duration_seconds_sum")
                or line.startswith("apiserver_admission_webhook_admission_duration_seconds_count")):
            continue
        entry = out.setdefault(m[1], [0.0, 0.0])
        entry["_count" in line.split("{")[0]] += float(line.split()[-1])
    return {k: (v[0], v[1]) for k, v in out.items()}


def handler_sums(metrics_port: int) -> tuple[float, float]:
    """fluxnetes' own histogram of its Job answers (seconds summed, calls)."""
    import urllib.request

    text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).read().decode()
    s = c = 0.0
    for line in text.splitlines():
        if line.startswith('fluxnetes_webhook_duration_seconds_sum{kind="Job"'):
            s += float(line.split()[-1])
        elif line.startswith('fluxnetes_webhook_duration_seconds_count{kind="Job"'):
            c += float(line.split()[-1])
    return s, c


async def create_batch(kube: Kube, ns: str, prefix: str, n: int, conc: int, hook: str | None,
                       server_pid: int | None, server_port: int | None, apiserver_pid: int,
                       metrics_port: int | None) -> dict[str, Any]:
    seen: set[str] = set()
    stop = asyncio.Event()

    async def poll() -> None:
        while not stop.is_set() and server_port:
            seen.update(await asyncio.to_thread(connections, server_port))
            await asyncio.sleep(0.02)

    poller = asyncio.ensure_future(poll())
    load0 = os.getloadavg()[0]
    h0, f0 = await hook_sums(kube), handler_sums(metrics_port) if metrics_port else (0.0, 0.0)
    a0, w0 = sched(apiserver_pid), sched(server_pid) if server_pid else (0.0, 0.0)
    sem = asyncio.Semaphore(conc)
    lat: list[float] = []

    async def create(i: int) -> None:
        async with sem:
            t = time.perf_counter()
            await kube.create(JOBS, job_body(f"{prefix}-{i}"), ns)
            lat.append(time.perf_counter() - t)

    t0 = time.perf_counter()
    await asyncio.gather(*(create(i) for i in range(n)))
    wall = time.perf_counter() - t0
    stop.set()
    await poller
    a1, w1 = sched(apiserver_pid), sched(server_pid) if server_pid else (0.0, 0.0)
    h1, f1 = await hook_sums(kube), handler_sums(metrics_port) if metrics_port else (0.0, 0.0)
    lat.sort()
    r: dict[str, Any] = {
        "jobs": n, "in_flight": conc, "wall_s": round(wall, 3),
        "load_before": round(load0, 2), "load_after": round(os.getloadavg()[0], 2),
        "post_job_p50_ms": round(lat[len(lat) // 2] * 1000, 1),
        "post_job_mean_ms": round(statistics.mean(lat) * 1000, 1),
        "apiserver_cpu_ms_per_job": round((a1[0] - a0[0]) / n, 2),
        "apiserver_runqueue_wait_ms_per_job": round((a1[1] - a0[1]) / n, 2),
    }
    if hook:
        s0, c0 = h0.get(hook, (0.0, 0.0))
        s1, c1 = h1.get(hook, (0.0, 0.0))
        r["apiserver_webhook_calls"] = c1 - c0
        r["apiserver_webhook_mean_ms"] = round((s1 - s0) / max(1.0, c1 - c0) * 1000, 2)
        r["webhook_process_cpu_ms_per_call"] = round((w1[0] - w0[0]) / n, 3)
        r["webhook_process_runqueue_wait_ms_per_call"] = round((w1[1] - w0[1]) / n, 3)
        r["distinct_connections_to_webhook"] = len(seen)
    if metrics_port:
        r["handler_mean_ms"] = round((f1[0] - f0[0]) / max(1.0, f1[1] - f0[1]) * 1000, 3)
    return r


def review_of(job: dict[str, Any]) -> dict[str, Any]:
    job = {**job, "metadata": {**job["metadata"], "namespace": "ns"}}
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "1", "operation": "CREATE", "namespace": "ns",
                        "kind": {"group": "batch", "version": "v1", "kind": "Job"},
                        "resource": {"group": "batch", "version": "v1", "resource": "jobs"},
                        "object": job}}


async def direct(url: str, n: int, pid: int) -> list[dict[str, Any]]:
    """Python client straight to the webhook: the server's answer time without the API server."""
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    body = review_of(job_body("x"))
    out = []
    for conc, new_conn in [(1, False), (1, True), (32, False), (32, True)]:
        lat: list[float] = []
        cpu0 = sched(pid)
        conn = aiohttp.TCPConnector(ssl=ctx, limit=conc, force_close=new_conn)
        async with aiohttp.ClientSession(connector=conn) as s:
            sem = asyncio.Semaphore(conc)

            async def one(s: aiohttp.ClientSession = s, sem: asyncio.Semaphore = sem,
                          lat: list[float] = lat) -> None:
                async with sem:
                    t = time.perf_counter()
                    async with s.post(url, json=body) as resp:
                        await resp.read()
                    lat.append((time.perf_counter() - t) * 1000)

            await asyncio.gather(*(one() for _ in range(n)))
        lat.sort()
        cpu1 = sched(pid)
        out.append({"in_flight": conc, "new_connection_each": new_conn, "requests": n,
                    "server_cpu_ms_per_request": round((cpu1[0] - cpu0[0]) / n, 3),
                    "server_runqueue_wait_ms_per_request": round((cpu1[1] - cpu0[1]) / n, 3),
                    "p50_ms": round(lat[n // 2], 2), "mean_ms": round(statistics.mean(lat), 2),
                    "p99_ms": round(lat[int(n * 0.99) - 1], 2), "load": round(os.getloadavg()[0], 2)})
    return out


def strace_span(path: Path) -> dict[str, Any]:
    """Per request: first recvfrom on a connection -> the sendto of its answer (ms)."""
    rx = re.compile(r"^\d+\s+(\d+):(\d+):([\d.]+) (recvfrom|sendto)\((\d+),.*= \d+$")
    start: dict[str, float] = {}
    spans: list[float] = []
    for line in path.read_text().splitlines():
        m = rx.match(line.strip())
        if not m:
            continue
        t = int(m[1]) * 3600 + int(m[2]) * 60 + float(m[3])
        if m[4] == "recvfrom":
            start.setdefault(m[5], t)
        elif m[5] in start:
            spans.append((t - start.pop(m[5])) * 1000)
    spans.sort()
    if not spans:
        return {"requests": 0}
    return {"requests": len(spans), "p50_ms": round(spans[len(spans) // 2], 2),
            "mean_ms": round(statistics.mean(spans), 2), "p90_ms": round(spans[int(len(spans) * 0.9)], 2),
            "max_ms": round(spans[-1], 2)}


async def wait_log(path: Path, pattern: str, timeout: float = 120) -> re.Match[str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        m = re.search(pattern, path.read_text() if path.exists() else "")
        if m:
            return m
        await asyncio.sleep(0.3)
    raise SystemExit(f"{path}: no {pattern!r} within {timeout}s")


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cluster-dir", required=True, help="a running dev cluster's directory")
    ap.add_argument("--jobs", type=int, default=100, help="Jobs per batch")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--direct-requests", type=int, default=300)
    ap.add_argument("--output", default=str(RESULTS))
    args = ap.parse_args()
    state = json.loads((Path(args.cluster_dir) / "state.json").read_text())
    kubeconfig = state["kubeconfig"]
    apiserver_pid = next(p["pid"] for p in state["processes"] if p["name"] == "kube-apiserver")
    kube = await Kube.from_config(kubeconfig)
    work = Path(tempfile.mkdtemp(prefix="webhook-latency-"))
    procs: list[subprocess.Popen[bytes]] = []
    operator: list[subprocess.Popen[bytes]] = []
    out: dict[str, Any] = {"benchmark": "webhook_latency", "parameters": vars(args),
                           "machine": {"cpu_count": os.cpu_count(), "load_start": os.getloadavg()}}
    try:
        # fluxnetes: the operator as users run it (the webhook in its own process)
        async def start_operator(rnd: int) -> tuple[int, int, int]:
            for p in operator:
                p.terminate()
                p.wait(timeout=30)
            operator.clear()
            metrics_port = free_port()
            oplog = work / f"operator-{rnd}.log"
            operator.append(subprocess.Popen(
                [sys.executable, "-m", "fluxnetes.k8s", "run", "--kubeconfig", kubeconfig, "--webhook-port", "0",
                 "--metrics-port", str(metrics_port), "--log-level", "INFO"],
                stdout=oplog.open("wb"), stderr=subprocess.STDOUT))
            m = await wait_log(oplog, r"webhook serving on https://127\.0\.0\.1:(\d+) \(process (\d+)\)")
            await wait_log(oplog, "operator ready")
            await asyncio.sleep(2)  # the API server sees the webhook configuration's new URL
            return int(m[1]), int(m[2]), metrics_port

        flux_port, flux_pid, metrics_port = await start_operator(0)
        # the Go control webhook, over HTTP/2 and over HTTP/1.1
        exe = work / "control"
        subprocess.run(["go", "build", "-o", str(exe), str(HERE / "webhook_control" / "main.go")],
                       check=True, env={**os.environ, "GO111MODULE": "off"})
        bundle = certs.make_bundle(["127.0.0.1"])
        (work / "tls.crt").write_bytes(bundle.tls_crt)
        (work / "tls.key").write_bytes(bundle.tls_key)
        controls: dict[str, tuple[int, int]] = {}
        for proto in ("h2", "h1"):
            p = subprocess.Popen([str(exe), "-cert", str(work / "tls.crt"), "-key", str(work / "tls.key"),
                                  *(["-h1"] if proto == "h1" else [])], stdout=subprocess.PIPE)
            procs.append(p)
            assert p.stdout is not None
            controls[proto] = (int(p.stdout.readline()), p.pid)
        import base64

        ca = base64.b64encode(bundle.ca_crt).decode()
        hooks = [{"name": f"control-{proto}.bench.fluxnetes.io", "admissionReviewVersions": ["v1"],
                  "sideEffects": "None", "failurePolicy": "Fail", "timeoutSeconds": 10,
                  "reinvocationPolicy": "Never",
                  "clientConfig": {"url": f"https://127.0.0.1:{port}/mutate", "caBundle": ca},
                  "namespaceSelector": {"matchLabels": {"bench.fluxnetes.io/control": proto}},
                  "rules": [{"apiGroups": ["batch"], "apiVersions": ["v1"], "operations": ["CREATE"],
                             "resources": ["jobs"]}]}
                 for proto, (port, _) in controls.items()]
        with contextlib.suppress(Exception):
            await kube.delete(MUTATING, CONTROL_CONFIG)
        await kube.create(MUTATING, {"apiVersion": "admissionregistration.k8s.io/v1",
                                     "kind": "MutatingWebhookConfiguration",
                                     "metadata": {"name": CONTROL_CONFIG}, "webhooks": hooks})
        tag = str(int(time.time()))[-6:]
        systems: dict[str, dict[str, Any]] = {
            "fluxnetes": {"labels": {"fluxnetes.io/enabled": "true"}, "hook": FLUX_HOOK,
                          "pid": flux_pid, "port": flux_port, "metrics": metrics_port},
            "go_control_h2": {"labels": {"bench.fluxnetes.io/control": "h2"},
                              "hook": "control-h2.bench.fluxnetes.io", "pid": controls["h2"][1],
                              "port": controls["h2"][0], "metrics": None},
            "go_control_h1": {"labels": {"bench.fluxnetes.io/control": "h1"},
                              "hook": "control-h1.bench.fluxnetes.io", "pid": controls["h1"][1],
                              "port": controls["h1"][0], "metrics": None},
            "no_webhook": {"labels": {}, "hook": None, "pid": None, "port": None, "metrics": None},
        }
        for name, s in systems.items():
            s["ns"] = f"wl-{name.replace('_', '-')}-{tag}"
            await kube.create(NAMESPACES, {"metadata": {"name": s["ns"], "labels": s["labels"]}})
        await asyncio.sleep(3)  # the API server's namespace informer sees the labels
        runs: list[dict[str, Any]] = []
        order = list(systems)
        for rnd in range(args.rounds):
            for conc in (1, 32):
                for name in order[rnd % len(order):] + order[:rnd % len(order)]:  # rotate who goes first
                    s = systems[name]
                    r = await create_batch(kube, s["ns"], f"r{rnd}c{conc}", args.jobs, conc, s["hook"],
                                           s["pid"], s["port"], apiserver_pid, s["metrics"])
                    r.update(system=name, round=rnd)
                    print(json.dumps(r), flush=True)
                    runs.append(r)
        out["via_apiserver"] = runs
        summary: dict[str, Any] = {}
        for name in sorted({r["system"] for r in runs}):
            for conc in (1, 32):
                rs = [r for r in runs if r["system"] == name and r["in_flight"] == conc]
                summary[f"{name} in_flight={conc}"] = {
                    k: round(statistics.median(r[k] for r in rs), 2)
                    for k in rs[0] if isinstance(rs[0][k], float | int) and k not in ("round", "jobs", "in_flight")}
        out["via_apiserver_medians"] = summary
        out["direct_fluxnetes"] = await direct(f"https://127.0.0.1:{flux_port}/mutate-workloads",
                                               args.direct_requests, flux_pid)
        print("direct", json.dumps(out["direct_fluxnetes"]), flush=True)
        if shutil.which("strace"):
            trace = work / "strace.txt"
            st = subprocess.Popen(["strace", "-f", "-p", str(flux_pid), "-tt", "-e", "trace=recvfrom,sendto",
                                   "-o", str(trace)], stderr=subprocess.DEVNULL)
            await asyncio.sleep(1)
            s = systems["fluxnetes"]
            r = await create_batch(kube, s["ns"], "strace", args.jobs, 32, s["hook"], None, None,
                                   apiserver_pid, None)
            st.terminate()
            st.wait()
            out["strace_fluxnetes_in_flight_32"] = {
                "note": "strace slows the traced process: an upper bound",
                "inside_webhook_process": strace_span(trace),
                "apiserver_webhook_mean_ms_same_batch": r.get("apiserver_webhook_mean_ms")}
            print("strace", json.dumps(out["strace_fluxnetes_in_flight_32"]), flush=True)
        for s in systems.values():
            with contextlib.suppress(Exception):
                await kube.delete(NAMESPACES, s["ns"])
        with contextlib.suppress(Exception):
            await kube.delete(MUTATING, CONTROL_CONFIG)
    finally:
        for p in procs + operator:
            p.terminate()
        for p in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=10)
        await kube.close()
    out["machine"]["load_end"] = os.getloadavg()
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(out, indent=1) + "\n")
    print("wrote", args.output)


if __name__ == "__main__":
    asyncio.run(main())
