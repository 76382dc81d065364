"""``python -m fluxnetes.k8s run ...``: the operator without loading every CLI command group."""

from __future__ import annotations

import typer

from fluxnetes.cli import run_cmd

app = typer.Typer(no_args_is_help=True, pretty_exceptions_enable=False)
run_cmd.register(app)


@app.callback()
def _root() -> None:
    """fluxnetes operator."""


if __name__ == "__main__":
    app()
