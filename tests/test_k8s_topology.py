"""The operator follows NodeResourceTopology objects (k8s/cluster/topology.py wired into the
controller): a node with an aligned topology gets sockets in the graph, a pod asking
`fluxnetes.io/topology: socket` is placed within one socket, a change of the object replaces
the node's subtree with running allocations kept, and deleting it makes the node flat again.

Unit level: the Controller driven by watch events (the recording fake of test_k8s_prune).
Against the API server (k8s): the NodeResourceTopology CRD installed after the start is noticed
within seconds."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import pytest

from test_graph_topology import nrt_obj
from test_k8s_prune import bound, make_controller, pod, settle


def socket_pod(name: str, cpu: str) -> dict[str, Any]:
    p = pod(name, labels={"fluxnetes.io/group": name, "fluxnetes.io/group-size": "1"})
    p["metadata"]["annotations"] = {"fluxnetes.io/topology": "socket"}
    p["spec"]["containers"][0]["resources"]["requests"]["cpu"] = cpu
    return p


def sockets_of(c: Any, node: str) -> list[str]:
    return sorted(v.path for v in c.cluster.matcher.graph.vertices if v is not None and v.type == "socket"
                  and f"/{node}/" in v.path + "/")


def test_topology_events_shape_the_graph_and_keep_running_work() -> None:
    async def main() -> None:
        c, _kube = make_controller()  # n0..n3, 16 cpu each, flat
        assert sockets_of(c, "n0") == []
        # n0's kubelet aligns pods to one NUMA node: 2 zones of 8 cpus
        c.handle(("NodeResourceTopology", "ADDED", nrt_obj("n0", [(8, 32, 0), (8, 32, 0)])))
        assert len(sockets_of(c, "n0")) == 2
        # socket-local pods of 6 cpus: only n0 has sockets, so two fit there (one per socket)
        pods = [socket_pod(f"s{i}", "6") for i in range(3)]
        for p in pods:
            c.handle(("Pod", "ADDED", p))
        await settle(c)
        groups = {k[1]: g for k, g in c.groups.items()}
        running = [n for n, g in groups.items() if str(g.phase) == "Running"]
        assert sorted(running) == ["s0", "s1"], {n: str(g.phase) for n, g in groups.items()}
        assert all(groups[n].slots[0] == "n0" for n in running)
        for n in running:
            c.handle(("Pod", "MODIFIED", bound(pods[int(n[1])], "n0")))
        await settle(c)
        # a pod of 10 cpus asking for one socket can never fit an 8-cpu socket
        big = socket_pod("big", "10")
        c.handle(("Pod", "ADDED", big))
        await settle(c)
        assert str(c.groups[("ns", "big")].phase) == "Unsatisfiable"
        # the object changes (zones of 8 -> the same, plus GPUs): the subtree is replaced and
        # the two running pods keep their shares
        before = dict(c.cluster.matcher.jobs)
        changed = nrt_obj("n0", [(8, 32, 1), (8, 32, 1)])
        c.handle(("NodeResourceTopology", "MODIFIED", changed))
        assert set(c.cluster.matcher.jobs) == set(before)
        assert str(groups["s2"].phase) != "Running"  # still no room for a third
        # the node's topology manager stops aligning: the node goes flat, work kept
        unaligned = copy.deepcopy(changed)
        unaligned["attributes"][0]["value"] = "best-effort"
        c.handle(("NodeResourceTopology", "MODIFIED", unaligned))
        assert sockets_of(c, "n0") == [] and set(c.cluster.matcher.jobs) == set(before)
        c.handle(("NodeResourceTopology", "DELETED", unaligned))
        assert sockets_of(c, "n0") == []

    asyncio.run(main())


@pytest.mark.k8s
def test_a_topology_crd_installed_after_the_start_is_read_within_seconds(
    k8s_cluster: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue #28, against the API server: the agent installs the NodeResourceTopology CRD
    after the operator started. The operator's TopologySource (crd_poll here an hour, so a
    look at the next poll cannot pass) watches the CRD by name and lists the first object
    within seconds of the CRD's creation."""
    import time

    from fluxnetes.agent import nrt
    from fluxnetes.k8s.cluster.topology import CRD_NAME, NRT, TopologySource
    from fluxnetes.k8s.kube import CRDS, ApiError, Kube

    monkeypatch.setattr(nrt, "_crd_ready", False)
    node = "kwok-node-0"

    async def served(kube: Kube) -> bool:
        try:
            await kube.request("GET", NRT.path(), params={"limit": 1})
        except ApiError as exc:
            if exc.status == 404:
                return False
            raise
        return True

    async def main() -> None:
        kube = await Kube.from_config(str(k8s_cluster.kubeconfig))
        task: asyncio.Future[None] | None = None
        try:
            await kube.delete(CRDS, CRD_NAME)  # (left by an earlier test: absent at the start)
            for _ in range(300):
                if not await served(kube):
                    break
                await asyncio.sleep(0.2)
            assert not await served(kube), f"the {CRD_NAME} CRD did not go"
            queue: asyncio.Queue[Any] = asyncio.Queue()
            # wait for the state, not a time: the source has opened its watch of the CRD (from
            # its list's resourceVersion, so a CRD made from here on reaches that watch)
            watching = asyncio.Event()
            real_watch = kube.watch

            def spy(res: Any, *args: Any, **kwargs: Any) -> Any:
                if res == CRDS:
                    watching.set()
                return real_watch(res, *args, **kwargs)

            monkeypatch.setattr(kube, "watch", spy)
            task = asyncio.ensure_future(TopologySource(kube, queue, crd_poll=3600).run())
            await asyncio.wait_for(watching.wait(), 120)
            assert queue.empty()
            created = time.monotonic()
            assert await nrt.ensure_crd(kube)  # what the agent does at its start
            await kube.create(NRT, nrt_obj(node, [(8, 32, 0), (8, 32, 0)]))
            kind, etype, obj = await asyncio.wait_for(queue.get(), 30)
            assert (kind, etype, obj["metadata"]["name"]) == ("NodeResourceTopology", "ADDED", node)
            assert time.monotonic() - created < 30
        finally:
            if task is not None:
                task.cancel()
            await kube.delete(NRT, node)
            await kube.close()

    asyncio.run(main())
