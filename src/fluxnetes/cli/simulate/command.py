"""`fluxnetes simulate`: replay an SWF trace through the queue and the matcher.

The command's options and help are here; checking them and building the run plan is in
options.py, running in run.py, measuring and the written files in results.py, what it prints
in output.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from fluxnetes.cli.simulate.options import SimulateArgs, plan_run, usage_error


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
    # Not for the count oracle: it is not compiled (fastsim.py), and it is the yardstick the
    # benchmarks measure as Python (it also runs with the build loaded: tests/test_native.py).
    build = native.NativeStatus(False, "the count oracle runs as Python")
    if engine == "queue":
        try:
            build = native.activate()
        except native.NativeError as exc:
            raise usage_error(str(exc)) from None
    opts = SimulateArgs(
        trace=trace, policy=policy, compare=compare, as_json=as_json, csv_file=csv_file,
        plots=plots, use_filter=use_filter, nodes=nodes, cores=cores, graph=graph,
        from_cluster=from_cluster, rack_label=rack_label, racks=racks, whole_nodes=whole_nodes,
        pack=pack, estimate=estimate, limit=limit, match_policy=match_policy,
        queue_depth=queue_depth, reservations=reservations, engine=engine, strict=strict,
        store=store, fairshare=fairshare, fairshare_algo=fairshare_algo, half_life=half_life,
        max_age=max_age, weight_age=weight_age, weight_fairshare=weight_fairshare,
        weight_size=weight_size, weight_qos=weight_qos, accounts_shown=accounts_shown,
    )
    plan = plan_run(opts)

    from rich.console import Console

    from fluxnetes.cli.simulate import output, results, run

    err = Console(stderr=True, highlight=False, soft_wrap=True)
    out = Console(highlight=False, soft_wrap=True)
    output.print_notes(opts, plan, build, out, err)
    runs, summaries = run.run_plan(opts, plan, err, out)
    if csv_file is not None:
        try:
            results.write_job_csv(csv_file, runs)
        except OSError as exc:
            raise usage_error(f"--csv: cannot write {csv_file} ({exc.strerror or exc})") from None
    measured = results.collect(opts, plan, runs, summaries)
    if as_json:
        output.print_json(opts, plan, summaries, measured, build)
        return
    output.print_report(opts, plan, runs, summaries, measured, out)


def register(app: typer.Typer) -> None:
    app.command("simulate", no_args_is_help=False)(simulate_command)
