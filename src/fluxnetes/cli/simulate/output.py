"""`fluxnetes simulate`: what it prints: the notes before the runs (trace, machine, filter,
engine), the summary table and the per-account table, or one JSON object (--json)."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fluxnetes.cli.simulate.options import RunPlan, SimulateArgs
from fluxnetes.cli.simulate.results import Results


def _short(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.0f}s"
    if seconds < 3600:
        return f"{seconds / 60:.1f}m"
    if seconds < 86400 * 2:
        return f"{seconds / 3600:.1f}h"
    return f"{seconds / 86400:.1f}d"


def _hms(seconds: float) -> str:
    s = round(seconds)
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    if s < 86400 * 2:
        return f"{s // 3600} h {s % 3600 // 60:02d} min"
    return f"{s / 86400:.1f} days"


def print_notes(opts: SimulateArgs, plan: RunPlan, build: Any, out: Any, err: Any) -> None:
    """What is simulated, on stdout (--json: only the trace's first problems, on stderr)."""
    path, swf, workload, setup, engines = plan.path, plan.swf, plan.workload, plan.setup, plan.engines
    as_json = opts.as_json
    notes = _notes(path, opts.trace is None, swf, workload, opts.use_filter, opts.estimate,
                   opts.reservations)
    if setup is not None:
        notes.append(f"priority {setup.describe()}")
        notes.extend(f"note     {line}" for line in setup.accounts.notes)
    notes.append("engine   " + "; ".join(f"{name}: {what}" for name, what in engines.items()))
    notes.append(f"build    {build.describe()}")
    if not as_json:
        for line in notes:
            out.print(line, markup=False)
    else:
        for problem in swf.problems[:5]:
            err.print(f"warning: {path}: {problem}", markup=False)


def print_json(opts: SimulateArgs, plan: RunPlan, summaries: dict[str, Any], results: Results,
               build: Any) -> None:
    """The summaries as one JSON object on stdout: a single run's, or one per run label."""
    workload, setup, spreads, frags = plan.workload, plan.setup, results.spreads, results.frags
    reports, fits = results.reports, results.fits
    payload: dict[str, Any] = {name: _json_summary(s, workload) for name, s in summaries.items()}
    for entry in payload.values():
        entry["build"] = "native" if build.active else "python"
        entry["build_detail"] = build.detail
    for name, spread in spreads.items():
        if spread:
            payload[name]["racks"] = spread
        if frags[name]:
            payload[name]["fragmentation"] = frags[name]
    for name, report in reports.items():
        payload[name]["fairness"] = {**report.as_dict(), **fits[name].as_dict()}
    if setup is not None:
        config = setup.config
        for name, _, fs in plan.runs:
            if fs is not None:
                payload[name]["fairshare"] = {
                    "accounts": setup.accounts.source, "algorithm": config.algorithm,
                    "half_life": config.half_life, "max_age": config.max_age,
                    "weights": {"age": config.weights.age, "fairshare": config.weights.fairshare,
                                "job_size": config.weights.job_size, "qos": config.weights.qos}}
    single = len(payload) == 1 and not opts.compare
    sys.stdout.write(json.dumps(next(iter(payload.values())) if single else payload, indent=2) + "\n")


def print_report(opts: SimulateArgs, plan: RunPlan, runs: dict[str, Any], summaries: dict[str, Any],
                 results: Results, out: Any) -> None:
    """The summary table, the per-account table (--fairshare), jobs that could not run and the
    files written."""
    reports, fits, setup = results.reports, results.fits, plan.setup
    _print_table(out, summaries, reports, results.spreads, fits if setup is not None else None,
                 results.frags)
    if setup is not None:
        _print_accounts(out, reports, opts.accounts_shown, fits)
    impossible = [o for r in runs.values() for o in r.outcomes if o.rejected]
    if impossible:
        shown = {o.job.id: o.rejected for o in impossible}
        out.print(f"[yellow]{len(shown)} job(s) could not run[/], e.g. "
                  + "; ".join(f"job {k}: {v}" for k, v in list(shown.items())[:3]))
    if opts.csv_file is not None:
        out.print(f"per-job results: {opts.csv_file}")
    for p in results.plot_paths:
        out.print(f"plot: {p}")


def _notes(path: Path, bundled: bool, swf: Any, workload: Any, use_filter: bool, estimate: str,
           reservations: str) -> list[str]:
    header = swf.header
    name = f"{path.name} (bundled; acknowledgement: {header.acknowledge or 'see README'})" if bundled else str(path)
    lines = [f"trace    {name}: {len(swf.records):,} records"
             + (f", {header.computer}" if header.computer else "")]
    lines.append(f"machine  {workload.machine.describe()}")
    if workload.machine.pack is not None:
        lines.append(f"pack     a job of up to {workload.machine.rack_capacity} nodes (the largest "
                     "rack) in one rack; larger jobs anywhere")
    report = workload.report
    what = "published-studies filter" if use_filter else "no filter"
    detail = "; ".join(report.lines()) or "nothing dropped"
    lines.append(f"jobs     {report.kept:,} simulated ({what}: {detail})")
    lines.append(f"estimate {'user requested time' if estimate == 'requested' else 'actual run time'}")
    lines.append(f"reserve  {reservations} reservations"
                 + (" (classic backfilling)" if reservations == "counted" else " (Fluxion placements)"))
    if swf.problems:
        lines.append(f"warning  {len(swf.problems)} malformed line(s) skipped, e.g. "
                     + "; ".join(str(p) for p in swf.problems[:3]))
    return lines


def _json_summary(s: Any, workload: Any) -> dict[str, Any]:
    d: dict[str, Any] = s.as_dict()
    d["dropped"] = dict(workload.report.dropped)
    d["capped"] = workload.report.capped
    return d


def _print_table(out: Any, summaries: dict[str, Any], reports: dict[str, Any] | None = None,
                 spreads: dict[str, dict[str, float]] | None = None,
                 fits: dict[str, Any] | None = None,
                 frags: dict[str, dict[str, float]] | None = None) -> None:
    from rich.table import Table

    table = Table(title="simulation summary", title_justify="left")
    table.add_column("")
    for name in summaries:
        table.add_column(name, justify="right")
    rows: list[tuple[str, Callable[[Any], str]]] = [
        ("jobs run", lambda s: f"{s.jobs:,}"),
        ("not run", lambda s: f"{s.rejected:,}"),
        ("makespan", lambda s: _hms(s.makespan)),
        ("utilization", lambda s: f"{s.utilization * 100:.1f} %"),
        ("mean wait", lambda s: _hms(s.mean_wait)),
        ("median wait", lambda s: _hms(s.median_wait)),
        ("max wait", lambda s: _hms(s.max_wait)),
        ("mean bounded slowdown (AVEbsld)", lambda s: f"{s.mean_bsld:,.4f}"),
        ("max bounded slowdown", lambda s: f"{s.max_bsld:,.1f}"),
        ("engine", lambda s: s.engine),
        ("scheduling passes", lambda s: f"{s.cycles:,}"),
        ("matcher calls", lambda s: f"{s.matcher_calls:,}"),
        ("wall time", lambda s: f"{s.wall_seconds:.1f} s"),
    ]
    for label, fmt in rows:
        table.add_row(label, *(fmt(s) for s in summaries.values()))
    if spreads and any(spreads.values()):
        def cell(name: str, key: str, fmt: str) -> str:
            value = spreads[name].get(key)
            return "-" if value is None else format(value, fmt)

        table.add_row("multi-node jobs", *(cell(n, "multi_node_jobs", ",") for n in summaries))
        table.add_row("  spanning > 1 rack", *(
            "-" if not spreads[n].get("multi_node_jobs") else
            f"{spreads[n]['spanning_share'] * 100:.1f} %" for n in summaries))
        table.add_row("  mean racks (excess)", *(
            "-" if not spreads[n].get("multi_node_jobs") else
            f"{spreads[n]['mean_racks']:.2f} (+{spreads[n]['mean_excess_racks']:.2f})"
            for n in summaries))
    if frags and any(frags.values()):
        for key, label in (("stranded_core_share", "free cores on part-used nodes"),
                           ("held_unused_share", "cores held, not asked for"),
                           ("rack_fragmentation", "free cores outside the freest rack")):
            table.add_row(label, *("-" if key not in frags[n] else f"{frags[n][key] * 100:.1f} %"
                                   for n in summaries))
    if fits:
        table.add_row("share error (contended days)",
                      *(f"{fits[name].error:.4f}" for name in summaries))
    if reports:
        table.add_row("Jain index (users' mean bsld)",
                      *(f"{reports[name].jain:.4f}" for name in summaries))
    out.print(table)
    out.print("bounded slowdown uses tau = 10 s; makespan = last end - first submit")


def _print_accounts(out: Any, reports: dict[str, Any], shown: int,
                    fits: dict[str, Any] | None = None) -> None:
    from rich.table import Table

    first = next(iter(reports.values()))
    names = set()
    for report in reports.values():
        names.update(report.accounts)
    jobs = {n: max(r.accounts[n].jobs for r in reports.values() if n in r.accounts) for n in names}
    ordered = sorted(names, key=lambda n: (-jobs[n], n))
    rows = ordered if shown == 0 else ordered[:shown]
    title = (f"per account ({len(rows)} of {len(ordered)}, most jobs first"
             + ("; --accounts-shown 0 for all, --json has them all)" if len(rows) < len(ordered) else ")"))
    table = Table(title=title, title_justify="left")
    table.add_column("account", no_wrap=True)
    table.add_column("share", justify="right", no_wrap=True)
    table.add_column("jobs", justify="right", no_wrap=True)
    heads = ["usage", "mean wait", "mean bsld"] + (["got / due"] if fits else [])
    for head in heads:
        table.add_column(head, justify="right", no_wrap=True)
    for acct in rows:
        row0 = next(r.accounts[acct] for r in reports.values() if acct in r.accounts)
        cells = [acct, f"{row0.share * 100:.2f} %", f"{jobs[acct]:,}"]
        got = [report.accounts.get(acct) for report in reports.values()]
        cells.append(" / ".join("-" if r is None else f"{r.usage_fraction * 100:.1f}%" for r in got))
        cells.append(" / ".join("-" if r is None else _short(r.mean_wait) for r in got))
        cells.append(" / ".join("-" if r is None else f"{r.mean_bsld:.1f}" for r in got))
        if fits:
            cells.append(" / ".join(_got_due(fits[name], acct) for name in reports))
        table.add_row(*cells)
    out.print(table)
    if len(reports) > 1:
        out.print("cells: " + " / ".join(reports), markup=False)
    out.print(f"usage = share of the core-seconds delivered in the run; Jain's index over "
              f"{len(first.user_bsld)} users' mean bounded slowdown (1 = all equal)", markup=False)
    if fits:
        out.print("got / due = core-seconds the account got / its fair division of them, summed "
                  "over the days some job waited (1 = its share exactly; see docs/fairshare.md)",
                  markup=False)


def _got_due(fit: Any, account: str) -> str:
    due = fit.due.get(account, 0.0)
    if account not in fit.delivered or due <= 0:
        return "-"
    return f"{fit.delivered[account] / due:.2f}"
