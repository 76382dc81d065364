"""NodeResourceTopology objects on the operator side: read them, keep them by node, and turn a
change into an in-place replacement of that node's subtree in the matcher's graph.

* :class:`Topologies` - node name -> :class:`~fluxnetes.graph.topology.NodeTopology`, fed
  with NRT watch events (``update(etype, obj)`` says whether the node's topology changed).
  Objects written by ``fluxnetes agent`` and by NFD's nfd-topology-updater read the same.
* :func:`build_graph` - the whole graph from Nodes and topologies (for ``build_matcher``).
* :func:`replace_node` - one node's subtree replaced (flat <-> sockets, or changed zones)
  while the matcher keeps every recorded job: the jobs holding something on the node are
  cancelled, the subtree swapped, and the same jobs recorded again with the same ids, times
  and amounts, on the same vertices where the path still exists (else in the same socket,
  else on free vertices of the same type on that node). A socket held whole that no longer
  exists (the node went flat) is simply not held any more. Cores, GPUs or memory that no
  longer fit (the node shrank under running work) are reported in ``ReplaceResult.lost``.
  Reservations (future) are recorded again as plain allocations; the scheduler's next cycle
  re-plans them (call ``scheduler.invalidate()``).
* :class:`TopologySource` - a watch of NRT objects that tolerates the CRD being absent (it
  waits for it) and a missing permission (logged once, the graph stays flat), so it never
  blocks the operator's start. It needs get/list/watch on noderesourcetopologies only.
  While the CRD is absent it watches that one CRD by name (list/watch on
  customresourcedefinitions ``noderesourcetopologies.topology.node.k8s.io``, as the chart
  grants): the agent installs the CRD after the operator has started, and its topology is
  read as soon as the CRD is served instead of at the next minute's look (issue #28). One
  idle watch costs the API server nothing between events; without that permission it looks
  every ``crd_poll`` seconds as before.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from fluxnetes.graph.model import GraphError, ResourceGraph, Vertex
from fluxnetes.graph.topology import (
    NodeTopology,
    from_k8s_nodes_topology,
    node_graph,
    topology_from_nrt,
)
from fluxnetes.k8s.kube import CRDS, ApiError, Kube, Resource, short, transient

log = logging.getLogger("fluxnetes.k8s.topology")  # its name from before the sub-packages

# a CRD that exists but is not served yet (being established) is looked at again this soon
CRD_SETTLE_SECONDS = 0.5

KIND = "NodeResourceTopology"
CRD_NAME = "noderesourcetopologies.topology.node.k8s.io"
NRT = Resource("topology.node.k8s.io/v1alpha2", "noderesourcetopologies", namespaced=False)
DEFAULT_RACK_LABEL = "fluxnetes.io/rack"
ALIGNED_POLICY = "single-numa-node"  # the topology manager policy that sockets in the graph need


class Topologies:
    """The topologies the cluster's NRT objects describe, by node name."""

    def __init__(self) -> None:
        self.by_node: dict[str, NodeTopology] = {}
        self.errors: dict[str, str] = {}  # node -> why its NRT object was not usable
        self.unaligned: set[str] = set()  # nodes whose kubelet does not align to one NUMA node

    def get(self, node: str) -> NodeTopology | None:
        return self.by_node.get(node)

    def update(self, etype: str, obj: Mapping[str, Any]) -> bool:
        """Apply one watch event; True when the node's topology changed (replace its subtree).
        A malformed object is logged and treated as absent (the node goes flat)."""
        name = str((obj.get("metadata") or {}).get("name", ""))
        if not name:
            return False
        if etype == "DELETED":
            self.errors.pop(name, None)
            self.unaligned.discard(name)
            return self.by_node.pop(name, None) is not None
        try:
            topo = topology_from_nrt(obj)
        except GraphError as exc:
            if self.errors.get(name) != str(exc):
                log.warning("ignoring the NodeResourceTopology of %s: %s", name, exc)
            self.errors[name] = str(exc)
            return self.by_node.pop(name, None) is not None
        self.errors.pop(name, None)
        if topo.policy != ALIGNED_POLICY:
            # The graph follows what the node enforces: only a kubelet that puts each pod in
            # one NUMA domain makes socket placement true. Elsewhere a pod larger than one
            # domain is normal, and a socket subtree would refuse it: the node stays flat.
            if name not in self.unaligned:
                log.info("node %s: topologyManagerPolicy %s (not %s): its graph stays flat",
                         name, topo.policy, ALIGNED_POLICY)
            self.unaligned.add(name)
            return self.by_node.pop(name, None) is not None
        self.unaligned.discard(name)
        if not topo.zones:
            return self.by_node.pop(name, None) is not None
        if self.by_node.get(name) == topo:
            return False  # e.g. only `available` or metadata changed
        self.by_node[name] = topo
        return True


def build_graph(nodes: list[dict[str, Any]], topologies: Topologies, *, rack_label: str = DEFAULT_RACK_LABEL,
                cluster_name: str = "k8scluster0") -> tuple[ResourceGraph, dict[str, list[str]]]:
    """The operator's graph: flat nodes, and socket subtrees where a topology is known.
    Returns it and, per node, the NRT/Node disagreements (for Events)."""
    return from_k8s_nodes_topology(nodes, topologies.by_node, rack_label=rack_label, cluster_name=cluster_name)


@dataclass
class ReplaceResult:
    node: str
    notes: list[str] = field(default_factory=list)  # NRT vs Node disagreements (smaller used)
    kept: list[int] = field(default_factory=list)  # job ids recorded again in full
    lost: dict[int, str] = field(default_factory=dict)  # job id -> what could not be kept


def _graph_under(old: Vertex, fresh: ResourceGraph) -> ResourceGraph:
    """``fresh``'s node subtree under the same ancestors (and rank) as ``old``, so the node
    keeps its place (zone/rack) and its path."""
    out = ResourceGraph()
    chain: list[Vertex] = []
    a = old.parent
    while a is not None:
        chain.append(a)
        a = a.parent
    parent: Vertex | None = None
    for a in reversed(chain):
        parent = out.add_vertex(Vertex(a.type, basename=a.basename, name=a.name, id=a.id, rank=a.rank,
                                       size=a.size, unit=a.unit, properties=a.properties, path=a.path,
                                       status=a.status), parent)
    src = fresh.by_type["node"][0]

    def copy(v: Vertex, dst: Vertex | None) -> None:
        path = (dst.path if dst is not None else "") + "/" + v.name
        rank = old.rank if v.rank == src.rank else v.rank
        nv = out.add_vertex(Vertex(v.type, basename=v.basename, name=v.name, id=v.id, rank=rank, size=v.size,
                                   unit=v.unit, properties=v.properties, path=path, status=v.status), dst)
        for c in v.children:
            copy(c, nv)

    copy(src, parent)
    out.meta.update(fresh.meta)
    return out


def replace_node(matcher: Any, node: Mapping[str, Any], topo: NodeTopology | None, *,
                 rack_label: str = DEFAULT_RACK_LABEL) -> ReplaceResult:
    """Replace the node's subtree in ``matcher``'s graph by the one ``topo`` describes (flat
    when None), keeping recorded jobs (see the module docstring). A node not yet in the graph
    is added."""
    from fluxnetes.match.results import MatchError

    name = str((node.get("metadata") or {}).get("name", ""))
    g: ResourceGraph = matcher.graph
    root = g.root
    cluster = root.name if root is not None else "k8scluster0"
    fresh, notes = node_graph(node, topo, rack_label=rack_label, cluster_name=cluster)
    result = ReplaceResult(name, notes)
    olds = [v for v in g.by_name.get(name, []) if v.type == "node"]
    if not olds:
        matcher.add_subgraph(fresh)
        return result
    old = olds[0]
    prefix = old.path

    def on_node(p: str) -> bool:
        return p == prefix or p.startswith(prefix + "/")

    # per job: (path, type, amount, leaf) of what it holds
    snaps: list[tuple[int, int, int, list[tuple[str, str, int, bool]]]] = []
    for jid, rec in sorted(matcher.jobs.items()):
        held = [(e.vs.v.path, e.vs.v.type, int(e.plan), not e.vs.v.children) for e in rec.entries if e.plan > 0]
        if any(on_node(p) for p, _, _, _ in held):
            snaps.append((jid, rec.at, rec.duration, held))
    for jid, *_ in snaps:
        matcher.cancel(jid)
    new = _graph_under(old, fresh)
    matcher.remove_subgraph(prefix)
    matcher.add_subgraph(new)
    top = g.by_path.get(prefix)
    if top is None:  # the node's own path changed (it cannot: same ancestors, same name)
        raise GraphError(f"node {name}: the new subtree was not attached at {prefix}")
    split = bool(getattr(matcher, "split_pools", g.meta.get("split_pools", False)))
    left: dict[str, int] = {}  # new vertex path -> what is still free on it
    by_type: dict[str, list[Vertex]] = {}
    for v in g.walk(top):
        left[v.path] = v.size
        by_type.setdefault(v.type, []).append(v)

    def take(path: str, vtype: str, amount: int) -> tuple[list[tuple[str, int]], int]:
        """New vertices for ``amount`` of what ``path`` held: the same path first, then the
        same parent (a socket-local job stays in its socket), then any."""
        parent = path.rsplit("/", 1)[0]
        cands = sorted(by_type.get(vtype, []),
                       key=lambda v: 0 if v.path == path else 1 if v.path.rsplit("/", 1)[0] == parent else 2)
        got: list[tuple[str, int]] = []
        for v in cands:
            if amount <= 0:
                break
            pool = split and v.size > 1 and not v.children
            free = left[v.path]
            if free <= 0 or (not pool and free < v.size):
                continue
            n = min(free, amount) if pool else v.size
            left[v.path] -= n
            amount -= n
            got.append((v.path, n))
        return got, amount

    for jid, at, duration, held in snaps:
        verts: list[dict[str, Any]] = []
        short: dict[str, int] = {}
        for path, vtype, amount, leaf in held:
            if not on_node(path):
                got, missing = [(path, amount)], 0
            else:
                got, missing = take(path, vtype, amount)
            if missing > 0 and leaf:  # a socket held whole that no longer exists: no resource lost
                short[vtype] = short.get(vtype, 0) + missing
            for p, n in got:
                verts.append({"id": str(len(verts)), "metadata": {
                    "type": g.by_path[p].type, "paths": {"containment": p}, "exclusive": True, "size": n}})
        if not verts:
            result.lost[jid] = f"nothing of it fits on {name} any more"
            continue
        try:
            matcher.update_allocate(jid, {"graph": {"nodes": verts, "edges": []}}, at=at, duration=duration)
        except MatchError as exc:
            result.lost[jid] = str(exc)
            continue
        if short:
            what = ", ".join(f"{n} {t}" for t, n in sorted(short.items()))
            result.lost[jid] = f"{name} no longer has room for {what} of it"
        else:
            result.kept.append(jid)
    return result


class TopologySource:
    """Watch NodeResourceTopology objects into ``queue`` as ``(KIND, etype, obj)`` events.

    Never blocks or ends the operator: without the CRD it watches for it (``crd_poll``
    seconds at most per watch; every ``crd_poll`` seconds a plain look when it may not watch
    CRDs); without permission on the NRT objects it logs once and retries rarely."""

    def __init__(self, kube: Kube, queue: asyncio.Queue[Any], *, crd_poll: float = 60) -> None:
        self.kube, self.queue, self.crd_poll = kube, queue, crd_poll
        self._warned = False
        self._crd_watch = True  # False once watching the CRD was refused: plain looks then

    async def _crd_changed(self) -> None:
        """Return when the NRT CRD may have appeared: it is created or changed (a watch by name),
        it exists already, ``crd_poll`` seconds passed, or (no permission to watch it) after a
        plain ``crd_poll`` sleep."""
        if self._crd_watch:
            selector = f"metadata.name={CRD_NAME}"
            try:
                items, version = await self.kube.list(CRDS, field_selector=selector)
                if items:  # made, not served yet: being established
                    await asyncio.sleep(min(CRD_SETTLE_SECONDS, self.crd_poll))
                    return
                async for event in self.kube.watch(CRDS, version, field_selector=selector,
                                                   timeout_seconds=max(1, int(self.crd_poll))):
                    if event.get("type") in ("ADDED", "MODIFIED"):
                        return
                return  # the watch timed out: look again
            except ApiError as exc:
                if exc.status == 410:  # the version is too old: list again
                    return
                self._crd_watch = False
                log.info("node topology: cannot watch the CustomResourceDefinition %s (%s); looking for "
                         "it every %.0f s instead", CRD_NAME, short(exc), self.crd_poll)
        await asyncio.sleep(self.crd_poll)

    async def _served(self) -> bool:
        """Is the NRT API there (the CRD installed)? A one-item list: no permission on
        CustomResourceDefinitions is needed."""
        try:
            await self.kube.request("GET", NRT.path(), params={"limit": 1})
        except ApiError as exc:
            if exc.status == 404:
                return False
            raise
        return True

    async def load(self, topologies: Topologies) -> int:
        """List the NRT objects once into ``topologies`` (before the first graph is built, so
        it is built with them instead of replacing nodes one by one). Returns how many were
        usable; 0 without the CRD or without permission (logged once)."""
        try:
            if not await self._served():
                return 0
            items, _ = await self.kube.list(NRT)
        except ApiError as exc:
            self._warn(exc)
            return 0
        for obj in items:
            topologies.update("ADDED", obj)
        return len(topologies.by_node)

    def _warn(self, exc: ApiError) -> None:
        if not self._warned:
            self._warned = True
            log.warning("NodeResourceTopology objects cannot be read (%s); the graph stays flat. "
                        "Grant get/list/watch on noderesourcetopologies.topology.node.k8s.io "
                        "(and get on customresourcedefinitions) to use them", exc)

    async def run(self) -> None:
        from fluxnetes.k8s.informer import Informer

        while True:
            try:
                if not await self._served():
                    await self._crd_changed()
                    continue
                await Informer(self.kube, NRT, KIND, self.queue).run()
            except asyncio.CancelledError:
                raise
            except ApiError as exc:
                self._warn(exc)
                await asyncio.sleep(max(self.crd_poll, 300) if exc.forbidden else self.crd_poll)
            except Exception as exc:
                if not transient(exc):
                    raise
                # the API server is away (its restart): ask again, as the informers do
                log.info("node topology: %s; trying again", short(exc))
                await asyncio.sleep(min(self.crd_poll, 5.0))
