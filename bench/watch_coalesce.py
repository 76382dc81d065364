"""What waiting between watch reads saves the reader (issue #31, item 3, lever 1).

A live watch delivers events one at a time, each its own TLS record; reading each as it comes
costs the reader ~180 µs of CPU (bench/watch_encoding.py), against ~10 µs per event when the
same bytes arrive in bursts. This serves a stream of Pod-sized JSON events over TLS from a
child process, one event per write every ``--gap-ms``, and reads it here the way ``Kube.watch``
does with each ``--wait-ms`` after a read, the reader's CPU µs per event for each (rounds
alternate the order; medians), and the events per read.

    PYTHONPATH=src python bench/watch_coalesce.py --out bench/results/watch_coalesce.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import ssl
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson
from watch_encoding import serve_tls  # (bench/ is this script's directory: on the path)


def event(i: int) -> bytes:
    """A Pod MODIFIED event about the size of a real one (~3.8 KB of JSON)."""
    obj = {"type": "MODIFIED", "object": {
        "kind": "Pod", "apiVersion": "v1",
        "metadata": {"name": f"job-{i}-x", "namespace": "bench", "uid": f"uid-{i}",
                     "resourceVersion": str(1000 + i), "labels": {"job-name": f"job-{i}"},
                     "annotations": {"a": "x" * 1500}},
        "spec": {"containers": [{"name": "c", "image": "busybox", "command": ["sleep", "1"]}],
                 "schedulerName": "fluxnetes", "nodeName": f"kwok-node-{i % 1000}"},
        "status": {"phase": "Running", "conditions": [{"type": t, "status": "True"} for t in
                                                      ("Initialized", "Ready", "ContainersReady", "PodScheduled")],
                   "padding": "y" * 1500}}}
    return orjson.dumps(obj) + b"\n"


def serve(cert: Path, key: Path, ports: Any) -> None:
    from aiohttp import web

    async def handler(request: web.Request) -> web.StreamResponse:
        n, gap = int(request.query["n"]), float(request.query["gap"])
        resp = web.StreamResponse()
        await resp.prepare(request)
        for i in range(n):
            await resp.write(event(i))
            await asyncio.sleep(gap)
        await resp.write_eof()
        return resp

    serve_tls("/", handler, cert, key, ports)


async def read_once(session: Any, port: int, n: int, gap: float, wait: float) -> tuple[float, float]:
    """One stream read with ``read_watch_batches`` (the operator's reader); (CPU µs per event, events per read)."""
    from fluxnetes.k8s.kube import read_watch_batches

    t0 = time.process_time()
    events = reads = 0
    async with session.get(f"https://127.0.0.1:{port}/?n={n}&gap={gap}") as resp:
        transport = resp.connection.transport if resp.connection is not None else None
        async for lines in read_watch_batches(resp.content, wait, transport):
            events += len(lines)
            reads += 1
    cpu = time.process_time() - t0
    if events != n:
        raise SystemExit(f"read {events} events, expected {n}")
    return cpu / n * 1e6, n / max(1, reads)


async def measure(port: int, n: int, gap: float, waits: list[float], rounds: int) -> dict[str, Any]:
    us, per_read = await measure_raw(port, n, gap, waits, rounds)
    return summary(waits, us, per_read)


def summary(waits: list[float], us: dict[float, list[float]], per_read: dict[float, list[float]]) -> dict[str, Any]:
    return {f"{w * 1000:g}ms": {"us_per_event": round(statistics.median(us[w]), 1),
                                "us_per_event_rounds": [round(x, 1) for x in us[w]],
                                "events_per_read": round(statistics.median(per_read[w]), 2)} for w in waits}


async def measure_raw(port: int, n: int, gap: float, waits: list[float],
                      rounds: int) -> tuple[dict[float, list[float]], dict[float, list[float]]]:
    import aiohttp

    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    us: dict[float, list[float]] = {w: [] for w in waits}
    per_read: dict[float, list[float]] = {w: [] for w in waits}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx)) as session:
        for r in range(rounds):
            for w in (waits if r % 2 == 0 else list(reversed(waits))):
                a, b = await read_once(session, port, n, gap, w)
                us[w].append(a)
                per_read[w].append(b)
    return us, per_read


def by_loop(port: int, n: int, gap: float, waits: list[float], rounds: int, loops: list[str]) -> dict[str, Any]:
    """The reader on each event loop (k8s/event_loop.py), the loops alternating round by round."""
    from fluxnetes.k8s.event_loop import loop_factory

    us: dict[str, dict[float, list[float]]] = {lp: {w: [] for w in waits} for lp in loops}
    per_read: dict[str, dict[float, list[float]]] = {lp: {w: [] for w in waits} for lp in loops}
    for r in range(rounds):
        for lp in (loops if r % 2 == 0 else list(reversed(loops))):
            factory, _ = loop_factory(lp)
            with asyncio.Runner(loop_factory=factory) as runner:
                a, b = runner.run(measure_raw(port, n, gap, waits, 1))
            for w in waits:
                us[lp][w] += a[w]
                per_read[lp][w] += b[w]
    return {lp: summary(waits, us[lp], per_read[lp]) for lp in loops}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=1000)
    ap.add_argument("--gap-ms", type=float, nargs="+", default=[1.0, 5.0])
    ap.add_argument("--wait-ms", type=float, nargs="+", default=[0.0, 5.0, 10.0, 20.0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", default="bench/results/watch_coalesce.json")
    ap.add_argument("--loops", nargs="+", choices=["asyncio", "uvloop"],
                    help="compare the reader on these event loops (alternating by round) instead of asyncio's alone")
    args = ap.parse_args()
    load0 = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        cert, key = Path(tmp, "c.pem"), Path(tmp, "k.pem")
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=x",
                        "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
        mp = multiprocessing.get_context("fork")
        ports = mp.Queue()
        server = mp.Process(target=serve, args=(cert, key, ports), daemon=True)
        server.start()
        try:
            port = ports.get(timeout=30)
            waits = [w / 1000 for w in args.wait_ms]
            if args.loops:
                results = {f"gap {g:g}ms": by_loop(port, args.events, g / 1000, waits, args.rounds, args.loops)
                           for g in args.gap_ms}
            else:
                results = {f"gap {g:g}ms": asyncio.run(measure(port, args.events, g / 1000, waits, args.rounds))
                           for g in args.gap_ms}
        finally:
            server.terminate()
            server.join(10)
    out = {"benchmark": "watch_coalesce", "parameters": vars(args), "results": results,
           "what": "the reader's CPU µs per event (aiohttp + ssl + line splitting, no decode) reading a TLS stream "
                   "written one ~3.8 KB event per write every gap, waiting wait after each read (Kube.watch's reader)",
           "load": {"before": load0, "after": os.getloadavg()}}
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
