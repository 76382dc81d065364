"""`fluxnetes match`: a resource-query-like matching session, or a conformance replay."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from fluxnetes.graph import ResourceGraph


def _err(message: str, code: int = 1) -> typer.Exit:
    from rich.console import Console
    from rich.markup import escape

    Console(stderr=True).print(f"[bold red]error:[/] {escape(message)}", highlight=False)
    return typer.Exit(code)


def match(
    graph: Annotated[
        Path | None,
        typer.Option("--graph", "-g", help="Graph: .json (JGF) or .yaml (cluster description). "
                     "Default: the bundled demo graph."),
    ] = None,
    policy: Annotated[str, typer.Option("--policy", "-P", help="first, low, high, lonode, hinode, "
                                        "lonodex, hinodex, firstnodex, locality, variation")] = "first",
    fmt: Annotated[str, typer.Option("--format", "-F", help="simple | jgf | rv1")] = "simple",
    commands: Annotated[
        Path | None, typer.Option("--commands", "-c", help="Read commands from FILE instead of stdin")
    ] = None,
    replay: Annotated[
        Path | None,
        typer.Option("--replay", help="Replay a conformance cases.json; exit 1 if any answer differs"),
    ] = None,
    tie_break: Annotated[
        str, typer.Option("--tie-break", help="stable (default) or fluxion (reproduce std::sort ties)")
    ] = "stable",
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Replay: print only the summary")] = False,
    demo: Annotated[bool, typer.Option("--demo", help="Run the bundled demo session (graph + commands)")] = False,
) -> None:
    """Match jobspecs against a resource graph (commands: match allocate FILE, cancel JOBID,
    partial-cancel JOBID FILE, info JOBID, stat, set-status PATH up|down,
    set-property PATH KEY=VALUE, advance SECONDS, now, quit)."""
    from fluxnetes.graph import GraphError, load_graph
    from fluxnetes.match import Matcher, MatchError
    from fluxnetes.match.session import Session, replay_cases

    if replay is not None:
        try:
            rep = replay_cases(replay, on_message=None if quiet else (lambda s: print(s, flush=True)))
        except (ValueError, KeyError, GraphError, MatchError) as exc:
            raise _err(f"{replay}: {exc}") from None
        print(rep.summary())
        raise typer.Exit(0 if rep.ok else 1)
    if fmt not in ("simple", "jgf", "rv1"):
        raise _err(f"--format must be simple, jgf or rv1 (got '{fmt}')")
    if graph is None:
        from importlib.resources import as_file, files

        res = files("fluxnetes").joinpath("data", "graphs", "demo.json")
        with as_file(res) as p:
            gpath = Path(p)
            g = _load(load_graph, gpath, GraphError)
        base = Path.cwd()
    else:
        g = _load(load_graph, graph, GraphError)
        base = Path.cwd()
    try:
        m = Matcher(g, policy, tie_break=tie_break)
    except MatchError as exc:
        raise _err(str(exc)) from None
    if demo:
        from importlib.resources import as_file, files

        res_dir = files("fluxnetes").joinpath("data", "jobspecs")
        with as_file(res_dir) as d:
            lines = (Path(d) / "demo.commands").read_text().splitlines()
            errors = Session(m, fmt, Path(d), err=lambda s: print(s, file=sys.stderr)).run(lines)
        raise typer.Exit(0 if errors == 0 else 2)
    if commands is not None:
        try:
            lines = commands.read_text().splitlines()
        except OSError as exc:
            raise _err(f"{commands}: {exc.strerror}") from None
        base = commands.parent
        errors = Session(m, fmt, base, err=lambda s: print(s, file=sys.stderr)).run(lines)
    else:
        interactive = sys.stdin.isatty()
        sess = Session(m, fmt, base, err=lambda s: print(s, file=sys.stderr))
        if interactive:
            print("fluxnetes match: type 'help' for commands, 'quit' to leave")
        errors = sess.run(_stdin_lines(interactive))
    raise typer.Exit(0 if errors == 0 else 2)


def _stdin_lines(interactive: bool) -> Iterator[str]:
    while True:
        if interactive:
            print("fluxnetes> ", end="", flush=True)
        line = sys.stdin.readline()
        if not line:
            return
        yield line


def _load(load_graph: Callable[[Path], ResourceGraph], path: Path, error_type: type[Exception]) -> ResourceGraph:
    try:
        return load_graph(path)
    except error_type as exc:
        raise _err(str(exc)) from None


def register(app: typer.Typer) -> None:
    app.command("match")(match)
