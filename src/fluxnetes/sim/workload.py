"""From SWF records to simulated jobs: the published-studies filter and the estimates."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from fluxnetes.sim.engine import SimJob
from fluxnetes.sim.swf import SwfRecord

Estimate = Literal["requested", "actual"]


@dataclass
class FilterReport:
    """What the conversion kept, dropped (with the reason) and changed."""

    total: int = 0
    kept: int = 0
    dropped: Counter[str] = field(default_factory=Counter)
    capped: int = 0  # run time cut down to the requested time
    examples: dict[str, list[int]] = field(default_factory=dict)  # reason -> a few line numbers

    def drop(self, reason: str, record: SwfRecord) -> None:
        self.dropped[reason] += 1
        lines = self.examples.setdefault(reason, [])
        if len(lines) < 5:
            lines.append(record.line)

    def lines(self) -> list[str]:
        out = [f"{count} dropped: {reason}" for reason, count in self.dropped.most_common()]
        if self.capped:
            out.append(f"{self.capped} run times capped at the requested time")
        return out


def to_jobs(
    records: Sequence[SwfRecord],
    *,
    machine_cores: int,
    filter_published: bool = True,
    estimate: Estimate = "requested",
) -> tuple[list[SimJob], FilterReport]:
    """Turn records into jobs.

    Always dropped (the job cannot be simulated): cancelled before it started (status 5 and
    no run time), unknown processor count, unknown run time. With ``filter_published``
    (what published backfilling studies do): also drop run time <= 0, requested time <= 0
    and more processors than the machine, and cap run time at the requested time. Without
    it, jobs asking more processors than the machine are kept and reported as unsatisfiable
    by the scheduler, and an unknown requested time means "duration unknown".

    Estimates: ``requested`` (the user's requested time, as the real scheduler saw it) or
    ``actual`` (the run time: perfect estimates).
    """
    report = FilterReport(total=len(records))
    jobs: list[SimJob] = []
    for r in records:
        if r.cancelled_before_start:
            report.drop("cancelled before it started (status 5, no run time)", r)
            continue
        if r.procs <= 0:
            report.drop("processor count unknown (fields 5 and 8 are -1 or 0)", r)
            continue
        if r.run_time < 0:
            report.drop("run time unknown (field 4 is -1)", r)
            continue
        runtime = r.run_time
        requested = r.requested_time if r.requested_time > 0 else 0
        if filter_published:
            if runtime <= 0:
                report.drop("run time <= 0", r)
                continue
            if requested <= 0:
                report.drop("requested time <= 0 or unknown", r)
                continue
            if r.procs > machine_cores:
                report.drop(f"more processors than the machine ({machine_cores})", r)
                continue
            if runtime > requested:
                runtime = requested
                report.capped += 1
        est = runtime if estimate == "actual" else requested
        if estimate == "actual" and est <= 0:
            est = 1  # a zero-length job still needs a (tiny) duration to be planned
        jobs.append(SimJob(str(r.job_number), r.submit_time, runtime, est, r.procs))
    report.kept = len(jobs)
    return jobs, report
