"""Benchmark: the full KTH-SP2 trace (Parallel Workloads Archive) through `fluxnetes simulate`'s
engine under fcfs, easy and conservative, with the real queue and matcher.

Writes bench/results/sim_bench.json: parameters, per-policy wall and CPU seconds, simulated
jobs per second, matcher calls, the summary metrics, the metrics of the archive's own log
(the KTH machine ran EASY), and machine info.

    .venv/bin/python bench/sim_bench.py [--policies fcfs,easy,conservative/pinned,easy@low]
                                        [--limit N]

Wall time depends on what else runs on the machine: cpu_seconds (process time) is the
steadier figure; load_average_at_end says how busy the machine was.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

from fluxnetes.sim.machine import machine_from_header
from fluxnetes.sim.metrics import TAU
from fluxnetes.sim.runner import SIM_QUEUE_DEPTH, bundled_trace, policy_for, prepare, run_policy
from fluxnetes.sim.swf import read_swf

TARGETS = {"easy": 6.0, "conservative": 20.0}


def log_reference(workload: object) -> dict[str, float]:
    """Wait and bounded slowdown as recorded in the log itself (field 3 = wait time), over
    the same filtered jobs (run time capped at the requested time, like the simulation)."""
    jobs = {j.id: j for j in workload.jobs}  # type: ignore[attr-defined]
    waits: list[int] = []
    bslds: list[float] = []
    for r in workload.trace.records:  # type: ignore[attr-defined]
        job = jobs.get(str(r.job_number))
        if job is None or r.wait_time < 0:
            continue
        waits.append(r.wait_time)
        bslds.append(max(1.0, (r.wait_time + job.runtime) / max(job.runtime, TAU)))
    return {
        "jobs": len(waits),
        "mean_wait": statistics.fmean(waits),
        "median_wait": statistics.median(waits),
        "mean_bsld": statistics.fmean(bslds),
        "max_bsld": max(bslds),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--policies",
        default="fcfs,easy,conservative,easy@low,conservative@low,easy/pinned,conservative/pinned",
        help="policy[/counted|pinned][@match-policy], comma-separated (default: counted, first)",
    )
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--match-policy", default="first")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "sim_bench.json"))
    args = parser.parse_args()

    t0 = time.perf_counter()
    trace = read_swf(bundled_trace())
    read_s = time.perf_counter() - t0
    machine = machine_from_header(trace.header)
    workload = prepare(trace, machine, limit=args.limit)
    results: dict[str, object] = {}
    for spec in args.policies.split(","):
        spec_policy, _, match_policy = spec.partition("@")
        name, _, style = spec_policy.partition("/")
        match_policy = match_policy or args.match_policy
        policy = policy_for(name, reservations=style or "counted")  # type: ignore[arg-type]
        cpu0 = time.process_time()
        wall0 = time.perf_counter()
        run, summary = run_policy(workload, policy, match_policy=match_policy)
        wall = time.perf_counter() - wall0
        cpu = time.process_time() - cpu0
        entry = {
            "policy": str(policy),
            "reservations": policy.reservation_style,
            "match_policy": match_policy,
            "queue_depth": policy.queue_depth,
            "wall_seconds": round(wall, 3),
            "cpu_seconds": round(cpu, 3),
            "jobs_per_second_wall": round(len(workload.jobs) / wall, 1),
            "jobs_per_second_cpu": round(len(workload.jobs) / cpu, 1),
            "target_wall_seconds": TARGETS.get(name),
            "meets_target_wall": wall <= TARGETS[name] if name in TARGETS else None,
            "cycles": run.cycles,
            "full_cycles": run.full_cycles,
            "matcher_calls": run.matcher_calls,
            "summary": summary.as_dict(),
        }
        results[spec] = entry
        print(
            f"{spec:>20}: wall {wall:6.2f} s  cpu {cpu:6.2f} s  "
            f"{len(workload.jobs) / wall:8.0f} jobs/s  calls {run.matcher_calls:,}  "
            f"mean wait {summary.mean_wait:8.0f} s  mean bsld {summary.mean_bsld:7.2f}",
            flush=True,
        )
    payload = {
        "benchmark": "sim_bench",
        "trace": bundled_trace().name,
        "parameters": {
            "jobs": len(workload.jobs),
            "records": len(trace.records),
            "filter": "published (run<=0, requested<=0, procs>machine dropped; run capped)",
            "dropped": dict(workload.report.dropped),
            "capped": workload.report.capped,
            "estimate": "requested",
            "machine": machine.describe(),
            "match_policy": args.match_policy,
            "sim_queue_depth": SIM_QUEUE_DEPTH,
            "limit": args.limit,
        },
        "read_swf_seconds": round(read_s, 3),
        "results": results,
        "log_reference_easy": log_reference(workload),
        "machine_info": {
            "cpu_count": os.cpu_count(),
            "python": sys.version.split()[0],
            "platform": platform.platform(),
            "load_average_at_end": os.getloadavg(),
        },
        "when_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(payload, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
