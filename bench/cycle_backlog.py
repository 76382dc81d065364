"""Scheduling-cycle cost against backlog depth (issue 17, item 3), pure core.

1,000 nodes (32 cpu, 128 GiB; the operator's Kubernetes graph, match policy ``lonode``)
hold 5,000 running single-node jobs (6 cpu each: 5 per node, 2 cpu free per node). A
backlog of 0, 250, 1,000 or 5,000 waiting jobs of 16 cpu cannot fit. The queue policy is
EASY with the operator's default queue depth (32). Cycles alternate:

* ``trickle``: 5 random running jobs are released (``Scheduler.release``) and 5
  replacement 6-cpu jobs are submitted (behind the backlog), then a cycle;
* ``idle``: nothing happened since the last cycle, then a cycle.

Two regimes: ``unknown`` durations (the Kubernetes default: every job holds until
released, so the EASY head can never get a reservation) and ``known`` durations (running
jobs end at 10,000 s + i, waiting jobs ask 600 s: the head is reserved).

Each configuration runs twice on a fresh graph: ``before`` = ``Scheduler(parking=False)``
(the full re-evaluation every cycle, qmanager's cancel-all-and-walk) and ``after`` =
parking (the default). Both must decide the same: the bench checks that the started /
reserved / blocked ids are identical cycle by cycle (while the two runs see the same
events, i.e. the same random seed), and fails otherwise.

Also measured (``matcher``): the real matcher's failure path at this size - plain
``allocate`` BUSY, ``allocate_orelse_reserve`` BUSY, ``satisfiability`` - against a
successful allocate, with and without a reservation held.

Run:  .venv/bin/python bench/cycle_backlog.py            (about 10 minutes)
      .venv/bin/python bench/cycle_backlog.py --quick    (smaller, for a smoke run)
Writes bench/results/cycle_backlog.json.
"""

from __future__ import annotations

import json
import os
import platform
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import typer

from fluxnetes.graph.builders import from_k8s_nodes
from fluxnetes.jobspec import PodRequest, jobspec_from_pods
from fluxnetes.match.matcher import Matcher
from fluxnetes.queue import QueuedJob, QueuePolicy, Scheduler

HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE / "results" / "cycle_backlog.json"
GI = 1024**3


def k8s_node(name: str, cpu: int, mem_gi: int) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {}},
        "status": {
            "allocatable": {"cpu": str(cpu), "memory": f"{mem_gi}Gi"},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def make_job(job_id: str, cpu: int, duration: int, submit: int) -> QueuedJob:
    spec = jobspec_from_pods(1, PodRequest(cpu * 1000, GI, 0, {}), duration=duration, name=job_id)
    return QueuedJob(id=job_id, jobspec=spec, submit_time=submit)


def pct(values: list[float], p: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def summary(values: list[float]) -> dict[str, float]:
    return {
        "n": len(values),
        "mean_ms": round(statistics.fmean(values) * 1000, 3) if values else 0.0,
        "p50_ms": round(pct(values, 50) * 1000, 3),
        "p99_ms": round(pct(values, 99) * 1000, 3),
        "max_ms": round(max(values, default=0.0) * 1000, 3),
    }


class Setup:
    """A fresh graph with the running jobs adopted and the backlog queued."""

    def __init__(self, nodes: int, cpu: int, running: int, run_cpu: int, backlog: int, big_cpu: int,
                 known: bool, parking: bool, depth: int | None) -> None:
        names = [f"n{i:04d}" for i in range(nodes)]
        self.matcher = Matcher(from_k8s_nodes([k8s_node(n, cpu, 128) for n in names]), "lonode")
        self.sched = Scheduler(self.matcher, QueuePolicy("easy", queue_depth=depth),
                               node_cores=dict.fromkeys(names, cpu), parking=parking)
        self.known = known
        self.run_cpu = run_cpu
        self.running: list[str] = []
        for i in range(running):
            job = make_job(f"r{i}", run_cpu, 10_000 + i if known else 0, 0)
            alloc = self.matcher.allocate(job.jobspec, now=0)
            if alloc.status.name != "ALLOCATED":
                raise SystemExit(f"setup: running job {i} did not fit ({alloc.reason})")
            self.sched.adopt(job.id, alloc, duration=int(job.jobspec.duration))
            self.running.append(job.id)
        self.pending: dict[str, QueuedJob] = {}
        for i in range(backlog):
            job = make_job(f"b{i}", big_cpu, 600 if known else 0, 1)
            self.pending[job.id] = job
        self.serial = 0

    def trickle(self, rng: random.Random, releases: int, now: int) -> None:
        for _ in range(min(releases, len(self.running))):
            job_id = self.running.pop(rng.randrange(len(self.running)))
            self.sched.release(job_id)
            self.serial += 1
            job = make_job(f"s{self.serial}", self.run_cpu, 3600 if self.known else 0, now)
            self.pending[job.id] = job

    def cycle(self, now: int) -> tuple[float, Any]:
        t0 = time.perf_counter()
        result = self.sched.cycle(list(self.pending.values()), now)
        took = time.perf_counter() - t0
        for job, _ in result.started:
            del self.pending[job.id]
            self.running.append(job.id)
        for job, _ in result.unsatisfiable:
            del self.pending[job.id]
            self.sched.withdraw(job.id)
        return took, result


def decisions(result: Any) -> tuple[Any, ...]:
    return (
        [(j.id, tuple(sorted(n.name for n in r.nodes))) for j, r in result.started],
        [(j.id, int(r.at)) for j, r in result.reserved],
        [j.id for j in result.blocked],
    )


def run_config(known: bool, backlog: int, parking: bool, cycles: int, args: dict[str, Any],
               seed: int) -> tuple[dict[str, Any], list[Any]]:
    t0 = time.perf_counter()
    s = Setup(args["nodes"], args["cpu"], args["running"], args["run_cpu"], backlog, args["big_cpu"],
              known, parking, args["depth"])
    setup_s = time.perf_counter() - t0
    rng = random.Random(seed)
    times: dict[str, list[float]] = {"trickle": [], "idle": [], "first": []}
    calls: dict[str, list[int]] = {"trickle": [], "idle": [], "first": []}
    modes: dict[str, int] = {}
    seen: list[Any] = []
    now = 2
    took, result = s.cycle(now)  # the first cycle after a (re)start walks everything
    times["first"].append(took)
    calls["first"].append(result.matcher_calls)
    seen.append(decisions(result))
    for i in range(cycles):
        now += 1
        kind = "trickle" if i % 2 == 0 else "idle"
        if kind == "trickle":
            s.trickle(rng, args["releases"], now)
        took, result = s.cycle(now)
        times[kind].append(took)
        calls[kind].append(result.matcher_calls)
        modes[result.mode] = modes.get(result.mode, 0) + 1
        seen.append(decisions(result))
    every = times["trickle"] + times["idle"]
    out = {
        "parking": parking,
        "setup_s": round(setup_s, 2),
        "first_cycle_ms": round(times["first"][0] * 1000, 3),
        "first_cycle_matcher_calls": calls["first"][0],
        "cycles": summary(every),
        "trickle_cycles": summary(times["trickle"]),
        "idle_cycles": summary(times["idle"]),
        "matcher_calls_per_trickle_cycle": round(statistics.fmean(calls["trickle"]), 2) if calls["trickle"] else 0,
        "matcher_calls_per_idle_cycle": round(statistics.fmean(calls["idle"]), 2) if calls["idle"] else 0,
        "modes": modes,
        "pending_at_end": len(s.pending),
    }
    return out, seen


def matcher_failure_path(args: dict[str, Any]) -> dict[str, Any]:
    """Per-call cost of the matcher's success and failure answers at this size (median of 5)."""

    def timed(fn: Any, n: int = 5) -> tuple[str, float]:
        samples = []
        answer = None
        for _ in range(n):
            t0 = time.perf_counter()
            answer = fn()
            samples.append(time.perf_counter() - t0)
        return str(answer.status.name), round(statistics.median(samples) * 1000, 3)

    out: dict[str, Any] = {}
    for known in (False, True):
        names = [f"n{i:04d}" for i in range(args["nodes"])]
        m = Matcher(from_k8s_nodes([k8s_node(n, args["cpu"], 128) for n in names]), "lonode")
        for i in range(args["running"]):
            m.allocate(make_job(f"r{i}", args["run_cpu"], 10_000 + i if known else 0, 0).jobspec, now=0)
        big = make_job("b", args["big_cpu"], 600 if known else 0, 1).jobspec
        small = make_job("s", 1, 5 if known else 0, 1).jobspec

        def ok(m: Matcher = m, small: Any = small) -> Any:
            r = m.allocate(small, now=1)
            m.cancel(r.jobid)
            return r

        def reserve(m: Matcher = m, big: Any = big) -> Any:
            r = m.allocate_orelse_reserve(big, now=1)
            if r.status.name == "RESERVED":
                m.cancel(r.jobid)
            return r

        row: dict[str, Any] = {
            "allocate_success_then_cancel": timed(ok),
            "allocate_busy": timed(lambda m=m, big=big: m.allocate(big, now=1)),
            "allocate_orelse_reserve": timed(reserve),
            "satisfiability": timed(lambda m=m, big=big: m.satisfiability(big, now=1)),
        }
        if known:
            held = m.allocate_orelse_reserve(big, now=1)
            row["with_a_reservation_held"] = {
                "reservation_at": int(held.at),
                "allocate_busy": timed(lambda m=m, big=big: m.allocate(big, now=1)),
                "allocate_success_then_cancel": timed(ok),
            }
        out["known_durations" if known else "unknown_durations"] = row
    return out


def main(
    quick: bool = typer.Option(False, help="100 nodes, 500 running, backlogs 0/25/100, fewer cycles"),
    cycles: int = typer.Option(30, help="cycles per configuration after the first (half trickle, half idle)"),
    cycles_before: int = typer.Option(6, help="cycles for the full re-evaluation (it is slow)"),
    out: Path = typer.Option(DEFAULT_OUT, help="JSON output"),
    seed: int = typer.Option(17),
) -> None:
    args: dict[str, Any] = {
        "nodes": 1000, "cpu": 32, "running": 5000, "run_cpu": 6, "big_cpu": 16,
        "releases": 5, "depth": 32, "policy": "easy", "match_policy": "lonode",
        "backlogs": [0, 250, 1000, 5000],
    }
    if quick:
        args.update(nodes=100, running=500, backlogs=[0, 25, 100])
        cycles, cycles_before = min(cycles, 10), min(cycles_before, 4)
    load_before = os.getloadavg()
    started = time.perf_counter()
    rows: list[dict[str, Any]] = []
    for known in (False, True):
        for backlog in args["backlogs"]:
            n = min(cycles, cycles_before)
            before, seen_b = run_config(known, backlog, False, n, args, seed)
            after, seen_a = run_config(known, backlog, True, cycles, args, seed)
            same = seen_a[: len(seen_b)] == seen_b
            row = {"durations": "known" if known else "unknown", "backlog": backlog,
                   "before": before, "after": after, "identical_decisions": same,
                   "compared_cycles": len(seen_b)}
            rows.append(row)
            print(f"durations={row['durations']:7} backlog={backlog:5}  "
                  f"before mean {before['cycles']['mean_ms']:10.1f} ms  "
                  f"after mean {after['cycles']['mean_ms']:8.1f} ms "
                  f"(trickle {after['trickle_cycles']['mean_ms']:.1f}, idle {after['idle_cycles']['mean_ms']:.1f})"
                  f"  identical={same}", flush=True)
            if not same:
                raise SystemExit("parking decided differently from the full re-evaluation")
    print("matcher failure path ...", flush=True)
    failure = matcher_failure_path(args)
    result = {
        "benchmark": "cycle_backlog",
        "parameters": {**args, "cycles": cycles, "cycles_before": cycles_before, "seed": seed},
        "rows": rows,
        "matcher_failure_path_ms": failure,
        "wall_s": round(time.perf_counter() - started, 1),
        "machine": {
            "cpu_count": os.cpu_count(),
            "loadavg_start": [round(x, 2) for x in load_before],
            "loadavg_end": [round(x, 2) for x in os.getloadavg()],
            "python": sys.version.split()[0],
            "platform": platform.platform(),
        },
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(failure, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    typer.run(main)
