"""Where the queue engine's time goes: matcher, the queue's Scheduler, the simulator's driver.

cProfile of ``run_policy(..., engine="queue")`` on two workloads, for one source tree per
process (``--src``: e.g. main's code in a ``git worktree`` and this tree, to compare):

* KTH-SP2, the first ``--kth-jobs`` records, EASY, 100 one-core nodes;
* a seeded synthetic trace (``sim_bench.synthetic``) of ``--synthetic-jobs`` jobs on 1,152
  one-core nodes, EASY.

The split (cumulative seconds under the profiler, whose overhead inflates Python-heavy
parts, so compare shares, not seconds): **matcher** = ``Matcher.allocate``,
``allocate_orelse_reserve``, ``satisfiability`` and ``cancel``, with the walk
(``Engine.select``), the commit (``Engine.update``) and the release
(``Engine.remove_entries``) apart, and the counters of ``match/firstfit.py`` when they
answer; **scheduler** = ``Scheduler.cycle``, ``release`` and ``expire`` minus the matcher
calls inside them; **driver** = ``sim.engine.simulate`` minus both; **setup** = the rest
of ``run_policy`` (copying the graph, building the matcher). The machine's load average is
recorded with each run.

    .venv/bin/python bench/sim_profile_split.py --src before=/tmp/wt-before/src \\
        --src after=src --out bench/results/sim_profile_split.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

# (file suffix, function name) -> component; cumulative times are summed per component
MATCHER_TOP = [("match/matcher.py", "allocate"), ("match/matcher.py", "allocate_orelse_reserve"),
               ("match/matcher.py", "satisfiability"), ("match/matcher.py", "cancel")]
MATCHER_PARTS = {
    "walk (Engine.select)": [("match/walk.py", "select")],
    "commit (Engine.update)": [("match/commit.py", "update")],
    "release (Engine.remove_entries)": [("match/commit.py", "remove_entries")],
    # (select and commit before 2026-11-30; one `allocate` since)
    "counters allocate (firstfit: select + commit)": [
        ("match/firstfit.py", "select"), ("match/firstfit.py", "commit"),
        ("match/firstfit.py", "allocate")],
    "counters release (firstfit)": [("match/firstfit.py", "release")],
}
SCHEDULER_TOP = [("queue/cycle.py", "cycle"), ("queue/book.py", "release"),
                 ("queue/book.py", "expire")]


def _cum(stats: dict[Any, Any], keys: list[tuple[str, str]]) -> float:
    total = 0.0
    for (filename, _line, func), (_cc, _nc, _tt, ct, _callers) in stats.items():
        for suffix, name in keys:
            if func == name and filename.endswith(suffix):
                total += ct
    return total


def _worker(task: dict[str, Any]) -> dict[str, Any]:
    import cProfile
    import pstats

    sys.path.insert(0, str(ROOT / "bench"))
    from sim_bench import synthetic

    from fluxnetes.sim.machine import machine_from_header, machine_from_size
    from fluxnetes.sim.runner import Workload, bundled_trace, policy_for, prepare, run_policy
    from fluxnetes.sim.swf import read_swf

    trace = read_swf(bundled_trace())
    if task["trace"] == "kth":
        workload = prepare(trace, machine_from_header(trace.header), limit=task["jobs"])
    else:
        base = prepare(trace, machine_from_header(trace.header), limit=10)
        jobs = synthetic(task["jobs"], task["procs"], 7)
        workload = Workload(trace, machine_from_size(task["procs"], 1), jobs, base.report)
    workload.machine.graph  # noqa: B018 (built before the profile)
    prof = cProfile.Profile()
    cpu = time.process_time()
    prof.enable()
    run_policy(workload, policy_for(task["policy"]), engine="queue")
    prof.disable()
    cpu = time.process_time() - cpu
    stats = pstats.Stats(prof).stats  # type: ignore[attr-defined]
    total = _cum(stats, [("sim/runner.py", "run_policy")])
    sim = _cum(stats, [("sim/engine.py", "simulate")])
    matcher = _cum(stats, MATCHER_TOP)
    scheduler = _cum(stats, SCHEDULER_TOP) - matcher
    parts = {name: round(_cum(stats, keys), 3) for name, keys in MATCHER_PARTS.items()}
    return {
        "jobs": len(workload.jobs),
        "cpu_seconds_profiled": round(cpu, 3),
        "profiled_seconds": {
            "total (run_policy)": round(total, 3),
            "matcher": round(matcher, 3),
            "scheduler (minus matcher)": round(scheduler, 3),
            "driver (simulate minus both)": round(sim - matcher - scheduler, 3),
            "setup (graph copy, matcher)": round(total - sim, 3),
        },
        "shares": {
            "matcher": round(matcher / total, 3),
            "scheduler": round(scheduler / total, 3),
            "driver": round((sim - matcher - scheduler) / total, 3),
            "setup": round((total - sim) / total, 3),
        },
        "matcher_parts_seconds": parts,
        "load_average": os.getloadavg(),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--src", action="append", default=[],
                        help="NAME=PATH of a source tree (repeatable)")
    parser.add_argument("--kth-jobs", type=int, default=3000)
    parser.add_argument("--synthetic-jobs", type=int, default=2000)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "sim_profile_split.json"))
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(_worker(json.loads(args.worker))))
        return 0
    tasks = {"kth_easy": {"trace": "kth", "jobs": args.kth_jobs, "policy": "easy"},
             "synthetic_1152_easy": {"trace": "synthetic", "jobs": args.synthetic_jobs,
                                     "procs": 1152, "policy": "easy"}}
    results: dict[str, Any] = {}
    for name, task in tasks.items():
        for spec in args.src or [f"this={ROOT / 'src'}"]:
            label, path = spec.split("=", 1)
            env = dict(os.environ, PYTHONPATH=path)
            proc = subprocess.run([sys.executable, __file__, "--worker", json.dumps(task)],
                                  env=env, check=True, capture_output=True, text=True)
            results.setdefault(name, {})[label] = json.loads(proc.stdout.strip().splitlines()[-1])
            print(name, label, results[name][label]["shares"], flush=True)
    payload = {
        "benchmark": "sim_profile_split",
        "parameters": {"sources": args.src, "kth": f"first {args.kth_jobs} KTH-SP2 records, EASY",
                       "synthetic": f"{args.synthetic_jobs} jobs on 1,152 one-core nodes, EASY",
                       "measure": "cProfile cumulative seconds (profiler overhead included: "
                                  "compare shares)"},
        "results": results,
        "when_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    Path(args.out).write_text(json.dumps(payload, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
