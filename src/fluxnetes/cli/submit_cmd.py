"""`fluxnetes submit --dry-run FILE`: the plugin's `submit` command (fluxnetes.cli.ctl.submit),
also offered at the top level, like `sbatch --test-only`."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    from fluxnetes.cli.ctl import submit

    submit.register(app)
