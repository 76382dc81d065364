"""Benchmark: the EASY backfill walk (``queue/walk.py``) before and after, paired.

Cases: full KTH-SP2 under EASY (100 one-core nodes, requested times as estimates, counted
reservations, match policy ``first``) and SDSC-BLUE-like synthetic traces
(``bench/sim_bench.py:synthetic``, seed 7, 1,152 one-core nodes; SDSC-BLUE itself is not
on this machine) of ``--synthetic`` jobs each, under EASY. Every run is a fresh process of
one source tree (``--before`` / this tree), pure Python or the native (mypyc) build,
before and after alternating (the order flips every round), ``--rounds`` each; the measure
is the CPU seconds of ``run_policy`` (time.process_time). Both trees must give the same
start times (digest). ``--count``: one more pure run per tree and case that counts what the
walk looked at and asked the core profile (counts, not times: the same on a busy machine).

    .venv/bin/python bench/easy_walk.py --before ../main-checkout [--rounds 2]
        [--synthetic 20000,100000] [--native-only-synthetic] [--count] [--out FILE]

Writes bench/results/sim_walk_s39.json by default (parameters, machine load per run).
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def _workload(case: str) -> Any:
    from fluxnetes.sim.machine import machine_from_header, machine_from_size
    from fluxnetes.sim.runner import Workload, bundled_trace, prepare
    from fluxnetes.sim.swf import read_swf

    trace = read_swf(bundled_trace())
    if case == "kth":
        return prepare(trace, machine_from_header(trace.header))
    sys.path.insert(0, str(ROOT / "bench"))
    from sim_bench import synthetic

    jobs = int(case.split("_")[1])
    base = prepare(trace, machine_from_header(trace.header), limit=10)
    return Workload(trace, machine_from_size(1152, 1), synthetic(jobs, 1152, 7), base.report)


def _counting() -> collections.Counter[str]:
    """Wrap the walk and the core profile's questions with counters (pure Python only)."""
    from fluxnetes.queue import cycle, profile

    counts: collections.Counter[str] = collections.Counter()
    walk = cycle._walk

    def counted_walk(jobs: Any, *args: Any, **kw: Any) -> None:
        jobs = list(jobs)
        counts["walks"] += 1
        counts["jobs_walked"] += len(jobs)
        walk(jobs, *args, **kw)

    cycle._walk = counted_walk  # type: ignore[assignment]
    for name in ("avail_during", "fits_now", "earliest", "moves_earlier"):
        plain = getattr(profile.CoreProfile, name)

        def wrapped(self: Any, *a: Any, _plain: Any = plain, _name: str = name) -> Any:
            counts[f"profile.{_name}"] += 1
            return _plain(self, *a)

        setattr(profile.CoreProfile, name, wrapped)
    return counts


def worker(task: dict[str, Any]) -> dict[str, Any]:
    from fluxnetes import native

    status = native.activate()
    counts = _counting() if task.get("count") else None
    from fluxnetes.sim.runner import policy_for, run_policy

    workload = _workload(task["case"])
    t0 = time.process_time()
    run, summary = run_policy(workload, policy_for("easy"), engine="queue")
    cpu = time.process_time() - t0
    out: dict[str, Any] = {
        "build": status.describe(), "jobs": len(workload.jobs), "cpu_seconds": round(cpu, 3),
        "mean_bsld": round(summary.mean_bsld, 4), "matcher_calls": run.matcher_calls,
        "starts_digest": hashlib.sha256(repr([o.start for o in run.outcomes]).encode())
        .hexdigest()[:16],
        "load_average_1min": round(os.getloadavg()[0], 2),
    }
    if counts is not None:
        out["counts"] = dict(counts)
    return out


def run_worker(tree: str, task: dict[str, Any], native: bool) -> dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=str(Path(tree) / "src"), PYTHONHASHSEED="0",
               FLUXNETES_NATIVE="1" if native else "0")
    proc = subprocess.run([sys.executable, __file__, "--worker", json.dumps(task)], env=env,
                          check=True, capture_output=True, text=True)
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--before", help="the source tree to compare with (required)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--synthetic", type=lambda t: [int(x) for x in t.split(",") if x],
                        default=[20_000, 100_000])
    parser.add_argument("--native-only-synthetic", action="store_true",
                        help="time the synthetic cases native only (pure takes ~4x longer)")
    parser.add_argument("--count", action="store_true")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "sim_walk_s39.json"))
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(json.loads(args.worker))))
        return 0
    if not args.before:
        parser.error("--before: the source tree to compare with is required")
    trees = {"before": args.before, "after": str(ROOT)}
    cases = ["kth"] + [f"synthetic_{n}" for n in args.synthetic]
    load_start = os.getloadavg()
    rows: list[dict[str, Any]] = []
    for case in cases:
        builds = (True,) if args.native_only_synthetic and case != "kth" else (False, True)
        for native in builds:
            cpu: dict[str, list[float]] = {"before": [], "after": []}
            loads: list[float] = []
            got: dict[str, dict[str, Any]] = {}
            for r in range(args.rounds):
                for side in (("before", "after") if r % 2 == 0 else ("after", "before")):
                    res = run_worker(trees[side], {"case": case}, native)
                    got[side] = res
                    cpu[side].append(res["cpu_seconds"])
                    loads.append(res["load_average_1min"])
            before, after = (statistics.median(cpu[s]) for s in ("before", "after"))
            row = {
                "case": case, "build": "native" if native else "pure", "jobs": got["after"]["jobs"],
                "cpu_seconds": cpu, "after_over_before": round(after / before, 3),
                "microseconds_per_job_cpu": {
                    s: round(statistics.median(cpu[s]) / got[s]["jobs"] * 1e6, 1) for s in cpu},
                "same_start_times": got["after"]["starts_digest"] == got["before"]["starts_digest"],
                "mean_bsld": got["after"]["mean_bsld"],
                "matcher_calls": {s: got[s]["matcher_calls"] for s in got},
                "builds_used": {s: got[s]["build"] for s in got},
                "load_average_1min_per_run": loads,
            }
            rows.append(row)
            print(f"{case:>18} {row['build']:>6}: before {before:.2f} s, after {after:.2f} s "
                  f"({row['after_over_before']}x), same starts {row['same_start_times']}, "
                  f"AVEbsld {row['mean_bsld']}", flush=True)
    counts: dict[str, Any] = {}
    if args.count:
        for case in cases[:2]:  # (pure: the 100k case would take minutes per tree)
            counts[case] = {side: run_worker(trees[side], {"case": case, "count": True},
                                             False)["counts"] for side in trees}
            print(case, json.dumps(counts[case]), flush=True)
    payload = {
        "benchmark": "bench/easy_walk.py",
        "parameters": {
            "before": args.before, "after": str(ROOT), "rounds": args.rounds,
            "kth": "full KTH-SP2 (published filter), 100 one-core nodes, requested times as "
                   "estimates, counted reservations, match policy first, EASY",
            "synthetic": "bench/sim_bench.py synthetic(jobs, 1152, seed 7), 1,152 one-core "
                         "nodes, EASY (in place of SDSC-BLUE, not on this machine)",
            "measure": "CPU seconds of run_policy (time.process_time), a fresh process per "
                       "run, before/after alternating; medians",
            "counts": "pure runs with counters: walks, jobs walked (queue length summed over "
                      "walks), the core profile's questions",
        },
        "rows": rows,
        "counts": counts,
        "machine": {"cpu_count": os.cpu_count(), "python": sys.version.split()[0],
                    "platform": platform.platform(), "load_average_at_start": load_start,
                    "load_average_at_end": os.getloadavg()},
        "when_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    Path(args.out).write_text(json.dumps(payload, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
