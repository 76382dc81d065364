"""`fluxnetes simulate`: what the runs show beyond their summaries (fairness per account and
how well each got its share, rack spread, fragmentation) and the files written from them
(per-job CSV, plots)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fluxnetes.cli.simulate.options import RunPlan, SimulateArgs


@dataclass(frozen=True)
class Results:
    """Per run label: fairness report and share fit (with --fairshare), rack spread and
    fragmentation (when the machine has racks); the plots written."""

    reports: dict[str, Any]  # sim.fairshare.FairnessReport
    fits: dict[str, Any]  # sim.sharefit.ShareFit
    spreads: dict[str, dict[str, float]]
    frags: dict[str, dict[str, float]]
    plot_paths: list[Path]


def collect(opts: SimulateArgs, plan: RunPlan, runs: dict[str, Any],
            summaries: dict[str, Any]) -> Results:
    """Measure the runs and write the plots (--plots)."""
    plots, path, setup, workload = opts.plots, plan.path, plan.setup, plan.workload
    plot_paths: list[Path] = []
    if plots is not None:
        from fluxnetes.sim.plots import write_plots

        plot_paths = write_plots(runs, plots, title=f"({path.name})")
    reports: dict[str, Any] = {}
    fits: dict[str, Any] = {}  # run -> sharefit.ShareFit
    if setup is not None:
        from fluxnetes.sim.fairshare import fairness, normalized_shares, write_share_plot
        from fluxnetes.sim.sharefit import share_fit

        reports = {name: fairness(run, setup.accounts) for name, run in runs.items()}
        shares = normalized_shares(setup.accounts.tree)
        fits = {name: share_fit(run, setup.accounts.account_of, shares)
                for name, run in runs.items()}
        if plots is not None:
            plot_paths.append(write_share_plot(runs, setup.accounts, plots / "fairshare_usage.png",
                                               title=f"({path.name})"))
    from fluxnetes.sim.topology import fragmentation, rack_spread, racks_of

    rack_of = racks_of(workload.machine.graph) if any(
        s.engine == "queue" for s in summaries.values()) else {}
    spreads = {name: rack_spread(run.outcomes, rack_of) for name, run in runs.items()}
    node_cores = workload.machine.node_cores() if rack_of else {}
    frags = {name: fragmentation(run.outcomes, node_cores, rack_of) if rack_of else {}
             for name, run in runs.items()}
    return Results(reports, fits, spreads, frags, plot_paths)


def write_job_csv(path: Path, runs: dict[str, Any]) -> None:
    import csv

    from fluxnetes.sim.metrics import write_csv

    if len(runs) == 1:
        name, run = next(iter(runs.items()))
        write_csv(run.outcomes, path, name)
        return
    with path.open("w", newline="") as handle:
        w = csv.writer(handle)
        first = True
        for name, run in runs.items():
            tmp = path.with_suffix(path.suffix + ".part")
            write_csv(run.outcomes, tmp, name)
            with tmp.open(newline="") as part:
                reader = csv.reader(part)
                header = next(reader)
                if first:
                    w.writerow(header)
                    first = False
                w.writerows(reader)
            tmp.unlink()
