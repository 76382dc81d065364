"""Summary metrics of a simulation run (the usual ones of the backfilling literature)."""

from __future__ import annotations

import csv
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from fluxnetes.sim.engine import JobOutcome, SimRun

#: bounded slowdown threshold (seconds), as in Feitelson et al.
TAU = 10


@dataclass
class Summary:
    policy: str
    jobs: int  # jobs that ran
    rejected: int  # reported unsatisfiable or never started
    makespan: int  # last end - first submit (seconds)
    utilization: float  # core-seconds used / (cores * makespan)
    mean_wait: float
    median_wait: float
    max_wait: int
    mean_bsld: float
    max_bsld: float
    cores: int
    cycles: int
    matcher_calls: int
    wall_seconds: float = 0.0
    engine: str = ""  # "reference" (fastsim.py) or "queue" (Scheduler + graph matcher)

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def bounded_slowdown(outcome: JobOutcome, tau: int = TAU) -> float:
    assert outcome.start is not None and outcome.end is not None
    run = outcome.end - outcome.start
    wait = outcome.start - outcome.job.submit
    return max(1.0, (wait + run) / max(run, tau))


def summarize(run: SimRun, policy: str, wall_seconds: float = 0.0, *, engine: str = "") -> Summary:
    ran = [o for o in run.outcomes if o.start is not None and o.end is not None]
    rejected = len(run.outcomes) - len(ran)
    if not ran:
        return Summary(policy, 0, rejected, 0, 0.0, 0.0, 0.0, 0, 0.0, 0.0, run.total_cores,
                       run.cycles, run.matcher_calls, wall_seconds, engine)
    waits = [o.start - o.job.submit for o in ran if o.start is not None]
    first = min(o.job.submit for o in ran)
    last = max(o.end for o in ran if o.end is not None)
    makespan = max(last - first, 1)
    used = sum(o.cores * (o.end - o.start) for o in ran if o.end is not None and o.start is not None)
    bslds = [bounded_slowdown(o) for o in ran]
    return Summary(
        policy=policy,
        jobs=len(ran),
        rejected=rejected,
        makespan=makespan,
        utilization=used / (run.total_cores * makespan),
        mean_wait=statistics.fmean(waits),
        median_wait=float(statistics.median(waits)),
        max_wait=max(waits),
        mean_bsld=statistics.fmean(bslds),
        max_bsld=max(bslds),
        cores=run.total_cores,
        cycles=run.cycles,
        matcher_calls=run.matcher_calls,
        wall_seconds=wall_seconds,
        engine=engine,
    )


def write_csv(outcomes: Sequence[JobOutcome], path: str | Path, policy: str = "") -> None:
    """Per-job CSV: id, submit, start, end, wait, run, procs, cores, nodes, status."""
    with Path(path).open("w", newline="") as handle:
        w = csv.writer(handle)
        w.writerow(["policy", "job", "submit", "start", "end", "wait", "run", "procs",
                    "cores", "nodes", "status"])
        for o in outcomes:
            ran = o.start is not None and o.end is not None
            w.writerow([
                policy, o.job.id, o.job.submit,
                "" if o.start is None else o.start,
                "" if o.end is None else o.end,
                "" if o.start is None else o.start - o.job.submit,
                "" if not ran else (o.end or 0) - (o.start or 0),
                o.job.procs, o.cores, " ".join(o.nodes),
                "ran" if ran else (o.rejected or "not run"),
            ])
