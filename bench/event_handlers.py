"""The operator's CPU per watch event of a single-pod Job, by event (no cluster).

A Controller (the operator's real state machine, matcher and queue; its API writes go to the
unit tests' recording fake, tests/test_k8s_prune.py) is handed, for each of ``--jobs``
single-pod Jobs, the watch events such a Job causes on a real cluster, in their order (what
`bench/operator_bench.py` counts as ``operator_watch_events_per_pod``):

    Job ADDED (suspended by the webhook), [a cycle allocates it], Job MODIFIED (resumed),
    Pod ADDED (gated), Job MODIFIED (status: active), Pod MODIFIED (placed: gate gone,
    nodeName), Pod MODIFIED (status: Running), Job MODIFIED (status: ready)

and the process time of each ``Controller.handle`` call is summed per step. Only the
handlers are measured (not the watch reading, the cycle or the writes). Each ``--src`` runs in
its own process (PYTHONPATH), alternating ``--rounds`` times, so an earlier checkout and this
one are compared in one run.

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
import asyncio, copy, json, sys, time
sys.path.insert(0, sys.argv[2])
from test_k8s_prune import RecordingKube, job, node, pod
from fluxnetes.k8s.config import OperatorConfig
from fluxnetes.k8s.controller import Controller

n = int(sys.argv[1])
BATCH = 20  # Jobs per scheduling cycle (a burst of arrivals, as the operator coalesces them)

async def main() -> None:
    c = Controller(RecordingKube(), OperatorConfig())
    for i in range(n // 8 + 10):  # 8 pods of 2 cpu per node: room for all
        c.cluster.know_node(node(f"n{i}"))
    c.cluster.build_matcher()
    c.reconciled = True
    cpu: dict[str, int] = {}

    def feed(step: str, ev: tuple) -> None:
        t = time.process_time_ns()
        c.handle(ev)
        cpu[step] = cpu.get(step, 0) + time.process_time_ns() - t

    for b in range(0, n, BATCH):
        jobs = []
        for i in range(b, min(n, b + BATCH)):
            j = job(f"j{i}", 1)
            j["metadata"]["generation"] = 1
            j["metadata"]["resourceVersion"] = str(10 * i)
            feed("1 Job ADDED (suspended)", ("Job", "ADDED", j))
            jobs.append(j)
        c.scheduling.run_cycle()
        await asyncio.sleep(0)
        for j in jobs:
            name = j["metadata"]["name"]
            g = c.groups[("ns", f"job-{name}")]
            assert g.slots, (g.phase, g.reason)
            resumed = copy.deepcopy(j)
            resumed["spec"]["suspend"] = False
            resumed["metadata"]["generation"] = 2
            resumed["metadata"]["resourceVersion"] += "1"
            feed("2 Job MODIFIED (resumed)", ("Job", "MODIFIED", resumed))
            p = pod(f"{name}-x", owner=j)
            feed("3 Pod ADDED (gated)", ("Pod", "ADDED", p))
            active = copy.deepcopy(resumed)
            active["status"] = {"active": 1, "startTime": "2026-01-01T00:00:00Z"}
            active["metadata"]["resourceVersion"] += "2"
            feed("4 Job MODIFIED (status active)", ("Job", "MODIFIED", active))
            placed = copy.deepcopy(p)
            placed["spec"].pop("schedulingGates")
            placed["spec"]["nodeName"] = g.slots[0]
            feed("5 Pod MODIFIED (placed)", ("Pod", "MODIFIED", placed))
            running = copy.deepcopy(placed)
            running["status"] = {"phase": "Running", "startTime": "2026-01-01T00:00:01Z"}
            feed("6 Pod MODIFIED (Running)", ("Pod", "MODIFIED", running))
            ready = copy.deepcopy(active)
            ready["status"]["ready"] = 1
            ready["metadata"]["resourceVersion"] += "3"
            feed("7 Job MODIFIED (status ready)", ("Job", "MODIFIED", ready))
        await asyncio.sleep(0)
    running = sum(1 for g in c.groups.values() if str(g.phase) == "Running")
    print(json.dumps({"running": running, "cpu_ns": cpu}))

asyncio.run(main())
"""


def run(src: Path, n: int) -> dict[str, object]:
    env = {**os.environ, "PYTHONPATH": str(src.resolve())}
    out = subprocess.run([sys.executable, "-c", CHILD, str(n), str(HERE.parent / "tests")],
                         env=env, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"{src}: {out.stderr[-3000:]}")
    res = json.loads(out.stdout.strip().splitlines()[-1])
    us = {k: round(v / n / 1000, 2) for k, v in sorted(res["cpu_ns"].items())}
    return {"src": str(src), "jobs": n, "running": res["running"], "us_per_job": us,
            "us_per_job_total": round(sum(us.values()), 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--src", action="append", type=Path, help="a checkout's src/ (repeat; default: this tree's)")
    ap.add_argument("--jobs", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=3, help="each src this many times, alternating")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    srcs = args.src or [HERE.parent / "src"]
    load_before = os.getloadavg()
    runs = []
    for _ in range(args.rounds):
        for src in srcs:
            r = run(src, args.jobs)
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
           "measure": "operator CPU (process time) in Controller.handle per single-pod Job, per watch event",
           "summary": summary, "runs": runs}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2, default=str) + "\n")


if __name__ == "__main__":
    main()
