"""Helpers shared by the command modules."""

from __future__ import annotations

import typer


def error_exit(message: str, code: int = 1) -> typer.Exit:
    """Print ``error: <message>`` on stderr and return the Exit to raise (``raise error_exit(...)``).

    The message is printed as plain text (escaped), so brackets in paths or URLs survive."""
    from rich.console import Console
    from rich.markup import escape

    Console(stderr=True).print(f"[bold red]error:[/] {escape(message)}", highlight=False)
    return typer.Exit(code)
