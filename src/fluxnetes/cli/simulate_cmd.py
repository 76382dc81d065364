"""`fluxnetes simulate`: replay an SWF trace through the queue and the matcher."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer


def _err(message: str, code: int = 2) -> typer.Exit:
    from rich.console import Console

    console = Console(stderr=True, soft_wrap=True, highlight=False)
    console.print("error:", style="bold red", end=" ")
    console.print(message, markup=False)
    return typer.Exit(code)


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


def simulate_command(
    trace: Annotated[
        Path | None,
        typer.Argument(help="SWF trace (.swf or .swf.gz). Default: the bundled KTH-SP2 log "
                       "(100 nodes, 28,489 jobs, Parallel Workloads Archive)."),
    ] = None,
    policy: Annotated[str, typer.Option("--policy", "-p", help="fcfs, easy, conservative or "
                                        "hybrid:N (N reservations)")] = "easy",
    compare: Annotated[
        str | None,
        typer.Option("--compare", help="Several policies side by side, e.g. fcfs,easy,conservative"),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary as one JSON object")] = False,
    csv_file: Annotated[Path | None, typer.Option("--csv", help="Write per-job results (CSV)")] = None,
    plots: Annotated[Path | None, typer.Option("--plots", help="Write PNG plots into DIR")] = None,
    use_filter: Annotated[
        bool,
        typer.Option("--filter/--no-filter", help="Published-studies filter: drop jobs with run "
                     "time <= 0, requested time <= 0 or more processors than the machine; cap "
                     "run time at the requested time"),
    ] = True,
    nodes: Annotated[int | None, typer.Option("--nodes", help="Machine: N nodes (with --cores)")] = None,
    cores: Annotated[int | None, typer.Option("--cores", help="Machine: cores per node")] = None,
    graph: Annotated[
        Path | None, typer.Option("--graph", help="Machine: a graph file (.json JGF or .yaml)")
    ] = None,
    from_cluster: Annotated[
        Path | None,
        typer.Option("--from-cluster", help="Machine: the graph built from a live cluster's "
                     "Nodes and labels (zone, rack label), as `kubectl fluxnetes graph` "
                     "exports it; the value is the kubeconfig file"),
    ] = None,
    rack_label: Annotated[
        str, typer.Option("--rack-label", help="With --from-cluster: the Node label that "
                          "names a node's rack")
    ] = "fluxnetes.io/rack",
    racks: Annotated[
        int, typer.Option("--racks", help="Machine: spread the nodes (SWF header or --nodes) "
                          "over N racks (a rack level in the graph); the summary then shows "
                          "how multi-node jobs spread over racks")
    ] = 0,
    whole_nodes: Annotated[
        bool, typer.Option("--whole-nodes", help="Jobs ask for whole (exclusive) nodes, not cores")
    ] = False,
    pack: Annotated[
        str, typer.Option("--pack", help="racks (with --whole-nodes): a job whose nodes one "
                          "rack can hold asks for rack[1] -> node[N] (exclusive), all its "
                          "nodes in one rack; a larger one stays as it is. none (default): "
                          "anywhere. Needs racks in the machine (--racks N)")
    ] = "none",
    estimate: Annotated[
        str, typer.Option("--estimate", help="Durations the scheduler sees: requested | actual")
    ] = "requested",
    limit: Annotated[int | None, typer.Option("--limit", help="Only the first N records")] = None,
    match_policy: Annotated[str, typer.Option("--match-policy", help="Matcher policy")] = "first",
    queue_depth: Annotated[
        int | None,
        typer.Option("--queue-depth", help="Jobs considered per cycle (default: all for "
                     "fcfs/easy, 256 for conservative/hybrid)"),
    ] = None,
    reservations: Annotated[
        str,
        typer.Option("--reservations", help="counted (classic backfilling, as published "
                     "simulations: a reservation is a count of cores) or pinned (Fluxion/"
                     "qmanager, as the operator: a reservation holds specific nodes)"),
    ] = "counted",
    engine: Annotated[
        str,
        typer.Option("--engine", help="queue (default): the operator's Scheduler and graph "
                     "matcher, in the reference simulator's event order (its schedules exactly, "
                     "with counted reservations on identical nodes); count: the count-only "
                     "oracle the tests compare it with (no graph placement; fcfs, easy, "
                     "conservative with counted reservations on identical nodes)"),
    ] = "queue",
    strict: Annotated[
        bool, typer.Option("--strict", help="Stop at the first malformed SWF line")
    ] = False,
    store: Annotated[
        str | None,
        typer.Option("--store", help="Also record every job and decision in a fluxnetes store "
                     "(sqlite:///PATH or postgresql+psycopg://...); slower, to show the store"),
    ] = None,
    fairshare: Annotated[
        str | None,
        typer.Option("--fairshare", help="Order the queue by fair share (multifactor priority): "
                     "users (one account per SWF user, equal shares), groups (per SWF group) or "
                     "FILE.yaml: an account tree, or FluxAccount manifests as applied to a cluster "
                     "(examples/accounts.yaml; a Namespace user-<N> or group-<N> labelled "
                     "fluxnetes.io/account chooses a trace user's account, the rest charge the "
                     "default account). With --compare, every policy runs plain and "
                     "with fair share", rich_help_panel="Fair share"),
    ] = None,
    fairshare_algo: Annotated[
        str | None,
        typer.Option("--fairshare-algo", help="fairtree (default; Slurm's Fair Tree) or classic "
                     "(Slurm's classic formula)", rich_help_panel="Fair share"),
    ] = None,
    half_life: Annotated[
        str | None,
        typer.Option("--half-life", help="Usage decay half-life: seconds or 90m, 12h, 7d, 2w; "
                     "0 = no decay (default 7d)", rich_help_panel="Fair share"),
    ] = None,
    max_age: Annotated[
        str | None,
        typer.Option("--max-age", help="Age at which the age factor reaches 1 (default 7d)",
                     rich_help_panel="Fair share"),
    ] = None,
    weight_age: Annotated[
        float | None, typer.Option("--weight-age", help="Weight of the age factor (default 1000)",
                                   rich_help_panel="Fair share")] = None,
    weight_fairshare: Annotated[
        float | None, typer.Option("--weight-fairshare", help="Weight of the fair-share factor "
                                   "(default 10000)", rich_help_panel="Fair share")] = None,
    weight_size: Annotated[
        float | None, typer.Option("--weight-size", help="Weight of the job-size factor (cores / "
                                   "machine; default 1000)", rich_help_panel="Fair share")] = None,
    weight_qos: Annotated[
        float | None, typer.Option("--weight-qos", help="Weight of the QoS (job priority) factor "
                                   "(default 1000)", rich_help_panel="Fair share")] = None,
    accounts_shown: Annotated[
        int, typer.Option("--accounts-shown", help="Accounts in the per-account table (most "
                          "jobs first; 0 = all); --json has them all", rich_help_panel="Fair share"),
    ] = 10,
) -> None:
    """Replay a workload trace through fluxnetes' queue and matcher; report waits,
    slowdowns and utilization (the same code the Kubernetes operator schedules with)."""
    from fluxnetes import native

    # before anything imports the engine's modules: the mypyc build when it matches these
    # sources (hack/build-native.sh), else pure Python (FLUXNETES_NATIVE=0 turns it off).
    # Not for the count oracle: it subclasses the engine's JobOutcome, and an interpreted
    # class cannot inherit from a compiled one.
    build = native.NativeStatus(False, "the count oracle runs as Python")
    if engine == "queue":
        try:
            build = native.activate()
        except native.NativeError as exc:
            raise _err(str(exc)) from None
    from fluxnetes.queue import PolicyError
    from fluxnetes.sim.machine import (
        MachineError,
        machine_from_graph_file,
        machine_from_header,
        machine_from_size,
    )
    from fluxnetes.sim.runner import bundled_trace, policy_for, prepare
    from fluxnetes.sim.swf import SwfError, read_swf

    if estimate not in ("requested", "actual"):
        raise _err(f"--estimate must be requested or actual (got {estimate!r})")
    if limit is not None and limit < 1:
        raise _err(f"--limit must be >= 1 (got {limit})")
    if queue_depth is not None and queue_depth < 1:
        raise _err(f"--queue-depth must be >= 1 (got {queue_depth})")
    if graph is not None and (nodes is not None or cores is not None):
        raise _err("give the machine either as --graph FILE or as --nodes N --cores C, not both")
    if (nodes is None) != (cores is None):
        raise _err("--nodes and --cores go together (e.g. --nodes 100 --cores 1)")
    if reservations not in ("pinned", "counted"):
        raise _err(f"--reservations must be pinned or counted (got {reservations!r})")
    if engine not in ("queue", "count"):
        raise _err(f"--engine must be queue or count (got {engine!r})")
    if pack not in ("none", "racks"):
        raise _err(f"--pack must be racks or none (got {pack!r})")
    if pack != "none" and engine == "count":
        raise _err("--pack racks needs the queue engine (--engine count places no job)")
    names = [p.strip() for p in (compare or policy).split(",") if p.strip()]
    if not names:
        raise _err("--compare needs at least one policy")
    try:
        policies = [policy_for(name, queue_depth, reservations=reservations)  # type: ignore[arg-type]
                    for name in names]
    except PolicyError as exc:
        raise _err(str(exc)) from None
    if len({str(p) for p in policies}) != len(policies):
        raise _err(f"--compare lists a policy twice: {compare}")
    fs_flags = {"--fairshare-algo": fairshare_algo, "--half-life": half_life, "--max-age": max_age,
                "--weight-age": weight_age, "--weight-fairshare": weight_fairshare,
                "--weight-size": weight_size, "--weight-qos": weight_qos}
    if fairshare is None:
        given = [flag for flag, value in fs_flags.items() if value is not None]
        if given:
            raise _err(f"{given[0]} needs --fairshare users|groups|FILE.yaml")
    if accounts_shown < 0:
        raise _err(f"--accounts-shown must be >= 0 (got {accounts_shown})")
    if match_policy != "first":  # the default needs no check (and no matcher import)
        from fluxnetes.match import POLICIES

        if match_policy not in POLICIES:
            raise _err(f"--match-policy must be one of {', '.join(POLICIES)} (got {match_policy!r})")

    # Output locations are checked before the run, so a typo does not cost the simulation.
    for target, what in ((csv_file.parent if csv_file else None, "--csv"), (plots, "--plots")):
        if target is None:
            continue
        try:
            target.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise _err(f"{what}: cannot create {target} ({exc.strerror or exc})") from None

    path = trace or bundled_trace()
    try:
        swf = read_swf(path, strict=strict)
    except SwfError as exc:
        raise _err(str(exc)) from None
    except OSError as exc:
        raise _err(f"{path}: cannot read ({exc.strerror or exc})") from None
    if not swf.records:
        detail = f" ({len(swf.problems)} malformed lines, first: {swf.problems[0]})" if swf.problems else ""
        raise _err(f"{path}: no job records{detail}")
    given = [flag for flag, value in (("--graph", graph), ("--from-cluster", from_cluster),
                                      ("--nodes/--cores", nodes)) if value is not None]
    if len(given) > 1:
        raise _err(f"give the machine one way: {' and '.join(given)} were both given")
    try:
        if from_cluster is not None:
            if racks:
                raise MachineError("--racks builds racks for a machine given by size; a "
                                   "cluster's racks come from its Node labels (--rack-label)")
            machine = _cluster_machine(from_cluster, rack_label, whole_nodes)
        elif graph is not None:
            if racks:
                raise MachineError("--racks builds racks for a machine given by size (the SWF "
                                   "header or --nodes/--cores); a --graph has its own")
            machine = machine_from_graph_file(graph, whole_nodes=whole_nodes)
        elif nodes is not None and cores is not None:
            machine = machine_from_size(nodes, cores, whole_nodes=whole_nodes, racks=racks)
        else:
            machine = machine_from_header(swf.header, whole_nodes=whole_nodes, racks=racks)
        if pack == "racks":
            machine.set_pack("rack")
    except MachineError as exc:
        raise _err(str(exc)) from None
    workload = prepare(swf, machine, filter_published=use_filter, estimate=estimate,  # type: ignore[arg-type]
                       limit=limit)
    if not workload.jobs:
        raise _err(f"{path}: no job left to simulate ({'; '.join(workload.report.lines())})")

    setup = None
    if fairshare is not None:
        setup = _fairshare_setup(fairshare, swf, workload, fairshare_algo, half_life, max_age,
                                 {"age": weight_age, "fairshare": weight_fairshare,
                                  "job_size": weight_size, "qos": weight_qos})
    # (label, policy, fair share or None): with --fairshare and --compare each policy runs
    # plain and with fair share; with --fairshare alone, with fair share only
    plan: list[tuple[str, Any, Any]] = []
    for pol in policies:
        if setup is None or compare:
            plan.append((str(pol), pol, None))
        if setup is not None:
            plan.append((f"{pol}+fairshare", pol, setup))

    from rich.console import Console

    err = Console(stderr=True, highlight=False, soft_wrap=True)
    out = Console(highlight=False, soft_wrap=True)
    from fluxnetes.sim.runner import fast_engine_reason

    engines: dict[str, str] = {}
    for label, pol, fs in plan:
        if engine == "queue":
            engines[label] = f"queue (the operator's Scheduler, graph matcher '{match_policy}')"
            continue
        reason = fast_engine_reason(workload, pol)
        if not reason and fs is not None and pol.name == "conservative":
            reason = "fair share with conservative (the count oracle plans each job at submission)"
        if reason:
            raise _err(f"--engine count cannot run {label}: {reason}")
        engines[label] = "count (the oracle: no graph placement)"
    notes = _notes(path, trace is None, swf, workload, use_filter, estimate, reservations)
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

    recorder = _open_recorder(store) if store is not None else None
    try:
        runs, summaries = _run_all(workload, plan, match_policy, quiet=as_json, console=err,
                                   recorder=recorder, engine=engine)
    finally:
        if recorder is not None:
            recorder.close()
            recorder.store.close()
    if recorder is not None and not as_json:
        out.print(f"recorded {len(recorder.ids):,} jobs in the store ({store})", markup=False)

    if csv_file is not None:
        try:
            _write_csv(csv_file, runs)
        except OSError as exc:
            raise _err(f"--csv: cannot write {csv_file} ({exc.strerror or exc})") from None
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
    if as_json:
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
            for name, _, fs in plan:
                if fs is not None:
                    payload[name]["fairshare"] = {
                        "accounts": setup.accounts.source, "algorithm": config.algorithm,
                        "half_life": config.half_life, "max_age": config.max_age,
                        "weights": {"age": config.weights.age, "fairshare": config.weights.fairshare,
                                    "job_size": config.weights.job_size, "qos": config.weights.qos}}
        single = len(payload) == 1 and not compare
        sys.stdout.write(json.dumps(next(iter(payload.values())) if single else payload, indent=2) + "\n")
        return
    _print_table(out, summaries, reports, spreads, fits if setup is not None else None, frags)
    if setup is not None:
        _print_accounts(out, reports, accounts_shown, fits)
    impossible = [o for r in runs.values() for o in r.outcomes if o.rejected]
    if impossible:
        shown = {o.job.id: o.rejected for o in impossible}
        out.print(f"[yellow]{len(shown)} job(s) could not run[/], e.g. "
                  + "; ".join(f"job {k}: {v}" for k, v in list(shown.items())[:3]))
    if csv_file is not None:
        out.print(f"per-job results: {csv_file}")
    for p in plot_paths:
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


def _open_recorder(url: str) -> Any:
    """A store observer for the simulation; with --compare every policy's run is recorded in
    its own namespace (``sim-<policy>``)."""
    from fluxnetes.store import Store
    from fluxnetes.store.recorder import StoreRecorder

    try:
        opened = Store.open(url)
    except Exception as exc:  # a bad URL or an unreachable database: say which, no traceback
        raise _err(f"--store {url}: {exc}") from None
    return StoreRecorder(opened)


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
        raise _err(str(exc)) from None
    return FairShareSetup(accounts, config)


def _run_all(workload: Any, plan: list[tuple[str, Any, Any]], match_policy: str, *, quiet: bool,
             console: Any, recorder: Any = None,
             engine: str = "queue") -> tuple[dict[str, Any], dict[str, Any]]:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from fluxnetes.sim.runner import run_policy

    runs: dict[str, Any] = {}
    summaries: dict[str, Any] = {}
    total = len(workload.jobs)
    show = not quiet and console.is_terminal
    with Progress(TextColumn("{task.description:>14}"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("jobs"), TimeElapsedColumn(), console=console, disable=not show,
                  transient=False) as progress:
        for label, policy, fairshare in plan:
            task = progress.add_task(label, total=total)

            def advance(done: int, task: Any = task) -> None:
                progress.update(task, completed=done)

            if recorder is not None:
                recorder.flush()
                recorder.namespace = f"sim-{label.replace(':', '-').replace('+', '-')}"
                recorder.ids.clear()
            run, summary = run_policy(workload, policy, match_policy=match_policy, progress=advance,
                                      observer=recorder, engine=engine,  # type: ignore[arg-type]
                                      fairshare=fairshare)
            runs[label] = run
            summaries[label] = summary
    return runs, summaries


def _json_summary(s: Any, workload: Any) -> dict[str, Any]:
    d: dict[str, Any] = s.as_dict()
    d["dropped"] = dict(workload.report.dropped)
    d["capped"] = workload.report.capped
    return d


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


def _write_csv(path: Path, runs: dict[str, Any]) -> None:
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


def register(app: typer.Typer) -> None:
    app.command("simulate", no_args_is_help=False)(simulate_command)
