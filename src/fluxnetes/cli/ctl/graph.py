"""`kubectl fluxnetes graph`: the resource graph built from the cluster's Nodes, as JGF."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from fluxnetes.cli.ctl.common import (
    Conn,
    ContextOpt,
    CtlError,
    KubeconfigOpt,
    Output,
    fail,
    fetch,
)


def graph_cmd(
    kubeconfig: KubeconfigOpt = None,
    context: ContextOpt = None,
    out: Annotated[
        Path | None, typer.Option("--file", "-f", help="Write to FILE instead of stdout.")
    ] = None,
    rack_label: Annotated[
        str, typer.Option(help="Node label that names a node's rack.")
    ] = "fluxnetes.io/rack",
    output: Annotated[
        Output, typer.Option("--output", "-o", help="json (JGF, the default) or yaml (the same document).")
    ] = Output.json,
) -> None:
    """Export the resource graph built from the cluster's Nodes, as JGF (JSON)."""
    import json

    import yaml

    from fluxnetes.graph import GraphError, from_k8s_nodes, write_jgf

    if output is Output.table:
        raise fail(CtlError("graph: --output must be json or yaml (a graph is no table; see `nodes`)"))

    conn = Conn(kubeconfig, context, None)
    try:
        view = fetch(conn, nodes=True)
        graph = from_k8s_nodes(view.nodes, rack_label=rack_label)
    except (CtlError, GraphError) as exc:
        raise fail(exc) from None
    doc = write_jgf(graph)
    if output is Output.yaml:
        text = yaml.safe_dump(doc, sort_keys=False, default_flow_style=False).rstrip()
    else:
        text = json.dumps(doc, indent=1)
    if out is None:
        typer.echo(text)
    else:
        out.write_text(text + "\n")
        typer.echo(f"wrote {out} ({len(view.nodes)} node(s))", err=True)


def register(ctl: typer.Typer) -> None:
    ctl.command("graph")(graph_cmd)
