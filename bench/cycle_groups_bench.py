"""Scheduling-cycle cost against the number of groups the operator holds (no cluster).

A Controller (the operator's real state machine, matcher and queue) is filled with N single-pod
Jobs of 2 cpu on nodes of 16 cpu (``--room``: 1.5 = every Job runs, each new one starts; 0.67
= a third of them wait; ``--ended F``: that fraction of the running groups then ends while
their Jobs are not marked finished yet, as after a burst of completions the Job controller has
not caught up with or during a namespace's deletion: groups over but kept), then
``--cycles`` times one more Job arrives and one cycle runs with the periodic chores (FluxJob
due scan, queue gauge), as the operator's loop does when an event comes in. The API server is
the unit tests' recording fake (tests/test_k8s_prune.py): only the operator's own CPU counts.
Each ``--src`` runs in its own process (PYTHONPATH), so an earlier checkout and this one are
measured in one run. Results: ms per cycle (median and mean) for every (src, N).

    .venv/bin/python bench/cycle_groups_bench.py --src /tmp/before/src --src src --groups 5000 10000
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
OUT = HERE / "results" / "cycle_groups_bench.json"

CHILD = r"""
import asyncio, json, sys, time
sys.path.insert(0, sys.argv[3])
from test_k8s_prune import RecordingKube, job, node
from fluxnetes.k8s.config import OperatorConfig
from fluxnetes.k8s.controller import Controller
from fluxnetes.k8s.persistence.fluxjob import Phase

n, cycles, room, ended = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[4]), float(sys.argv[5])

async def main() -> None:
    c = Controller(RecordingKube(), OperatorConfig())
    for i in range(int(n * room / 8) + 10):  # 8 pods of 2 cpu per node
        c.cluster.know_node(node(f"n{i}"))
    c.cluster.build_matcher()
    c.reconciled = True
    for i in range(n):
        j = job(f"j{i}", 1)
        c.book.set_owner("Job", "ns", f"j{i}", j)
        c.handle(("Job", "ADDED", j))
        if i % 50 == 0:
            c.scheduling.run_cycle()
    for _ in range(1000):  # a cycle starts a bounded number of groups: until nothing more starts
        before = sum(1 for g in c.groups.values() if str(g.phase) == "Running")
        c.scheduling.run_cycle()
        if sum(1 for g in c.groups.values() if str(g.phase) == "Running") == before:
            break
    running = [g for g in c.groups.values() if str(g.phase) == "Running"]
    for g in running[:int(ended * len(running))]:
        c.release_all(g)
        c.status.set_phase(g, Phase.COMPLETED, "its pods ended")
    while c.groups.fj_dirty:  # their last FluxJob status written: only the Job keeps them
        await c.status.flush_fluxjobs(float("inf"))
    c.scheduling.run_cycle()
    await asyncio.sleep(0)
    phases = {}
    for g in c.groups.values():
        phases[str(g.phase)] = phases.get(str(g.phase), 0) + 1
    times = []
    for k in range(cycles):
        j = job(f"x{k}", 1)
        c.book.set_owner("Job", "ns", f"x{k}", j)
        t = time.process_time()
        c.handle(("Job", "ADDED", j))
        c.scheduling.run_cycle()
        c.status.fluxjobs_due(time.monotonic())
        c.status.update_queue_gauge()
        times.append(time.process_time() - t)
        await asyncio.sleep(0)
    print(json.dumps({"phases": phases, "cpu_s": times}))

asyncio.run(main())
"""


def run(src: Path, n: int, cycles: int, room: float, ended: float) -> dict[str, object]:
    env = {**os.environ, "PYTHONPATH": str(src.resolve())}
    out = subprocess.run([sys.executable, "-c", CHILD, str(n), str(cycles), str(HERE.parent / "tests"), str(room),
                          str(ended)],
                         env=env, capture_output=True, text=True, check=True)
    res = json.loads(out.stdout.strip().splitlines()[-1])
    ms = [1000 * t for t in res["cpu_s"]]
    return {"src": str(src), "groups": n, "room": room, "ended": ended, "phases": res["phases"], "cycles": len(ms),
            "ms_per_cycle_median": round(statistics.median(ms), 2), "ms_per_cycle_mean": round(statistics.mean(ms), 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--src", action="append", type=Path, help="a checkout's src/ (repeat; default: this tree's)")
    ap.add_argument("--groups", type=int, nargs="+", default=[1000, 5000, 10000])
    ap.add_argument("--cycles", type=int, default=40)
    ap.add_argument("--room", type=float, default=1.5,
                    help="cluster size as a multiple of the groups' needs (below 1: a backlog waits)")
    ap.add_argument("--ended", type=float, default=0.0,
                    help="fraction of the running groups ended while their Jobs are not finished yet")
    ap.add_argument("--rounds", type=int, default=2, help="each (src, groups) this many times, alternating")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    srcs = args.src or [HERE.parent / "src"]
    load_before = os.getloadavg()
    runs = []
    for _ in range(args.rounds):
        for n in args.groups:
            for src in srcs:
                r = run(src, n, args.cycles, args.room, args.ended)
                r["load_1m"] = round(os.getloadavg()[0], 2)
                print(json.dumps(r), flush=True)
                runs.append(r)
    out = {"benchmark": "cycle_groups_bench", "parameters": vars(args) | {"src": [str(s) for s in srcs],
                                                                          "out": str(args.out)},
           "machine": {"cpu_count": os.cpu_count(), "python": platform.python_version(),
                       "platform": platform.platform(), "load_before": [round(x, 2) for x in load_before]},
           "measure": "operator CPU (process time) per cycle: one Job arrives, one cycle, the chores",
           "runs": runs}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2, default=str) + "\n")


if __name__ == "__main__":
    main()
