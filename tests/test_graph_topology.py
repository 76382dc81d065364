"""Topology-aware graphs from NodeResourceTopology objects (fluxnetes.graph.topology), socket
locality in pod jobspecs (fluxnetes.jobspec.pods) and the operator side: a node's subtree
replaced in a live matcher with its allocations kept (fluxnetes.k8s.cluster.topology)."""

from __future__ import annotations

import asyncio
from typing import Any
from unittest.mock import patch

import pytest

from fluxnetes.graph.model import GraphError
from fluxnetes.graph.topology import (
    NodeTopology,
    Zone,
    from_k8s_nodes_topology,
    node_graph,
    reconcile,
    topology_from_nrt,
)
from fluxnetes.jobspec.model import JobspecError
from fluxnetes.jobspec.pods import PodRequest, jobspec_from_pods, locality_from_annotations
from fluxnetes.k8s.cluster.topology import (
    CRD_NAME,
    NRT,
    Topologies,
    TopologySource,
    build_graph,
    replace_node,
)
from fluxnetes.match.matcher import Matcher
from fluxnetes.match.results import MatchStatus

GI = 2**30


def k8s_node(name: str, cpu: str = "8", memory: str = "16Gi", gpus: int = 4,
             labels: dict[str, str] | None = None, extra: dict[str, str] | None = None) -> dict[str, Any]:
    alloc = {"cpu": cpu, "memory": memory, "nvidia.com/gpu": str(gpus), **(extra or {})}
    return {"metadata": {"name": name, "labels": labels or {}},
            "status": {"allocatable": alloc, "capacity": alloc,
                       "conditions": [{"type": "Ready", "status": "True"}]}}


def nrt_obj(name: str, zones: list[tuple[int, int, int]], *, policy: str = "single-numa-node",
            api: str = "topology.node.k8s.io/v1alpha2", extra: dict[str, int] | None = None) -> dict[str, Any]:
    """An NRT as NFD's topology-updater writes it: (cpus, GiB memory, gpus) per NUMA zone."""
    out = []
    for i, (cpu, gib, gpu) in enumerate(zones):
        res = [{"name": "cpu", "capacity": cpu, "allocatable": cpu, "available": cpu},
               {"name": "memory", "capacity": f"{gib}Gi", "allocatable": f"{gib}Gi", "available": f"{gib}Gi"}]
        if gpu:
            res.append({"name": "nvidia.com/gpu", "capacity": gpu, "allocatable": gpu, "available": gpu})
        for rname, n in (extra or {}).items():
            res.append({"name": rname, "capacity": n, "allocatable": n, "available": n})
        out.append({"name": f"node-{i}", "type": "Node", "resources": res,
                    "costs": [{"name": f"node-{j}", "value": 10 if i == j else 21} for j in range(len(zones))]})
    return {"apiVersion": api, "kind": "NodeResourceTopology", "metadata": {"name": name},
            "attributes": [{"name": "topologyManagerPolicy", "value": policy},
                           {"name": "topologyManagerScope", "value": "container"}],
            "zones": out}


TWO_BY_FOUR = [(4, 8, 2), (4, 8, 2)]  # 2 NUMA zones of 4 cpus, 8 GiB, 2 GPUs


# ----------------------------------------------------------------------------- reading NRT


def test_nrt_to_topology() -> None:
    topo = topology_from_nrt(nrt_obj("n1", TWO_BY_FOUR))
    assert topo.node == "n1" and topo.policy == "single-numa-node" and topo.scope == "container"
    assert [(z.numa, z.cores, z.memory, z.gpus) for z in topo.zones] == [(0, 4, 8192, 2), (1, 4, 8192, 2)]
    assert topo.zones[0].cost == {0: 10, 1: 21}


def test_nrt_v1alpha1_policies_and_other_zone_types() -> None:
    obj = nrt_obj("n1", TWO_BY_FOUR, api="topology.node.k8s.io/v1alpha1")
    del obj["attributes"]
    obj["topologyPolicies"] = ["SingleNUMANodePodLevel"]
    obj["zones"].append({"name": "socket-0", "type": "Socket", "resources": []})  # ignored
    topo = topology_from_nrt(obj)
    assert (topo.policy, topo.scope) == ("single-numa-node", "pod")
    assert len(topo.zones) == 2


@pytest.mark.parametrize("mutate, where", [
    (lambda o: o.update(zones="x"), "zones: must be a list"),
    (lambda o: o["zones"][0].update(name="numa0"), "zones[0].name: expected node-<N>"),
    (lambda o: o["zones"][1].update(name="node-0"), "zones[1].name: duplicate zone"),
    (lambda o: o["zones"][0]["resources"][0].update(allocatable="lots"), "zones[0].resources[0].allocatable"),
    (lambda o: o["zones"][0]["resources"][0].update(allocatable=-2), "must be >= 0"),
    (lambda o: o["zones"][0]["costs"][0].update(value="near"), "zones[0].costs[0]"),
    (lambda o: o.update(metadata={}), "metadata.name: is required"),
    (lambda o: o.update(apiVersion="v1"), "apiVersion"),
])
def test_bad_nrt_names_the_field(mutate: Any, where: str) -> None:
    obj = nrt_obj("n1", TWO_BY_FOUR)
    mutate(obj)
    with pytest.raises(GraphError, match=where.replace("[", r"\[").replace("]", r"\]")):
        topology_from_nrt(obj)


def test_reconcile_smaller_wins() -> None:
    topo = topology_from_nrt(nrt_obj("n1", [(6, 8, 2), (6, 8, 2)]))
    fitted, notes = reconcile(topo, {"cpu": "10500m", "memory": "32Gi", "nvidia.com/gpu": "4"})
    assert [z.cores for z in fitted.zones] == [5, 5]  # 12 in the zones, 10 on the Node
    assert [z.memory for z in fitted.zones] == [8192, 8192]  # the zones hold less: kept
    assert len(notes) == 2
    assert "places 12 cores but the Node's allocatable cpu is 10: using 10" in notes[0]
    assert "places 16384 MiB memory" in notes[1] and "using 16384" in notes[1]
    same, none = reconcile(topo, {"cpu": "12", "memory": "16Gi", "nvidia.com/gpu": "4"})
    assert same == topo and none == []
    # uneven zones keep their proportion, remainder to the largest
    uneven = NodeTopology("n", (Zone(0, cores=8), Zone(1, cores=4)))
    assert [z.cores for z in reconcile(uneven, {"cpu": "9"})[0].zones] == [6, 3]


# ----------------------------------------------------------------------------- graph shape


def test_graph_sockets_where_a_topology_exists_flat_elsewhere() -> None:
    nodes = [k8s_node("a", extra={"example.com/fpga": "1"}), k8s_node("b")]
    g, notes = from_k8s_nodes_topology(nodes, {"a": topology_from_nrt(nrt_obj("a", TWO_BY_FOUR))})
    assert notes == {}
    a = g.get("a")
    assert [c.name for c in a.children] == ["socket0", "socket1"]
    s0, s1 = a.children
    assert [c.name for c in s0.children] == ["core0", "core1", "core2", "core3", "gpu0", "gpu1", "memory0", "example.com_fpga0"]
    assert [c.name for c in s1.children] == ["core4", "core5", "core6", "core7", "gpu2", "gpu3", "memory1"]
    assert s0.children[6].size == 8192 and s0.properties == {"numa": "0"}
    assert all(v.rank == a.rank for v in g.walk(a))
    b = g.get("b")
    assert {c.type for c in b.children} == {"core", "gpu", "memory"}  # flat as before
    assert g.summary()["core"] == 16 and g.summary()["gpu"] == 8
    g.check()


def test_node_graph_reports_contradictions() -> None:
    topo = topology_from_nrt(nrt_obj("a", TWO_BY_FOUR))
    g, notes = node_graph(k8s_node("a", cpu="6", gpus=2), topo)
    assert g.summary()["core"] == 6 and g.summary()["gpu"] == 2
    assert [c.size for c in g.get("a").children] == [1, 1]
    assert any("places 8 cores" in n for n in notes) and any("places 4 GPUs" in n for n in notes)


# ----------------------------------------------------------------------------- locality


def _pods(n: int, cores: int, gpus: int = 0, mem_gib: int = 0, locality: str | None = None) -> Any:
    return jobspec_from_pods(n, PodRequest(cores * 1000, mem_gib * GI, gpus), locality=locality, name="g")


def _sockets_of(res: Any) -> set[str]:
    return {v.path.rsplit("/", 1)[0] for v in res.vertices if v.type in ("core", "gpu")}


def test_socket_local_request_lands_in_one_socket() -> None:
    g, _ = from_k8s_nodes_topology([k8s_node("a")], {"a": topology_from_nrt(nrt_obj("a", TWO_BY_FOUR))})
    m = Matcher(g, policy="first")
    r1 = m.allocate(_pods(1, 3, gpus=1, mem_gib=2, locality="socket"), now=0)
    assert r1.status == MatchStatus.ALLOCATED
    assert len(_sockets_of(r1)) == 1
    assert sum(1 for v in r1.vertices if v.type == "socket") == 1
    r2 = m.allocate(_pods(1, 3, gpus=1, locality="socket"), now=0)
    assert r2.status == MatchStatus.ALLOCATED and len(_sockets_of(r2)) == 1
    assert _sockets_of(r1) != _sockets_of(r2)  # a socket-local slot holds its socket
    m.check_invariants()


def test_request_larger_than_a_socket_is_refused_though_it_fits_across_two() -> None:
    topo = {"a": topology_from_nrt(nrt_obj("a", TWO_BY_FOUR))}
    g, _ = from_k8s_nodes_topology([k8s_node("a")], topo)
    m = Matcher(g, policy="first")
    r = m.allocate_with_satisfiability(_pods(1, 6, locality="socket"), now=0)
    assert r.status == MatchStatus.UNSATISFIABLE
    # two GPUs per socket: three in one socket never fit either
    assert m.allocate_with_satisfiability(_pods(1, 1, gpus=3, locality="socket"), now=0).status \
        == MatchStatus.UNSATISFIABLE
    # the same node without topology (8 cores, 4 GPUs in one flat node) takes both
    flat, _ = from_k8s_nodes_topology([k8s_node("a")], {})
    mf = Matcher(flat, policy="first")
    assert mf.allocate(_pods(1, 6), now=0).status == MatchStatus.ALLOCATED
    assert mf.allocate(_pods(1, 1, gpus=3), now=0).status == MatchStatus.ALLOCATED
    # and a flat node cannot take a socket-local pod at all (its locality is unknown)
    assert Matcher(from_k8s_nodes_topology([k8s_node("a")], {})[0]).allocate_with_satisfiability(
        _pods(1, 1, locality="socket"), now=0).status == MatchStatus.UNSATISFIABLE


def test_socket_local_gang_spreads_over_sockets_and_nodes() -> None:
    nodes = [k8s_node("a"), k8s_node("b"), k8s_node("c")]
    topos = {n: topology_from_nrt(nrt_obj(n, TWO_BY_FOUR)) for n in ("a", "b")}
    g, _ = from_k8s_nodes_topology(nodes, topos)
    m = Matcher(g, policy="first")
    r = m.allocate(_pods(4, 2, gpus=2, locality="socket"), now=0)  # 4 sockets on a, b
    assert r.status == MatchStatus.ALLOCATED
    assert len(_sockets_of(r)) == 4 and {s.split("/")[-2] for s in _sockets_of(r)} == {"a", "b"}
    # a socket-local pod does not hold its socket (issue #28): 2 of each socket's 4 cores are
    # left, so one more 2-core pod fits, a 3-core one (no socket has 3 free cores) waits
    assert m.allocate(_pods(1, 3, locality="socket"), now=0).status == MatchStatus.BUSY
    r2 = m.allocate(_pods(1, 2, locality="socket"), now=0)
    assert r2.status == MatchStatus.ALLOCATED and len(_sockets_of(r2)) == 1
    assert _sockets_of(r2) <= _sockets_of(r)
    m.check_invariants()


def test_locality_annotation() -> None:
    assert locality_from_annotations({"fluxnetes.io/topology": "socket"}) == "socket"
    assert locality_from_annotations({}) is None and locality_from_annotations(None) is None
    with pytest.raises(JobspecError, match=r"metadata.annotations.fluxnetes.io/topology: must be one of socket"):
        locality_from_annotations({"fluxnetes.io/topology": "numa-ish"})
    with pytest.raises(JobspecError, match="locality"):
        jobspec_from_pods(1, PodRequest(1000), locality="rack")
    shared = jobspec_from_pods(2, PodRequest(1000, GI, 1), locality="socket")
    sock = shared.resources[0]  # above the slot: a shared socket per pod, not an exclusive one
    assert sock.type == "socket" and sock.count.min == 2 and not sock.exclusive
    assert [r.type for r in sock.with_] == ["slot"] and sock.with_[0].count.min == 1
    js = jobspec_from_pods(2, PodRequest(1000, GI, 1), locality="socket", exclusive_nodes=True)
    slot = js.resources[0].with_[0]
    assert slot.type == "slot" and [r.type for r in slot.with_] == ["socket"]
    assert [r.type for r in slot.with_[0].with_] == ["core", "memory", "gpu"]


# ----------------------------------------------------------------------------- operator side


def _shares(m: Matcher, jid: int) -> dict[str, tuple[int, int, int]]:
    return {ns.name: (ns.cores, ns.gpus, ns.memory) for ns in m.jobs[jid].nodes}


def test_replace_node_keeps_allocations() -> None:
    nodes = [k8s_node("a"), k8s_node("b")]
    g, _ = build_graph(nodes, Topologies())
    m = Matcher(g, policy="first")
    gang = m.allocate(_pods(3, 4, gpus=1, mem_gib=3), now=0)  # spans a and b
    small = m.allocate(_pods(1, 2, gpus=1, mem_gib=1), now=10)
    assert gang.status == small.status == MatchStatus.ALLOCATED
    before = {j: _shares(m, j) for j in (gang.jobid, small.jobid)}
    assert "a" in before[gang.jobid]
    b_paths = sorted(v.path for v in m.graph.walk(m.graph.get("b")))

    topos = Topologies()
    assert topos.update("ADDED", nrt_obj("a", TWO_BY_FOUR))
    res = replace_node(m, nodes[0], topos.get("a"))
    assert res.lost == {} and sorted(res.kept) == sorted(j for j, s in before.items() if "a" in s)
    a = m.graph.get("a")
    assert [c.type for c in a.children] == ["socket", "socket"]
    assert sorted(v.path for v in m.graph.walk(m.graph.get("b"))) == b_paths
    after = {j: _shares(m, j) for j in (gang.jobid, small.jobid)}
    assert after == before  # same ids, same amounts on every node
    assert m.jobs[small.jobid].at == 10
    m.check_invariants()
    # what is held stays held: a's 8 cores minus those the jobs hold are all that is left there
    held_a = sum(s["a"][0] for s in after.values() if "a" in s)
    free_a = 0
    while m.allocate(jobspec_from_pods(1, PodRequest(1000), name="f"), now=20).status == MatchStatus.ALLOCATED:
        free_a += 1
    assert free_a == 16 - sum(sum(s[0] for s in sh.values()) for sh in after.values())
    assert held_a > 0
    # and back to flat (the NRT deleted): still kept
    assert topos.update("DELETED", {"metadata": {"name": "a"}})
    res2 = replace_node(m, nodes[0], topos.get("a"))
    assert res2.lost == {} and {j: _shares(m, j) for j in (gang.jobid, small.jobid)} == before
    assert {c.type for c in m.graph.get("a").children} == {"core", "gpu", "memory"}
    m.check_invariants()


def test_replace_node_keeps_socket_local_jobs_on_their_socket() -> None:
    topos = Topologies()
    topos.update("ADDED", nrt_obj("a", TWO_BY_FOUR))
    g, _ = build_graph([k8s_node("a")], topos)
    m = Matcher(g, policy="first")
    r = m.allocate(_pods(1, 2, gpus=1, locality="socket"), now=0)
    sock = _sockets_of(r)
    # the topology changes a little (a GPU disappears from zone 1): same structure elsewhere
    assert topos.update("MODIFIED", nrt_obj("a", [(4, 8, 2), (4, 8, 1)]))
    res = replace_node(m, k8s_node("a", gpus=3), topos.get("a"))
    assert res.lost == {} and res.kept == [r.jobid]
    assert {v.path.rsplit("/", 1)[0] for v in m.jobs[r.jobid].vertices if v.type in ("core", "gpu")} == sock
    m.check_invariants()
    # the NRT goes away: the node is flat again; the pod keeps its cores and GPU (the socket
    # it held whole no longer exists, which loses nothing)
    assert topos.update("DELETED", {"metadata": {"name": "a"}})
    res = replace_node(m, k8s_node("a", gpus=3), topos.get("a"))
    assert res.lost == {} and res.kept == [r.jobid]
    assert _shares(m, r.jobid) == {"a": (2, 1, 0)}
    m.check_invariants()


def test_replace_node_reports_what_no_longer_fits() -> None:
    g, _ = build_graph([k8s_node("a")], Topologies())
    m = Matcher(g, policy="first")
    r = m.allocate(_pods(1, 6), now=0)
    topos = Topologies()
    topos.update("ADDED", nrt_obj("a", TWO_BY_FOUR))
    res = replace_node(m, k8s_node("a"), topos.get("a"))
    assert res.lost == {}  # 6 cores fit in 8 over two sockets: the job keeps them
    shrunk = Topologies()
    shrunk.update("ADDED", nrt_obj("a", [(2, 8, 2), (2, 8, 2)]))
    res = replace_node(m, k8s_node("a"), shrunk.get("a"))
    assert "no longer has room for 2 core" in res.lost[r.jobid]
    assert any("places 4 cores" in n for n in res.notes)
    m.check_invariants()


def test_replace_unknown_node_adds_it() -> None:
    g, _ = build_graph([k8s_node("a")], Topologies())
    m = Matcher(g)
    res = replace_node(m, k8s_node("z"), topology_from_nrt(nrt_obj("z", TWO_BY_FOUR)))
    assert res.kept == [] and [c.type for c in m.graph.get("z").children] == ["socket", "socket"]


def test_topologies_ignore_bad_objects_and_unchanged_updates(caplog: pytest.LogCaptureFixture) -> None:
    t = Topologies()
    obj = nrt_obj("a", TWO_BY_FOUR)
    assert t.update("ADDED", obj)
    obj2 = nrt_obj("a", TWO_BY_FOUR)
    obj2["zones"][0]["resources"][0]["available"] = 1  # only usage changed: same graph
    assert not t.update("MODIFIED", obj2)
    bad = nrt_obj("a", TWO_BY_FOUR)
    bad["zones"] = "nope"
    assert t.update("MODIFIED", bad) and t.get("a") is None  # the node goes flat
    assert "zones: must be a list" in t.errors["a"]
    assert not t.update("MODIFIED", bad)
    assert sum("ignoring the NodeResourceTopology" in r.message for r in caplog.records) == 1


class _NoCrdKube:
    """No NRT API (404) and, unless ``may_watch``, no right to list CRDs (403)."""

    def __init__(self, may_watch: bool = False) -> None:
        self.calls = 0
        self.may_watch = may_watch
        self.crd_lists: list[str | None] = []

    async def request(self, method: str, path: str, **kw: Any) -> None:
        from fluxnetes.k8s.kube import ApiError

        self.calls += 1
        raise ApiError(404, {"message": "the server could not find the requested resource"}, method, path)

    async def list(self, res: Any, *, field_selector: str | None = None) -> tuple[list[Any], str]:
        from fluxnetes.k8s.kube import ApiError

        self.crd_lists.append(field_selector)
        if not self.may_watch:
            raise ApiError(403, {"message": "forbidden"}, "GET", res.path())
        return [], "1"


def test_topology_source_waits_for_the_crd() -> None:
    """Without the right to watch CRDs it looks every crd_poll seconds (refused once only)."""
    kube = _NoCrdKube()

    async def main() -> None:
        src = TopologySource(kube, asyncio.Queue(), crd_poll=0.01)  # type: ignore[arg-type]
        task = asyncio.ensure_future(src.run())
        await asyncio.sleep(0.1)
        assert not task.done()  # no CRD: it keeps waiting, it does not fail
        task.cancel()

    asyncio.run(main())
    assert kube.calls >= 2
    assert len(kube.crd_lists) == 1  # the refused watch is not asked for again


class _LateCrdKube(_NoCrdKube):
    """The NRT CRD appears (the agent installs it) while the source watches for it: a watch
    event, then the API is served and lists one object."""

    def __init__(self) -> None:
        super().__init__(may_watch=True)
        self.created = asyncio.Event()
        self.watches: list[tuple[str, str | None, int]] = []

    async def request(self, method: str, path: str, **kw: Any) -> dict[str, Any]:
        if not self.created.is_set():
            await super().request(method, path, **kw)
        return {}

    async def watch(self, res: Any, version: str, *, field_selector: str | None = None,
                    timeout_seconds: int = 290) -> Any:
        self.watches.append((version, field_selector, timeout_seconds))
        await self.created.wait()
        yield {"type": "ADDED", "object": {"metadata": {"name": CRD_NAME}}}


def test_topology_source_notices_a_late_crd_at_once_not_at_the_next_poll() -> None:
    """Issue #28: the agent installs the NRT CRD after the operator started; the operator
    read the topology only at its next look a minute later. It now watches that CRD by name
    and starts reading NRT objects as soon as it appears (crd_poll here: an hour)."""
    kube = _LateCrdKube()
    started: list[Any] = []

    class _Informer:
        def __init__(self, _kube: Any, res: Any, kind: str, queue: Any) -> None:
            started.append(res)

        async def run(self) -> None:
            await asyncio.sleep(3600)

    async def main() -> None:
        src = TopologySource(kube, asyncio.Queue(), crd_poll=3600)  # type: ignore[arg-type]
        with patch("fluxnetes.k8s.informer.Informer", _Informer):
            task = asyncio.ensure_future(src.run())
            await asyncio.sleep(0.05)
            assert not started and kube.watches == [("1", f"metadata.name={CRD_NAME}", 3600)]
            kube.created.set()
            for _ in range(100):
                if started:
                    break
                await asyncio.sleep(0.01)
            task.cancel()
        assert started == [NRT]

    asyncio.run(main())


class _Kube:
    """The NRT API: absent (404), forbidden (403) or listing objects (unit test only)."""

    def __init__(self, objs: list[dict[str, Any]] | None, forbidden: bool = False) -> None:
        self.objs, self.forbidden = objs, forbidden

    async def request(self, method: str, path: str, **kw: Any) -> dict[str, Any]:
        from fluxnetes.k8s.kube import ApiError

        if self.forbidden:
            raise ApiError(403, {"message": "forbidden"}, method, path)
        if self.objs is None:
            raise ApiError(404, {"message": "not found"}, method, path)
        return {}

    async def list(self, res: Any) -> tuple[list[dict[str, Any]], str]:
        return list(self.objs or []), "1"


def test_topology_source_load(caplog: pytest.LogCaptureFixture) -> None:
    good, bad = nrt_obj("a", TWO_BY_FOUR), nrt_obj("b", TWO_BY_FOUR)
    bad["zones"] = None
    t = Topologies()
    src = TopologySource(_Kube([good, bad]), asyncio.Queue())  # type: ignore[arg-type]
    assert asyncio.run(src.load(t)) == 1 and t.get("a") is not None and "b" in t.errors
    assert asyncio.run(TopologySource(_Kube(None), asyncio.Queue()).load(Topologies())) == 0  # type: ignore[arg-type]
    denied = TopologySource(_Kube([], forbidden=True), asyncio.Queue())  # type: ignore[arg-type]
    assert asyncio.run(denied.load(Topologies())) == 0
    assert asyncio.run(denied.load(Topologies())) == 0
    assert sum("cannot be read" in r.message for r in caplog.records) == 1


def test_only_nodes_whose_kubelet_aligns_get_sockets() -> None:
    """A node whose topology manager does not keep a pod in one NUMA domain stays flat, so a
    pod larger than one domain still fits there (the graph follows what the node enforces)."""
    topos = Topologies()
    assert not topos.update("ADDED", nrt_obj("n1", TWO_BY_FOUR, policy="best-effort"))
    assert topos.get("n1") is None
    assert topos.update("MODIFIED", nrt_obj("n1", TWO_BY_FOUR))
    assert topos.get("n1") is not None
    assert topos.update("MODIFIED", nrt_obj("n1", TWO_BY_FOUR, policy="none"))
    assert topos.get("n1") is None
