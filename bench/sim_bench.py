"""Benchmark: `fluxnetes simulate` on the full KTH-SP2 trace and on a large synthetic trace.

Records, in one run (bench/results/sim_bench.json):

* **after**: the count oracle (``fluxnetes.sim.fastsim``, ``--engine count``) under fcfs,
  easy and conservative on all 28,481 KTH-SP2 jobs (100 one-core nodes, requested times as
  estimates, counted reservations): wall and CPU seconds, simulated jobs/s, and whether the
  schedule is the reference simulator's (start time by start time, when the shared
  reference schedules are there);
* **before**: the same runs through the queue engine (the operator's Scheduler and the graph
  matcher; the default now, and exact since issue #32);
* the **whole process** (``fluxnetes simulate --json``, EASY: startup, reading the trace,
  the run, the output) against the target (1.96 s, the reference simulator's time here);
* a **profile** (cProfile) of the EASY run: what dominates;
* **scaling**: a seeded synthetic trace (200,000+ jobs on 1,152 one-core nodes, many equal
  timestamps) in growing prefixes, and the same workload shape on 288, 576 and 1,152
  processors, so that time per job can be seen to stay flat;
* parameters, machine info and the load average (``os.getloadavg()``) at start and end
  (the machine is shared: wall times are pessimistic when the load is high).

    .venv/bin/python bench/sim_bench.py [--quick] [--synthetic-jobs 200000] [--seed 7]

``--quick`` skips the "before" runs (about a minute of queue-engine time);
``--process-only`` only times the whole process (bench/results/sim_process.json).

``--paired`` (bench/results/sim_paired.json): the operator's engine (``--engine queue``, the
default: Scheduler + graph matcher, every job placed) against the count oracle
(``--engine count``) on all of KTH-SP2 under fcfs, easy and conservative, alternating in
one process (``--rounds`` each), CPU seconds; the reference simulator (pyss) cannot be run
here, so its time is derived from the count oracle's time in the same run and the paired
count/pyss ratios measured before (ISSUE_COUNT_OVER_PYSS); plus a profile of the queue
engine's EASY run (what dominates) and the cost per job as a synthetic trace grows.
"""

from __future__ import annotations

import argparse
import cProfile
import csv
import gzip
import io
import json
import math
import os
import platform
import pstats
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from fluxnetes.sim.engine import SimJob
from fluxnetes.sim.fastsim import simulate_fast
from fluxnetes.sim.machine import machine_from_header, machine_from_size
from fluxnetes.sim.metrics import summarize
from fluxnetes.sim.runner import Workload, bundled_trace, policy_for, prepare, run_policy
from fluxnetes.sim.swf import read_swf

ROOT = Path(__file__).resolve().parents[1]
SCHEDULES = ROOT.parent / "shared" / "data" / "reference-schedules"
TARGET_PROCESS_SECONDS = 1.96  # the reference simulator, whole process, KTH-SP2 EASY, here
POLICIES = ("fcfs", "easy", "conservative")


def timed(fn: Any) -> tuple[Any, float, float]:
    cpu0, wall0 = time.process_time(), time.perf_counter()
    value = fn()
    return value, time.perf_counter() - wall0, time.process_time() - cpu0


def same_as_reference(run: Any) -> int | None:
    """Start times that differ from the reference's full-trace EASY schedule (None: the
    shared schedules are not there)."""
    path = SCHEDULES / "kthfull_easy.csv.gz"
    if not path.exists():
        return None
    with gzip.open(path, "rt", newline="") as handle:
        ref = {row["id"]: int(row["start"]) for row in csv.DictReader(handle)}
    return sum(1 for o in run.outcomes if o.start != ref.get(o.job.id))


def log_reference(workload: Workload) -> dict[str, float]:
    """Wait and bounded slowdown as recorded in the log itself (field 3 = wait time), over
    the same filtered jobs (run time capped at the requested time, like the simulation)."""
    jobs = {j.id: j for j in workload.jobs}
    waits: list[int] = []
    bslds: list[float] = []
    for r in workload.trace.records:
        job = jobs.get(str(r.job_number))
        if job is None or r.wait_time < 0:
            continue
        waits.append(r.wait_time)
        bslds.append(max(1.0, (r.wait_time + job.runtime) / max(job.runtime, 10)))
    return {"jobs": len(waits), "mean_wait": round(statistics.fmean(waits), 1),
            "median_wait": statistics.median(waits), "mean_bsld": round(statistics.fmean(bslds), 2)}


def run_entry(workload: Workload, policy: str, engine: str) -> tuple[dict[str, Any], Any]:
    (run, summary), wall, cpu = timed(lambda: run_policy(workload, policy_for(policy),
                                                         engine=engine))  # type: ignore[arg-type]
    jobs = len(workload.jobs)
    return {
        "engine": summary.engine,
        "wall_seconds": round(wall, 3),
        "cpu_seconds": round(cpu, 3),
        "jobs_per_second_wall": round(jobs / wall),
        "jobs_per_second_cpu": round(jobs / cpu),
        "passes_or_cycles": run.cycles,
        "matcher_calls": run.matcher_calls,
        "mean_wait": round(summary.mean_wait, 4),
        "mean_bsld": round(summary.mean_bsld, 4),
    }, run


def whole_process(args: list[str], runs: int) -> dict[str, Any]:
    exe = str(Path(sys.executable).with_name("fluxnetes"))
    walls = []
    cpus = []
    for _ in range(runs):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        subprocess.run([exe, "simulate", *args], check=True, stdout=subprocess.DEVNULL)
        walls.append(time.perf_counter() - start)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    # wall time is the target's measure; CPU time (user + system) is what the process itself
    # needed, which a busy shared machine does not inflate as much
    return {"command": " ".join(["fluxnetes", "simulate", *args]), "runs": runs,
            "wall_seconds": [round(w, 3) for w in walls], "best": round(min(walls), 3),
            "median": round(statistics.median(walls), 3),
            "cpu_seconds": [round(c, 3) for c in cpus], "best_cpu": round(min(cpus), 3)}


def profile_easy(workload: Workload, top: int = 10) -> list[dict[str, Any]]:
    names = list(workload.machine.node_cores())
    prof = cProfile.Profile()
    prof.enable()
    simulate_fast(workload.jobs, "easy", node_names=names, cores_per_node=1)
    prof.disable()
    stats = pstats.Stats(prof, stream=io.StringIO())
    total = sum(row[2] for row in stats.stats.values())  # type: ignore[attr-defined]
    rows = sorted(stats.stats.items(), key=lambda kv: kv[1][2], reverse=True)  # type: ignore[attr-defined]
    out = []
    for (path, line, func), (_, calls, tottime, cumtime, _) in rows[:top]:
        out.append({"function": f"{Path(path).name}:{line}({func})", "calls": calls,
                    "self_seconds": round(tottime, 3), "self_share": round(tottime / total, 3),
                    "cumulative_seconds": round(cumtime, 3)})
    return out


# ---------------------------------------------------------------------------- synthetic

REQUESTS = (900, 1800, 3600, 7200, 14400, 28800, 43200, 86400, 129600)


def synthetic(jobs: int, procs: int, seed: int, load: float = 0.7) -> list[SimJob]:
    """A seeded workload of the usual shape: many small and power-of-two jobs, log-normal
    run times, requested times from a few round values (often far above the run time,
    sometimes reached: the job is killed at its limit), Poisson arrivals with bursts of
    jobs submitted in the same second, scaled to ``load`` of ``procs`` processors."""
    rng = random.Random(seed)
    shapes: list[tuple[int, int, int]] = []
    top = max(0, int(math.log2(procs)))
    for _ in range(jobs):
        roll = rng.random()
        if roll < 0.3:
            p = 1
        elif roll < 0.9:
            p = 2 ** rng.randint(1, max(1, top - 2))  # up to a quarter of the machine
        else:
            p = rng.randint(2, max(2, procs // 2))
        run = max(1, min(int(rng.lognormvariate(6.3, 1.9)), REQUESTS[-1]))
        fits = [r for r in REQUESTS if r >= run]
        req = fits[0] if rng.random() < 0.5 else rng.choice(fits)
        if rng.random() < 0.1:
            run = req  # killed at its limit: ends exactly at its estimate
        shapes.append((min(p, procs), run, req))
    work = statistics.fmean(p * r for p, r, _ in shapes)
    gap = work / (procs * load)  # mean seconds between submissions
    out: list[SimJob] = []
    t = 0.0
    for i, (p, run, req) in enumerate(shapes):
        if i and rng.random() >= 0.2:  # 20% arrive in the same second as the one before
            t += rng.expovariate(1 / gap) * 1.25
        out.append(SimJob(str(i + 1), int(t), run, req, p))
    return out


def write_swf(jobs: list[SimJob], procs: int, path: Path) -> None:
    with gzip.open(path, "wt") as handle:
        handle.write(f"; MaxNodes: {procs}\n; MaxProcs: {procs}\n")
        for j in jobs:
            handle.write(f"{j.id} {j.submit} -1 {j.runtime} {j.procs} -1 -1 {j.procs} "
                         f"{j.estimate} -1 1 1 1 -1 1 -1 -1 -1\n")


def synthetic_entry(jobs: list[SimJob], procs: int, policy: str) -> dict[str, Any]:
    names = [f"node{i}" for i in range(procs)]
    run, wall, cpu = timed(lambda: simulate_fast(jobs, policy, node_names=names,
                                                 cores_per_node=1))
    summary = summarize(run, policy)
    return {"jobs": len(jobs), "processors": procs, "policy": policy,
            "wall_seconds": round(wall, 3), "cpu_seconds": round(cpu, 3),
            "jobs_per_second_cpu": round(len(jobs) / cpu),
            "microseconds_per_job_cpu": round(cpu / len(jobs) * 1e6, 1),
            "utilization": round(summary.utilization, 3),
            "mean_wait": round(summary.mean_wait, 1), "mean_bsld": round(summary.mean_bsld, 2)}


#: the count oracle's time over the reference simulator's (pyss), paired runs on full KTH-SP2
#: as recorded in issue #32 (pyss is not installable here: no package, no network)
ISSUE_COUNT_OVER_PYSS = {"fcfs": 1.05, "easy": 0.63, "conservative": 0.39}


def profile_top(fn: Any, top: int = 12) -> list[dict[str, Any]]:
    prof = cProfile.Profile()
    prof.enable()
    fn()
    prof.disable()
    stats = pstats.Stats(prof, stream=io.StringIO())
    total = sum(row[2] for row in stats.stats.values())  # type: ignore[attr-defined]
    rows = sorted(stats.stats.items(), key=lambda kv: kv[1][2], reverse=True)  # type: ignore[attr-defined]
    return [{"function": f"{Path(path).name}:{line}({func})", "calls": calls,
             "self_seconds": round(tottime, 3), "self_share": round(tottime / total, 3)}
            for (path, line, func), (_, calls, tottime, _, _) in rows[:top]]


def paired(args: argparse.Namespace) -> int:
    load_start = os.getloadavg()
    trace = read_swf(bundled_trace())
    workload = prepare(trace, machine_from_header(trace.header))
    jobs = len(workload.jobs)
    kth: dict[str, Any] = {}
    for policy in POLICIES:
        cpu: dict[str, list[float]] = {"queue": [], "count": []}
        starts: dict[str, Any] = {}
        calls = 0
        for _ in range(args.rounds):
            for engine in ("count", "queue"):
                (run, _summary), _, seconds = timed(
                    lambda e=engine, p=policy: run_policy(workload, policy_for(p), engine=e))
                cpu[engine].append(round(seconds, 3))
                starts[engine] = {o.job.id: o.start for o in run.outcomes}
                if engine == "queue":
                    calls = run.matcher_calls
        ratios = [q / c for q, c in zip(cpu["queue"], cpu["count"], strict=True)]
        ratio = statistics.median(ratios)
        kth[policy] = {
            "cpu_seconds": cpu, "matcher_calls_queue": calls,
            "jobs_per_second_cpu": {e: round(jobs / min(v)) for e, v in cpu.items()},
            "queue_over_count_median": round(ratio, 2),
            "count_over_pyss_recorded": ISSUE_COUNT_OVER_PYSS[policy],
            "queue_over_pyss_derived": round(ratio * ISSUE_COUNT_OVER_PYSS[policy], 2),
            "start_times_differing_between_engines": sum(
                1 for k, v in starts["queue"].items() if v != starts["count"][k]),
        }
        print(policy, kth[policy], flush=True)
    profile = profile_top(lambda: run_policy(workload, policy_for("easy"), engine="queue"))
    growth = []
    procs = args.synthetic_procs
    big = synthetic(args.paired_jobs, procs, args.seed)
    for n in (args.paired_jobs // 4, args.paired_jobs // 2, args.paired_jobs):
        part = Workload(trace, machine_from_size(procs, 1), big[:n], workload.report)
        _, _, seconds = timed(lambda w=part: run_policy(w, policy_for("easy"), engine="queue"))
        growth.append({"jobs": n, "processors": procs, "cpu_seconds": round(seconds, 3),
                       "microseconds_per_job_cpu": round(seconds / n * 1e6, 1)})
        print(growth[-1], flush=True)
    payload = {
        "benchmark": "sim_bench --paired",
        "parameters": {"trace": bundled_trace().name, "jobs": jobs, "rounds": args.rounds,
                       "machine": workload.machine.describe(), "match_policy": "first",
                       "reservations": "counted", "measure": "CPU seconds of the run "
                       "(time.process_time), engines alternating in one process",
                       "reference_time": "pyss cannot run here: derived = count oracle time "
                       "/ count_over_pyss_recorded (issue #32's paired runs)"},
        "kth": kth, "profile_queue_easy_top": profile,
        "synthetic_easy_queue_engine": growth,
        "machine_info": {"cpu_count": os.cpu_count(), "python": sys.version.split()[0],
                         "platform": platform.platform(), "load_average_at_start": load_start,
                         "load_average_at_end": os.getloadavg()},
        "when_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    out = Path(args.out or ROOT / "bench" / "results" / "sim_paired.json")
    out.write_text(json.dumps(payload, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


# ------------------------------------------------------------------ engine speed, before/after

def _worker(task: dict[str, Any]) -> dict[str, Any]:
    """One measurement in this process (the fluxnetes on PYTHONPATH: before or after).
    Uses only APIs both versions have (run_policy, policy_for, prepare, machine_from_size)."""
    trace = read_swf(bundled_trace())
    base = prepare(trace, machine_from_header(trace.header), limit=task.get("limit"))
    if task["trace"] == "kth":
        workload = base
    else:
        procs = int(task["procs"])
        jobs = synthetic(int(task["jobs"]), procs, int(task.get("seed", 7)))
        cores = int(task.get("cores", 1))
        workload = Workload(trace, machine_from_size(procs // cores, cores), jobs, base.report)
    policy = task["policy"]
    out: dict[str, Any] = {"jobs": len(workload.jobs)}
    if task.get("profile"):
        out["profile_top"] = profile_top(
            lambda: run_policy(workload, policy_for(policy), engine="queue"), top=15)
        return out
    if task.get("calls"):
        # Python function calls per job (cProfile's count: the same on a busy machine)
        prof = cProfile.Profile()
        prof.enable()
        run, _summary = run_policy(workload, policy_for(policy), engine="queue")
        prof.disable()
        calls = sum(row[1] for row in pstats.Stats(prof).stats.values())  # type: ignore[attr-defined]
        out["python_calls_per_job"] = round(calls / len(workload.jobs), 1)
        out["matcher_calls"] = run.matcher_calls
        out["cycles"] = run.cycles
        return out
    engines = ("count", "queue") if task.get("count") else ("queue",)
    for engine in engines:
        (run, summary), wall, cpu = timed(
            lambda e=engine: run_policy(workload, policy_for(policy), engine=e))  # type: ignore[misc]
        out[engine] = {"cpu_seconds": round(cpu, 3), "wall_seconds": round(wall, 3),
                       "matcher_calls": run.matcher_calls,
                       "mean_bsld": round(summary.mean_bsld, 4)}
        out[engine]["starts"] = [o.start for o in run.outcomes]
        out[engine]["load_average"] = os.getloadavg()
        if engine == "queue":
            out["placements_digest"] = __import__("hashlib").sha256(
                repr([o.shares for o in run.outcomes]).encode()).hexdigest()[:16]
    return out


def _growth_side(row: dict[str, Any], side: str, src: str, jobs: int, procs: int) -> None:
    """One side of a growth row: a synthetic EASY trace of ``jobs`` on ``procs`` one-core
    nodes in a fresh process; the after side also runs the count oracle and compares starts."""
    res = _run_worker(src, {"trace": "synthetic", "jobs": jobs, "procs": procs,
                            "policy": "easy", "count": side == "after"})
    row[side] = {"cpu_seconds": res["queue"]["cpu_seconds"],
                 "microseconds_per_job_cpu": round(res["queue"]["cpu_seconds"] / jobs * 1e6, 1),
                 "load_average_1min": round(res["queue"]["load_average"][0], 1)}
    if "count" in res:
        row["count_oracle_cpu_seconds"] = res["count"]["cpu_seconds"]
        row["differing_starts_after_vs_count"] = sum(
            1 for a, b in zip(res["queue"]["starts"], res["count"]["starts"], strict=True)
            if a != b)


def _run_worker(src: str, task: dict[str, Any]) -> dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=src, PYTHONHASHSEED="0")
    proc = subprocess.run([sys.executable, __file__, "--worker", json.dumps(task)], env=env,
                          check=True, capture_output=True, text=True)
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def engine_speed(args: argparse.Namespace) -> int:
    """Before (``--before-src``: main's code) and after (this tree), alternating, each run in
    a fresh process; CPU seconds of the run itself (time.process_time)."""
    after_src = args.after_src or str(ROOT / "src")
    before_src = args.before_src
    load_start = os.getloadavg()
    sides = {"before": before_src, "after": after_src}
    kth: dict[str, Any] = {}
    profiles: dict[str, Any] = {}
    growth_jobs: list[dict[str, Any]] = []
    growth_nodes: list[dict[str, Any]] = []
    out = Path(args.out or ROOT / "bench" / "results" / "sim_engine_speed.json")
    calls: dict[str, Any] = {}
    # the figures this run replaces, kept (without their own "previous")
    previous: dict[str, Any] = {}
    if out.exists():
        previous = {k: v for k, v in json.loads(out.read_text()).items() if k != "previous"}

    def save(done: str) -> None:
        """Written after every section: a run cut short keeps what it measured."""
        payload = {
            "benchmark": "sim_bench --engine-speed",
            "sections_done": done,
            "parameters": {
                "before": f"{before_src} (main's code, {args.before_rev})",
                "after": f"{after_src} (a copy of this branch's src, so the tree could change "
                         "while the benchmark ran)",
                "kth": f"KTH-SP2, the first {args.kth_limits} records (0 = all; published "
                       "filter), 100 one-core nodes (SWF header), requested times as "
                       "estimates, counted reservations, match policy first (the default)",
                "big": f"synthetic trace of {args.big_jobs} jobs on {args.big_procs} one-core "
                       "nodes, EASY, in place of SDSC-BLUE (232k jobs, 1,152 processors), "
                       "which is not on this machine",
                "rounds": args.rounds,
                "measure": "CPU seconds of run_policy (time.process_time) in a fresh process "
                           "per run, before and after alternating; the count oracle runs in "
                           "the after process just before the queue engine",
                "reference_time": "pyss cannot run here: derived = count oracle time / "
                                  "count_over_pyss_recorded (issue #32's paired runs)",
                "profiles": f"cProfile of the after side, top 15 by own time: the first "
                            f"{args.profile_jobs} KTH-SP2 records per policy, and a synthetic "
                            f"trace of {args.profile_jobs} jobs on 1,152 one-core nodes (EASY)",
                "synthetic": "bench/sim_bench.py synthetic(jobs, procs, seed 7): one-core "
                             "nodes, EASY; each growth row is a fresh seeded trace",
            },
            "runs": kth,
            "python_calls_per_job": calls,
            "profile_after_top": profiles,
            "growth_jobs": growth_jobs,
            "growth_nodes": growth_nodes,
            "machine_info": {"cpu_count": os.cpu_count(), "python": sys.version.split()[0],
                             "platform": platform.platform(),
                             "load_average_at_start": load_start,
                             "load_average_now": os.getloadavg()},
            "when_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "previous": previous,
        }
        out.write_text(json.dumps(payload, indent=2) + "\n")

    cases = [(f"kth_{limit or 'full'}", policy, {"trace": "kth", "limit": limit or None})
             for limit in args.kth_limits for policy in POLICIES]
    cases += [(f"synthetic_{args.big_jobs}_on_{args.big_procs}", "easy",
               {"trace": "synthetic", "jobs": args.big_jobs, "procs": args.big_procs})]
    for name, policy, spec in cases:
        cpu: dict[str, list[float]] = {"before": [], "after": [], "count": []}
        loads: list[float] = []
        got: dict[str, dict[str, Any]] = {}
        for r in range(args.rounds):
            for side in (("before", "after") if r % 2 == 0 else ("after", "before")):
                res = _run_worker(sides[side], {**spec, "policy": policy,
                                                "count": side == "after"})
                loads.append(round(res["queue"]["load_average"][0], 1))
                got[side] = res
                cpu[side].append(res["queue"]["cpu_seconds"])
                if "count" in res:
                    cpu["count"].append(res["count"]["cpu_seconds"])
        after, before = got["after"], got["before"]
        count_med = statistics.median(cpu["count"])
        entry = {
            "trace": name,
            "policy": policy,
            "cpu_seconds": cpu,
            "load_average_1min_per_run": loads,
            "jobs": after["jobs"],
            "jobs_per_second_cpu": {k: round(after["jobs"] / statistics.median(v))
                                    for k, v in cpu.items()},
            "after_over_before": round(statistics.median(cpu["after"])
                                       / statistics.median(cpu["before"]), 3),
            "after_over_count": round(statistics.median(cpu["after"]) / count_med, 2),
            "count_over_pyss_recorded": ISSUE_COUNT_OVER_PYSS[policy],
            "after_over_pyss_derived_is": "after / count * count_over_pyss_recorded (the "
                                          "ratio recorded on KTH-SP2 for this policy; for the "
                                          "synthetic trace an indication only)",
            "after_over_pyss_derived": round(statistics.median(cpu["after"]) / count_med
                                             * ISSUE_COUNT_OVER_PYSS[policy], 2),
            "before_over_pyss_derived": round(statistics.median(cpu["before"]) / count_med
                                              * ISSUE_COUNT_OVER_PYSS[policy], 2),
            "matcher_calls": {"before": before["queue"]["matcher_calls"],
                              "after": after["queue"]["matcher_calls"]},
            "mean_bsld": after["queue"]["mean_bsld"],
            "start_times_differing_after_vs_before": sum(
                1 for a, b in zip(after["queue"]["starts"], before["queue"]["starts"],
                                  strict=True) if a != b),
            "start_times_differing_after_vs_count": sum(
                1 for a, b in zip(after["queue"]["starts"], after["count"]["starts"],
                                  strict=True) if a != b),
            "same_placements_after_vs_before":
                after["placements_digest"] == before["placements_digest"],
        }
        kth[f"{name} {policy}"] = entry
        print(name, policy, {k: v for k, v in entry.items()
                             if k not in ("cpu_seconds", "load_average_1min_per_run")},
              cpu, flush=True)
        save(f"{name} {policy}")
    for limit in args.kth_limits:
        for policy in POLICIES:
            calls[f"kth_{limit or 'full'} {policy}"] = {
                side: _run_worker(sides[side], {"trace": "kth", "limit": limit or None,
                                                "policy": policy, "calls": True})
                for side in ("before", "after")}
    save("calls per job")
    for procs in args.growth_nodes:
        row = {"jobs": args.nodes_jobs, "processors": procs, "policy": "easy"}
        for side in ("before", "after"):
            _growth_side(row, side, sides[side], args.nodes_jobs, procs)
        growth_nodes.append(row)
        save(f"growth nodes {procs}")
        print(row, flush=True)
    for policy in args.profile_policies:
        profiles[f"kth_{policy}"] = _run_worker(after_src, {
            "trace": "kth", "policy": policy, "profile": True,
            "limit": args.profile_jobs})["profile_top"]
    profiles["synthetic_easy"] = _run_worker(after_src, {
        "trace": "synthetic", "jobs": args.profile_jobs, "procs": 1152, "policy": "easy",
        "profile": True})["profile_top"]
    save("profiles")
    print("profiles done", flush=True)
    for n in args.growth_jobs:
        row: dict[str, Any] = {"jobs": n, "processors": 1152, "policy": "easy"}
        for side in (("before", "after") if n <= args.before_max_jobs else ("after",)):
            _growth_side(row, side, sides[side], n, 1152)
        growth_jobs.append(row)
        save(f"growth jobs {n}")
        print(row, flush=True)
    print(f"wrote {out}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="skip the 'before' runs")
    parser.add_argument("--synthetic-jobs", type=int, default=200_000)
    parser.add_argument("--synthetic-procs", type=int, default=1152)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--process-runs", type=int, default=3)
    parser.add_argument("--process-only", action="store_true",
                        help="only time the whole process (KTH-SP2, EASY) --process-runs times; "
                        "writes bench/results/sim_process.json unless --out is given")
    parser.add_argument("--out", default=None)
    parser.add_argument("--paired", action="store_true",
                        help="queue engine vs count oracle, alternating (sim_paired.json)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--paired-jobs", type=int, default=8000)
    parser.add_argument("--engine-speed", action="store_true",
                        help="queue engine before (--before-src) vs after, alternating, plus "
                        "profiles and growth in jobs and nodes (sim_engine_speed.json)")
    parser.add_argument("--before-src", default="/tmp/wt32a-before/src")
    parser.add_argument("--before-rev", default="8c60de4")
    parser.add_argument("--after-src", default=None,
                        help="the after side's sources (default: this tree's src; a copy "
                             "lets the tree change while the benchmark runs)")
    parser.add_argument("--profile-jobs", type=int, default=20_000)
    parser.add_argument("--growth-jobs", type=lambda t: [int(x) for x in t.split(",")],
                        default=[10_000, 50_000, 200_000, 500_000])
    parser.add_argument("--before-max-jobs", type=int, default=50_000,
                        help="growth runs of more jobs time the after side only")
    parser.add_argument("--growth-nodes", type=lambda t: [int(x) for x in t.split(",")],
                        default=[100, 1152, 4096])
    parser.add_argument("--nodes-jobs", type=int, default=20_000)
    parser.add_argument("--kth-limits", type=lambda t: [int(x) for x in t.split(",")],
                        default=[10_000, 0],
                        help="KTH-SP2 runs on the first N records each (0: all)")
    parser.add_argument("--big-jobs", type=int, default=20_000,
                        help="the 1,152-processor synthetic EASY row (SDSC-BLUE's machine "
                             "size; the trace itself is not on this machine)")
    parser.add_argument("--big-procs", type=int, default=1152)
    parser.add_argument("--profile-policies", type=lambda t: t.split(","),
                        default=list(POLICIES))
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(_worker(json.loads(args.worker))))
        return 0
    if args.engine_speed:
        return engine_speed(args)
    if args.paired:
        return paired(args)
    load_start = os.getloadavg()
    if args.process_only:
        out = Path(args.out or ROOT / "bench" / "results" / "sim_process.json")
        entry = whole_process(["--json", "--engine", "count"], args.process_runs)
        payload = {"benchmark": "sim_bench --process-only", "whole_process_easy": entry,
                   "target_seconds": TARGET_PROCESS_SECONDS,
                   "meets_target": entry["best"] <= TARGET_PROCESS_SECONDS,
                   "machine_info": {"cpu_count": os.cpu_count(), "python": sys.version.split()[0],
                                    "platform": platform.platform(),
                                    "load_average_at_start": load_start,
                                    "load_average_at_end": os.getloadavg()},
                   "when_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        out.write_text(json.dumps(payload, indent=2) + "\n")
        print(f"whole process, EASY: best {entry['best']} s wall ({entry['best_cpu']} s cpu), "
              f"median {entry['median']} s; wrote {out}")
        return 0
    args.out = args.out or str(ROOT / "bench" / "results" / "sim_bench.json")

    trace, read_wall, _ = timed(lambda: read_swf(bundled_trace()))
    workload = prepare(trace, machine_from_header(trace.header))
    results: dict[str, Any] = {"after": {}, "before": {}}
    for policy in POLICIES:
        entry, run = run_entry(workload, policy, "count")
        if policy == "easy":
            entry["start_times_differing_from_reference"] = same_as_reference(run)
        results["after"][policy] = entry
        print(f"after  {policy:>12}: {entry['wall_seconds']:6.2f} s wall "
              f"{entry['cpu_seconds']:6.2f} s cpu {entry['jobs_per_second_cpu']:8,} jobs/s "
              f"bsld {entry['mean_bsld']}", flush=True)
    if not args.quick:
        for policy in POLICIES:
            entry, _ = run_entry(workload, policy, "queue")
            results["before"][policy] = entry
            print(f"before {policy:>12}: {entry['wall_seconds']:6.2f} s wall "
                  f"{entry['cpu_seconds']:6.2f} s cpu {entry['jobs_per_second_cpu']:8,} jobs/s "
                  f"bsld {entry['mean_bsld']}", flush=True)
    process = {
        "after_easy": whole_process(["--json", "--engine", "count"], args.process_runs),
        "after_startup_only": whole_process(["--json", "--engine", "count", "--limit", "1"],
                                            args.process_runs),
    }
    if not args.quick:
        process["before_easy"] = whole_process(["--json", "--engine", "queue"], 1)
    process["target_seconds"] = TARGET_PROCESS_SECONDS
    process["meets_target"] = process["after_easy"]["best"] <= TARGET_PROCESS_SECONDS
    print(f"whole process, EASY: best {process['after_easy']['best']} s wall, median "
          f"{process['after_easy']['median']} s, best {process['after_easy']['best_cpu']} s cpu "
          f"[target {TARGET_PROCESS_SECONDS} s]", flush=True)
    profile = profile_easy(workload)

    # scaling on a synthetic trace: prefixes of one workload, then the machine size
    procs = args.synthetic_procs
    big = synthetic(args.synthetic_jobs, procs, args.seed)
    scaling_jobs = []
    for n in (args.synthetic_jobs // 4, args.synthetic_jobs // 2, args.synthetic_jobs):
        entry = synthetic_entry(big[:n], procs, "easy")
        scaling_jobs.append(entry)
        print(f"synthetic easy {n:>7} jobs x {procs} procs: {entry['cpu_seconds']:6.2f} s cpu, "
              f"{entry['microseconds_per_job_cpu']} us/job", flush=True)
    scaling_procs = []
    for p in (procs // 4, procs // 2, procs):
        entry = synthetic_entry(synthetic(args.synthetic_jobs // 2, p, args.seed), p, "easy")
        scaling_procs.append(entry)
        print(f"synthetic easy {args.synthetic_jobs // 2:>7} jobs x {p:>4} procs: "
              f"{entry['cpu_seconds']:6.2f} s cpu, {entry['microseconds_per_job_cpu']} us/job",
              flush=True)
    policies_big = []
    for policy in ("fcfs", "conservative"):
        entry = synthetic_entry(big, procs, policy)
        policies_big.append(entry)
        print(f"synthetic {policy} {len(big)} jobs x {procs} procs: "
              f"{entry['cpu_seconds']:6.2f} s cpu", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "synthetic.swf.gz"
        write_swf(big, procs, path)
        big_process = whole_process([str(path), "--json", "--engine", "count"], 1)
    big_process["command"] = (f"fluxnetes simulate synthetic.swf.gz --json "
                              f"({len(big)} jobs, {procs} one-core nodes, seed {args.seed})")
    print(f"whole process, synthetic EASY: {big_process['best']} s", flush=True)

    payload = {
        "benchmark": "sim_bench",
        "parameters": {
            "trace": bundled_trace().name,
            "jobs": len(workload.jobs),
            "filter": "published (run<=0, requested<=0, procs>machine dropped; run capped)",
            "estimate": "requested",
            "machine": workload.machine.describe(),
            "reservations": "counted",
            "synthetic": {"jobs": args.synthetic_jobs, "processors": procs, "seed": args.seed,
                          "generator": "bench/sim_bench.py:synthetic (offered load 0.7)"},
        },
        "read_swf_seconds": round(read_wall, 3),
        "kth": results,
        "log_reference_easy": log_reference(workload),
        "whole_process": process,
        "profile_easy_top": profile,
        "synthetic": {"easy_by_jobs": scaling_jobs, "easy_by_processors": scaling_procs,
                      "other_policies": policies_big, "whole_process_easy": big_process},
        "machine_info": {
            "cpu_count": os.cpu_count(),
            "python": sys.version.split()[0],
            "platform": platform.platform(),
            "load_average_at_start": load_start,
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
