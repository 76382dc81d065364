"""Unit level (no cluster): the cluster mirror (k8s/cluster/mirror.py) on its own and in the Controller.

The cluster view is built alone (``ClusterView`` over the shared ``Context``, with fakes of the
parts it meets as its side: an empty group book, no release): Nodes become the graph, pods bound by anyone else become one
allocation per node, node loss gives back exactly the lost node's share.
"""

from __future__ import annotations

import asyncio
from typing import Any

from fluxnetes.k8s.cluster.mirror import ClusterView
from fluxnetes.k8s.config import OperatorConfig
from fluxnetes.k8s.context import Context
from fluxnetes.k8s.groups import OwnerRef
from fluxnetes.k8s.groups.group import Group
from fluxnetes.k8s.groups.grouptable import GroupTable
from fluxnetes.k8s.persistence.fluxjob import Phase
from fluxnetes.k8s.persistence.status import StatusWriter
from test_k8s_prune import RecordingKube, bound, job, make_controller, node, pod, settle


class Book(Context):
    """The shared core with fakes of what the cluster view meets (its ``MirrorSide``, and the
    status writer's ``StatusBook``): an empty group table, no release or eviction (node loss
    here finds no group holding the node), no workload objects. The cluster view is built on
    it (``cluster``)."""

    def __init__(self) -> None:
        super().__init__(RecordingKube(), OperatorConfig())  # type: ignore[arg-type]
        self.groups = GroupTable()
        self.pruned: dict[str, int] = {}
        self.status = StatusWriter(self, self)
        self.cluster: ClusterView = ClusterView(self, self)

    def drop_member(self, uid: str) -> None:
        pass

    async def evict(self, g: Group, pods: list[dict[str, Any]] | None = None) -> None:
        raise AssertionError("no group to evict")

    def release_all(self, g: Group) -> None:
        raise AssertionError("no group to release")

    def release_slot(self, g: Group, slot: int) -> None:
        raise AssertionError("no group to release")

    def release_idle_slots(self, g: Group) -> None:
        raise AssertionError("no group to release")

    def recheck_prune(self, g: Group) -> None:
        pass

    def spend_name(self, g: Group) -> None:
        pass

    def mark_finished(self, key: tuple[str, str]) -> None:
        pass

    def owner_obj(self, ref: OwnerRef | None, namespace: str) -> dict[str, Any] | None:
        return None


def mirror(*names: str, cls: type[ClusterView] = ClusterView) -> Book:
    b = Book()
    b.cluster = cls(b, b)
    for n in names:
        b.cluster.know_node(node(n))
    b.cluster.build_matcher()
    return b


def foreign_cores(m: Book) -> dict[str, int]:
    """Cores recorded per node for foreign pods (the matcher's allocations of the mirror)."""
    out: dict[str, int] = {}
    for node_name, jobid in m.cluster.foreign_jobs.items():
        rec = m.cluster.matcher.jobs[jobid]
        assert not rec.reserved
        out[node_name] = sum(s.cores for s in rec.nodes)
    return out


def other(name: str, cpu: str, node_name: str) -> dict[str, Any]:
    """A pod another scheduler bound (no fluxnetes label)."""
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "kube-system", "uid": f"pod-{name}"},
            "spec": {"nodeName": node_name, "containers": [{"name": "c", "resources": {"requests": {"cpu": cpu}}}]},
            "status": {"phase": "Running"}}


def test_foreign_pods_are_one_allocation_per_node_and_follow_moves_and_deletes() -> None:
    m = mirror("n0", "n1")
    m.cluster.add_foreign("a", other("a", "3", "n0"), "n0")
    m.cluster.add_foreign("b", other("b", "2", "n0"), "n0")
    m.cluster.flush_foreign()
    assert foreign_cores(m) == {"n0": 5}
    assert not m.cluster.foreign_dirty
    m.cluster.add_foreign("a", other("a", "3", "n0"), "n0")  # seen again unchanged: nothing to record
    assert not m.cluster.foreign_dirty
    m.cluster.add_foreign("b", other("b", "2", "n1"), "n1")  # moved (deleted, made again elsewhere)
    m.cluster.flush_foreign()
    assert foreign_cores(m) == {"n0": 3, "n1": 2}
    m.cluster.remove_foreign("a")
    m.cluster.remove_foreign("b")
    m.cluster.flush_foreign()
    assert foreign_cores(m) == {}
    assert len(m.cluster.matcher.jobs) == 0


def test_nodes_added_cordoned_and_removed_change_the_graph_in_place() -> None:
    m = mirror("n0")
    m.cluster.on_node("ADDED", node("n1"))
    assert set(m.cluster.nodes) == {"n0", "n1"} and m.cluster.node_down == {"n0": False, "n1": False}
    m.cluster.add_foreign("a", other("a", "4", "n1"), "n1")
    m.cluster.flush_foreign()
    assert foreign_cores(m) == {"n1": 4}
    cordoned = node("n1")
    cordoned["spec"] = {"unschedulable": True}
    m.cluster.on_node("MODIFIED", cordoned)
    assert m.cluster.node_down["n1"] is True
    m.cluster.on_node("DELETED", cordoned)
    assert "n1" not in m.cluster.nodes and "n1" not in m.cluster.node_down
    m.cluster.add_foreign("b", other("b", "2", "n1"), "n1")  # (a pod still seen on the gone node)
    m.cluster.flush_foreign()
    assert foreign_cores(m) == {}  # a foreign pod on a node that is gone holds nothing


def test_node_loss_fails_the_group_and_gives_back_only_the_lost_nodes_share() -> None:
    async def main() -> None:
        c, _ = make_controller()
        j = job("j", 2)
        j["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "12"  # one per node
        c.handle(("Job", "ADDED", j))
        await settle(c)
        pods = [pod(f"j-{i}", owner=j) for i in range(2)]
        for p in pods:
            p["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "12"
            c.handle(("Pod", "ADDED", p))
        await settle(c)
        g = c.groups[("ns", "job-j")]
        assert g.phase == Phase.RUNNING and len(set(g.slots)) == 2
        for i, p in enumerate(pods):
            c.handle(("Pod", "MODIFIED", bound(p, g.slots[g.slot_pod.index(f"pod-j-{i}")])))
        lost, kept = g.slots
        c.handle(("Node", "DELETED", node(lost)))
        assert g.phase == Phase.FAILED and "was removed" in g.reason
        assert set(g.held) == {kept}  # the surviving pod still runs: its share stays held
        assert c.cluster.matcher.jobs[g.jobid].nodes[0].name == kept

    asyncio.run(main())


def test_a_node_heartbeat_costs_nothing_a_cordon_or_a_resize_is_seen() -> None:
    """Issue #17: at 5,000 nodes the operator's loop stalled for minutes after start: every Node
    event (the replay of the initial list, then kubelet/kwok heartbeats every few seconds)
    recounted every node's cores and woke the queue. A heartbeat changes nothing the graph or
    the queue sees; a cordon, a new allocatable, a new node or a new label does."""
    import copy

    synced: list[int] = []

    class Counting(ClusterView):
        def sync_node_cores(self) -> None:
            synced.append(1)
            super().sync_node_cores()

    m = mirror("n0", "n1", cls=Counting)
    m.cluster.node_view.reset(m.cluster.nodes.values())
    m.dirty = False
    beat = copy.deepcopy(m.cluster.nodes["n0"])
    beat["status"]["conditions"][0]["lastHeartbeatTime"] = "2026-11-26T14:00:00Z"
    m.cluster.on_node("MODIFIED", beat)
    m.cluster.on_node("ADDED", copy.deepcopy(m.cluster.nodes["n1"]))  # the replay of the initial list
    assert synced == [] and not m.dirty
    cordoned = copy.deepcopy(beat)
    cordoned["spec"] = {"unschedulable": True}
    m.cluster.on_node("MODIFIED", cordoned)
    assert synced == [1] and m.dirty
    m.dirty = False
    bigger = copy.deepcopy(m.cluster.nodes["n1"])
    bigger["status"]["allocatable"]["cpu"] = "32"
    m.cluster.on_node("MODIFIED", bigger)
    assert synced == [1, 1] and m.dirty
    m.dirty = False
    labelled = copy.deepcopy(bigger)
    labelled["metadata"]["labels"]["team"] = "a"
    m.cluster.on_node("MODIFIED", labelled)
    assert m.dirty


def test_a_foreign_pod_leaves_the_rest_of_its_socket_to_socket_local_pods() -> None:
    """Issue #28: on a real node (one NUMA zone) the agent DaemonSet's pod took 1 of 2 cores
    and a socket-local pod (``fluxnetes.io/topology: socket``) was never placed there. The
    foreign pod's core is in the socket, so the socket carries its x_checker tag (Fluxion); the
    socket-local request must not ask for the socket exclusively, only for cores within it."""
    from fluxnetes.jobspec.pods import PodRequest, jobspec_from_pods
    from fluxnetes.match.results import MatchStatus
    from test_graph_topology import nrt_obj

    m = Book()
    n = node("n0")
    n["status"]["allocatable"]["cpu"] = "2"
    n["status"]["capacity"]["cpu"] = "4"
    m.cluster.know_node(n)
    m.cluster.topologies.update("ADDED", nrt_obj("n0", [(2, 8, 0)]))
    m.cluster.build_matcher()
    assert [v.type for v in m.cluster.matcher.graph.vertices].count("socket") == 1
    m.cluster.add_foreign("agent", other("agent", "1", "n0"), "n0")
    m.cluster.flush_foreign()
    assert foreign_cores(m) == {"n0": 1}
    local = jobspec_from_pods(1, PodRequest(cpu_millis=1000), locality="socket", name="g")
    r = m.cluster.matcher.allocate(local, now=0)
    assert r.status == MatchStatus.ALLOCATED, r
    assert [(s.name, s.cores) for s in r.nodes] == [("n0", 1)]
    # the socket is full now: a second one waits
    assert m.cluster.matcher.allocate(local, now=0).status == MatchStatus.BUSY
    m.cluster.matcher.check_invariants()


def test_foreign_pods_that_do_not_fit_yet_are_recorded_once_there_is_room() -> None:
    """A node's foreign pods whose record fails (what the graph holds there first leaves no
    room) stay to be recorded: the next flush tries again, without a change on that node to
    make it dirty. (Was: the dirty flag was cleared whatever the outcome; nothing changed
    there afterwards, so the pods ran uncharged for good and the node was overbooked.)"""
    from fluxnetes.k8s.scheduling import shares

    m = mirror("n0")
    block = m.cluster.matcher.next_jobid
    m.cluster.matcher.update_allocate(block, shares.to_match([shares.Share("n0", 16)]), at=0, duration=0)
    m.cluster.add_foreign("a", other("a", "4", "n0"), "n0")
    m.cluster.flush_foreign()
    assert foreign_cores(m) == {}  # no room: nothing recorded
    assert not m.cluster.foreign_dirty  # (the loop is not woken every few ms for it)
    m.cluster.matcher.cancel(block)
    m.dirty = False
    m.cluster.flush_foreign()  # nothing changed on n0: tried again all the same
    assert foreign_cores(m) == {"n0": 4}
    m.cluster.flush_foreign()
    assert foreign_cores(m) == {"n0": 4}
    m.cluster.matcher.check_invariants()


def test_a_group_that_no_longer_fits_a_shrunk_node_holds_nothing_its_pod_counts_as_foreign() -> None:
    """A node's allocatable shrank under two running groups (8 of 16 cores each; now 12): the
    graph is rebuilt and re-records them; the second does not fit. It must hold nothing the
    graph does not (it fails, as on node loss; its pod runs on, charged to its node as a
    foreign pod once there is room). (Was: the failed record was ignored, the group kept
    running holding 8 cores the graph did not, and the next group was placed over its pod.)"""
    from fluxnetes.k8s.controller import Controller

    async def main() -> None:
        from test_k8s_prune import RecordingKube, bind_to_slots

        c = Controller(RecordingKube(), OperatorConfig(fluxjobs="all"))  # type: ignore[arg-type]
        c.cluster.know_node(node("n0"))
        c.cluster.build_matcher()
        c.reconciled = True
        placed = {}
        for name in ("j1", "j2"):
            j = job(name, 1)
            j["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "8"
            c.handle(("Job", "ADDED", j))
            p = pod(f"{name}-0", owner=j)
            p["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "8"
            c.handle(("Pod", "ADDED", p))
            await settle(c)
            g = c.groups[("ns", f"job-{name}")]
            assert g.phase == Phase.RUNNING and g.slots == ["n0"], (g.phase, g.reason)
            placed[name] = bind_to_slots(c, g, [p])[0]
        await settle(c)
        g1, g2 = c.groups[("ns", "job-j1")], c.groups[("ns", "job-j2")]
        small = node("n0")
        small["status"]["allocatable"]["cpu"] = "12"
        c.handle(("Node", "MODIFIED", small))
        await settle(c)
        assert g1.phase == Phase.RUNNING and g1.jobid in c.cluster.matcher.jobs
        assert g2.phase == Phase.FAILED and "did not fit" in g2.reason, (g2.phase, g2.reason)
        assert not g2.held and "pod-j2-0" not in g2.members
        assert c.cluster.foreign_node == {"pod-j2-0": "n0"}
        # 8 more do not fit beside j1's 8 on 12 cores: the 4 free ones are charged meanwhile
        assert foreign_cores(c) == {"n0": 4}
        done = copy.deepcopy(placed["j1"])
        done["status"]["phase"] = "Succeeded"
        c.handle(("Pod", "MODIFIED", done))
        await settle(c)
        assert g1.phase.final and not g1.held
        assert foreign_cores(c) == {"n0": 8}  # j2's pod is charged once j1's room is free
        c.cluster.matcher.check_invariants()

    import copy

    asyncio.run(main())


def test_foreign_pods_that_do_not_fit_take_what_is_free_on_their_node_meanwhile() -> None:
    """A node's foreign pods whose whole record does not fit (the graph holds 14 of its 16
    cores for what was recorded first; the pods use 4) take the 2 cores left there until the
    whole fits: nothing new is placed on a node they already overfill. (Was: the 2 cores
    stayed free in the graph while the record was retried, and the next group placed there
    joined pods that had no room: the kubelet refuses it, OutOfcpu.)"""
    from fluxnetes.jobspec.pods import PodRequest, jobspec_from_pods
    from fluxnetes.k8s.scheduling import shares
    from fluxnetes.match.results import MatchStatus

    m = mirror("n0")
    block = m.cluster.matcher.next_jobid
    m.cluster.matcher.update_allocate(block, shares.to_match([shares.Share("n0", 14)]), at=0, duration=0)
    m.cluster.add_foreign("a", other("a", "4", "n0"), "n0")
    m.cluster.flush_foreign()
    assert foreign_cores(m) == {"n0": 2}  # what is free, until the whole fits
    one = jobspec_from_pods(1, PodRequest(cpu_millis=1000), name="g")
    assert m.cluster.matcher.allocate(one, now=0).status == MatchStatus.BUSY
    m.cluster.matcher.check_invariants()
    m.cluster.flush_foreign()  # tried again, still no room for the whole: the same 2
    assert foreign_cores(m) == {"n0": 2}
    m.cluster.matcher.cancel(block)
    m.cluster.flush_foreign()  # room now: the whole is recorded, the part given back
    assert foreign_cores(m) == {"n0": 4}
    assert m.cluster.matcher.allocate(one, now=0).status == MatchStatus.ALLOCATED
    m.cluster.matcher.check_invariants()
