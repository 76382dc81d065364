"""The operator's CPU per single-pod Job, step by step (no cluster).

A Controller (the operator's real state machine, matcher and queue) is handed, for each of
``--jobs`` single-pod Jobs, the watch events such a Job causes on a real cluster, in their
order, runs the scheduling cycle, and lets the writes it spawned run. Its API client is the
real ``Kube`` up to the socket (bodies built, JSON encoded, the fence checked; ``_send``
answers at once), so the bind path's request building counts. ``--path bind`` (default) is
`bench/operator_bench.py`'s Job as the webhook holds it by default (``--job-mode auto``,
``--placement auto``): not suspended, its pod held by fluxnetes' scheduler name:

    Job ADDED, Pod ADDED (held), [cycle: allocates, spawns the Binding and the Event],
    Pod MODIFIED (bound), Job MODIFIED (active), Pod MODIFIED (Running), Job MODIFIED (ready),
    Pod MODIFIED (Succeeded), Job MODIFIED (Complete), [cycle: nothing queued]

``--path gate``: suspended and gated, resumed after the cycle (the earlier measure's path).
``--batch`` Jobs arrive per cycle (1: each alone, as at kube-scheduler's rate with the 50 ms
coalescing; 20: a burst). The process time of each step is summed. Each ``--src`` runs in its
own process (PYTHONPATH), alternating ``--rounds`` times, so an earlier checkout and this one
are compared in one run; the first Job of each (the matcher's index for its shape is built
then) is not counted.

    .venv/bin/python bench/event_handlers.py --src ../main-checkout/src --src src --jobs 2000
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
OUT = HERE / "results" / "event_handlers.json"

CHILD = r"""
import asyncio, copy, gc, json, os, sys, time
sys.path.insert(0, sys.argv[2])
from test_k8s_prune import job, node, pod
from fluxnetes.k8s import names
from fluxnetes.k8s.config import OperatorConfig
from fluxnetes.k8s.controller import Controller
from fluxnetes.k8s.kube import Kube

n, path, batch, nodes = int(sys.argv[1]), sys.argv[3], int(sys.argv[4]), int(sys.argv[5])


class StubKube(Kube):
    # the real client up to the socket: bodies built and encoded, the fence, the semaphores
    def __init__(self) -> None:
        super().__init__("https://127.0.0.1:1", False, {"Accept": "application/json"})
        self.sent: dict[str, int] = {}

    async def _send(self, method, url, path, data, content_type, timeout):
        parts = path.split("/")
        what = f"{method} {'binding' if path.endswith('/binding') else parts[parts.index('namespaces') + 2]}"
        self.sent[what] = self.sent.get(what, 0) + 1
        return {}


REQUESTS = {"cpu": "1", "memory": "64Mi"}  # operator_bench.py's Job


def held_job(i: int) -> dict:
    # what the webhook made of bench/operator_bench.py's Job (--placement auto, --job-mode
    # auto, no deadline): not suspended, its template held by fluxnetes' scheduler name
    j = job(f"j{i}", 1)
    j["metadata"].update({"generation": 1, "resourceVersion": str(10 * i)})
    j["metadata"].pop("annotations")
    j["spec"]["suspend"] = False
    t = j["spec"]["template"]["spec"]
    t.pop("schedulingGates")
    t["schedulerName"] = names.SCHEDULER_NAME
    t["containers"][0]["resources"]["requests"] = dict(REQUESTS)
    return j


def held_pod(j: dict) -> dict:
    p = pod(f"{j['metadata']['name']}-x", owner=j)
    p["spec"].pop("schedulingGates")
    p["spec"]["schedulerName"] = names.SCHEDULER_NAME
    p["spec"]["containers"][0]["resources"]["requests"] = dict(REQUESTS)
    return p


async def main() -> None:
    # the operator's log lines (fluxnetes run: JSON, INFO), written where nobody reads them
    from fluxnetes.logging import configure_logging
    configure_logging("INFO", "json", stream=open(os.devnull, "w"))
    kube = StubKube()
    # --fluxjobs waiting, as operator_bench.py runs it; every pod its Event (the operator's
    # 20/s cap is above the rates it places pods at on a real cluster, not at this loop's)
    c = Controller(kube, OperatorConfig(fluxjobs="waiting", event_rate=1e9))
    for i in range(nodes):
        c.cluster.know_node(node(f"n{i}"))
    c.cluster.build_matcher()
    c.reconciled = True
    gc.collect()
    gc.freeze()  # as the operator does once ready (operator.py _freeze_when_ready)
    try:
        from fluxnetes.k8s.operator import GC_THRESHOLDS
        gc.set_threshold(*GC_THRESHOLDS)
    except ImportError:
        pass
    cpu: dict[str, int] = {}

    def feed(step: str, ev: tuple) -> None:
        t = time.process_time_ns()
        c.handle(ev)
        cpu[step] = cpu.get(step, 0) + time.process_time_ns() - t

    def cycle(step: str) -> None:
        t = time.process_time_ns()
        c.scheduling.run_cycle()
        cpu[step] = cpu.get(step, 0) + time.process_time_ns() - t

    async def tasks(step: str) -> None:  # the writes the handlers and the cycle spawned
        t = time.process_time_ns()
        for _ in range(4):
            await asyncio.sleep(0)
        cpu[step] = cpu.get(step, 0) + time.process_time_ns() - t

    async def run_batch(indices: range) -> None:
        jobs = []
        for i in indices:
            if path == "bind":
                j = held_job(i)
                feed("1 Job ADDED", ("Job", "ADDED", j))
                p = held_pod(j)
                feed("2 Pod ADDED (held)", ("Pod", "ADDED", p))
            else:
                j = job(f"j{i}", 1)
                j["metadata"]["generation"] = 1
                j["metadata"]["resourceVersion"] = str(10 * i)
                feed("1 Job ADDED (suspended)", ("Job", "ADDED", j))
                p = None
            jobs.append((j, p))
        cycle("3 cycle (allocates)")
        await tasks("4 writes (Binding / resume, Event)")
        for j, p in jobs:
            name = j["metadata"]["name"]
            g = c.groups[("ns", f"job-{name}")]
            assert g.slots, (g.phase, g.reason)
            if path == "gate":
                resumed = copy.deepcopy(j)
                resumed["spec"]["suspend"] = False
                resumed["metadata"]["generation"] = 2
                resumed["metadata"]["resourceVersion"] += "1"
                feed("5 Job MODIFIED (resumed)", ("Job", "MODIFIED", resumed))
                j = resumed
                p = pod(f"{name}-x", owner=j)
                feed("2 Pod ADDED (gated)", ("Pod", "ADDED", p))
                await tasks("4 writes (Binding / resume, Event)")
            placed = copy.deepcopy(p)
            placed["spec"].pop("schedulingGates", None)
            placed["spec"]["nodeName"] = g.slots[0]
            feed("6 Pod MODIFIED (placed)", ("Pod", "MODIFIED", placed))
            active = copy.deepcopy(j)
            active["status"] = {"active": 1, "startTime": "2026-01-01T00:00:00Z"}
            active["metadata"]["resourceVersion"] += "2"
            feed("7 Job MODIFIED (status active)", ("Job", "MODIFIED", active))
            running = copy.deepcopy(placed)
            running["status"] = {"phase": "Running", "startTime": "2026-01-01T00:00:01Z"}
            feed("8 Pod MODIFIED (Running)", ("Pod", "MODIFIED", running))
            ready = copy.deepcopy(active)
            ready["status"]["ready"] = 1
            ready["metadata"]["resourceVersion"] += "3"
            feed("9 Job MODIFIED (status ready)", ("Job", "MODIFIED", ready))
            if path == "bind":  # the pod ends, the Job completes: its share goes back
                done = copy.deepcopy(running)
                done["status"]["phase"] = "Succeeded"
                feed("10 Pod MODIFIED (Succeeded)", ("Pod", "MODIFIED", done))
                complete = copy.deepcopy(ready)
                complete["status"] = {"succeeded": 1, "conditions": [{"type": "Complete", "status": "True"}]}
                complete["metadata"]["resourceVersion"] += "4"
                feed("11 Job MODIFIED (Complete)", ("Job", "MODIFIED", complete))
        if path == "bind":
            cycle("12 cycle (nothing queued)")
        await tasks("4 writes (Binding / resume, Event)")

    # a first Job, not counted: the matcher's index for its request shape is built once
    await run_batch(range(n, n + 1))
    cpu.clear()
    kube.sent.clear()
    for b in range(0, n, batch):
        await run_batch(range(b, min(n, b + batch)))
    print(json.dumps({"sent": kube.sent, "cpu_ns": cpu}))

asyncio.run(main())
"""


def run(src: Path, n: int, path: str, batch: int, nodes: int) -> dict[str, object]:
    env = {**os.environ, "PYTHONPATH": str(src.resolve())}
    out = subprocess.run([sys.executable, "-c", CHILD, str(n), str(HERE.parent / "tests"), path, str(batch),
                          str(nodes)], env=env, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"{src}: {out.stderr[-3000:]}")
    res = json.loads(out.stdout.strip().splitlines()[-1])
    us = {k: round(v / n / 1000, 2) for k, v in sorted(res["cpu_ns"].items(), key=lambda kv: int(kv[0].split()[0]))}
    return {"src": str(src), "jobs": n, "writes_sent": res["sent"], "us_per_job": us,
            "us_per_job_total": round(sum(us.values()), 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--src", action="append", type=Path, help="a checkout's src/ (repeat; default: this tree's)")
    ap.add_argument("--jobs", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=3, help="each src this many times, alternating")
    ap.add_argument("--path", choices=("bind", "gate"), default="bind",
                    help="bind: the benchmark's Job as the webhook holds it by default (scheduler name, not "
                         "suspended; placed by a Binding, then it completes); gate: suspended, gated, resumed")
    ap.add_argument("--batch", type=int, default=1, help="Jobs per scheduling cycle (1: each arrives alone)")
    ap.add_argument("--nodes", type=int, default=0, help="nodes of 16 cpu (default: room for every Job)")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    srcs = args.src or [HERE.parent / "src"]
    load_before = os.getloadavg()
    runs = []
    for _ in range(args.rounds):
        for src in srcs:
            r = run(src, args.jobs, args.path, args.batch, args.nodes or args.jobs // 8 + 10)
            r["load_1m"] = round(os.getloadavg()[0], 2)
            print(json.dumps(r), flush=True)
            runs.append(r)
    summary = {}
    for src in srcs:
        mine = [r for r in runs if r["src"] == str(src)]
        steps = mine[0]["us_per_job"]
        summary[str(src)] = {
            "us_per_job_total_median": statistics.median(r["us_per_job_total"] for r in mine),
            "us_per_job_median": {k: statistics.median(r["us_per_job"][k] for r in mine) for k in steps},
        }
    out = {"benchmark": "event_handlers", "parameters": vars(args) | {"src": [str(s) for s in srcs],
                                                                      "out": str(args.out)},
           "machine": {"cpu_count": os.cpu_count(), "python": platform.python_version(),
                       "platform": platform.platform(), "load_before": [round(x, 2) for x in load_before],
                       "load_after": [round(x, 2) for x in os.getloadavg()]},
           "measure": "operator CPU (process time) per single-pod Job, per step: Controller.handle per watch "
                      "event, the scheduling cycle, and the writes it spawns (the API client up to the socket)",
           "summary": summary, "runs": runs}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2, default=str) + "\n")


if __name__ == "__main__":
    main()
