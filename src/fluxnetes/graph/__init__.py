"""Resource graph: vertices, containment tree, indexes; JGF I/O; builders."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from fluxnetes.graph.builders import from_description, from_k8s_nodes, parse_quantity
from fluxnetes.graph.jgf import parse_jgf_compact, read_jgf, write_jgf
from fluxnetes.graph.model import DOWN, UP, GraphError, ResourceGraph, Vertex


def load_graph(path: str | Path) -> ResourceGraph:
    """Load a graph file: ``.json`` = JGF, ``.yaml``/``.yml`` = cluster description."""
    p = Path(path)
    suffix = p.suffix.lower()
    if suffix not in (".json", ".yaml", ".yml"):
        raise GraphError(f"{p}: unknown graph file type (use .json for JGF, .yaml for a description)")
    try:
        text = p.read_bytes()
    except OSError as exc:
        raise GraphError(f"{p}: cannot read ({exc.strerror})") from None
    if suffix == ".json":
        try:
            obj: Any = parse_jgf_compact(text)
        except GraphError as exc:
            raise GraphError(f"{p}: {exc}") from None
        del text  # the raw bytes are not needed while building (lower peak memory)
        try:
            return read_jgf(obj, consume=True)
        except GraphError as exc:
            raise GraphError(f"{p}: {exc}") from None
    if suffix in (".yaml", ".yml"):
        try:
            desc = yaml.load(text, Loader=yaml.CSafeLoader)
        except yaml.YAMLError as exc:
            raise GraphError(f"{p}: not valid YAML: {exc}") from None
        try:
            return from_description(desc)
        except GraphError as exc:
            raise GraphError(f"{p}: {exc}") from None
    raise GraphError(f"{p}: unknown graph file type (use .json for JGF, .yaml for a description)")


__all__ = [
    "DOWN",
    "UP",
    "GraphError",
    "ResourceGraph",
    "Vertex",
    "from_description",
    "from_k8s_nodes",
    "load_graph",
    "parse_quantity",
    "read_jgf",
    "write_jgf",
]
