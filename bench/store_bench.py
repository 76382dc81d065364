"""Store benchmark: submissions per second and the time of a scheduling cycle that persists its
decisions, on SQLite and on PostgreSQL.

Setup (per backend): a 1,024-node graph (32 racks x 32 nodes, 64 cores each), ``--jobs`` queued jobs (1-8 nodes, 1-32 cores per node, 1 min - 2 h), a fresh database.

* submissions/s: the jobs submitted in batches of ``--batch`` (``Store.submit_many``, one
  transaction per batch), and, for comparison, ``--single`` submissions one per transaction;
* first cycle: an empty cluster and the whole queue pending (many starts to persist);
* fill cycles: more cycles at the same instant until one starts nothing (the cluster is full);
* steady cycles: the clock jumps to the next job end, the jobs that ended are completed in the
  store (not timed), then one cycle is timed: lock, sync the matcher with the store, load the
  first queue-depth jobs, run ``schedule_cycle``, persist starts / reservations / events,
  commit. ``match_s`` is the part spent inside ``schedule_cycle`` (the matcher);
  ``store_s`` = total - match_s; ``gc_pause_s`` = garbage-collector pauses inside the cycle;
* recovery: a new service rebuilding its matcher from the recorded allocations.

Targets (issue 3): >= 2,000 submissions/s on PostgreSQL with batching; a cycle over 10,000
pending jobs persisting its decisions in <= 0.5 s.

Run:  source hack/lib.sh && pg_start && .venv/bin/python bench/store_bench.py; pg_stop
(PostgreSQL is used when FLUXNETES_TEST_PG_URL or --pg-url is set.)
"""

from __future__ import annotations

import gc
import json
import os
import platform
import random
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import typer

HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE / "results" / "store_bench.json"
TARGET_SUBMIT_PER_S = 2_000.0
TARGET_CYCLE_S = 0.5

app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)


def graph_description(nodes: int) -> dict[str, Any]:
    racks = max(1, nodes // 32)
    return {
        "cluster": "bench0",
        "node": {"cores": 64},
        "racks": [{"nodes": nodes // racks} for _ in range(racks)],
    }


def jobspec_text(nodes: int, cores: int, duration: int) -> str:
    return json.dumps(
        {
            "version": 1,
            "resources": [
                {
                    "type": "node",
                    "count": nodes,
                    "with": [
                        {
                            "type": "slot",
                            "count": 1,
                            "label": "task",
                            "with": [{"type": "core", "count": cores}],
                        }
                    ],
                }
            ],
            "tasks": [{"command": ["app"], "slot": "task", "count": {"per_slot": 1}}],
            "attributes": {"system": {"duration": duration}},
        }
    )


def make_jobs(n: int, seed: int) -> list[Any]:
    from fluxnetes.store import Submission

    rng = random.Random(seed)
    out = []
    for i in range(n):
        nodes = min(8, int(rng.expovariate(0.6)) + 1)
        cores = rng.choice([1, 2, 4, 8, 16, 32])
        duration = rng.randint(60, 7_200)
        out.append(
            Submission(
                "bench",
                f"job{i}",
                jobspec_text(nodes, cores, duration),
                size=nodes,
                duration=duration,
                priority=1 if rng.random() < 0.05 else 0,
            )
        )
    return out


@contextmanager
def fresh_database(kind: str, pg_url: str | None, tmp: Path) -> Iterator[str]:
    if kind == "sqlite":
        path = tmp / f"store-bench-{uuid.uuid4().hex[:8]}.db"
        try:
            yield f"sqlite:///{path}"
        finally:
            for suffix in ("", "-wal", "-shm"):
                Path(str(path) + suffix).unlink(missing_ok=True)
        return
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    assert pg_url
    name = "fx_bench_" + uuid.uuid4().hex[:8]
    admin = create_engine(pg_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        c.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield make_url(pg_url).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as c:
            c.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def matcher_factory(nodes: int, policy: str) -> Callable[[], Any]:
    from fluxnetes.graph import from_description
    from fluxnetes.match import Matcher  # type: ignore[attr-defined]

    desc = graph_description(nodes)
    return lambda: Matcher(from_description(desc), policy=policy)


def run_backend(kind: str, url: str, opts: dict[str, Any]) -> dict[str, Any]:
    from fluxnetes.queue.cycle import schedule_cycle
    from fluxnetes.queue.policy import QueuePolicy
    from fluxnetes.store import JobState, Store
    from fluxnetes.store.service import QueueService

    store = Store.open(url)
    jobs = make_jobs(opts["jobs"], opts["seed"])
    now = 1_000_000
    out: dict[str, Any] = {"backend": kind}

    # --- submissions
    t0 = time.perf_counter()
    for i in range(0, len(jobs), opts["batch"]):
        store.submit_many(jobs[i : i + opts["batch"]], now)
    dt = time.perf_counter() - t0
    out["submit_batched"] = {
        "jobs": len(jobs),
        "batch": opts["batch"],
        "seconds": dt,
        "per_s": len(jobs) / dt,
    }
    single = make_jobs(opts["single"], opts["seed"] + 1)
    single = [type(s)(**{**s.__dict__, "name": "single-" + s.name}) for s in single]
    t0 = time.perf_counter()
    for s in single:
        store.submit(s, now)
    dt = time.perf_counter() - t0
    out["submit_single"] = {"jobs": len(single), "seconds": dt, "per_s": len(single) / dt}
    # the single ones are not part of the cycle workload
    for s in single:
        rec = store.find(s.namespace, s.name)
        assert rec is not None
        store.transition(rec.id, JobState.CANCELLED, now, "bench: submission test only")

    # --- cycles
    match_time = [0.0]

    def timed_cycle(*a: Any, **kw: Any) -> Any:
        t = time.perf_counter()
        try:
            return schedule_cycle(*a, **kw)
        finally:
            match_time[0] = time.perf_counter() - t

    gc_pause = [0.0]
    gc_start = [0.0]

    def on_gc(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            gc_start[0] = time.perf_counter()
        else:
            gc_pause[0] += time.perf_counter() - gc_start[0]

    gc.callbacks.append(on_gc)
    clock = {"t": now}
    policy = QueuePolicy(name=opts["policy"], queue_depth=opts["queue_depth"])
    factory = matcher_factory(opts["nodes"], opts["match_policy"])
    svc = QueueService(store, factory, clock=lambda: clock["t"], policy=policy, cycle=timed_cycle)

    t0 = time.perf_counter()
    svc.recover()  # the initial (empty) matcher: graph build not counted in the cycles
    out["graph_build_s"] = time.perf_counter() - t0

    def one_cycle() -> dict[str, Any]:
        pending = store.counts()
        queued = pending[JobState.PENDING] + pending[JobState.RESERVED]
        t = time.perf_counter()
        gc_pause[0] = 0.0
        rep = svc.run_cycle()
        total = time.perf_counter() - t
        return {
            "now": clock["t"],
            "queued": queued,
            "considered": rep.considered,
            "started": len(rep.started),
            "reserved": len(rep.reserved),
            "unsatisfiable": len(rep.unsatisfiable),
            "total_s": total,
            "match_s": match_time[0],
            "store_s": total - match_time[0],
            "gc_pause_s": gc_pause[0],
        }

    out["first_cycle"] = one_cycle()
    # fill: cycles at the same instant until the cluster takes no more jobs
    fill = []
    for _ in range(opts["max_fill"]):
        c = one_cycle()
        fill.append(c)
        if c["started"] == 0:
            break
    out["fill_cycles"] = fill
    # steady state: jump to the next job end, complete what ended, run one cycle
    steady = []
    for _ in range(opts["cycles"]):
        running = store.jobs([JobState.RUNNING])
        if not running:
            break
        ends = sorted((j.start_time or 0) + j.duration for j in running)
        clock["t"] = max(clock["t"] + 1, ends[0])
        for j in running:
            if (j.start_time or 0) + j.duration <= clock["t"]:
                store.transition(j.id, JobState.COMPLETED, clock["t"], "bench: time limit")
        steady.append(one_cycle())
    out["steady_cycles"] = steady

    def summary(key: str) -> dict[str, float]:
        vals = [c[key] for c in steady] or [0.0]
        return {
            "median": statistics.median(vals),
            "max": max(vals),
            "p90": sorted(vals)[int(0.9 * (len(vals) - 1))],
        }

    out["steady_summary"] = {k: summary(k) for k in ("total_s", "match_s", "store_s", "gc_pause_s")}
    out["steady_summary"]["started_total"] = sum(c["started"] for c in steady)

    # --- recovery: a new process rebuilds the graph from the recorded allocations
    gc.callbacks.remove(on_gc)
    svc2 = QueueService(store, factory, clock=lambda: clock["t"], policy=policy)
    t0 = time.perf_counter()
    replayed = svc2.recover()
    out["recovery"] = {
        "allocations_replayed": replayed,
        "seconds": time.perf_counter() - t0,
        "replay_errors": len(svc2.replay_errors),
    }
    store.close()
    return out


def machine() -> dict[str, Any]:
    return {
        "cpu_count": os.cpu_count(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "processor": platform.processor(),
        # the machine is shared: its load (runnable processes, 1 min average) at the start
        # and at the end of the run tells how much the figures were disturbed
        "loadavg_1m": os.getloadavg()[0],
    }


@app.command()
def main(
    jobs: int = typer.Option(10_000, help="queued jobs"),
    nodes: int = typer.Option(1_024, help="graph nodes"),
    batch: int = typer.Option(500, help="submissions per transaction"),
    single: int = typer.Option(500, help="one-per-transaction submissions (comparison)"),
    cycles: int = typer.Option(30, help="steady-state cycles to time"),
    max_fill: int = typer.Option(200, help="most cycles spent filling the cluster"),
    policy: str = typer.Option("easy", help="queue policy"),
    queue_depth: int = typer.Option(32, help="jobs a cycle considers"),
    match_policy: str = typer.Option("first", help="matcher policy"),
    seed: int = typer.Option(7),
    backend: list[str] = typer.Option(["sqlite", "postgresql"], help="sqlite / postgresql"),
    pg_url: str = typer.Option("", help="PostgreSQL server URL (default FLUXNETES_TEST_PG_URL)"),
    tmp: Path = typer.Option(Path("/tmp"), help="where SQLite files go"),
    out: Path = typer.Option(DEFAULT_OUT),
) -> None:
    opts = {
        "jobs": jobs,
        "nodes": nodes,
        "batch": batch,
        "single": single,
        "cycles": cycles,
        "policy": policy,
        "queue_depth": queue_depth,
        "match_policy": match_policy,
        "seed": seed,
        "max_fill": max_fill,
    }
    load_start = os.getloadavg()[0]
    pg = pg_url or os.environ.get("FLUXNETES_TEST_PG_URL", "")
    results = []
    for kind in backend:
        if kind == "postgresql" and not pg:
            typer.echo(
                "store_bench: no PostgreSQL URL (FLUXNETES_TEST_PG_URL); skipping it", err=True
            )
            continue
        with fresh_database(kind, pg, tmp) as url:
            typer.echo(f"store_bench: {kind} ...", err=True)
            results.append(run_backend(kind, url, opts))
    targets = []
    for r in results:
        cycles_all = [r["first_cycle"], *r["fill_cycles"], *r["steady_cycles"]]
        worst = max(c["total_s"] for c in cycles_all)
        worst_store = max(c["store_s"] for c in cycles_all)
        targets.append(
            {
                "backend": r["backend"],
                "metric": "cycle_store_s (worst; total - matcher)",
                "value": worst_store,
                "limit": TARGET_CYCLE_S,
                "pass": worst_store <= TARGET_CYCLE_S,
            }
        )
        median = statistics.median(c["total_s"] for c in cycles_all)
        targets.append(
            {
                "backend": r["backend"],
                "metric": "cycle_total_s (median)",
                "value": median,
                "limit": TARGET_CYCLE_S,
                "pass": median <= TARGET_CYCLE_S,
            }
        )
        targets.append(
            {
                "backend": r["backend"],
                "metric": "cycle_total_s (worst)",
                "value": worst,
                "limit": TARGET_CYCLE_S,
                "pass": worst <= TARGET_CYCLE_S,
            }
        )
        if r["backend"] == "postgresql":
            v = r["submit_batched"]["per_s"]
            targets.append(
                {
                    "backend": "postgresql",
                    "metric": "submissions_per_s (batched)",
                    "value": v,
                    "limit": TARGET_SUBMIT_PER_S,
                    "pass": v >= TARGET_SUBMIT_PER_S,
                }
            )
    info = machine()
    info["loadavg_1m_start"] = load_start
    doc = {
        "benchmark": "store_bench",
        "parameters": opts,
        "machine": info,
        "results": results,
        "targets": targets,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2) + "\n")
    for r in results:
        s = r["steady_summary"]
        typer.echo(
            f"{r['backend']:>10}: submit {r['submit_batched']['per_s']:,.0f}/s batched, "
            f"{r['submit_single']['per_s']:,.0f}/s single; first cycle "
            f"{r['first_cycle']['total_s']:.3f}s ({r['first_cycle']['started']} started); "
            f"{len(r['fill_cycles'])} fill cycles max "
            f"{max([c['total_s'] for c in r['fill_cycles']] or [0]):.3f}s; steady "
            f"median {s['total_s']['median']:.3f}s max {s['total_s']['max']:.3f}s "
            f"(store {s['store_s']['median']:.3f}s); recovery {r['recovery']['seconds']:.2f}s "
            f"({r['recovery']['allocations_replayed']} allocations)"
        )
    for t in targets:
        typer.echo(
            f"target {t['backend']} {t['metric']}: {t['value']:.3f} vs {t['limit']} "
            f"{'PASS' if t['pass'] else 'FAIL'}"
        )
    typer.echo(f"wrote {out}")


if __name__ == "__main__":
    app()
