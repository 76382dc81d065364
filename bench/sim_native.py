"""Benchmark: the queue engine compiled with mypyc (``fluxnetes.native``) against pure Python.

Full KTH-SP2 (28,481 records, published filter, 100 one-core nodes, requested times as
estimates, counted reservations, match policy ``first``) under fcfs, easy and conservative.
Every run is a fresh process (``FLUXNETES_NATIVE=0`` or ``=1``), pure and native
alternating (the order flips every round), ``--rounds`` each; the measure is the CPU seconds
of ``run_policy`` (time.process_time). The pure process also runs the count oracle just
before the queue engine: the reference simulator (pyss) cannot run here, so its time is
derived as count oracle time / the count/pyss ratio issue #32 measured in paired runs.
Both builds must give the same schedule (start time and placement of every job).

    .venv/bin/python bench/sim_native.py [--rounds 3] [--limit N] [--out FILE]
        [--before OLD_TREE] [--calls]

``--before``: a second source tree (e.g. ``git worktree add /tmp/before <commit>``) run the
same way, pure and native, in the same alternation (before/after in one run, same load).
``--calls``: Python calls per job of each tree (one cProfile'd pure run each).

Writes bench/results/sim_native.json (parameters, modules compiled, build time, machine
load, per-policy CPU seconds, speedup and derived ratio to the reference).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
POLICIES = ("fcfs", "easy", "conservative")
#: the count oracle's time over pyss's, paired runs on full KTH-SP2 (issue #32)
COUNT_OVER_PYSS = {"fcfs": 1.05, "easy": 0.63, "conservative": 0.39}


def worker(task: dict[str, Any]) -> dict[str, Any]:
    """One run in this (fresh) process: native or pure as FLUXNETES_NATIVE says."""
    from fluxnetes import native

    status = native.activate()
    from fluxnetes.sim.machine import machine_from_header
    from fluxnetes.sim.runner import bundled_trace, policy_for, prepare, run_policy
    from fluxnetes.sim.swf import read_swf

    trace = read_swf(bundled_trace())
    workload = prepare(trace, machine_from_header(trace.header), limit=task.get("limit"))
    policy = policy_for(task["policy"])
    out: dict[str, Any] = {"build": status.describe(), "jobs": len(workload.jobs)}
    if task.get("count"):
        t0 = time.process_time()
        run_policy(workload, policy, engine="count")
        out["count_cpu_seconds"] = round(time.process_time() - t0, 3)
    if task.get("profile"):  # Python calls per job (cProfile: counts, not times)
        import cProfile
        import pstats

        prof = cProfile.Profile()
        prof.enable()
        run_policy(workload, policy, engine="queue")
        prof.disable()
        calls = sum(v[1] for v in pstats.Stats(prof).stats.values())  # type: ignore[attr-defined]
        return {"python_calls_per_job": round(calls / len(workload.jobs), 1)}
    t0 = time.process_time()
    run, summary = run_policy(workload, policy, engine="queue")
    out["cpu_seconds"] = round(time.process_time() - t0, 3)
    out["mean_bsld"] = round(summary.mean_bsld, 4)
    out["matcher_calls"] = run.matcher_calls
    out["schedule_digest"] = hashlib.sha256(repr(
        [(o.job.id, o.start, o.shares) for o in run.outcomes]).encode()).hexdigest()[:16]
    out["load_average_1min"] = round(os.getloadavg()[0], 2)
    return out


def run_worker(task: dict[str, Any], native_on: bool, src: Path = ROOT / "src") -> dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=str(src), PYTHONHASHSEED="0",
               FLUXNETES_NATIVE="1" if native_on else "0")
    proc = subprocess.run([sys.executable, __file__, "--worker", json.dumps(task)], env=env,
                          check=True, capture_output=True, text=True)
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--limit", type=int, default=0, help="first N records (0 = all)")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "sim_native.json"))
    parser.add_argument("--fresh-build", action="store_true",
                        help="build into a new temporary cache first (times a cold build)")
    parser.add_argument("--before", help="also run this source tree (e.g. a git worktree of "
                        "an older commit), pure and native, alternating with this one")
    parser.add_argument("--calls", action="store_true",
                        help="also count Python calls per job (one cProfile'd pure run per tree)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(json.loads(args.worker))))
        return 0
    sys.path.insert(0, str(ROOT / "src"))
    from fluxnetes import native

    load_start = os.getloadavg()
    if args.fresh_build:  # the workers inherit it: they load this build
        os.environ[native.ENV_CACHE] = tempfile.mkdtemp(prefix="sim-native-cache-")
    t0 = time.monotonic()
    build_dir = native.build()
    manifest = native.read_manifest(build_dir) or {}
    fresh = round(time.monotonic() - t0, 1)
    before_src: Path | None = None
    before_build: dict[str, Any] = {}
    if args.before:
        before_src = Path(args.before).resolve() / "src"
        # the older tree's own native build (cached by its source hash like this one's)
        proc = subprocess.run(
            [sys.executable, "-c", "import json; from fluxnetes import native; "
             "d = native.build(); print(json.dumps(native.read_manifest(d) or {}))"],
            env=dict(os.environ, PYTHONPATH=str(before_src)), check=True, capture_output=True,
            text=True)
        manifest_before = json.loads(proc.stdout.strip().splitlines()[-1])
        commit = subprocess.run(["git", "-C", args.before, "rev-parse", "HEAD"],
                                capture_output=True, text=True).stdout.strip()
        before_build = {"hash": manifest_before.get("hash"),
                        "modules": manifest_before.get("modules"), "commit": commit or None}
    # (side, source tree, native): "pure"/"native" are this tree; "before_*" the --before one
    sides: list[tuple[str, Path, bool]] = [("pure", ROOT / "src", False),
                                           ("native", ROOT / "src", True)]
    if before_src is not None:
        sides = [("before_pure", before_src, False), *sides[:1],
                 ("before_native", before_src, True), *sides[1:]]
    results: dict[str, Any] = {}
    for policy in POLICIES:
        cpu: dict[str, list[float]] = {name: [] for name, _src, _n in sides}
        cpu["count"] = []
        loads: list[float] = []
        digests: dict[str, set[str]] = {name: set() for name, _src, _n in sides}
        bsld: dict[str, set[float]] = {name: set() for name, _src, _n in sides}
        builds: dict[str, set[str]] = {name: set() for name, _src, _n in sides}
        calls: dict[str, float] = {}
        for r in range(args.rounds):
            for side, src, native_on in (sides if r % 2 == 0 else sides[::-1]):
                task = {"policy": policy, "limit": args.limit or None, "count": side == "pure"}
                res = run_worker(task, native_on, src)
                cpu[side].append(res["cpu_seconds"])
                if "count_cpu_seconds" in res:
                    cpu["count"].append(res["count_cpu_seconds"])
                loads.append(res["load_average_1min"])
                digests[side].add(res["schedule_digest"])
                bsld[side].add(res["mean_bsld"])
                builds[side].add(res["build"])
        if args.calls:
            for side, src, native_on in sides:
                if not native_on:
                    res = run_worker({"policy": policy, "limit": args.limit or None,
                                      "profile": True}, False, src)
                    calls[side] = res["python_calls_per_job"]
        # paired: each native run against the pure run of the same round
        ratios = [p / n for p, n in zip(cpu["pure"], cpu["native"], strict=True)]
        count_med = statistics.median(cpu["count"])
        pyss = count_med / COUNT_OVER_PYSS[policy]
        med = {side: statistics.median(cpu[side]) for side, _src, _n in sides}
        results[policy] = {
            "cpu_seconds": cpu,
            "median_cpu_seconds": {side: round(v, 3) for side, v in med.items()},
            "speedup_native_over_pure_median_of_pairs": round(statistics.median(ratios), 2),
            "pure_over_pyss_derived": round(med["pure"] / pyss, 2),
            "native_over_pyss_derived": round(med["native"] / pyss, 2),
            "pyss_seconds_derived": round(pyss, 3),
            "same_schedule": len(set().union(*digests.values())) == 1,
            "mean_bsld": sorted(set().union(*bsld.values())),
            "builds": {k: sorted(v) for k, v in builds.items()},
            "load_average_1min_per_run": loads,
        }
        if before_src is not None:
            results[policy]["before_pure_over_pyss_derived"] = round(med["before_pure"] / pyss, 2)
            results[policy]["before_native_over_pyss_derived"] = round(
                med["before_native"] / pyss, 2)
            results[policy]["after_over_before_median_of_pairs"] = {
                kind: round(statistics.median(
                    a / b for a, b in zip(cpu[kind], cpu["before_" + kind], strict=True)), 2)
                for kind in ("pure", "native")}
        if calls:
            results[policy]["python_calls_per_job"] = calls
        print(policy, {k: v for k, v in results[policy].items()
                       if k not in ("load_average_1min_per_run", "builds", "cpu_seconds")},
              flush=True)
    out = Path(args.out)
    previous: Any = None
    if out.exists():  # the figures this run replaces (their own "previous" dropped)
        previous = json.loads(out.read_text())
        if isinstance(previous, dict):
            previous.pop("previous", None)
    payload = {
        "benchmark": "sim_native",
        "parameters": {
            "trace": "KTH-SP2-1996-2.swf.gz" + (f", first {args.limit} records" if args.limit
                                                else ", all records"),
            "machine": "100 one-core nodes (SWF header)", "estimates": "requested",
            "reservations": "counted", "match_policy": "first", "rounds": args.rounds,
            "measure": "CPU seconds of run_policy (time.process_time), a fresh process per "
                       "run, pure (FLUXNETES_NATIVE=0) and native (=1) alternating, order "
                       "flipped every round; speedup = median over rounds of pure/native",
            "reference_time": "pyss cannot run here: derived = count oracle CPU seconds (in "
                              "the pure process, median) / count_over_pyss (issue #32)",
            "count_over_pyss": COUNT_OVER_PYSS,
        },
        "native_build": {"hash": manifest.get("hash"), "modules": manifest.get("modules"),
                         "mypy": manifest.get("mypy"),
                         "compile_wall_seconds": manifest.get("build_seconds"),
                         "compile_cpu_seconds": manifest.get("build_cpu_seconds"),
                         "load_average_at_build": manifest.get("load_average_at_build"),
                         "cold_build_this_run": args.fresh_build,
                         "build_call_seconds_this_run": fresh},
        "results": results,
        "before": {"source": str(args.before), "native_build": before_build} if args.before
        else None,
        "previous": previous,
        "machine_info": {"cpu_count": os.cpu_count(), "python": sys.version.split()[0],
                         "platform": platform.platform(), "load_average_at_start": load_start,
                         "load_average_at_end": os.getloadavg()},
        "when_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(payload, indent=2) + "\n")
    print(f"wrote {out}")
    if args.fresh_build:
        shutil.rmtree(os.environ[native.ENV_CACHE], ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
