"""Matcher operations: allocate, reserve, satisfiability, cancel, partial cancel, update_allocate,
status, grow/shrink, results (JGF/RV1), fast paths == walk."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from fluxnetes.graph import ResourceGraph, Vertex, from_description, from_k8s_nodes, load_graph
from fluxnetes.jobspec import PodRequest, jobspec_from_pods, parse_jobspec
from fluxnetes.match import Matcher, MatchError, MatchStatus, NodeShare

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "examples" / "graphs" / "demo.yaml"


def js(resources: list[dict[str, Any]], duration: int = 3600, **system: Any) -> Any:
    return parse_jobspec({"version": 9999, "resources": resources,
                          "tasks": [{"command": ["a"], "slot": "s", "count": {"per_slot": 1}}],
                          "attributes": {"system": {"duration": duration, **system}}})


def slot(n: int, **types: int) -> dict[str, Any]:
    return {"type": "slot", "count": n, "label": "s", "with": [{"type": t, "count": c} for t, c in types.items()]}


def snapshot(m: Matcher) -> dict[str, Any]:
    out = {}
    for u in m.engine.vs.values():
        out[u.v.path] = (dict(u.ps or {}), u.pused, u.alloc_n, dict(u.xs or {}), dict(u.fspans or {}),
                         list(u.fused), list(u.ftot))
    return out


def demo(policy: str = "first", **kw: Any) -> Matcher:
    return Matcher(load_graph(DEMO), policy, **kw)


def test_allocate_records_and_ids_advance_on_failure() -> None:
    m = demo()
    r = m.allocate(js([slot(1, core=1)]))
    assert r.status is MatchStatus.ALLOCATED and r.jobid == 1 and r.at == 0 and r.duration == 3600
    assert [(n.name, n.cores) for n in r.nodes] == [("node7", 1)]
    assert m.jobs[1].nodes[0].cores == 1
    big = m.allocate(js([slot(1, core=9)]))  # 8 cores per node, 4 per socket
    assert big.status is MatchStatus.BUSY and big.jobid == 2
    assert m.allocate(js([slot(1, core=1)])).jobid == 3
    assert m.allocate(js([slot(1, core=1)]), jobid=42).jobid == 42
    with pytest.raises(MatchError, match="already exists"):
        m.allocate(js([slot(1, core=1)]), jobid=42)
    m.check_invariants()


def test_satisfiability_distinguishes_busy_from_never() -> None:
    m = demo()
    never = m.allocate_with_satisfiability(js([slot(1, core=128)]))
    assert never.status is MatchStatus.UNSATISFIABLE
    assert "needs 128 core, only 64 exist" in never.reason
    shape = m.satisfiability(js([slot(1, core=5)]))  # fits the totals, never one socket
    assert shape.status is MatchStatus.UNSATISFIABLE
    whole = js([{"type": "node", "count": 8, "exclusive": True, "with": [slot(1, core=1)]}])
    assert m.allocate(whole).status is MatchStatus.ALLOCATED
    busy = m.allocate_with_satisfiability(js([slot(1, core=1)]))
    assert busy.status is MatchStatus.BUSY
    assert "needs 1 core, 0 free now" in busy.reason
    assert m.satisfiability(js([slot(1, core=1)])).status is MatchStatus.ALLOCATED
    assert m.allocate(js([slot(1, fpga=1)])).status is MatchStatus.UNSATISFIABLE


def test_orelse_reserve_earliest_time_and_horizon_jobs() -> None:
    m = demo("low")
    node = js([{"type": "node", "count": 4, "exclusive": True, "with": [slot(1, core=1)]}], duration=100)
    assert m.allocate_orelse_reserve(node).at == 0
    assert m.allocate_orelse_reserve(node).at == 0
    r = m.allocate_orelse_reserve(node)
    assert r.status is MatchStatus.RESERVED and r.at == 100
    assert m.jobs[r.jobid].reserved
    forever = js([{"type": "node", "count": 8, "exclusive": True, "with": [slot(1, core=1)]}], duration=0)
    f = m.allocate_orelse_reserve(forever)
    assert f.status is MatchStatus.RESERVED and f.at == 200
    # backfilled into the gap before it: 4 nodes are free in [100, 200)
    gap = m.allocate_orelse_reserve(js([slot(1, core=1)], duration=10))
    assert gap.status is MatchStatus.RESERVED and gap.at == 100
    # nothing ends after a duration-less job: busy (fits the graph), never reserved
    five = js([{"type": "node", "count": 5, "exclusive": True, "with": [slot(1, core=1)]}], duration=10)
    again = m.allocate_orelse_reserve(five)
    assert again.status is MatchStatus.BUSY
    assert m.satisfiability(five).status is MatchStatus.ALLOCATED
    m.check_invariants()


def test_reservation_count_and_earliest_end_follow_the_records() -> None:
    m = demo("low")
    assert m.reservation_count() == 0 and m.earliest_end() is None
    forever = m.allocate(js([slot(1, core=1)], duration=0))
    assert m.reservation_count() == 0 and m.earliest_end() == forever.at + forever.duration
    node = js([{"type": "node", "count": 8, "exclusive": True, "with": [slot(1, core=1)]}], duration=100)
    later = m.allocate_orelse_reserve(node)  # one core is taken until released: never free
    assert later.status is MatchStatus.BUSY and m.reservation_count() == 0
    m.cancel(forever.jobid)
    assert m.earliest_end() is None
    first = m.allocate_orelse_reserve(node)
    second = m.allocate_orelse_reserve(node)
    assert first.status is MatchStatus.ALLOCATED and second.status is MatchStatus.RESERVED
    assert m.reservation_count() == 1 and m.earliest_end() == 100
    m.check_invariants()
    m.cancel(second.jobid)
    m.cancel(first.jobid)
    assert m.reservation_count() == 0 and m.earliest_end() is None
    m.check_invariants()


def test_cancel_restores_exactly() -> None:
    for policy in ("first", "low", "hinodex"):
        m = demo(policy)
        m.allocate(js([slot(2, core=2)]))
        before = snapshot(m)
        r = m.allocate(js([slot(3, core=1, gpu=1)]))
        r2 = m.allocate_orelse_reserve(js([slot(6, core=4)]))
        assert r.ok and r2.ok
        m.cancel(r2.jobid)
        m.cancel(r.jobid)
        assert snapshot(m) == before
        m.check_invariants()
        with pytest.raises(MatchError, match="not found"):
            m.cancel(r.jobid)


def test_partial_cancel_by_node_share_and_jgf() -> None:
    m = demo("low")
    base = snapshot(m)
    r = m.allocate(js([{"type": "node", "count": 3, "exclusive": True, "with": [slot(1, core=1)]}]))
    names = [n.name for n in r.nodes]
    assert names == ["node0", "node1", "node2"]
    assert m.partial_cancel(r.jobid, [NodeShare("node1")]) is False
    assert [n.name for n in m.jobs[r.jobid].nodes] == ["node0", "node2"]
    m.check_invariants()
    # node1 is free again, whole
    r2 = m.allocate(js([{"type": "node", "count": 1, "exclusive": True, "with": [slot(1, core=1)]}]))
    assert [n.name for n in r2.nodes] == ["node1"]
    m.cancel(r2.jobid)
    # release node0 via its JGF piece, node2 via R_lite ranks
    part = {"graph": {"nodes": [{"id": "x", "metadata": {"type": v.type, "paths": {"containment": v.path}}}
                                for v in m.jobs[r.jobid].vertices if v.path.startswith("/cluster0/rack0/node0")],
                      "edges": []}}
    assert m.partial_cancel(r.jobid, part) is False
    assert m.partial_cancel(r.jobid, {"execution": {"R_lite": [{"rank": "2", "children": {"core": "0-7"}}]}}) is True
    assert r.jobid not in m.jobs
    assert snapshot(m) == base


def test_partial_cancel_counts_within_a_node() -> None:
    m = demo("low")
    r = m.allocate(js([slot(1, core=4)]))
    held = {n.name: n.cores for n in r.nodes}
    node = next(iter(held))
    assert held[node] == 4
    assert m.partial_cancel(r.jobid, [NodeShare(node, cores=1)]) is False
    left = sum(n.cores for n in m.jobs[r.jobid].nodes)
    assert left == 3
    m.check_invariants()
    with pytest.raises(MatchError, match="holds less core"):
        m.partial_cancel(r.jobid, [NodeShare(node, cores=99)])


def test_update_allocate_records_foreign_placements() -> None:
    m = demo("low")
    r = m.update_allocate(100, [NodeShare("node0", cores=8, gpus=2)])
    assert r.ok and m.jobs[100].nodes[0].cores == 8 and m.next_jobid == 101
    nxt = m.allocate(js([slot(1, core=1)]))
    assert nxt.nodes[0].name == "node1"  # node0's cores are taken
    with pytest.raises(MatchError, match="not enough free core"):
        m.update_allocate(200, [NodeShare("node0", cores=1)])
    rjgf = nxt.to_rv1()
    m.cancel(nxt.jobid)
    again = m.update_allocate(7, rjgf)
    assert [(n.name, n.cores) for n in again.nodes] == [("node1", 1)]
    assert (again.at, again.duration) == (0, 3600)
    m.check_invariants()
    with pytest.raises(MatchError, match=r"already used|cannot record"):
        m.update_allocate(8, rjgf)


def test_status_down_is_never_used_but_still_satisfiable() -> None:
    m = demo("low")
    m.set_status("node0", False)
    r = m.allocate(js([slot(1, core=1)]))
    assert r.nodes[0].name == "node1"
    m.set_status("/cluster0/rack0", False)
    r = m.allocate(js([slot(1, core=1)]))
    assert r.nodes[0].name == "node4"
    for n in ["node4", "node5", "node6", "node7"]:
        m.set_status(n, False)
    assert m.allocate(js([slot(1, core=1)])).status is MatchStatus.BUSY
    assert m.allocate_with_satisfiability(js([slot(1, core=1)])).status is MatchStatus.BUSY
    need = js([{"type": "node", "count": 2, "exclusive": True, "with": [slot(1, core=1)]}])
    assert m.allocate(need).status is MatchStatus.BUSY
    m.set_status("node5", True)
    assert m.stat()["nodes_up"] == 4  # node vertices up (as Fluxion counts); rack0 is down
    assert m.allocate(js([slot(1, core=1)])).nodes[0].name == "node5"
    with pytest.raises(MatchError, match="no vertex"):
        m.set_status("nope", True)


def test_grow_and_shrink() -> None:
    g = from_description({"racks": [{"name": "rack0", "nodes": 2, "node": {"cores": 2}}]})
    m = Matcher(g, "low")
    extra = from_description({"racks": [{"name": "rack0", "nodes": 3, "node": {"cores": 2}}]})
    # take node2 (the 3rd node) from a bigger description and attach it
    node2 = extra.get("node2")
    piece = ResourceGraph()
    for v in [extra.root, extra.get("rack0"), node2, *node2.children]:
        assert v is not None
        c = Vertex(v.type, basename=v.basename, name=v.name, id=v.id, uniq_id=v.uniq_id + 1000, rank=v.rank,
                   size=v.size, path=v.path)
        piece.add_vertex(c, piece.by_path.get(v.path.rsplit("/", 1)[0]) if v.parent else None)
    new = m.add_subgraph(piece)
    assert "/cluster0/rack0/node2" in new and m.stat()["capacity"]["core"] == 6
    r = m.allocate(js([slot(3, core=2)]))
    assert r.ok and {n.name for n in r.nodes} == {"node0", "node1", "node2"}
    affected = m.remove_subgraph("node1")
    assert affected == [r.jobid]
    assert {n.name for n in m.jobs[r.jobid].nodes} == {"node0", "node2"}
    assert m.stat()["capacity"]["core"] == 4
    m.check_invariants()
    m.cancel(r.jobid)
    assert m.allocate(js([slot(2, core=2)])).ok
    m.check_invariants()


def test_results_rv1_and_jgf_shapes() -> None:
    m = demo("low")
    r = m.allocate(js([slot(2, core=2, gpu=1)], duration=60, queue="batch"))
    rv1 = r.to_rv1()
    ex = rv1["execution"]
    assert ex["R_lite"] == [{"rank": "0-1", "children": {"core": "0-1", "gpu": "0"}}]
    assert ex["nodelist"] == ["node0", "node1"] and (ex["starttime"], ex["expiration"]) == (0, 60)
    assert rv1["attributes"] == {"system": {"scheduler": {"queue": "batch"}}}
    jgf = rv1["scheduling"]
    types = [n["metadata"]["type"] for n in jgf["graph"]["nodes"]]
    assert types[-1] == "cluster" and types.count("core") == 4
    assert all(n["metadata"].get("exclusive") for n in jgf["graph"]["nodes"] if n["metadata"]["type"] == "core")
    assert "scheduling" not in r.to_rv1(with_scheduling=False)
    info = m.info(r.jobid)
    assert info["mode"] == "ALLOCATED" and info["expiration"] == 60
    st = m.stat()
    assert st["jobs"] == 1 and st["by_type"]["core"] == 64


def test_worked_example_spec_4_7() -> None:
    """tiny: cluster -> rack0 -> 2 nodes -> 2 sockets -> 18 cores, 1 gpu, 4 memory(2);
    cluster[1]->rack[1]->node[1]->slot[1]->socket[1]->core[1] (fluxion-spec §4.7)."""

    def graph() -> ResourceGraph:
        g = ResourceGraph()
        uid = iter(range(10000))
        root = g.add_vertex(Vertex("cluster", name="tiny0", id=0, uniq_id=next(uid), path="/tiny0"), None)
        rack = g.add_vertex(Vertex("rack", id=0, uniq_id=next(uid), path="/tiny0/rack0"), root)
        for n in range(2):
            node = g.add_vertex(Vertex("node", id=n, uniq_id=next(uid), rank=n, path=f"/tiny0/rack0/node{n}"), rack)
            core = 0
            for s in range(2):
                sp = f"{node.path}/socket{s}"
                sock = g.add_vertex(Vertex("socket", id=s, uniq_id=next(uid), rank=n, path=sp), node)
                for _ in range(18):
                    g.add_vertex(Vertex("core", id=core, uniq_id=next(uid), rank=n, path=f"{sp}/core{core}"), sock)
                    core += 1
                g.add_vertex(Vertex("gpu", id=s, uniq_id=next(uid), rank=n, path=f"{sp}/gpu{s}"), sock)
                for k in range(4):
                    mid = s * 4 + k
                    g.add_vertex(Vertex("memory", id=mid, uniq_id=next(uid), rank=n, size=2,
                                        path=f"{sp}/memory{mid}"), sock)
        return g

    spec = js([{"type": "cluster", "count": 1, "with": [{"type": "rack", "count": 1, "with": [
        {"type": "node", "count": 1, "with": [{"type": "slot", "count": 1, "label": "s", "with": [
            {"type": "socket", "count": 1, "with": [{"type": "core", "count": 1}]}]}]}]}]}])

    def cores(r: Any) -> str:
        c = [v for v in r.vertices if v.type == "core"]
        assert len(c) == 1
        return c[0].path.split("/", 3)[3]

    m = Matcher(graph(), "high", tie_break="fluxion")
    got = [cores(m.allocate(spec)) for _ in range(4)]
    assert got == ["node1/socket1/core35", "node1/socket0/core17", "node0/socket1/core35", "node0/socket0/core17"]
    assert m.allocate(spec).status is MatchStatus.BUSY
    m = Matcher(graph(), "low", tie_break="fluxion")
    assert [cores(m.allocate(spec)) for _ in range(2)] == ["node0/socket0/core0", "node0/socket1/core18"]
    m = Matcher(graph(), "high", tie_break="fluxion")
    ats = [m.allocate_orelse_reserve(spec).at for _ in range(10)]
    assert ats == [0, 0, 0, 0, 3600, 3600, 3600, 3600, 7200, 7200]


def test_kubernetes_graph_pods_share_memory_pools() -> None:
    nodes = [{"metadata": {"name": f"w{i}", "labels": {}},
              "status": {"allocatable": {"cpu": "4", "memory": "8Gi"},
                         "conditions": [{"type": "Ready", "status": "True"}]}} for i in range(2)]
    m = Matcher(from_k8s_nodes(nodes), "lonode")
    pods = jobspec_from_pods(4, PodRequest(cpu_millis=900, memory_bytes=2 * 2**30))
    r = m.allocate(pods)
    assert r.ok
    assert [(n.name, n.cores, n.memory) for n in r.nodes] == [("w0", 4, 8192)]
    r2 = m.allocate(jobspec_from_pods(2, PodRequest(cpu_millis=1000, memory_bytes=4 * 2**30)))
    assert [(n.name, n.cores, n.memory) for n in r2.nodes] == [("w1", 2, 8192)]
    assert m.allocate(jobspec_from_pods(1, PodRequest(cpu_millis=100, memory_bytes=1))).status is MatchStatus.BUSY
    m.partial_cancel(r.jobid, [NodeShare("w0", cores=1, memory=2048)])
    r3 = m.allocate(jobspec_from_pods(1, PodRequest(cpu_millis=100, memory_bytes=2**30)))
    assert [(n.name, n.cores, n.memory) for n in r3.nodes] == [("w0", 1, 1024)]
    m.check_invariants()


def test_tie_break_modes_differ_only_in_ties() -> None:
    spec = js([slot(1, core=1)])
    a = demo("low")
    b = demo("low", tie_break="fluxion")
    ra, rb = a.allocate(spec), b.allocate(spec)
    assert ra.nodes[0].name == "node0"  # stable: first in depth-first order among equals
    assert rb.ok and rb.nodes[0].cores == 1
    with pytest.raises(MatchError, match="tie_break"):
        demo("low", tie_break="random")
    with pytest.raises(MatchError, match="unknown policy"):
        demo("best")


@pytest.mark.parametrize("policy", ["low", "high", "lonode", "hinode"])
def test_fast_paths_equal_the_walk(policy: str) -> None:
    specs = [js([slot(1, core=1)]), js([slot(3, core=2)]), js([slot(2, core=1, gpu=1)]),
             js([slot(1, core=1, memory=8)]), js([{"type": "node", "count": 2, "exclusive": True,
                                                  "with": [slot(1, core=2)]}]),
             js([slot(5, core=4)])]
    for seed in range(6):
        rnd = random.Random(seed)
        fast, walk = demo(policy), demo(policy)
        walk._fast_policy = False
        live: list[int] = []
        for _ in range(40):
            if live and rnd.random() < 0.3:
                j = live.pop(rnd.randrange(len(live)))
                fast.cancel(j)
                walk.cancel(j)
                continue
            s = rnd.choice(specs)
            ra, rb = fast.allocate(s), walk.allocate(s)
            assert (ra.status, ra.jobid, [(v.path, v.exclusive, v.size) for v in ra.vertices]) == (
                rb.status, rb.jobid, [(v.path, v.exclusive, v.size) for v in rb.vertices])
            if ra.ok:
                live.append(ra.jobid)
        assert fast.stats["fast"] > 0
        fast.check_invariants()
        walk.check_invariants()


def test_bad_inputs() -> None:
    m = demo()
    with pytest.raises(MatchError, match="unknown match operation"):
        m.match("frobnicate", js([slot(1, core=1)]))
    with pytest.raises(MatchError, match="release must be"):
        m.partial_cancel(m.allocate(js([slot(1, core=1)])).jobid, 5)  # type: ignore[arg-type]
    with pytest.raises(MatchError, match="placement"):
        m.update_allocate(50, {"nothing": 1})
    with pytest.raises(MatchError, match="not found"):
        m.info(999)
    _ = from_description


def test_kubernetes_node_added_and_removed_by_name() -> None:
    def node(name: str, zone: str) -> dict[str, Any]:
        return {"metadata": {"name": name, "labels": {"topology.kubernetes.io/zone": zone}},
                "status": {"allocatable": {"cpu": "2", "memory": "2Gi", "nvidia.com/gpu": "1"},
                           "conditions": [{"type": "Ready", "status": "True"}]}}

    m = Matcher(from_k8s_nodes([node("a", "z1"), node("b", "z1")]), "first")
    added = m.add_subgraph(from_k8s_nodes([node("c", "z2")]))
    assert "/k8scluster0/z2/c" in added
    g = m.graph
    assert len({v.uniq_id for v in g}) == len(g)
    assert sorted(v.rank for v in g.by_type["node"]) == [0, 1, 2]
    r = m.allocate(jobspec_from_pods(3, PodRequest(cpu_millis=2000, gpus=1)))
    assert sorted(n.name for n in r.nodes) == ["a", "b", "c"]
    ranks = [e["rank"] for e in r.to_rv1()["execution"]["R_lite"]]
    assert ranks == ["0-2"]
    assert m.remove_subgraph("c") == [r.jobid]
    assert sorted(n.name for n in m.jobs[r.jobid].nodes) == ["a", "b"]
    m.check_invariants()
