"""Pod sets and gang topology: one jobspec per multi-role workload, matched all or nothing."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fluxnetes.graph import from_description, from_k8s_nodes
from fluxnetes.graph.model import ResourceGraph
from fluxnetes.jobspec import JobspecError, PodRequest, jobspec_from_pods, parse_jobspec
from fluxnetes.jobspec.packing import (
    ANN_EXCLUSIVE,
    ANN_KUEUE_REQUIRED,
    ANN_PACK,
    Packing,
    PackingError,
    packing_from_annotations,
)
from fluxnetes.jobspec.podsets import PodSet, jobspec_from_podsets, keep_stable, nodes_of_sets
from fluxnetes.match import Matcher, MatchStatus
from fluxnetes.match.gang import podset_shortfall

MIB = 1024 * 1024


def cpu(n: float) -> PodRequest:
    return PodRequest(cpu_millis=int(n * 1000))


def flat(nodes: int, cores: int = 4) -> ResourceGraph:
    return from_description({"node": {"cores": cores}, "nodes": nodes})


def racks(*sizes: int, cores: int = 4) -> ResourceGraph:
    return from_description({"node": {"cores": cores},
                             "racks": [{"name": f"rack{i}", "nodes": n} for i, n in enumerate(sizes)]})


MPI = [PodSet("launcher", 1, cpu(1)), PodSet("worker", 8, cpu(4))]


def node_rack(g: ResourceGraph, node: str) -> str:
    v = g.get(node)
    assert v.parent is not None
    return v.parent.name


def free_cores(m: Matcher) -> int:
    return m.free_now(0).get("core", 0)


# ----------------------------------------------------------------------------- jobspec shape


@pytest.mark.parametrize("req, kw", [
    (cpu(1), {}),
    (PodRequest(2500, 3 * MIB + 1, 1, {"example.com/fpga": 2}), {}),
    (cpu(4), {"exclusive": True}),
    (PodRequest(1000, 64 * MIB), {"locality": "socket"}),
])
def test_one_set_is_todays_jobspec(req: PodRequest, kw: dict[str, Any]) -> None:
    excl = bool(kw.get("exclusive"))
    loc = kw.get("locality")
    today = jobspec_from_pods(5, req, duration=90, exclusive_nodes=excl, name="job-a", locality=loc)
    mine = jobspec_from_podsets([PodSet("pods", 5, req, loc)], duration=90, packing=Packing(None, excl),
                                name="job-a")
    assert mine.to_yaml() == today.to_yaml()
    assert mine.sets == ()


def test_multi_set_jobspec_round_trips() -> None:
    js = jobspec_from_podsets(MPI, duration=60, name="mpi")
    assert js.sets == ("launcher", "worker")
    assert [t.slot for t in js.tasks] == ["launcher", "worker"]
    back = parse_jobspec(js.to_yaml())
    assert back.sets == js.sets and back.to_dict() == js.to_dict()
    assert js.totals["core"] == 33 and js.totals["slot"] == 9
    packed = jobspec_from_podsets(MPI, packing=Packing("rack", True))
    top = packed.resources[0]
    assert top.type == "rack" and top.count.min == 1
    assert [(e.type, e.count.min, e.exclusive) for e in top.with_] == [("node", 1, True), ("node", 8, True)]
    assert parse_jobspec(packed.to_yaml()).sets == ("launcher", "worker")


def test_sibling_slots_need_distinct_labels() -> None:
    slot = {"type": "slot", "count": 1, "label": "a", "with": [{"type": "core", "count": 1}]}
    doc = {"version": 9999, "resources": [slot, dict(slot)], "tasks": [], "attributes": {}}
    with pytest.raises(JobspecError, match="siblings may not request the same type"):
        parse_jobspec(doc)


@pytest.mark.parametrize("sets, where", [
    ([], "podsets"),
    ([PodSet("a", 1), PodSet("a", 2)], "podsets[1].name"),
    ([PodSet("", 1)], "podsets[0].name"),
    ([PodSet("a", -1)], "podsets[0].count"),
    ([PodSet("a", 0)], "podsets"),
    ([PodSet("a", 1, PodRequest(cpu_millis=-5))], "podsets[0].request.cpu_millis"),
])
def test_bad_pod_sets_name_the_field(sets: list[PodSet], where: str) -> None:
    with pytest.raises(JobspecError) as ei:
        jobspec_from_podsets(sets)
    assert ei.value.path == where


def test_empty_set_takes_no_slot() -> None:
    js = jobspec_from_podsets([PodSet("leader", 1, cpu(1)), PodSet("workers", 0, cpu(2))], name="lws")
    assert js.sets == () and js.resources[0].label == "lws"


# ----------------------------------------------------------------------------- annotations


@pytest.mark.parametrize("ann, want", [
    ({}, Packing()),
    ({ANN_PACK: "rack"}, Packing("rack")),
    ({ANN_PACK: "Zone "}, Packing("zone")),
    ({ANN_EXCLUSIVE: "node"}, Packing(None, True)),
    ({ANN_EXCLUSIVE: "true"}, Packing(None, True)),
    ({ANN_EXCLUSIVE: "false"}, Packing()),
    ({ANN_KUEUE_REQUIRED: "topology.kubernetes.io/zone"}, Packing("zone")),
    ({ANN_KUEUE_REQUIRED: "fluxnetes.io/rack", ANN_PACK: "rack"}, Packing("rack")),
    ({ANN_KUEUE_REQUIRED: "kubernetes.io/hostname"}, Packing("node")),
    ({ANN_PACK: "rack", ANN_EXCLUSIVE: "node"}, Packing("rack", True)),
])
def test_packing_annotations(ann: dict[str, str], want: Packing) -> None:
    assert packing_from_annotations(ann, pods=9) == want


def test_kueue_alias_follows_the_rack_label() -> None:
    got = packing_from_annotations({ANN_KUEUE_REQUIRED: "example.com/rack"}, rack_label="example.com/rack")
    assert got == Packing("rack")


@pytest.mark.parametrize("ann, annotation, words", [
    ({ANN_PACK: "socket"}, ANN_PACK, "must be one of node, rack, zone"),
    ({ANN_EXCLUSIVE: "rack"}, ANN_EXCLUSIVE, "must be node"),
    ({ANN_KUEUE_REQUIRED: "example.com/row"}, ANN_KUEUE_REQUIRED, "node label key"),
    ({ANN_KUEUE_REQUIRED: "topology.kubernetes.io/zone", ANN_PACK: "rack"}, ANN_KUEUE_REQUIRED, "give one level"),
    ({ANN_PACK: "node", ANN_EXCLUSIVE: "node"}, ANN_EXCLUSIVE, "one pod per node"),
])
def test_bad_packing_names_the_annotation(ann: dict[str, str], annotation: str, words: str) -> None:
    with pytest.raises(PackingError) as ei:
        packing_from_annotations(ann, pods=9)
    assert ei.value.annotation == annotation
    assert words in str(ei.value) and str(ei.value).startswith(f"annotation {annotation}: ")


def test_pack_node_with_exclusive_node_is_fine_for_one_pod() -> None:
    pk = packing_from_annotations({ANN_PACK: "node", ANN_EXCLUSIVE: "node"}, pods=1)
    js = jobspec_from_podsets([PodSet("only", 1, cpu(1))], packing=pk, name="g")
    assert js.to_yaml() == jobspec_from_pods(1, cpu(1), exclusive_nodes=True, name="g").to_yaml()
    with pytest.raises(JobspecError, match="one pod per node"):
        jobspec_from_podsets(MPI, packing=pk)


# ----------------------------------------------------------------------------- the MPIJob


def test_mpijob_waits_for_room_then_places_all_nine() -> None:
    m = Matcher(flat(10), policy="first")
    blockers = [m.allocate(jobspec_from_pods(1, cpu(4), exclusive_nodes=True, name=f"b{i}")).jobid
                for i in range(3)]
    js = jobspec_from_podsets(MPI, name="mpijob-pi")
    # 7 free nodes: the workers alone do not fit
    r = m.allocate(js)
    assert r.status is MatchStatus.BUSY and len(m.jobs) == 3
    m.cancel(blockers[0])
    # 8 free 4-cpu nodes: the 8 workers would fill them, the launcher needs a 9th (Fluxion
    # slots take whole cores and never straddle nodes): still nothing placed
    before = free_cores(m)
    assert m.allocate(js).status is MatchStatus.BUSY
    assert free_cores(m) == before and len(m.jobs) == 2
    m.cancel(blockers[1])
    r = m.allocate(js)
    assert r.status is MatchStatus.ALLOCATED
    assert r.podsets is not None
    assert len(r.podsets["worker"]) == 8 and len(set(r.podsets["worker"])) == 8
    assert len(r.podsets["launcher"]) == 1 and r.podsets["launcher"][0] not in r.podsets["worker"]
    assert sum(n.cores for n in r.nodes) == 33
    assert m.jobs[r.jobid].nodes == r.nodes
    m.check_invariants()
    m.cancel(r.jobid)
    assert free_cores(m) == 4 * 9


def test_mpijob_on_too_few_nodes_is_unsatisfiable_naming_the_set() -> None:
    r = Matcher(flat(7)).allocate_orelse_reserve(jobspec_from_podsets(MPI))
    assert r.status is MatchStatus.UNSATISFIABLE and "pod set 'worker'" in r.reason
    r = Matcher(flat(8)).allocate_orelse_reserve(jobspec_from_podsets(MPI))
    assert r.status is MatchStatus.UNSATISFIABLE and "together" in r.reason
    assert Matcher(flat(9)).satisfiability(jobspec_from_podsets(MPI)).status is MatchStatus.ALLOCATED


def test_mpijob_reserves_when_the_blockers_end() -> None:
    m = Matcher(flat(9), policy="low")
    m.allocate(jobspec_from_pods(2, cpu(4), exclusive_nodes=True, name="b", duration=100))
    r = m.allocate_orelse_reserve(jobspec_from_podsets(MPI, duration=50))
    assert r.status is MatchStatus.RESERVED and r.at == 100
    assert r.podsets is not None and len(r.podsets["worker"]) == 8


@pytest.mark.parametrize("policy", ["first", "low", "high", "lonode", "hinode"])
def test_exclusive_node_puts_one_pod_per_whole_node(policy: str) -> None:
    g = flat(12, cores=8)
    shared = Matcher(g, policy=policy).allocate(jobspec_from_podsets(MPI))
    assert shared.podsets is not None
    if policy not in ("low", "high"):  # low/high spread slots by core id; the others pack
        assert len(set(shared.podsets["worker"])) < 8  # 8-cpu nodes: workers share them
    m = Matcher(g, policy=policy)
    r = m.allocate(jobspec_from_podsets(MPI, packing=Packing(None, True)))
    assert r.status is MatchStatus.ALLOCATED and r.podsets is not None
    used = r.podsets["worker"] + r.podsets["launcher"]
    assert len(used) == len(set(used)) == 9
    assert all(n.cores == 8 for n in r.nodes) and len(r.nodes) == 9
    # the nodes are exclusive: the 3 others are whole, then a 1-cpu pod finds no room
    assert m.allocate(jobspec_from_pods(3, cpu(8))).status is MatchStatus.ALLOCATED
    assert m.allocate(jobspec_from_pods(1, cpu(1))).status is MatchStatus.BUSY


# ----------------------------------------------------------------------------- packing


@pytest.mark.parametrize("policy", ["first", "low", "high"])
def test_pack_rack_keeps_the_gang_in_one_rack(policy: str) -> None:
    g = racks(4, 6, 6)
    sets = [PodSet("launcher", 1, cpu(1)), PodSet("worker", 5, cpu(4))]
    m = Matcher(g, policy=policy)
    r = m.allocate(jobspec_from_podsets(sets, packing=Packing("rack")))
    assert r.status is MatchStatus.ALLOCATED and r.podsets is not None
    nodes = r.podsets["launcher"] + r.podsets["worker"]
    assert len({node_rack(g, n) for n in nodes}) == 1
    assert node_rack(g, nodes[0]) != "rack0"  # 4 nodes cannot hold 6 pods of this shape
    # the other 6-node rack still takes a second gang; a third finds no rack
    r2 = m.allocate(jobspec_from_podsets(sets, packing=Packing("rack")))
    assert r2.status is MatchStatus.ALLOCATED and r2.podsets is not None
    assert {node_rack(g, n) for n in r2.podsets["worker"]} != {node_rack(g, nodes[0])}
    assert m.allocate(jobspec_from_podsets(sets, packing=Packing("rack"))).status is MatchStatus.BUSY
    # unpacked, the same gang fits across racks (4 + leftovers)
    assert m.allocate(jobspec_from_podsets(sets[1:2] and [PodSet("w", 4, cpu(4))])).ok


def test_pack_rack_that_no_rack_holds_is_unsatisfiable() -> None:
    sets = [PodSet("launcher", 1, cpu(1)), PodSet("worker", 5, cpu(4))]
    r = Matcher(racks(4, 4)).allocate_orelse_reserve(jobspec_from_podsets(sets, packing=Packing("rack")))
    assert r.status is MatchStatus.UNSATISFIABLE and "no single rack" in r.reason
    r = Matcher(flat(9)).allocate_orelse_reserve(jobspec_from_podsets(sets, packing=Packing("rack")))
    assert r.status is MatchStatus.UNSATISFIABLE and "rack" in r.reason


def test_pack_rack_with_exclusive_nodes_and_one_set_is_a_fluxion_request() -> None:
    g = racks(3, 5)
    js = jobspec_from_podsets([PodSet("w", 4, cpu(1))], packing=Packing("rack", True), name="g")
    assert js.sets == ()
    r = Matcher(g, policy="low").allocate(js)
    assert r.ok and len(r.nodes) == 4 and {node_rack(g, n.name) for n in r.nodes} == {"rack1"}


def test_pack_node_and_zone() -> None:
    sets = [PodSet("leader", 1, cpu(1)), PodSet("worker", 3, cpu(1))]
    m = Matcher(flat(3), policy="high")
    m.allocate(jobspec_from_pods(1, cpu(1)))  # one core gone somewhere
    r = m.allocate(jobspec_from_podsets(sets, packing=Packing("node")))
    assert r.ok and len(r.nodes) == 1 and r.nodes[0].cores == 4
    nodes = [{"metadata": {"name": f"n{i}", "labels": {"topology.kubernetes.io/zone": f"z{i % 2}"}},
              "status": {"allocatable": {"cpu": "4", "memory": "8Gi"},
                         "conditions": [{"type": "Ready", "status": "True"}]}} for i in range(6)]
    g = from_k8s_nodes(nodes)
    big = [PodSet("driver", 1, PodRequest(1000, 1024 * MIB)), PodSet("exec", 2, PodRequest(4000, 1024 * MIB))]
    pk = packing_from_annotations({ANN_KUEUE_REQUIRED: "topology.kubernetes.io/zone"}, pods=3)
    r = Matcher(g).allocate(jobspec_from_podsets(big, packing=pk))
    assert r.ok and r.podsets is not None
    zones = {g.get(n).properties["topology.kubernetes.io/zone"]  # type: ignore[index]
             for n in r.podsets["driver"] + r.podsets["exec"]}
    assert len(zones) == 1


# ----------------------------------------------------------------------------- JobSet-like


def test_jobset_driver_and_two_worker_jobs_all_or_nothing() -> None:
    sets = [PodSet("driver", 1, cpu(2)), PodSet("workers-0", 4, cpu(2)), PodSet("workers-1", 4, cpu(2))]
    js = jobspec_from_podsets(sets, name="jobset-train")
    m = Matcher(flat(5), policy="first")
    blocker = m.allocate(jobspec_from_pods(1, cpu(4), exclusive_nodes=True)).jobid
    before = free_cores(m)
    r = m.allocate(js)
    assert r.status is MatchStatus.BUSY
    assert free_cores(m) == before and list(m.jobs) == [blocker]  # nothing partial
    m.cancel(blocker)
    r = m.allocate(js)
    assert r.status is MatchStatus.ALLOCATED and r.podsets is not None
    # identical shapes, still each pod goes to a slot of its own set
    assert {k: len(v) for k, v in r.podsets.items()} == {"driver": 1, "workers-0": 4, "workers-1": 4}
    per_node: dict[str, int] = {}
    for nodes in r.podsets.values():
        for n in nodes:
            per_node[n] = per_node.get(n, 0) + 2
    assert per_node == {n.name: n.cores for n in r.nodes}
    assert nodes_of_sets(sets, r) == {k: sorted(v) for k, v in r.podsets.items()}


def test_partial_release_of_one_set_and_rerecord() -> None:
    m = Matcher(flat(9))
    r = m.allocate(jobspec_from_podsets(MPI))
    assert r.ok and r.podsets is not None
    launcher = r.podsets["launcher"][0]
    share = next(n for n in r.nodes if n.name == launcher)
    assert share.cores == 1
    assert m.partial_cancel(r.jobid, [share]) is False
    assert sum(n.cores for n in m.jobs[r.jobid].nodes) == 32
    left = m.jobs[r.jobid].nodes
    m.cancel(r.jobid)
    assert m.update_allocate(77, left).ok and free_cores(m) == 4


def test_per_set_node_rules() -> None:
    sets = [PodSet("launcher", 1, cpu(1), constraint={"hostlist": ["node5"]}), PodSet("worker", 3, cpu(4))]
    r = Matcher(flat(6), policy="first").allocate(jobspec_from_podsets(sets))
    assert r.ok and r.podsets is not None and r.podsets["launcher"] == ["node5"]
    bad = [PodSet("launcher", 1, cpu(1), constraint={"hostlist": ["nowhere"]}), PodSet("worker", 3, cpu(4))]
    r = Matcher(flat(6)).allocate_orelse_reserve(jobspec_from_podsets(bad))
    assert r.status is MatchStatus.UNSATISFIABLE and "pod set 'launcher'" in r.reason


# ----------------------------------------------------------------------------- back to pods


def test_nodes_of_sets_from_shares_and_stability() -> None:
    m = Matcher(flat(3))
    r = m.allocate(jobspec_from_pods(6, cpu(2), name="g"))
    sets = [PodSet("pods", 6, cpu(2))]
    got = nodes_of_sets(sets, r)
    assert sorted(got["pods"]) == sorted(["node0", "node0", "node1", "node1", "node2", "node2"])
    prev = {"pods": ["node2", "node1", "node0", "node2", "node1", "node0"]}
    assert nodes_of_sets(sets, r, previous=prev) == prev
    # a node gone from the allocation: its slots take the new node, the others stay
    moved = keep_stable({"pods": ["node0", "node1", "node1", "node2", "node2", "node3"]}, prev)
    assert moved["pods"] == ["node2", "node1", "node0", "node2", "node1", "node3"]


def test_nodes_of_sets_exclusive_shares() -> None:
    m = Matcher(flat(4, cores=8))
    r = m.allocate(jobspec_from_pods(3, cpu(1), exclusive_nodes=True, name="g"))
    got = nodes_of_sets([PodSet("w", 3, cpu(1))], r.nodes, exclusive=True)
    assert len(set(got["w"])) == 3


def test_shortfall_names_the_pod_set() -> None:
    g = from_description({"node": {"cores": 4}, "nodes": [{"count": 3}, {"count": 10, "cores": 2}]})
    why = podset_shortfall(MPI, g)
    assert why == "pod set 'worker': needs 8 pods of 4 cpu each; the nodes hold at most 3 of them"
    assert podset_shortfall(MPI, flat(8)) == "the pod sets together need 33 cpu in all; the cluster has 32"
    assert podset_shortfall(MPI, flat(7)) == "pod set 'worker': needs 32 cpu in all; the cluster has 28"
    assert podset_shortfall(MPI, flat(9)) is None
    why = podset_shortfall(MPI, flat(8, cores=8), packing=Packing(None, True))
    assert why == "the pod sets together need 9 nodes in all; the cluster has 8"


# ----------------------------------------------------------------------------- property


@st.composite
def gangs(draw: Any) -> tuple[list[int], list[PodSet], bool, str]:
    nodes = draw(st.lists(st.integers(1, 6), min_size=1, max_size=6))
    nsets = draw(st.integers(1, 3))
    sets = [PodSet(f"s{i}", draw(st.integers(1, 4)),
                   PodRequest(draw(st.integers(0, 4000)), draw(st.integers(0, 3)) * 512 * MIB))
            for i in range(nsets)]
    return nodes, sets, draw(st.booleans()), draw(st.sampled_from(["first", "low", "high", "lonode"]))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(gangs())
def test_every_allocation_gives_each_set_its_count(case: tuple[list[int], list[PodSet], bool, str]) -> None:
    cores, sets, exclusive, policy = case
    g = from_description({"node": {"memory": 2048, "memory_unit": "MiB"},
                          "nodes": [{"cores": c} for c in cores]})
    g.meta["split_pools"] = True
    m = Matcher(g, policy=policy)
    m.allocate(jobspec_from_pods(1, cpu(1)))  # something already running
    js = jobspec_from_podsets(sets, packing=Packing(None, exclusive), name="g")
    before = free_cores(m)
    r = m.allocate(js)
    if not r.ok:
        assert free_cores(m) == before and len(m.jobs) == 1
        return
    mapping = nodes_of_sets(sets, r, exclusive=exclusive)
    assert {k: len(v) for k, v in mapping.items()} == {s.name: s.count for s in sets}
    capacity = {f"node{i}": c for i, c in enumerate(cores)}
    used: dict[str, int] = {}
    pods: dict[str, int] = {}
    for s in sets:
        for n in mapping[s.name]:
            used[n] = used.get(n, 0) + s.demand()["core"]
            pods[n] = pods.get(n, 0) + 1
    held = {n.name: n.cores for n in r.nodes}
    for n, c in used.items():
        assert c <= capacity[n] and c <= held[n]
    if exclusive:
        assert all(k == 1 for k in pods.values())
    else:
        assert used == held
    m.check_invariants()
    m.cancel(r.jobid)
    assert free_cores(m) == before


def test_socket_local_sets_share_sockets_but_keep_each_pod_in_one() -> None:
    """Issue #28: a set's socket locality puts a shared socket above each slot (not an
    exclusive one inside it), so pods of two sets can share a socket's cores."""
    from fluxnetes.graph.topology import from_k8s_nodes_topology, topology_from_nrt
    from fluxnetes.match.matcher import Matcher
    from fluxnetes.match.results import MatchStatus
    from test_graph_topology import k8s_node, nrt_obj

    g, _ = from_k8s_nodes_topology([k8s_node("a")], {"a": topology_from_nrt(nrt_obj("a", [(4, 8, 0), (4, 8, 0)]))})
    sets = [PodSet("l", 1, cpu(1), "socket"), PodSet("w", 2, cpu(3), "socket")]
    js = jobspec_from_podsets(sets, name="x")
    assert [(r.type, r.with_[0].type) for r in js.resources] == [("socket", "slot"), ("socket", "slot")]
    m = Matcher(g, policy="first")
    r = m.allocate(js, now=0)
    assert r.status == MatchStatus.ALLOCATED, r
    # 1 + 3 + 3 cores on 2 sockets of 4: the launcher shares a socket with a worker
    by_socket: dict[str, int] = {}
    for v in r.vertices:
        if v.type == "core":
            by_socket[v.path.rsplit("/", 1)[0]] = by_socket.get(v.path.rsplit("/", 1)[0], 0) + 1
    assert sorted(by_socket.values()) == [3, 4]
    m.check_invariants()
