"""`fluxnetes submit --dry-run FILE` (also `kubectl fluxnetes submit`): would FILE's work
start, where and when? Nothing is created (like `sbatch --test-only`); the answer comes from
`dryrun.py`."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

import typer

from fluxnetes.cli.ctl.common import (
    Conn,
    ContextOpt,
    CtlError,
    KubeconfigOpt,
    Output,
    OutputOpt,
    console,
    emit,
    fetch,
    table,
)
from fluxnetes.cli.ctl.dryrun import (
    Held,
    SubmitError,
    Waiting,
    cluster_state,
    dry_run,
    read_candidates,
)


def _relative(seconds: int | None) -> str:
    if seconds is None:
        return "-"
    if seconds == 0:
        return "now"
    if seconds < 90:
        return f"in {seconds}s"
    if seconds < 90 * 60:
        return f"in {seconds // 60}m"
    return f"in {seconds // 3600}h{(seconds % 3600) // 60:02d}m"


def submit_cmd(
    file: Annotated[
        Path,
        typer.Argument(
            help="YAML with Pods/Jobs/Deployments/ReplicaSets/StatefulSets or jobspecs."
        ),
    ],
    dry_run_flag: Annotated[
        bool,
        typer.Option(
            "--dry-run", help="Only say whether and when it would start (required for now)."
        ),
    ] = False,
    graph_file: Annotated[
        Path | None,
        typer.Option(
            "--graph",
            help="Offline: an empty cluster from this JGF (.json) or description (.yaml).",
        ),
    ] = None,
    policy: Annotated[
        str, typer.Option(help="Queue policy: fcfs, easy, conservative, hybrid[:N].")
    ] = "easy",
    match_policy: Annotated[
        str,
        typer.Option(
            help="Match policy (first, low, high, lonode, hinode, lonodex, hinodex, firstnodex)."
        ),
    ] = "lonode",
    kubeconfig: KubeconfigOpt = None,
    context: ContextOpt = None,
    output: OutputOpt = Output.table,
) -> None:
    """Would FILE's work start, where and when? Creates nothing (like sbatch --test-only).

    Against the cluster (nodes, running and queued FluxJobs, other pods), or offline with
    --graph. Exit status 3 when some work could never start.
    """
    if not dry_run_flag:
        typer.echo(
            "error: only --dry-run is supported: create workloads with kubectl apply", err=True
        )
        raise typer.Exit(2)
    from fluxnetes.graph import GraphError, from_k8s_nodes, load_graph
    from fluxnetes.match import POLICIES
    from fluxnetes.queue import PolicyError, QueuePolicy

    try:
        if match_policy not in POLICIES:
            raise SubmitError(
                f"--match-policy: {match_policy!r} is not one of {', '.join(POLICIES)}"
            )
        QueuePolicy.parse(policy)
        cands = read_candidates(file)
        now = datetime.now(UTC)
        held: list[Held] = []
        waiting: list[Waiting] = []
        notes: list[str] = []
        if graph_file is not None:
            graph = load_graph(graph_file)
            where = f"graph {graph_file} (empty)"
        else:
            view = fetch(Conn(kubeconfig, context, None), nodes=True, pods=True, fluxjobs="")
            if not view.nodes:
                raise SubmitError("the cluster has no Nodes")
            graph = from_k8s_nodes(view.nodes)
            held, waiting, notes = cluster_state(view.nodes, view.pods, view.fluxjobs, now)
            where = f"cluster: {len(view.nodes)} node(s), {len(held)} holding, {len(waiting)} queued"
        verdicts, more = dry_run(
            graph,
            cands,
            held=held,
            waiting=waiting,
            policy=policy,
            match_policy=match_policy,
            now=now,
        )
    except (SubmitError, CtlError, GraphError, PolicyError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    notes += more
    rows = [v.as_dict() for v in verdicts]
    if output is not Output.table:
        emit({"verdicts": rows, "notes": notes}, output)
    else:
        words = {
            "now": "would start now",
            "later": "would start later",
            "never": "would never start",
            "unknown": "start unknown",
        }
        tbl = table(
            f"fluxnetes submit --dry-run ({where}, policy {policy}, match {match_policy})",
            ["WORKLOAD", "SIZE", "PER POD", "DURATION", "VERDICT", "START", "NODES", "REASON"],
            (
                [
                    f"{v.kind}/{v.name}",
                    v.size,
                    v.per_pod,
                    v.duration or "unknown",
                    words[v.outcome],
                    f"{_relative(v.start_in)} ({v.start})" if v.start else "-",
                    ",".join(sorted(set(v.nodes))),
                    v.reason,
                ]
                for v in verdicts
            ),
        )
        out = console()
        out.print(tbl)
        for n in notes:
            out.print(f"note: {n}")
    if any(v.outcome == "never" for v in verdicts):
        raise typer.Exit(3)


def register(app: typer.Typer) -> None:
    app.command("submit")(submit_cmd)
