"""`fluxnetes ctl`, also the `kubectl fluxnetes` plugin: look at and steer the queue.

    kubectl fluxnetes queue [-A]          waiting and running FluxJobs, in scheduling order
    kubectl fluxnetes nodes               per-node use as the scheduler sees it
    kubectl fluxnetes explain JOB         why a job waits (short resource, reservation ahead)
    kubectl fluxnetes graph [-f out.json] the current resource graph, as JGF
    kubectl fluxnetes cancel JOB          cancel a job, queued or running
    kubectl fluxnetes submit --dry-run F  would F's work start, and when
    kubectl fluxnetes accounts            fair share per account (shares, usage, factor)

One module per command, each with ``register(ctl)``; what they share (connection, reading the
cluster, output) is in ``common.py``; groups running without a FluxJob (the operator's
``--fluxjobs waiting``), as ``explain`` and ``cancel`` find them, in ``unrecorded.py``. The pure functions (``queue_rows``, ``node_rows``,
``explain_job``, ``dry_run``) take plain dicts so they can be tested without a cluster.
"""

from __future__ import annotations

import importlib

import typer

# modules of fluxnetes.cli.ctl holding one command each, in help order
COMMANDS: tuple[str, ...] = ("queue", "nodes", "explain", "graph", "cancel", "submit", "accounts")


def build() -> typer.Typer:
    """The `ctl` command group with every command registered."""
    ctl = typer.Typer(
        name="ctl",
        help="Inspect and steer fluxnetes in a cluster (the same as `kubectl fluxnetes`).",
        no_args_is_help=True,
    )
    for name in COMMANDS:
        importlib.import_module(f"fluxnetes.cli.ctl.{name}").register(ctl)
    return ctl


def register(app: typer.Typer) -> None:
    app.add_typer(build(), name="ctl")
