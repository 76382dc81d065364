"""The `fluxnetes` command: one typer app, each subcommand group in its own module.

Every command module exposes ``register(app: typer.Typer) -> None``; adding a command means
adding its module to ``_COMMAND_MODULES``.
"""

from __future__ import annotations

import importlib
import sys

import typer

app = typer.Typer(
    name="fluxnetes",
    help="Graph-based (Fluxion-style) queueing and gang scheduling for Kubernetes.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)

# module path (relative to fluxnetes.cli) of each command group, in help order
_COMMAND_MODULES: tuple[str, ...] = (
    "match_cmd",
    "simulate.command",
    "dev_cmd",
    "run_cmd",
    "ctl",
    "submit_cmd",
    "store_cmd",
    "agent_cmd",
)


def _register_all() -> None:
    for name in _COMMAND_MODULES:
        module = importlib.import_module(f"fluxnetes.cli.{name}")
        module.register(app)


@app.callback()
def _root() -> None:
    """fluxnetes: HPC-grade scheduling on Kubernetes."""


_register_all()


def kubectl_plugin() -> None:
    """Entry point of the `kubectl-fluxnetes` plugin (the same as `fluxnetes ctl`)."""
    sys.argv = [sys.argv[0], "ctl", *sys.argv[1:]]
    app()


if __name__ == "__main__":
    app()
