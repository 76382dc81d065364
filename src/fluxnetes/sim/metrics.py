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
    # one pass over the outcomes (a run has up to hundreds of thousands), the bounded
    # slowdown inlined: the same arithmetic as `bounded_slowdown`, so the same floats
    waits: list[int] = []
    bslds: list[float] = []
    first: int | None = None
    last = 0
    used = 0
    for o in run.outcomes:
        start, end = o.start, o.end
        if start is None or end is None:
            continue
        submit = o.job.submit
        wait = start - submit
        took = end - start
        waits.append(wait)
        bsld = (wait + took) / (took if took > TAU else TAU)
        bslds.append(bsld if bsld > 1.0 else 1.0)
        used += o.cores * took
        if first is None:
            first, last = submit, end
        else:
            if submit < first:
                first = submit
            if end > last:
                last = end
    rejected = len(run.outcomes) - len(waits)
    if first is None:
        return Summary(policy, 0, rejected, 0, 0.0, 0.0, 0.0, 0, 0.0, 0.0, run.total_cores,
                       run.cycles, run.matcher_calls, wall_seconds, engine)
    makespan = max(last - first, 1)
    return Summary(
        policy=policy,
        jobs=len(waits),
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
