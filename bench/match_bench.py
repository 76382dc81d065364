"""Matcher benchmark: graph load time, per-match latency and peak memory.

For every graph size (nodes; cluster -> racks of 32 nodes -> 2 sockets -> 32 cores, optionally
2 GPUs and a 256 GB memory pool per socket), policy and jobspec:

* load: JGF file on disk -> Matcher ready (read + build + pruning filters), seconds;
* up to ``--max-allocs`` successive allocations of the same jobspec at now=0 (or until the
  graph is full), each timed from the jobspec TEXT to the emitted R (RV1 without the
  ``scheduling`` key): parsing, matching, committing and writing R;
* peak RSS of a fresh subprocess per graph size (ru_maxrss), so memory is per size.

Results go to bench/results/match_bench.json (parameters, figures, targets with pass/fail,
machine info) and a rich table is printed. Graph files are cached outside the repository (see
gen_graph.py).

Run:  .venv/bin/python bench/match_bench.py --sizes 16 --sizes 128
"""

from __future__ import annotations

import gc
import inspect
import json
import math
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import typer

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from gen_graph import GPU_VARIANT, Shape, default_cache_dir, ensure_graph  # noqa: E402

JOBSPECS: dict[str, Path] = {
    "a": HERE / "jobspecs" / "a_slot1_core1.yaml",
    "b": HERE / "jobspecs" / "b_node4_excl.yaml",
    "c": HERE / "jobspecs" / "c_slot64_core4.yaml",
}
POLICIES = ("first", "low", "lonode")
DEFAULT_OUT = HERE / "results" / "match_bench.json"

# (size, metric, policy or None, jobspec or None) -> limit ; ms for match, s for load, MB for RSS
TARGETS: list[tuple[int, str, str | None, str | None, float]] = [
    (4096, "load_s", None, None, 8.0),
    (4096, "peak_rss_mb", None, None, 1000.0),
    (4096, "median_ms", "first", "a", 0.2),
    (4096, "median_ms", "first", "b", 0.65),
    (4096, "median_ms", "first", "c", 1.0),
    *[(4096, "median_ms", p, j, 5.0) for p in ("low", "lonode") for j in "abc"],
    (1024, "median_ms", "first", "a", 0.14),
    (1024, "median_ms", "first", "b", 0.56),
    (1024, "median_ms", "first", "c", 0.8),
    *[(1024, "median_ms", p, j, 2.0) for p in ("low", "lonode") for j in "abc"],
]


# ---------------------------------------------------------------------------- worker side
def _rv1_caller(result: Any) -> Any:
    """R without the scheduling key: use the matcher's own switch if it has one."""
    to_rv1 = result.to_rv1
    try:
        params = inspect.signature(to_rv1).parameters
    except (TypeError, ValueError):  # pragma: no cover
        params = {}
    for name in ("scheduling", "include_scheduling", "with_scheduling", "jgf"):
        if name in params:
            return lambda r: r.to_rv1(**{name: False})
    return None


def _percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of an already sorted list."""
    k = max(1, math.ceil(q * len(sorted_values)))
    return sorted_values[k - 1]


def _parse_cost_ms(text: str, n: int = 300) -> float:
    """Median cost of parse_jobspec on texts it has never seen (no cache hit)."""
    from fluxnetes.jobspec import parse_jobspec

    samples = []
    for i in range(n):
        t = f"{text}\n# parse probe {i}\n"
        t0 = time.perf_counter()
        parse_jobspec(t)
        samples.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(samples)


def _double_booked(rs: list[dict[str, Any]]) -> int:
    """(rank, type, id) triples handed out by more than one allocation (R_lite idsets)."""
    from fluxnetes.jobspec.constraints import expand_idset

    seen: set[tuple[int, str, int]] = set()
    dup = 0
    for r in rs:
        for entry in r.get("execution", {}).get("R_lite", []):
            for rank in expand_idset(entry["rank"]):
                for typ, ids in entry.get("children", {}).items():
                    for i in expand_idset(ids):
                        key = (rank, typ, i)
                        if key in seen:
                            dup += 1
                        seen.add(key)
    return dup


def _rss_mb() -> float:
    try:
        import psutil

        return float(psutil.Process().memory_info().rss) / 2**20
    except ImportError:  # pragma: no cover
        return float("nan")


def run_one(
    path: Path,
    policy: str,
    spec_text: str,
    max_allocs: int,
    gc_freeze: bool,
    unique_text: bool,
    case_budget_s: float,
) -> dict[str, Any]:
    from fluxnetes.jobspec import parse_jobspec
    from fluxnetes.match import Matcher, MatchStatus

    try:
        from fluxnetes.graph import load_graph as _load
    except ImportError:
        from fluxnetes.graph import read_jgf as _load

    gc.collect()
    t0 = time.perf_counter()
    graph = _load(path)
    matcher = Matcher(graph, policy=policy)
    load_s = time.perf_counter() - t0
    rss_after_load = _rss_mb()
    if gc_freeze:
        gc.collect()
        gc.freeze()

    times: list[float] = []
    emitted: list[dict[str, Any]] = []
    fail_ms: float | None = None
    fail_status: str | None = None
    rv1_call = None
    sample_r: dict[str, Any] | None = None
    budget_end = time.perf_counter() + case_budget_s
    stopped_budget = False
    for i in range(max_allocs):
        if time.perf_counter() > budget_end:
            stopped_budget = True
            break
        # unique_text: a distinct comment per job defeats parse_jobspec's text cache
        text = f"{spec_text}\n# bench job {i}\n" if unique_text else spec_text
        t1 = time.perf_counter()
        spec = parse_jobspec(text)
        r = matcher.allocate(spec, now=0)
        if r.status is MatchStatus.ALLOCATED:
            if i == 0:
                rv1_call = _rv1_caller(r)
            if rv1_call is not None:
                rv1 = rv1_call(r)
            else:
                rv1 = r.to_rv1()
                rv1.pop("scheduling", None)
            t2 = time.perf_counter()
            times.append((t2 - t1) * 1e3)
            if sample_r is None:
                sample_r = rv1
            emitted.append(rv1)
        else:
            fail_ms = (time.perf_counter() - t1) * 1e3
            fail_status = getattr(r.status, "name", str(r.status))
            break
    if gc_freeze:
        gc.unfreeze()
    # correctness checks, outside the timed section
    checks: dict[str, Any] = {"double_booked": _double_booked(emitted)}
    if hasattr(matcher, "check_invariants"):
        try:
            matcher.check_invariants()
            checks["invariants"] = "ok"
        except Exception as exc:
            checks["invariants"] = f"{type(exc).__name__}: {exc}"
    del matcher, graph
    gc.collect()
    out: dict[str, Any] = {
        "policy": policy,
        "load_s": round(load_s, 4),
        "rss_after_load_mb": round(rss_after_load, 1),
        "allocations": len(times),
        "stopped_full": fail_ms is not None,
        "stopped_budget": stopped_budget,
        "fail_status": fail_status,
        "fail_ms": round(fail_ms, 4) if fail_ms is not None else None,
        "checks": checks,
    }
    if times:
        st = sorted(times)
        out.update(
            median_ms=round(statistics.median(st), 4),
            p99_ms=round(_percentile(st, 0.99), 4),
            mean_ms=round(statistics.fmean(st), 4),
            min_ms=round(st[0], 4),
            max_ms=round(st[-1], 4),
            first_ms=round(times[0], 4),
            # lazily built indexes make the first match pay part of the set-up cost
            load_plus_first_s=round(load_s + times[0] / 1e3, 4),
        )
        out["sample_r_lite"] = (sample_r or {}).get("execution", {}).get("R_lite")
    return out


def worker(
    size: int,
    policies: list[str],
    jobspecs: list[str],
    max_allocs: int,
    gpu_variant: bool,
    cache_dir: Path,
    gc_freeze: bool,
    unique_text: bool,
    case_budget_s: float,
) -> dict[str, Any]:
    shape = Shape(nodes=size, **(GPU_VARIANT if gpu_variant else {}))
    path = ensure_graph(shape, cache_dir)
    rss_start = _rss_mb()
    # import the matcher before any timing so import cost is not counted as load time
    import fluxnetes.jobspec
    import fluxnetes.match  # noqa: F401

    rss_imports = _rss_mb()
    parse_uncached: dict[str, float | str] = {}
    for js in jobspecs:
        text = JOBSPECS[js].read_text() if js in JOBSPECS else Path(js).read_text()
        try:
            parse_uncached[js] = round(_parse_cost_ms(text), 4)
        except Exception as exc:  # a bad jobspec is reported by its run below
            parse_uncached[js] = f"{type(exc).__name__}: {exc}"
    runs: list[dict[str, Any]] = []
    for policy in policies:
        for js in jobspecs:
            text = JOBSPECS[js].read_text() if js in JOBSPECS else Path(js).read_text()
            try:
                run = run_one(path, policy, text, max_allocs, gc_freeze, unique_text, case_budget_s)
            except Exception as exc:  # record and go on: one broken case must not hide the rest
                run = {"policy": policy, "error": f"{type(exc).__name__}: {exc}"}
            run["jobspec"] = js
            runs.append(run)
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {
        "size": size,
        "gpu_variant": gpu_variant,
        "vertices": shape.vertex_count(),
        "jgf_file": str(path),
        "jgf_bytes": path.stat().st_size,
        "rss_start_mb": round(rss_start, 1),
        "rss_after_imports_mb": round(rss_imports, 1),
        "peak_rss_mb": round(peak_kb / 1024, 1),
        "parse_uncached_median_ms": parse_uncached,
        "runs": runs,
    }


# ---------------------------------------------------------------------------- driver side
def machine_info() -> dict[str, Any]:
    cpu = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        load = os.getloadavg()
    except OSError:
        load = (float("nan"),) * 3
    return {
        "cpu_count": os.cpu_count(),
        "cpu_model": cpu,
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "loadavg_at_start": [round(x, 2) for x in load],
        "note": "2 vCPUs shared with other concurrent sessions: timings are noisy and pessimistic",
    }


def evaluate_targets(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    by_size = {r["size"]: r for r in results if not r.get("gpu_variant")}
    out: list[dict[str, Any]] = []
    for size, metric, policy, js, limit in TARGETS:
        entry: dict[str, Any] = {
            "size": size,
            "metric": metric,
            "policy": policy,
            "jobspec": js,
            "limit": limit,
        }
        res = by_size.get(size)
        value: float | None = None
        if res is not None:
            if metric == "peak_rss_mb":
                value = res.get("peak_rss_mb")
            elif metric == "load_s":
                loads = [r["load_s"] for r in res["runs"] if "load_s" in r]
                value = round(statistics.median(loads), 4) if loads else None
                entry["load_s_max"] = max(loads) if loads else None
                lpf = [r["load_plus_first_s"] for r in res["runs"] if "load_plus_first_s" in r]
                entry["load_plus_first_match_s_max"] = max(lpf) if lpf else None
            else:
                for run in res["runs"]:
                    if run.get("policy") == policy and run.get("jobspec") == js:
                        value = run.get(metric)
        entry["value"] = value
        entry["pass"] = None if value is None else bool(value <= limit)
        out.append(entry)
    return out


def _chk(run: dict[str, Any]) -> str:
    c = run.get("checks", {})
    bad = c.get("double_booked", 0) or c.get("invariants", "ok") != "ok"
    return "[red]BAD" if bad else "ok"


def _stop(run: dict[str, Any]) -> str:
    """Why a case stopped: graph full (with the failing match's ms), time budget, or max."""
    if run.get("fail_ms") is not None:
        return f"full {run['fail_ms']:.2f}"
    return "budget" if run.get("stopped_budget") else "max"


def print_table(doc: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    limits = {
        (t["size"], t["policy"], t["jobspec"]): t
        for t in doc["targets"]
        if t["metric"] == "median_ms"
    }
    table = Table(title="match_bench (ms per match: jobspec text -> R)")
    for col in (
        "size",
        "gpu",
        "policy",
        "js",
        "load s",
        "allocs",
        "1st",
        "median",
        "p99",
        "max",
        "stop",
        "RSS MB",
        "chk",
        "target",
    ):
        table.add_column(col, justify="right")
    for res in doc["results"]:
        if res.get("error"):
            table.add_row(str(res["size"]), "", "", "", "", "", "", f"[red]{res['error'][:80]}")
        for run in res["runs"]:
            t = limits.get((res["size"], run.get("policy"), run.get("jobspec")))
            verdict = ""
            if t is not None and not res.get("gpu_variant") and t["pass"] is not None:
                verdict = f"{'[green]ok' if t['pass'] else '[red]FAIL'} <= {t['limit']}"
            if "error" in run:
                table.add_row(
                    str(res["size"]),
                    "y" if res["gpu_variant"] else "",
                    run["policy"],
                    run["jobspec"],
                    "",
                    "",
                    "",
                    f"[red]{run['error'][:60]}",
                    "",
                    "",
                    "",
                    "",
                    "",
                )
                continue
            table.add_row(
                str(res["size"]),
                "y" if res["gpu_variant"] else "",
                run["policy"],
                run["jobspec"],
                f"{run['load_s']:.2f}",
                str(run["allocations"]),
                f"{run.get('first_ms', float('nan')):.2f}",
                f"{run.get('median_ms', float('nan')):.3f}",
                f"{run.get('p99_ms', float('nan')):.3f}",
                f"{run.get('max_ms', float('nan')):.3f}",
                _stop(run),
                f"{res['peak_rss_mb']:.0f}",
                _chk(run),
                verdict,
            )
    console = Console(width=max(Console().width, 130))
    console.print(table)
    other = [t for t in doc["targets"] if t["metric"] != "median_ms"]
    for t in other:
        mark = "not measured" if t["pass"] is None else ("ok" if t["pass"] else "FAIL")
        console.print(f"{t['size']} nodes {t['metric']}: {t['value']} (limit {t['limit']}): {mark}")


app = typer.Typer(add_completion=False)


@app.command()
def main(
    sizes: list[int] = typer.Option([16, 128, 1024, 4096], "--sizes", help="node counts"),
    policies: list[str] = typer.Option(list(POLICIES), "--policies", help="match policies"),
    jobspecs: list[str] = typer.Option(
        ["a", "b", "c"], "--jobspecs", help="a, b, c (bench/jobspecs) or jobspec file paths"
    ),
    max_allocs: int = typer.Option(1000, "--max-allocs", min=1, help="allocations per case"),
    gpu_variant: bool = typer.Option(
        False, "--gpu-variant", help="graphs with 2 GPUs + 256 GB memory per socket"
    ),
    out: Path = typer.Option(DEFAULT_OUT, "--out", help="result JSON file"),
    cache_dir: Path = typer.Option(None, "--cache-dir", help="JGF cache (default user cache)"),
    gc_freeze: bool = typer.Option(
        False, "--gc-freeze", help="gc.freeze() the loaded graph before matching"
    ),
    timeout: int = typer.Option(3600, "--timeout", help="seconds allowed per graph size"),
    unique_text: bool = typer.Option(
        False,
        "--unique-text",
        help="make every job's text distinct (defeats parse_jobspec's text cache)",
    ),
    case_budget: float = typer.Option(
        120.0,
        "--case-budget",
        help="stop allocating in one (size, policy, jobspec) case after this many seconds",
    ),
    worker_size: int = typer.Option(0, "--worker-size", hidden=True),
) -> None:
    for js in jobspecs:
        if js not in JOBSPECS and not Path(js).is_file():
            raise typer.BadParameter(
                f"unknown jobspec {js!r}: use a, b, c or a file path", param_hint="--jobspecs"
            )
    for s in sizes:
        if s < 1:
            raise typer.BadParameter(f"size must be >= 1, got {s}", param_hint="--sizes")
    cache = cache_dir or default_cache_dir()
    if out == DEFAULT_OUT and (gpu_variant or unique_text):
        suffix = ("_gpu" if gpu_variant else "") + ("_unique" if unique_text else "")
        out = DEFAULT_OUT.with_name(f"match_bench{suffix}.json")
    if worker_size:
        res = worker(
            worker_size,
            policies,
            jobspecs,
            max_allocs,
            gpu_variant,
            cache,
            gc_freeze,
            unique_text,
            case_budget,
        )
        print("RESULT " + json.dumps(res))
        return

    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    results: list[dict[str, Any]] = []
    for size in sizes:
        shape = Shape(nodes=size, **(GPU_VARIANT if gpu_variant else {}))
        ensure_graph(shape, cache)  # generate outside the measured subprocess
        cmd = [
            sys.executable,
            str(Path(__file__).resolve()),
            "--worker-size",
            str(size),
            "--max-allocs",
            str(max_allocs),
            "--cache-dir",
            str(cache),
        ]
        for p in policies:
            cmd += ["--policies", p]
        for js in jobspecs:
            cmd += ["--jobspecs", js]
        if gpu_variant:
            cmd.append("--gpu-variant")
        if gc_freeze:
            cmd.append("--gc-freeze")
        if unique_text:
            cmd.append("--unique-text")
        cmd += ["--case-budget", str(case_budget)]
        typer.echo(
            f"size {size}: running {len(policies)} policies x {len(jobspecs)} jobspecs ...",
            err=True,
        )
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
        except subprocess.TimeoutExpired:
            results.append(
                {
                    "size": size,
                    "gpu_variant": gpu_variant,
                    "runs": [],
                    "error": f"timeout after {timeout} s",
                    "peak_rss_mb": None,
                }
            )
            continue
        line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
        if line is None:
            results.append(
                {
                    "size": size,
                    "gpu_variant": gpu_variant,
                    "runs": [],
                    "peak_rss_mb": None,
                    "error": f"worker failed (rc={proc.returncode}): {proc.stderr[-2000:]}",
                }
            )
            typer.echo(proc.stderr[-2000:], err=True)
            continue
        results.append(json.loads(line[len("RESULT ") :]))

    doc: dict[str, Any] = {
        "benchmark": "match_bench",
        "started_utc": started,
        "finished_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "parameters": {
            "sizes": sizes,
            "policies": policies,
            "jobspecs": jobspecs,
            "jobspec_files": {
                j: str(JOBSPECS[j].relative_to(HERE.parent)) if j in JOBSPECS else j
                for j in jobspecs
            },
            "max_allocs": max_allocs,
            "gpu_variant": gpu_variant,
            "gc_freeze": gc_freeze,
            "unique_text": unique_text,
            "case_budget_s": case_budget,
            "graph_shape": "cluster -> racks of 32 nodes -> node -> 2 sockets -> 32 cores"
            + (" + 2 gpus + 256 GB memory per socket" if gpu_variant else ""),
            "timing": "per match: parse_jobspec(text) + Matcher.allocate(now=0) + to_rv1() "
            "without 'scheduling'; successful matches only (the final failing one "
            "is reported separately as fail_ms)",
            "load": "read JGF file + build Matcher (median over the fresh loads of each size)",
            "rss": "ru_maxrss of one fresh subprocess per size (all its loads and matches)",
        },
        "machine": machine_info(),
        "results": results,
    }
    doc["targets"] = evaluate_targets(results) if not gpu_variant else []
    measured = [t for t in doc["targets"] if t["pass"] is not None]
    # None when nothing was measured against a target (e.g. the GPU variant has none)
    doc["all_measured_targets_pass"] = all(t["pass"] for t in measured) if measured else None
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2) + "\n")
    print_table(doc)
    typer.echo(f"wrote {out}", err=True)


if __name__ == "__main__":
    app()
