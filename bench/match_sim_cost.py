"""Benchmark: the matcher's cost per allocation and per release on the simulator's graphs.

The simulator (``fluxnetes simulate`` on an SWF trace) matches on identical one-core nodes
under one cluster (100 for KTH-SP2, 1,152 for SDSC-BLUE-like traces) and asks the matcher
two things per job: ``allocate`` of ``slot[P] -> core[1]`` at ``now`` (only when the queue
already knows P cores are free) and ``cancel`` when the job ends. This replays that pattern
without the queue: a seeded stream of jobs (sizes 2^k up to an eighth of the machine, plus
some odd sizes; durations 1-10,000 s), each allocated as soon as enough cores are free
(releasing the earliest-ending jobs first, in end order, and with one every job that
ends at the same instant), so every call succeeds and the
machine stays mostly busy, as in a simulation.

Per (source tree, node count, match policy) one fresh process builds the matcher as the
simulator does (``sim.runner.default_matcher``: ``counters=True``), warms up, and times
every ``allocate`` and every ``cancel`` (perf_counter_ns around the call only). Reported:
mean and median microseconds per call, and the mean per quarter of the run (flat = the
cost does not grow as the run goes on). The figure that matters for the simulator is
``alloc_plus_cancel_us``: mean allocate + mean cancel, per job.

``--before TREE`` runs a second source tree (e.g. a git worktree of main) in the same run, alternating
with this one per round (order flipped every round), so both see the same machine load.
``--native`` activates the mypyc build of each tree (``FLUXNETES_NATIVE=1``: the tree
must have one built; see ``python -m fluxnetes.native build``).

    python bench/match_sim_cost.py [--nodes 100 --nodes 1152 --nodes 4096] [--jobs 4000]
        [--policy first ...] [--rounds 3] [--before TREE] [--native] [--out FILE]

Writes bench/results/match_sim_cost.json (parameters, figures per tree, machine load).
"""

from __future__ import annotations

import argparse
import heapq
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_NODES = (100, 1152, 4096)
DEFAULT_POLICIES = ("first", "low", "high", "lonode", "hinode")


def job_stream(nodes: int, jobs: int, seed: int, max_procs: int) -> list[tuple[int, int]]:
    """(processors, duration) per job: mostly powers of two up to min(nodes/8, max_procs),
    some odd sizes (the same sizes on every machine large enough: a cost that grows with
    the node count is the matcher's, not the jobs')."""
    rng = random.Random(seed)
    top = max(1, min(nodes // 8, max_procs))
    out = []
    for _ in range(jobs):
        if rng.random() < 0.7:
            p = 1 << rng.randrange(0, max(1, top.bit_length()))
        else:
            p = rng.randint(1, top)
        out.append((min(p, nodes), rng.randint(1, 10_000)))
    return out


def worker(task: dict[str, Any]) -> dict[str, Any]:
    """One measurement in this fresh process (PYTHONPATH points at the tree measured)."""
    status = "pure Python"
    if task["native"]:
        from fluxnetes import native

        status = native.activate().describe()
    import fluxnetes
    from fluxnetes.jobspec.batch import batch_jobspec
    from fluxnetes.sim.machine import machine_from_size
    from fluxnetes.sim.runner import default_matcher

    nodes = task["nodes"]
    machine = machine_from_size(nodes, 1)
    matcher = default_matcher(machine.graph, task["policy"])
    stream = job_stream(nodes, task["warmup"] + task["jobs"], task["seed"], task["max_procs"])
    specs: dict[tuple[int, int], Any] = {}
    running: list[tuple[int, int, int]] = []  # (end, jobid, procs)
    free = nodes
    now = 0
    alloc_ns: list[int] = []
    cancel_ns: list[int] = []
    clock = time.perf_counter_ns
    warm = task["warmup"]
    cpu0 = 0.0
    for k, (procs, duration) in enumerate(stream):
        if k == warm:
            cpu0 = time.process_time()
        timed = k >= warm
        while free < procs:
            end, jid, held = heapq.heappop(running)
            now = end
            t0 = clock()
            matcher.cancel(jid)
            t1 = clock()
            if timed:
                cancel_ns.append(t1 - t0)
            free += held
            # every job ending now ends now (the simulator releases them all before it
            # schedules: the counters need every recorded job active at `now`)
            while running and running[0][0] <= now:
                _end, jid, held = heapq.heappop(running)
                t0 = clock()
                matcher.cancel(jid)
                t1 = clock()
                if timed:
                    cancel_ns.append(t1 - t0)
                free += held
        spec = specs.get((procs, duration))
        if spec is None:
            spec = specs[(procs, duration)] = batch_jobspec(procs, duration)
        t0 = clock()
        res = matcher.allocate(spec, now=now)
        t1 = clock()
        if not res.ok:
            raise SystemExit(f"allocation {k} failed ({procs} of {free} free cores): "
                             f"{res.status} {res.reason}")
        if timed:
            alloc_ns.append(t1 - t0)
        free -= procs
        heapq.heappush(running, (now + duration, res.jobid, procs))
    cpu = time.process_time() - cpu0

    def figures(ns: list[int]) -> dict[str, Any]:
        us = [x / 1000 for x in ns]
        q = max(1, len(us) // 4)
        return {"calls": len(us), "mean_us": round(statistics.fmean(us), 2),
                "median_us": round(statistics.median(us), 2),
                "mean_us_per_quarter": [round(statistics.fmean(us[i * q:(i + 1) * q]), 2)
                                        for i in range(4) if us[i * q:(i + 1) * q]]}

    a, c = figures(alloc_ns), figures(cancel_ns)
    return {"build": status, "source": str(Path(fluxnetes.__file__).parents[2]),
            "counting_at_end": bool(getattr(matcher, "counting", False)),
            "allocate": a, "cancel": c,
            "alloc_plus_cancel_us": round(a["mean_us"] + c["mean_us"], 2),
            "alloc_plus_cancel_median_us": round(a["median_us"] + c["median_us"], 2),
            "mean_procs": round(statistics.fmean(p for p, _d in stream[warm:]), 1),
            "cpu_seconds_timed_part": round(cpu, 3),
            "load_average_1min": round(os.getloadavg()[0], 2)}


def run_in(tree: Path, task: dict[str, Any]) -> dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=str(tree / "src"),
               FLUXNETES_NATIVE="1" if task["native"] else "0")
    out = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--worker",
                          json.dumps(task)], env=env, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"worker failed in {tree}: {out.stderr.strip()[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, action="append", help="one-core nodes (repeat)")
    parser.add_argument("--policy", action="append", help="match policy (repeat)")
    parser.add_argument("--jobs", type=int, default=4000, help="timed jobs per run")
    parser.add_argument("--warmup", type=int, default=500, help="untimed jobs first")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--max-procs", type=int, default=64, help="largest job (and nodes/8)")
    parser.add_argument("--before", help="a second source tree, run alternately (same load)")
    parser.add_argument("--native", action="store_true", help="use each tree's mypyc build")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "match_sim_cost.json"))
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(json.loads(args.worker))))
        return
    trees = {"after": ROOT}
    if args.before:
        trees["before"] = Path(args.before).resolve()
    nodes_list = args.nodes or list(DEFAULT_NODES)
    policies = args.policy or list(DEFAULT_POLICIES)
    results: dict[str, Any] = {}
    loads = [round(os.getloadavg()[0], 2)]
    for nodes in nodes_list:
        for policy in policies:
            cell: dict[str, list[dict[str, Any]]] = {name: [] for name in trees}
            for r in range(args.rounds):
                order = list(trees) if r % 2 == 0 else list(reversed(trees))
                for name in order:
                    task = {"nodes": nodes, "policy": policy, "jobs": args.jobs,
                            "warmup": args.warmup, "seed": args.seed, "native": args.native,
                            "max_procs": args.max_procs}
                    cell[name].append(run_in(trees[name], task))
            summary: dict[str, Any] = {}
            for name, runs in cell.items():
                summary[name] = {
                    "alloc_plus_cancel_us_median_of_rounds": statistics.median(
                        x["alloc_plus_cancel_us"] for x in runs),
                    "alloc_plus_cancel_median_us_median_of_rounds": statistics.median(
                        x["alloc_plus_cancel_median_us"] for x in runs),
                    "allocate_mean_us": [x["allocate"]["mean_us"] for x in runs],
                    "cancel_mean_us": [x["cancel"]["mean_us"] for x in runs],
                    "runs": runs}
            if "before" in summary:
                pairs = [a["alloc_plus_cancel_us"] / b["alloc_plus_cancel_us"]
                         for a, b in zip(cell["after"], cell["before"], strict=True)]
                summary["after_over_before_median_of_pairs"] = round(statistics.median(pairs), 3)
            results[f"{nodes}/{policy}"] = summary
            line = f"{nodes:>5} nodes {policy:<8}" + "".join(
                f"  {name} {summary[name]['alloc_plus_cancel_us_median_of_rounds']:8.2f} us/job"
                f" (median call sum {summary[name]['alloc_plus_cancel_median_us_median_of_rounds']:.2f})"
                for name in trees)
            if "before" in summary:
                line += f"  after/before {summary['after_over_before_median_of_pairs']}"
            print(line, flush=True)
            loads.append(round(os.getloadavg()[0], 2))
    doc = {"benchmark": "match_sim_cost",
           "parameters": {"nodes": nodes_list, "cores_per_node": 1, "policies": policies,
                          "jobs": args.jobs, "warmup": args.warmup, "rounds": args.rounds,
                          "seed": args.seed, "native": args.native,
                          "max_procs": args.max_procs,
                          "trees": {k: str(v) for k, v in trees.items()},
                          "measure": "perf_counter_ns around each Matcher.allocate / cancel; "
                                     "a fresh process per (tree, nodes, policy, round), trees "
                                     "alternating, order flipped every round"},
           "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                       "load_average_1min_during": loads},
           "results": results}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
