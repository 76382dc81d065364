"""The operator's CPU per HTTP exchange, both sides of it, without a cluster (issue #31).

Two measures, each run for every ``--src`` (a checkout's ``src/``) in its own process,
alternating ``--rounds`` times, so an earlier checkout and this one are compared in one run:

* ``client``: the CPU (process time) the operator's API client (``fluxnetes.k8s.kube.Kube``)
  spends per write, over TLS on kept-alive connections, to a small local server that answers
  as the API server does (a Binding POST gets a ~200-byte Status, an Event POST its ~900-byte
  Event back, a pod PATCH a ~3.5 KB Pod). ``--in-flight`` writes at a time. The server is the
  same for every src (it is this file's), in a process of its own; only the client's CPU is
  counted.
* ``webhook``: the CPU (``/proc/PID/schedstat``) of the webhook process
  (``WebhookServer.start_in_process``, as ``fluxnetes run`` serves it) per Job
  AdmissionReview POSTed to it, on kept-alive connections and on a new connection each (the
  API server opens new ones often: bench/results/webhook_latency.json).

    .venv/bin/python bench/http_costs.py --src /tmp/before/src --src src --rounds 3

Writes bench/results/http_costs.json (``--output``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = HERE / "results" / "http_costs.json"

# the answering server: one process, TLS, HTTP/1.1 keep-alive (aiohttp's)
SERVER = r"""
import asyncio, datetime, ssl, sys, tempfile, os
from aiohttp import web
from fluxnetes.k8s.certs import make_ca, make_serving
ca_crt, ca_key = make_ca(datetime.datetime.now(datetime.timezone.utc))
crt, key = make_serving(ca_crt, ca_key, ["localhost"], datetime.datetime.now(datetime.timezone.utc))
STATUS = b'{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Success","code":201}'
POD = (b'{"kind":"Pod","apiVersion":"v1","metadata":{"name":"x","namespace":"ns","uid":"u","labels":{"a":"b"},'
       + b'"annotations":{"x":"' + b"y" * 3000 + b'"}},"spec":{"nodeName":"n1"},"status":{"phase":"Pending"}}')

async def handle(request):
    body = await request.read()
    if request.path.endswith("/binding"):
        return web.Response(body=STATUS, status=201, content_type="application/json")
    if "/events" in request.path:
        return web.Response(body=body, status=201, content_type="application/json")
    return web.Response(body=POD, content_type="application/json")

async def main():
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    with tempfile.TemporaryDirectory() as d:
        open(d + "/c", "wb").write(crt); open(d + "/k", "wb").write(key)
        ctx.load_cert_chain(d + "/c", d + "/k")
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ctx)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    open(sys.argv[1], "wb").write(ca_crt)
    print(port, flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""

CLIENT = r"""
import asyncio, json, ssl, sys, time
from fluxnetes.k8s.kube import Kube, PODS, EVENTS, JSON_PATCH
port, ca, n, in_flight = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
ctx = ssl.create_default_context(cafile=ca)
ctx.check_hostname = False
BINDING = {"apiVersion": "v1", "kind": "Binding",
           "metadata": {"name": "j1-abcde", "namespace": "ns", "uid": "pod-j1",
                        "annotations": {"fluxnetes.io/fluxjob": "job-j1", "fluxnetes.io/slot": "0",
                                        "fluxnetes.io/jobid": "17"}},
           "target": {"apiVersion": "v1", "kind": "Node", "name": "kwok-node-17"}}
EVENT = {"apiVersion": "v1", "kind": "Event", "metadata": {"generateName": "j1-abcde.", "namespace": "ns"},
         "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": "j1-abcde", "namespace": "ns", "uid": "pod-j1"},
         "type": "Normal", "reason": "Scheduled", "message": "fluxnetes placed the pod on kwok-node-17 (job 17, slot 0)",
         "source": {"component": "fluxnetes"}, "reportingComponent": "fluxnetes", "reportingInstance": "op-1",
         "firstTimestamp": "2026-11-30T04:00:00.000000Z", "lastTimestamp": "2026-11-30T04:00:00.000000Z", "count": 1}
PATCH = [{"op": "test", "path": "/spec/schedulingGates/0/name", "value": "fluxnetes.io/gate"},
         {"op": "add", "path": "/spec/affinity", "value": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
             "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["kwok-node-17"]}]}]}}}},
         {"op": "remove", "path": "/spec/schedulingGates/0"}]

async def main():
    kube = Kube(f"https://127.0.0.1:{port}", ctx, {"Accept": "application/json", "Authorization": "Bearer x"})
    out = {}
    writes = {
        "binding": lambda i: kube.request("POST", PODS.path("ns", f"j{i}-abcde", "binding"), BINDING),
        "event": lambda i: kube.create(EVENTS, EVENT, "ns", background=True),
        "pod_patch": lambda i: kube.patch(PODS, f"j{i}-abcde", PATCH, "ns", content_type=JSON_PATCH),
    }
    for name, call in writes.items():
        sem = asyncio.Semaphore(in_flight)
        async def one(i):
            async with sem:
                await call(i)
        await asyncio.gather(*(one(i) for i in range(200)))  # warm: connections open, code paths hot
        t = time.process_time()
        await asyncio.gather(*(one(i) for i in range(n)))
        out[name] = round((time.process_time() - t) / n * 1e6, 1)
    await kube.close()
    print(json.dumps(out))

try:  # the operator's loop (fluxnetes run: uvloop when installed)
    from fluxnetes.k8s.event_loop import loop_factory
    factory = loop_factory("auto")[0]
except ImportError:
    factory = None
with asyncio.Runner(loop_factory=factory) as runner:
    runner.run(main())
"""

WEBHOOK = r"""
import asyncio, json, os, ssl, sys, time, datetime
import aiohttp
from fluxnetes.k8s.certs import CertBundle, make_ca, make_serving
from fluxnetes.k8s.admission.webhook import WebhookServer
from fluxnetes.k8s.admission import webhook_config
n, job = int(sys.argv[1]), json.loads(sys.argv[2])
now = datetime.datetime.now(datetime.timezone.utc)
ca_crt, ca_key = make_ca(now)
crt, key = make_serving(ca_crt, ca_key, ["localhost"], now)
bundle = CertBundle(ca_crt=ca_crt, ca_key=ca_key, tls_crt=crt, tls_key=key)
review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
          "request": {"uid": "705ab4f5-6393-11e8-b7cc-42010a800002", "operation": "CREATE", "namespace": "ns",
                      "kind": {"group": "batch", "version": "v1", "kind": "Job"},
                      "resource": {"group": "batch", "version": "v1", "resource": "jobs"},
                      "userInfo": {"username": "admin", "groups": ["system:masters", "system:authenticated"]},
                      "object": job, "oldObject": None, "dryRun": False,
                      "options": {"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1"}}}
body = json.dumps(review).encode()

def cpu(pid):
    run, wait, _ = open(f"/proc/{pid}/schedstat").read().split()
    return int(run) / 1e6

async def main():
    server = WebhookServer("127.0.0.1", 0, bundle, lambda: frozenset(["op"]), job_mode="auto", hold="auto")
    port = await server.start_in_process()
    pid = server._proc.pid
    url = f"https://127.0.0.1:{port}{webhook_config.MUTATE_WORKLOADS_PATH}?timeout=5s"
    ctx = ssl.create_default_context(cadata=ca_crt.decode())
    ctx.check_hostname = False
    out = {}
    for label, new_conn in (("kept_alive", False), ("new_connection_each", True)):
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx, limit=1, force_close=new_conn)) as s:
            async def one():
                async with s.post(url, data=body, headers={"Content-Type": "application/json"}) as resp:
                    answer = json.loads(await resp.read())
                    assert answer["response"]["allowed"] and answer["response"]["uid"] == review["request"]["uid"], answer
                    return answer
            first = await one()
            for _ in range(50):
                await one()
            c0 = cpu(pid)
            for _ in range(n):
                await one()
            out[label] = round((cpu(pid) - c0) / n * 1000, 1)
    out["patch"] = first["response"].get("patch")
    await server.stop()
    print(json.dumps(out))

asyncio.run(main())
"""


def child(code: str, src: Path, *args: str) -> dict[str, object]:
    env = {**os.environ, "PYTHONPATH": str(src.resolve())}
    out = subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"{src}: {out.stderr[-3000:]}")
    res: dict[str, object] = json.loads(out.stdout.strip().splitlines()[-1])
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--src", action="append", type=Path, help="a checkout's src/ (repeat; default: this tree's)")
    ap.add_argument("--writes", type=int, default=2000, help="client: writes of each kind per round")
    ap.add_argument("--in-flight", type=int, default=4, help="client: writes at a time")
    ap.add_argument("--reviews", type=int, default=1000, help="webhook: AdmissionReviews per round and way")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--output", type=Path, default=OUT)
    args = ap.parse_args()
    srcs = args.src or [HERE.parent / "src"]
    sys.path.insert(0, str(HERE))
    from operator_bench import job_body

    job = job_body("j1", 1)
    job["metadata"].update({"namespace": "ns", "uid": "job-j1-uid", "creationTimestamp": None})
    ca = Path(f"/tmp/http-costs-{os.getpid()}-ca.crt")
    server = subprocess.Popen([sys.executable, "-c", SERVER, str(ca)], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(srcs[-1].resolve())})
    load_before = os.getloadavg()
    runs = []
    try:
        assert server.stdout is not None
        port = server.stdout.readline().strip()
        for r in range(args.rounds):
            for src in srcs:
                c = child(CLIENT, src, port, str(ca), str(args.writes), str(args.in_flight))
                w = child(WEBHOOK, src, str(args.reviews), json.dumps(job))
                run = {"src": str(src), "round": r, "client_us_per_write": c, "webhook_us_per_review": w,
                       "load_1m": round(os.getloadavg()[0], 2)}
                print(json.dumps(run), flush=True)
                runs.append(run)
    finally:
        server.terminate()
        server.wait(timeout=10)
        ca.unlink(missing_ok=True)

    def med(src: str, part: str, key: str) -> float:
        return statistics.median(float(r[part][key]) for r in runs if r["src"] == src)  # type: ignore[index]

    summary = {str(s): {"client_us_per_write_median": {k: med(str(s), "client_us_per_write", k)
                                                       for k in ("binding", "event", "pod_patch")},
                        "webhook_us_per_review_median": {k: med(str(s), "webhook_us_per_review", k)
                                                         for k in ("kept_alive", "new_connection_each")}}
               for s in srcs}
    out = {"benchmark": "http_costs",
           "parameters": vars(args) | {"src": [str(s) for s in srcs], "output": str(args.output)},
           "machine": {"cpu_count": os.cpu_count(), "python": platform.python_version(),
                       "platform": platform.platform(), "load_before": [round(x, 2) for x in load_before],
                       "load_after": [round(x, 2) for x in os.getloadavg()]},
           "measure": "client: the operator's process time per API write (TLS, kept-alive, local server); "
                      "webhook: the webhook process's CPU (schedstat) per Job AdmissionReview",
           "summary": summary, "runs": runs}
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(out, indent=2, default=str) + "\n")
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
