"""`fluxnetes simulate`: checking the options and building the run plan (the trace read, the
machine built, the workload prepared, the policies and fair share to run and on which engine).
Every bad option ends with `error: ...` on stderr and exit code 2, before anything runs.

The engine's modules (fluxnetes.queue, fluxnetes.sim) are imported inside the functions: the
command chooses the native or the pure-Python build before anything imports them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import typer


@dataclass(frozen=True)
class SimulateArgs:
    """The command line of `fluxnetes simulate`, as given (help: command.py)."""

    trace: Path | None
    policy: str
    compare: str | None
    as_json: bool
    csv_file: Path | None
    plots: Path | None
    use_filter: bool
    nodes: int | None
    cores: int | None
    graph: Path | None
    from_cluster: Path | None
    rack_label: str
    racks: int
    whole_nodes: bool
    pack: str
    estimate: str
    limit: int | None
    match_policy: str
    queue_depth: int | None
    reservations: str
    engine: str
    strict: bool
    store: str | None
    fairshare: str | None
    fairshare_algo: str | None
    half_life: str | None
    max_age: str | None
    weight_age: float | None
    weight_fairshare: float | None
    weight_size: float | None
    weight_qos: float | None
    accounts_shown: int


@dataclass(frozen=True)
class RunPlan:
    """What to simulate: the workload and, per run, (label, policy, fair share or None)."""

    path: Path  # the trace
    swf: Any  # sim.swf.SwfTrace
    workload: Any  # sim.runner.Workload
    setup: Any  # sim.fairshare.FairShareSetup, or None without --fairshare
    runs: list[tuple[str, Any, Any]]
    engines: dict[str, str]  # run label -> the engine that runs it, described


def usage_error(message: str, code: int = 2) -> typer.Exit:
    from rich.console import Console

    console = Console(stderr=True, soft_wrap=True, highlight=False)
    console.print("error:", style="bold red", end=" ")
    console.print(message, markup=False)
    return typer.Exit(code)


def plan_run(opts: SimulateArgs) -> RunPlan:
    """Check every option, read the trace and build the machine and the runs."""
    from fluxnetes.sim.runner import prepare

    policies = _check_flags(opts)
    _make_output_dirs(opts)
    path, swf = _read_trace(opts)
    machine = _machine(opts, swf)
    workload = prepare(swf, machine, filter_published=opts.use_filter, estimate=opts.estimate,  # type: ignore[arg-type]
                       limit=opts.limit)
    if not workload.jobs:
        raise usage_error(f"{path}: no job left to simulate ({'; '.join(workload.report.lines())})")

    setup = None
    if opts.fairshare is not None:
        setup = _fairshare_setup(opts.fairshare, swf, workload, opts.fairshare_algo,
                                 opts.half_life, opts.max_age,
                                 {"age": opts.weight_age, "fairshare": opts.weight_fairshare,
                                  "job_size": opts.weight_size, "qos": opts.weight_qos})
    # (label, policy, fair share or None): with --fairshare and --compare each policy runs
    # plain and with fair share; with --fairshare alone, with fair share only
    plan: list[tuple[str, Any, Any]] = []
    for pol in policies:
        if setup is None or opts.compare:
            plan.append((str(pol), pol, None))
        if setup is not None:
            plan.append((f"{pol}+fairshare", pol, setup))
    return RunPlan(path, swf, workload, setup, plan, _engines(opts, workload, plan))


def _check_flags(opts: SimulateArgs) -> list[Any]:
    """The flags that need no file read; returns the policies to run (queue.Policy)."""
    from fluxnetes.queue import PolicyError
    from fluxnetes.sim.runner import policy_for

    estimate, limit, queue_depth = opts.estimate, opts.limit, opts.queue_depth
    graph, nodes, cores = opts.graph, opts.nodes, opts.cores
    reservations, engine, pack, compare = opts.reservations, opts.engine, opts.pack, opts.compare
    accounts_shown, match_policy = opts.accounts_shown, opts.match_policy
    if estimate not in ("requested", "actual"):
        raise usage_error(f"--estimate must be requested or actual (got {estimate!r})")
    if limit is not None and limit < 1:
        raise usage_error(f"--limit must be >= 1 (got {limit})")
    if queue_depth is not None and queue_depth < 1:
        raise usage_error(f"--queue-depth must be >= 1 (got {queue_depth})")
    if graph is not None and (nodes is not None or cores is not None):
        raise usage_error("give the machine either as --graph FILE or as --nodes N --cores C, not both")
    if (nodes is None) != (cores is None):
        raise usage_error("--nodes and --cores go together (e.g. --nodes 100 --cores 1)")
    if reservations not in ("pinned", "counted"):
        raise usage_error(f"--reservations must be pinned or counted (got {reservations!r})")
    if engine not in ("queue", "count"):
        raise usage_error(f"--engine must be queue or count (got {engine!r})")
    if pack not in ("none", "racks"):
        raise usage_error(f"--pack must be racks or none (got {pack!r})")
    if pack != "none" and engine == "count":
        raise usage_error("--pack racks needs the queue engine (--engine count places no job)")
    names = [p.strip() for p in (compare or opts.policy).split(",") if p.strip()]
    if not names:
        raise usage_error("--compare needs at least one policy")
    try:
        policies = [policy_for(name, queue_depth, reservations=reservations)  # type: ignore[arg-type]
                    for name in names]
    except PolicyError as exc:
        raise usage_error(str(exc)) from None
    if len({str(p) for p in policies}) != len(policies):
        raise usage_error(f"--compare lists a policy twice: {compare}")
    fs_flags = {"--fairshare-algo": opts.fairshare_algo, "--half-life": opts.half_life,
                "--max-age": opts.max_age, "--weight-age": opts.weight_age,
                "--weight-fairshare": opts.weight_fairshare, "--weight-size": opts.weight_size,
                "--weight-qos": opts.weight_qos}
    if opts.fairshare is None:
        given = [flag for flag, value in fs_flags.items() if value is not None]
        if given:
            raise usage_error(f"{given[0]} needs --fairshare users|groups|FILE.yaml")
    if accounts_shown < 0:
        raise usage_error(f"--accounts-shown must be >= 0 (got {accounts_shown})")
    if match_policy != "first":  # the default needs no check (and no matcher import)
        from fluxnetes.match import POLICIES

        if match_policy not in POLICIES:
            raise usage_error(f"--match-policy must be one of {', '.join(POLICIES)} (got {match_policy!r})")
    return policies


def _make_output_dirs(opts: SimulateArgs) -> None:
    # Output locations are checked before the run, so a typo does not cost the simulation.
    csv_file, plots = opts.csv_file, opts.plots
    for target, what in ((csv_file.parent if csv_file else None, "--csv"), (plots, "--plots")):
        if target is None:
            continue
        try:
            target.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise usage_error(f"{what}: cannot create {target} ({exc.strerror or exc})") from None


def _read_trace(opts: SimulateArgs) -> tuple[Path, Any]:
    from fluxnetes.sim.runner import bundled_trace
    from fluxnetes.sim.swf import SwfError, read_swf

    path = opts.trace or bundled_trace()
    try:
        swf = read_swf(path, strict=opts.strict)
    except SwfError as exc:
        raise usage_error(str(exc)) from None
    except OSError as exc:
        raise usage_error(f"{path}: cannot read ({exc.strerror or exc})") from None
    if not swf.records:
        detail = f" ({len(swf.problems)} malformed lines, first: {swf.problems[0]})" if swf.problems else ""
        raise usage_error(f"{path}: no job records{detail}")
    return path, swf


def _machine(opts: SimulateArgs, swf: Any) -> Any:
    """The machine given one way: --from-cluster, --graph, --nodes/--cores or the SWF header."""
    from fluxnetes.sim.machine import (
        MachineError,
        machine_from_graph_file,
        machine_from_header,
        machine_from_size,
    )

    graph, from_cluster, nodes, cores = opts.graph, opts.from_cluster, opts.nodes, opts.cores
    racks, whole_nodes = opts.racks, opts.whole_nodes
    given = [flag for flag, value in (("--graph", graph), ("--from-cluster", from_cluster),
                                      ("--nodes/--cores", nodes)) if value is not None]
    if len(given) > 1:
        raise usage_error(f"give the machine one way: {' and '.join(given)} were both given")
    try:
        if from_cluster is not None:
            if racks:
                raise MachineError("--racks builds racks for a machine given by size; a "
                                   "cluster's racks come from its Node labels (--rack-label)")
            machine = _cluster_machine(from_cluster, opts.rack_label, whole_nodes)
        elif graph is not None:
            if racks:
                raise MachineError("--racks builds racks for a machine given by size (the SWF "
                                   "header or --nodes/--cores); a --graph has its own")
            machine = machine_from_graph_file(graph, whole_nodes=whole_nodes)
        elif nodes is not None and cores is not None:
            machine = machine_from_size(nodes, cores, whole_nodes=whole_nodes, racks=racks)
        else:
            machine = machine_from_header(swf.header, whole_nodes=whole_nodes, racks=racks)
        if opts.pack == "racks":
            machine.set_pack("rack")
    except MachineError as exc:
        raise usage_error(str(exc)) from None
    return machine


def _engines(opts: SimulateArgs, workload: Any, plan: list[tuple[str, Any, Any]]) -> dict[str, str]:
    """Which engine runs each run, described; the count oracle refuses what it cannot run."""
    from fluxnetes.sim.runner import fast_engine_reason

    engines: dict[str, str] = {}
    for label, pol, fs in plan:
        if opts.engine == "queue":
            engines[label] = f"queue (the operator's Scheduler, graph matcher '{opts.match_policy}')"
            continue
        reason = fast_engine_reason(workload, pol)
        if not reason and fs is not None and pol.name == "conservative":
            reason = "fair share with conservative (the count oracle plans each job at submission)"
        if reason:
            raise usage_error(f"--engine count cannot run {label}: {reason}")
        engines[label] = "count (the oracle: no graph placement)"
    return engines


def _cluster_machine(kubeconfig: Path, rack_label: str, whole_nodes: bool) -> Any:
    """The machine as the operator sees the cluster: its Nodes (allocatable resources, zone
    and rack labels) read with ``kubeconfig``, built into the graph ``kubectl fluxnetes
    graph`` exports (NodeResourceTopology socket subtrees are not read)."""
    from fluxnetes.cli.ctl.common import Conn, CtlError, fetch
    from fluxnetes.graph import GraphError, from_k8s_nodes
    from fluxnetes.sim.machine import MachineError, machine_from_graph

    if not kubeconfig.is_file():
        raise MachineError(f"--from-cluster: {kubeconfig}: no such kubeconfig file")
    try:
        view = fetch(Conn(kubeconfig, None, None), nodes=True)
        graph = from_k8s_nodes(view.nodes, rack_label=rack_label)
    except (CtlError, GraphError) as exc:
        raise MachineError(f"--from-cluster {kubeconfig}: {exc}") from None
    return machine_from_graph(graph, f"cluster of {kubeconfig} ({len(view.nodes)} Nodes)",
                              whole_nodes=whole_nodes)


def _fairshare_setup(how: str, swf: Any, workload: Any, algo: str | None, half_life: str | None,
                     max_age: str | None, weights: dict[str, float | None]) -> Any:
    from fluxnetes.sim.fairshare import (
        FairShareSetup,
        FairShareSimError,
        accounts_for,
        make_config,
        parse_duration,
    )

    defaults = {"age": 1000.0, "fairshare": 10000.0, "job_size": 1000.0, "qos": 1000.0}
    try:
        accounts = accounts_for(how, swf, workload.jobs)
        config = make_config(
            algorithm=algo or "fairtree",
            half_life=parse_duration(half_life or "7d", "--half-life"),
            max_age=parse_duration(max_age or "7d", "--max-age"),
            weights={k: (v if v is not None else defaults[k]) for k, v in weights.items()},
            total_cores=workload.machine.total_cores)
    except FairShareSimError as exc:
        raise usage_error(str(exc)) from None
    return FairShareSetup(accounts, config)
