"""Memory of a loaded graph and matcher: loading a JGF turns vertex objects into vertices as
the parser reads them (the parsed document's per-vertex dicts never all exist at once), equal
strings are shared, single containment paths are not kept as a dict per vertex, and only
`first`-style engines keep a dynamic child order. Measured with tracemalloc (allocation
counts, not the machine's RSS), so the figures do not depend on load."""

from __future__ import annotations

import gc
import io
import sys
import tracemalloc
from pathlib import Path

import pytest

from fluxnetes.graph import load_graph, read_jgf, write_jgf
from fluxnetes.graph.jgf import parse_json
from fluxnetes.match import Matcher

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
from gen_graph import Shape
from gen_graph import write_jgf as gen_jgf


@pytest.fixture(scope="module")
def jgf_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("jgf") / "n64.json"
    buf = io.StringIO()
    gen_jgf(Shape(nodes=64, nodes_per_rack=16, sockets=2, cores_per_socket=8, memory_gb_per_socket=16), buf)
    path.write_text(buf.getvalue())
    return path


def _traced(fn: object) -> tuple[object, int, int]:
    gc.collect()
    tracemalloc.start()
    try:
        out = fn()  # type: ignore[operator]
        cur, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return out, cur, peak


def test_loading_a_jgf_never_holds_the_whole_parsed_document(jgf_file: Path) -> None:
    graph, kept, peak = _traced(lambda: load_graph(jgf_file))
    text = jgf_file.stat().st_size
    # parsing everything first peaked at the text (bytes, and the str json makes of them)
    # plus ~2.6x the graph (every vertex's metadata, paths and edge dicts at once); now the
    # text and the graph being built
    assert peak < 2 * text + 1.25 * kept, (peak, text, kept)
    assert len(graph) == Shape(nodes=64, nodes_per_rack=16, sockets=2, cores_per_socket=8,  # type: ignore[arg-type]
                               memory_gb_per_socket=16).vertex_count()


def test_a_loaded_graph_is_a_fraction_of_its_jgf(jgf_file: Path) -> None:
    """~540 bytes per vertex kept (it was ~830 with a paths dict and own strings each)."""
    graph, kept, _peak = _traced(lambda: load_graph(jgf_file))
    assert kept / len(graph) < 650  # type: ignore[arg-type]
    cores = graph.by_type["core"]  # type: ignore[attr-defined]
    assert cores[0].type is cores[-1].type and cores[0].name is cores[16].name  # shared strings


def test_the_compact_reader_builds_the_same_graph(jgf_file: Path) -> None:
    text = jgf_file.read_text()
    via_dicts = read_jgf(parse_json(text))
    assert write_jgf(load_graph(jgf_file)) == write_jgf(via_dicts)
    assert write_jgf(read_jgf(text)) == write_jgf(via_dicts)


def test_paths_of_other_subsystems_are_kept() -> None:
    doc = {"graph": {"nodes": [
        {"id": "0", "metadata": {"type": "cluster", "id": 0, "uniq_id": 0,
                                 "paths": {"containment": "/c0", "power": "/p0"}}},
        {"id": "1", "metadata": {"type": "node", "id": 0, "uniq_id": 1, "paths": {"containment": "/c0/node0"}}},
    ], "edges": [{"source": "0", "target": "1", "metadata": {"subsystem": "containment"}},
                 {"source": "1", "target": "0", "metadata": {"subsystem": "power"}}]}}
    import json

    g = read_jgf(json.dumps(doc))
    assert g.root is not None and g.root.paths == {"containment": "/c0", "power": "/p0"}
    assert g.get("/c0/node0").paths == {"containment": "/c0/node0"}
    assert g.other_edges == [{"source": "1", "target": "0", "metadata": {"subsystem": "power"}}]
    assert write_jgf(g)["graph"]["nodes"][0]["metadata"]["paths"] == {"containment": "/c0", "power": "/p0"}


@pytest.mark.parametrize(("policy", "ordered"), [("low", False), ("locality", False), ("first", True)])
def test_only_first_style_engines_keep_a_child_order(jgf_file: Path, policy: str, ordered: bool) -> None:
    m = Matcher(load_graph(jgf_file), policy)
    assert bool(m.engine.root.order) is ordered
