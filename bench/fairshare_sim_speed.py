"""Fair share's cost in the simulator, before and after a change, in one run.

For each source tree (``--before DIR`` and ``--after DIR``, each a checkout's ``src``), a
fresh process replays the first ``--limit`` KTH-SP2 jobs (published-studies filter,
requested times) under EASY, plain and with fair share (``--fairshare users``: one account
per user, Fair Tree and classic, defaults), on the count oracle and on the queue engine;
the trees alternate for ``--rounds`` rounds so a change in the machine's load hits both
alike. Per run: the CPU seconds of the simulation (``time.process_time`` around
``run_policy``), the scheduling passes, AVEbsld, and the start times, which must be the
same before and after (the file records how many differ and a digest). Writes
``bench/results/fairshare_sim_speed.json`` with the load average (``os.getloadavg``) at
the start and end of every run:

    .venv/bin/python bench/fairshare_sim_speed.py --before /tmp/before/src --after src
"""

from __future__ import annotations

import argparse
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

MODES = [("count", None), ("count", "fairtree"), ("count", "classic"),
         ("queue", None), ("queue", "fairtree"), ("queue", "classic")]


def worker(limit: int, modes: list[tuple[str, str | None]]) -> None:
    """Run every mode in this process (the tree on sys.path) and print one JSON line."""
    from fluxnetes.sim.fairshare import FairShareSetup, accounts_for, make_config
    from fluxnetes.sim.machine import machine_from_header
    from fluxnetes.sim.runner import bundled_trace, policy_for, prepare, run_policy
    from fluxnetes.sim.swf import read_swf

    trace = read_swf(bundled_trace())
    workload = prepare(trace, machine_from_header(trace.header), limit=limit)
    accounts = accounts_for("users", trace, workload.jobs)
    weights = {"age": 1000.0, "fairshare": 10000.0, "job_size": 1000.0, "qos": 1000.0}
    out: dict[str, Any] = {}
    for engine, algo in modes:
        setup = None if algo is None else FairShareSetup(accounts, make_config(
            algorithm=algo, half_life=7 * 86400, max_age=7 * 86400, weights=weights,
            total_cores=workload.machine.total_cores))
        load0 = os.getloadavg()[0]
        cpu0 = time.process_time()
        run, summary = run_policy(workload, policy_for("easy"), engine=engine,  # type: ignore[arg-type]
                                  fairshare=setup)
        cpu = time.process_time() - cpu0
        starts = {o.job.id: o.start for o in run.outcomes}
        out[f"{engine}/{algo or 'plain'}"] = {
            "cpu_seconds": round(cpu, 3), "passes": summary.cycles,
            "mean_bsld": summary.mean_bsld, "starts": starts,
            "load_1m_start": round(load0, 2), "load_1m_end": round(os.getloadavg()[0], 2)}
    sys.stdout.write(json.dumps(out) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", type=Path, help="the 'before' tree's src directory (required)")
    ap.add_argument("--after", type=Path, default=Path("src"), help="the 'after' tree's src directory")
    ap.add_argument("--limit", type=int, default=10000)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--modes", default=",".join(f"{e}/{a or 'plain'}" for e, a in MODES))
    ap.add_argument("--out", type=Path, default=Path("bench/results/fairshare_sim_speed.json"))
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    modes = [(m.split("/")[0], None if m.split("/")[1] == "plain" else m.split("/")[1])
             for m in args.modes.split(",")]
    if args.worker:
        worker(args.limit, modes)
        return
    if args.before is None:
        ap.error("--before DIR is required")
    load0 = os.getloadavg()
    runs: dict[str, list[dict[str, Any]]] = {"before": [], "after": []}
    for r in range(args.rounds):
        for tree in ("before", "after") if r % 2 == 0 else ("after", "before"):
            src = (args.before if tree == "before" else args.after).resolve()
            env = {**os.environ, "PYTHONPATH": str(src)}
            proc = subprocess.run([sys.executable, __file__, "--worker", "--limit", str(args.limit),
                                   "--modes", args.modes], env=env, capture_output=True, text=True,
                                  check=True)
            runs[tree].append(json.loads(proc.stdout.strip().splitlines()[-1]))
            print(f"round {r + 1} {tree}: " + ", ".join(
                f"{k} {v['cpu_seconds']:.2f} s" for k, v in runs[tree][-1].items()), flush=True)
    results: dict[str, Any] = {}
    for engine, algo in modes:
        key = f"{engine}/{algo or 'plain'}"
        row: dict[str, Any] = {}
        for tree in ("before", "after"):
            cpus = [run[key]["cpu_seconds"] for run in runs[tree]]
            row[tree] = {"cpu_seconds_each": cpus, "cpu_seconds_median": statistics.median(cpus),
                         "passes": runs[tree][0][key]["passes"],
                         "mean_bsld": runs[tree][0][key]["mean_bsld"],
                         "load_1m": [(run[key]["load_1m_start"], run[key]["load_1m_end"])
                                     for run in runs[tree]]}
        a, b = runs["after"][0][key]["starts"], runs["before"][0][key]["starts"]
        row["differing_start_times"] = sum(1 for job, t in b.items() if a.get(job) != t) + \
            sum(1 for job in a if job not in b)
        row["starts_sha256"] = hashlib.sha256(json.dumps(sorted(a.items())).encode()).hexdigest()
        results[key] = row
    for engine in {e for e, _ in modes}:
        plain = results.get(f"{engine}/plain")
        for algo in ("fairtree", "classic"):
            row = results.get(f"{engine}/{algo}")
            if plain is None or row is None:
                continue
            for tree in ("before", "after"):
                row[tree]["cpu_vs_plain"] = round(row[tree]["cpu_seconds_median"]
                                                  / plain[tree]["cpu_seconds_median"], 2)
    out = {"bench": "fairshare_sim_speed",
           "parameters": {"trace": "KTH-SP2-1996-2 (bundled)", "limit": args.limit,
                          "filter": "published-studies", "estimate": "requested",
                          "policy": "easy", "accounts": "users (equal shares)",
                          "half_life": "7d", "max_age": "7d", "rounds": args.rounds,
                          "before": str(args.before), "after": str(args.after),
                          "figure": "CPU seconds of run_policy, one fresh process per tree and round"},
           "results": results,
           "machine": {"cpu_count": os.cpu_count(), "python": sys.version.split()[0],
                       "platform": platform.platform(), "loadavg_at_start": list(load0),
                       "loadavg_at_end": list(os.getloadavg())}}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
