"""Resource graph: JGF read/write (Fluxion rules), builders, indexes."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from fluxnetes.graph import (
    DOWN,
    UP,
    GraphError,
    from_description,
    from_k8s_nodes,
    load_graph,
    parse_quantity,
    read_jgf,
    write_jgf,
)

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "examples" / "graphs" / "demo.json"


def _small() -> dict[str, Any]:
    return {"graph": {
        "nodes": [
            {"id": "0", "metadata": {"type": "cluster", "basename": "tiny", "name": "tiny0", "id": 0, "uniq_id": 0,
                                     "paths": {"containment": "/tiny0"}}},
            {"id": "1", "metadata": {"type": "node", "name": "node7", "uniq_id": 1, "rank": 0,
                                     "properties": {"ssd": ""}, "paths": {"containment": "/tiny0/node7"}}},
            {"id": "2", "metadata": {"type": "core", "id": 0, "paths": {"containment": "/tiny0/node7/core0"}}},
            {"id": "3", "metadata": {"type": "memory", "id": 0, "size": 16, "unit": "GB",
                                     "paths": {"containment": "/tiny0/node7/memory0"}}},
        ],
        "edges": [{"source": "0", "target": "1", "metadata": {"subsystem": "containment"}},
                  {"source": "1", "target": "2"}, {"source": "1", "target": "3"}]}}


def test_defaults_follow_fluxion_reader() -> None:
    g = read_jgf(_small())
    node = g.get("/tiny0/node7")
    assert node.id == 7  # node id from the digits of its name
    assert node.basename == "node" and node.name == "node7"
    core = g.get("/tiny0/node7/core0")
    assert core.uniq_id == 2 and core.name == "core0" and core.rank == -1 and core.size == 1
    assert core.status == UP
    mem = g.get("/tiny0/node7/memory0")
    assert (mem.size, mem.unit) == (16, "GB")
    assert g.root is not None and g.root.name == "tiny0"
    assert [c.type for c in node.children] == ["core", "memory"]
    assert g.count("core") == 1 and g.by_name["node7"] == [node]


def test_round_trip_is_lossless() -> None:
    g = load_graph(DEMO)
    j = write_jgf(g)
    g2 = read_jgf(json.loads(json.dumps(j)))
    assert write_jgf(g2) == j
    for v in g:
        w = g2.get(v.path)
        assert (v.type, v.basename, v.name, v.id, v.uniq_id, v.rank, v.size, v.unit, v.properties, v.status) == (
            w.type, w.basename, w.name, w.id, w.uniq_id, w.rank, w.size, w.unit, w.properties, w.status)
        assert [c.path for c in v.children] == [c.path for c in w.children]


def test_written_jgf_follows_fluxion_reader_rules() -> None:
    j = write_jgf(load_graph(DEMO))
    ids = set()
    for n in j["graph"]["nodes"]:
        assert isinstance(n["id"], str)
        md = n["metadata"]
        assert isinstance(md["type"], str) and "containment" in md["paths"]
        assert isinstance(md["uniq_id"], int) and isinstance(md["size"], int)
        ids.add(n["id"])
    for e in j["graph"]["edges"]:
        assert e["source"] in ids and e["target"] in ids


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d["graph"]["nodes"][2]["metadata"].pop("paths"), "vertex 2: metadata.paths is required"),
        (lambda d: d["graph"]["edges"].append({"source": "1", "target": "99"}), "target '99' is not a vertex"),
        (lambda d: d["graph"]["edges"].append({"source": "x", "target": "2"}), "source 'x' is not a vertex"),
        (lambda d: d["graph"]["nodes"].append(copy.deepcopy(d["graph"]["nodes"][2])), "vertex 2: duplicate JGF id"),
        (lambda d: d["graph"]["nodes"].append(
            {"id": "9", "metadata": {"type": "cluster", "paths": {"containment": "/other0"}}}), "two containment roots"),
        (lambda d: d["graph"]["nodes"][1]["metadata"].update(size="4"), "vertex 1: metadata.size must be an integer"),
        (lambda d: d["graph"].pop("edges"), "graph.edges must be a list"),
        (lambda d: d["graph"]["edges"].append({"source": "2", "target": "3"}), "is not below source"),
        (lambda d: d["graph"]["edges"].pop(1), "not connected to the root"),
    ],
)
def test_malformed_jgf_is_rejected_with_vertex_and_rule(mutate: Any, message: str) -> None:
    d = _small()
    mutate(d)
    with pytest.raises(GraphError, match=message):
        read_jgf(d)


def test_kubernetes_bidirectional_edges_are_accepted() -> None:
    d = _small()
    d["graph"]["edges"] += [{"source": e["target"], "target": e["source"], "metadata": {"subsystem": "containment"}}
                            for e in list(d["graph"]["edges"])]
    g = read_jgf(d)
    assert len(g) == 4 and g.get("/tiny0/node7/core0").parent is g.get("/tiny0/node7")


def test_other_subsystem_edges_are_kept() -> None:
    d = _small()
    d["graph"]["edges"].append({"source": "2", "target": "3", "metadata": {"subsystem": "power"}})
    g = read_jgf(d)
    assert len(g.other_edges) == 1
    assert any(e.get("metadata", {}).get("subsystem") == "power" for e in write_jgf(g)["graph"]["edges"])


def test_conformance_graphs_load(tmp_path: Path) -> None:
    shared = REPO.parent / "shared" / "data" / "fluxion-conformance"
    if not shared.exists():
        pytest.skip("shared conformance data not found")
    g = load_graph(shared / "medium.json")
    assert g.summary()["core"] == 256 and g.count("node") == 16 and g.count("socket") == 32
    assert g.get("/cluster0/rack1/node8/socket1/memory1").size == 64


def test_description_builder() -> None:
    g = load_graph(REPO / "examples" / "graphs" / "demo.yaml")
    assert g.count("rack") == 2 and g.count("node") == 8 and g.summary()["core"] == 64
    n5 = g.get("node5")
    assert n5.path == "/cluster0/rack1/node5" and n5.rank == 5 and n5.properties == {"ssd": ""}
    cores = [v.name for v in g.walk(n5) if v.type == "core"]
    assert cores == [f"core{i}" for i in range(8)]  # per-node core numbering across sockets
    z = load_graph(REPO / "examples" / "graphs" / "zones.yaml")
    assert z.get("gpu-box").path == "/edge0/zone-a/rack0/gpu-box"
    assert sum(1 for v in z.walk(z.get("gpu-box")) if v.type == "gpu") == 4
    with pytest.raises(GraphError, match=r"description.racks\[0\].bogus: unknown key"):
        from_description({"racks": [{"bogus": 1}]})
    with pytest.raises(GraphError, match="no nodes"):
        from_description({"cluster": "x"})


def _k8s_node(name: str, cpu: str, mem: str, gpus: int = 0, zone: str | None = None, rack: str | None = None,
              ready: str = "True", unschedulable: bool = False, extra: dict[str, str] | None = None) -> dict[str, Any]:
    labels = {"kubernetes.io/hostname": name}
    if zone:
        labels["topology.kubernetes.io/zone"] = zone
    if rack:
        labels["example.com/rack"] = rack
    alloc = {"cpu": cpu, "memory": mem, "pods": "110", **(extra or {})}
    if gpus:
        alloc["nvidia.com/gpu"] = str(gpus)
    return {"metadata": {"name": name, "labels": labels}, "spec": {"unschedulable": unschedulable},
            "status": {"allocatable": alloc, "conditions": [{"type": "Ready", "status": ready}]}}


def test_k8s_builder_maps_allocatable_and_topology() -> None:
    nodes = [
        _k8s_node("w1", "3500m", "8Gi", gpus=2, zone="z1", rack="r1", extra={"example.com/fpga": "3"}),
        _k8s_node("w0", "4", "16Gi", zone="z1", rack="r2"),
        _k8s_node("w2", "2", "1000Mi", zone="z2", ready="False"),
        _k8s_node("w3", "2", "1Gi", zone="z2", unschedulable=True),
    ]
    g = from_k8s_nodes(nodes, rack_label="example.com/rack")
    w1 = g.get("w1")
    assert w1.path == "/k8scluster0/z1/r1/w1"
    kids = [c.type for c in w1.children]
    assert kids.count("core") == 3  # floor(3500m / 1000)
    assert kids.count("gpu") == 2
    mem = next(c for c in w1.children if c.type == "memory")
    assert (mem.size, mem.unit) == (8192, "MiB")
    fpga = next(c for c in w1.children if c.type == "example.com/fpga")
    assert fpga.name == "example.com_fpga0"
    assert fpga.size == 3
    assert g.get("w0").rank == 0 and w1.rank == 1  # sorted by name
    assert g.get("w2").status == DOWN and g.get("w3").status == DOWN and w1.status == UP
    assert g.get("w2").path == "/k8scluster0/z2/unknown/w2"
    assert g.meta["split_pools"] is True
    assert w1.properties and w1.properties["topology.kubernetes.io/zone"] == "z1"
    # round trip keeps the split-pools setting
    assert read_jgf(write_jgf(g)).meta["split_pools"] is True
    with pytest.raises(GraphError, match="not a Kubernetes quantity"):
        from_k8s_nodes([_k8s_node("bad", "lots", "1Gi")])
    with pytest.raises(GraphError, match="duplicate node name"):
        from_k8s_nodes([_k8s_node("a", "1", "1Gi"), _k8s_node("a", "1", "1Gi")])


def test_parse_quantity() -> None:
    from decimal import Decimal

    assert parse_quantity("3500m") == Decimal("3.5")
    assert parse_quantity("16Gi") == 16 * 2**30
    assert parse_quantity("1e3") == 1000
    assert parse_quantity(2) == 2


def test_attach_grows_graph() -> None:
    g = read_jgf(_small())
    add = {"graph": {"nodes": [
        {"id": "a", "metadata": {"type": "cluster", "uniq_id": 0, "id": 0, "basename": "tiny", "name": "tiny0",
                                 "paths": {"containment": "/tiny0"}}},
        {"id": "b", "metadata": {"type": "node", "uniq_id": 10, "name": "node8", "paths": {"containment": "/tiny0/node8"}}},
        {"id": "c", "metadata": {"type": "core", "uniq_id": 11, "id": 0, "paths": {"containment": "/tiny0/node8/core0"}}}],
        "edges": [{"source": "a", "target": "b"}, {"source": "b", "target": "c"}]}}
    read_jgf(add, graph=g)
    assert g.get("node8").parent is g.root and g.count("core") == 2
    gone = g.remove_subtree(g.get("node8"))
    assert len(gone) == 2 and g.find("node8") is None and g.count("core") == 1


def test_load_graph_errors(tmp_path: Path) -> None:
    bad = tmp_path / "g.json"
    bad.write_text("{not json")
    with pytest.raises(GraphError, match="not valid JSON"):
        load_graph(bad)
    with pytest.raises(GraphError, match="unknown graph file type"):
        load_graph(tmp_path / "g.txt")
    with pytest.raises(GraphError, match="cannot read"):
        load_graph(tmp_path / "missing.json")


def test_gc_paused_keeps_objects_the_process_froze() -> None:
    # the operator and the store freeze their start-up objects on purpose; a graph build
    # afterwards must not put them back under collection (gc.unfreeze empties the whole
    # permanent generation). With nothing frozen, the build's objects go to the oldest
    # generation and nothing stays frozen.
    import gc

    from fluxnetes.graph.model import gc_paused

    assert gc.isenabled()
    gc.collect()
    with gc_paused():
        made = [[i] for i in range(200)]
    assert gc.get_freeze_count() == 0
    assert gc.isenabled()
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        assert frozen > 0
        with gc_paused():
            made = [[i] for i in range(200)]
        assert gc.isenabled()
        # (refcounting may free a few frozen objects: the first `made`; 0 if unfrozen)
        assert gc.get_freeze_count() > frozen // 2
    finally:
        gc.unfreeze()
    assert len(made) == 200
