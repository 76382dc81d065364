"""Putting it together: trace -> jobs -> machine -> scheduler -> summary (used by the CLI
and the benchmark)."""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from fluxnetes.queue import QueuePolicy, Scheduler
from fluxnetes.queue.policy import ReservationStyle
from fluxnetes.sim.engine import SimJob, SimObserver, SimRun, simulate
from fluxnetes.sim.machine import Machine
from fluxnetes.sim.metrics import Summary, summarize
from fluxnetes.sim.swf import SwfTrace
from fluxnetes.sim.workload import Estimate, FilterReport, to_jobs

if TYPE_CHECKING:
    from fluxnetes.sim.fairshare import FairShareSetup

#: Jobs considered per scheduling cycle in the simulator (see sim/README.md): the whole
#: queue for fcfs/easy (as in the classic definitions); conservative and hybrid plan a
#: reservation for every job they consider, so they look at the first 256 (the longest
#: queue KTH-SP2 builds under conservative is ~140 jobs, so the cap never binds there).
SIM_QUEUE_DEPTH: dict[str, int | None] = {"fcfs": None, "easy": None, "conservative": None,
                                          "hybrid": 256}


#: ``queue`` (default): the operator's Scheduler and the graph matcher, in the reference's
#: event order (``engine.py``); it gives the reference's schedules exactly with counted
#: reservations on identical nodes. ``count``: the count-only model of the reference
#: (``fastsim.py``: no graph, no matcher; fcfs, easy or conservative with counted
#: reservations on identical nodes), kept as the oracle the tests and the benchmark compare
#: the queue engine with, or an error saying why it cannot run.
Engine = Literal["queue", "count"]
ENGINES: tuple[str, ...] = ("queue", "count")


class EngineError(ValueError):
    """``engine="count"`` was asked for a run it cannot do (the message says why)."""


def bundled_trace() -> Path:
    """The KTH-SP2 trace shipped with the package."""
    return Path(__file__).resolve().parent.parent / "data" / "traces" / "KTH-SP2-1996-2.swf.gz"


@dataclass
class Workload:
    trace: SwfTrace
    machine: Machine
    jobs: list[SimJob]
    report: FilterReport


def prepare(
    trace: SwfTrace,
    machine: Machine,
    *,
    filter_published: bool = True,
    estimate: Estimate = "requested",
    limit: int | None = None,
) -> Workload:
    records = trace.records[:limit] if limit else trace.records
    jobs, report = to_jobs(records, machine_cores=machine.total_cores,
                           filter_published=filter_published, estimate=estimate)
    return Workload(trace, machine, jobs, report)


def default_matcher(graph: Any, match_policy: str) -> Any:
    from fluxnetes.match import Matcher

    # `first` on identical nodes: the simulator's requests are answered from per-node
    # counters (match/firstfit.py), the walk's answers without the walk
    return Matcher(graph, policy=match_policy, counters=True)


def policy_for(
    name: str,
    queue_depth: int | None = None,
    *,
    reservations: ReservationStyle = "counted",
) -> QueuePolicy:
    """``name`` (fcfs, easy, conservative, hybrid[:N]) with the simulator's queue depth
    (``queue_depth`` None = the simulator default for that policy)."""
    base = QueuePolicy.parse(name, queue_depth=None)
    depth = queue_depth if queue_depth is not None else SIM_QUEUE_DEPTH[base.name]
    return QueuePolicy(base.name, queue_depth=depth, reservation_depth=base.reservation_depth,
                       reservation_style=reservations)


def fast_engine_reason(workload: Workload, policy: QueuePolicy) -> str:
    """Why ``workload`` under ``policy`` cannot run on the count oracle ("" = it can)."""
    from fluxnetes.sim.fastsim import fast_path_reason

    if policy.queue_depth not in (None, SIM_QUEUE_DEPTH.get(policy.name)):
        return f"queue depth {policy.queue_depth} (the reference looks at the whole queue)"
    return fast_path_reason(workload.jobs, list(workload.machine.node_cores().values()),
                            policy.name, policy.reservation_style)


def run_policy(
    workload: Workload,
    policy: QueuePolicy,
    *,
    match_policy: str = "first",
    matcher_factory: Callable[[Any, str], Any] = default_matcher,
    observer: SimObserver | None = None,
    progress: Callable[[int], None] | None = None,
    engine: Engine = "queue",
    fairshare: FairShareSetup | None = None,
) -> tuple[SimRun, Summary]:
    """Run one policy on ``engine`` (:data:`Engine`; ``Summary.engine`` says which). With
    ``fairshare`` the queue is in the fair-share order (``sim/fairshare.py``; any policy on
    the queue engine, fcfs and easy on the count oracle) and the summary is named
    ``<policy>+fairshare``."""
    machine = workload.machine
    if engine not in ENGINES:
        raise EngineError(f"engine: {engine!r} is not one of {', '.join(ENGINES)}")
    label = str(policy)
    reorder = None
    if fairshare is not None:
        from fluxnetes.sim.fairshare import FairShareOrder

        first = min((j.submit for j in workload.jobs), default=0)
        order = FairShareOrder(fairshare, observer, start=first)
        observer, reorder, label = order, order.reorder, f"{policy}+fairshare"
    if engine == "count":
        reason = fast_engine_reason(workload, policy)
        if not reason and reorder is not None and policy.name == "conservative":
            reason = "fair share with conservative (the count oracle plans each job at submission)"
        if not reason:
            from fluxnetes.sim.fastsim import simulate_fast

            names = list(machine.node_cores())
            started = time.perf_counter()
            run = simulate_fast(workload.jobs, policy.name, node_names=names,
                                cores_per_node=machine.cores_per_node,
                                whole_nodes=machine.whole_nodes, observer=observer,
                                progress=progress, reorder=reorder)
            wall = time.perf_counter() - started
            return run, summarize(run, label, wall, engine="count")
        raise EngineError(f"the count oracle cannot run this: {reason}")
    graph = copy.deepcopy(machine.graph)  # every run starts from an untouched graph
    matcher = matcher_factory(graph, match_policy)
    # per-node calendars matter for pinned reservations only (a counted reservation holds no
    # node, so with counted ones the root count already answers every `fits_now`)
    node_cores = machine.node_cores() if policy.reservation_style == "pinned" else None
    scheduler = Scheduler(matcher, policy, capacity_cores=machine.total_cores,
                          node_cores=node_cores, incremental=True)
    started = time.perf_counter()
    run = simulate(workload.jobs, scheduler, machine.jobspec, total_cores=machine.total_cores,
                   min_cores_for=machine.min_cores, observer=observer, progress=progress,
                   reorder=reorder)
    wall = time.perf_counter() - started
    return run, summarize(run, label, wall, engine="queue")
