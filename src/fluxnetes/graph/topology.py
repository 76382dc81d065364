"""Topology-aware node subtrees: node -> socket (one per NUMA zone) -> cores, GPUs, memory.

Input is a NodeResourceTopology object (``topology.node.k8s.io/v1alpha2`` or ``v1alpha1``,
as a plain dict: written by ``fluxnetes agent`` or by NFD's topology-updater) and the Node's
``status.allocatable``. Without one a node stays flat, exactly as
:func:`fluxnetes.graph.builders.from_k8s_nodes` builds it.

Mapping, per zone of ``type: Node`` (zones of other types are ignored), in NUMA id order:

* one ``socket`` vertex (id = the NUMA id, property ``numa``) under the node;
* ``floor(cpu allocatable)`` ``core`` vertices, ``nvidia.com/gpu`` (or ``amd.com/gpu``)
  ``gpu`` vertices and one ``memory`` pool (allocatable MiB) under it; cores, GPUs and
  memory pools are numbered across the node (core0.. in socket0, then socket1, ...);
* other extended resources a zone lists become pools in that zone's socket; extended
  resources of the Node that no zone lists go to the first socket (a slot must find all its
  types among one vertex's children).

The Node and the NRT may disagree: for cpu, memory and GPUs the smaller total wins. When the
zones hold more than the Node's allocatable, the zones are scaled down to it (in proportion,
the remainder to the largest zones); when the Node holds more, the extra stays unused (the
zones say where things are; what they do not place cannot be placed). Each disagreement is
returned as a message so the operator can emit an Event.

Why sockets and not NUMA vertices: Fluxion's jobspecs and graphs call the domain a socket
(``slot -> socket -> core``), and a slot is placed at the first vertex whose direct children
hold all its types, so on these nodes every slot lands within one NUMA domain.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from fluxnetes.graph.builders import MIB, from_k8s_nodes, parse_quantity
from fluxnetes.graph.model import GraphError, ResourceGraph, Vertex, vertex_basename
from fluxnetes.jobspec.pods import extended_type

NRT_GROUP = "topology.node.k8s.io"
GPU_RESOURCES = ("nvidia.com/gpu", "amd.com/gpu")
_CORE_TYPES = ("core", "gpu", "memory", "node", "slot", "socket")


@dataclass(frozen=True)
class Zone:
    """One NUMA zone's allocatable resources (whole units; memory in MiB)."""

    numa: int
    cores: int = 0
    gpus: int = 0
    memory: int = 0  # MiB
    extra: Mapping[str, int] = field(default_factory=dict)  # graph type -> count
    cost: Mapping[int, int] = field(default_factory=dict)  # NUMA id -> distance


@dataclass(frozen=True)
class NodeTopology:
    node: str
    zones: tuple[Zone, ...]
    policy: str = "none"  # topologyManagerPolicy
    scope: str = "container"  # topologyManagerScope

    def totals(self) -> dict[str, int]:
        return {
            "core": sum(z.cores for z in self.zones),
            "gpu": sum(z.gpus for z in self.zones),
            "memory": sum(z.memory for z in self.zones),
        }


def _whole(q: Any, where: str, divisor: int = 1) -> int:
    v = parse_quantity(q, where)
    if v < 0:
        raise GraphError(f"{where}: must be >= 0, got {q!r}")
    return int(v) // divisor


def topology_from_nrt(obj: Mapping[str, Any]) -> NodeTopology:
    """A NodeResourceTopology object -> :class:`NodeTopology`; malformed input raises
    :class:`GraphError` naming the field."""
    if not isinstance(obj, Mapping):
        raise GraphError("NodeResourceTopology: must be a mapping")
    api = str(obj.get("apiVersion", ""))
    if api and not api.startswith(NRT_GROUP + "/"):
        raise GraphError(f"NodeResourceTopology.apiVersion: expected {NRT_GROUP}/..., got {api!r}")
    md = obj.get("metadata")
    name = md.get("name") if isinstance(md, Mapping) else None
    if not isinstance(name, str) or not name:
        raise GraphError("NodeResourceTopology.metadata.name: is required (the node's name)")
    where = f"NodeResourceTopology {name}"
    attrs: dict[str, str] = {}
    for i, a in enumerate(obj.get("attributes") or []):
        if not isinstance(a, Mapping) or not isinstance(a.get("name"), str):
            raise GraphError(f"{where}: attributes[{i}].name: is required")
        attrs[str(a["name"])] = str(a.get("value", ""))
    policy = attrs.get("topologyManagerPolicy", "")
    scope = attrs.get("topologyManagerScope", "")
    if not policy:  # deprecated list form (v1alpha1)
        pols = [str(p) for p in obj.get("topologyPolicies") or []]
        for word, pol in (("SingleNUMANode", "single-numa-node"), ("Restricted", "restricted"),
                          ("BestEffort", "best-effort")):
            if any(p.startswith(word) for p in pols):
                policy = pol
                scope = scope or ("pod" if any(p.endswith("PodLevel") for p in pols) else "container")
                break
    zones_in = obj.get("zones")
    if not isinstance(zones_in, list):
        raise GraphError(f"{where}: zones: must be a list")
    zones: list[Zone] = []
    seen: set[int] = set()
    for i, z in enumerate(zones_in):
        zw = f"{where}: zones[{i}]"
        if not isinstance(z, Mapping):
            raise GraphError(f"{zw}: must be a mapping")
        if z.get("type") != "Node":
            continue  # sockets/cores zones some exporters add: only NUMA zones place things
        zname = z.get("name")
        numa = _numa_id(zname)
        if numa is None:
            raise GraphError(f"{zw}.name: expected node-<N> for a zone of type Node, got {zname!r}")
        if numa in seen:
            raise GraphError(f"{zw}.name: duplicate zone {zname}")
        seen.add(numa)
        cores = gpus = mem = 0
        extra: dict[str, int] = {}
        for j, r in enumerate(z.get("resources") or []):
            rw = f"{zw}.resources[{j}]"
            if not isinstance(r, Mapping) or not isinstance(r.get("name"), str):
                raise GraphError(f"{rw}.name: is required")
            rname = str(r["name"])
            q = r.get("allocatable", r.get("capacity", 0))
            if rname == "cpu":
                cores = _whole(q, f"{rw}.allocatable")
            elif rname == "memory":
                mem = _whole(q, f"{rw}.allocatable", MIB)
            elif rname in GPU_RESOURCES:
                gpus += _whole(q, f"{rw}.allocatable")
            elif "/" in rname and not rname.startswith("hugepages-"):
                t = extended_type(rname)
                if t in _CORE_TYPES:
                    continue
                extra[t] = extra.get(t, 0) + _whole(q, f"{rw}.allocatable")
        cost: dict[int, int] = {}
        for j, c in enumerate(z.get("costs") or []):
            m = _numa_id(c.get("name") if isinstance(c, Mapping) else None)
            val = c.get("value") if isinstance(c, Mapping) else None
            if m is None or isinstance(val, bool) or not isinstance(val, int):
                raise GraphError(f"{zw}.costs[{j}]: expected {{name: node-<N>, value: <int>}}")
            cost[m] = val
        zones.append(Zone(numa, cores, gpus, mem, extra, cost))
    zones.sort(key=lambda z: z.numa)
    return NodeTopology(name, tuple(zones), policy or "none", scope or "container")


def _numa_id(name: Any) -> int | None:
    if not isinstance(name, str) or not name.startswith("node-"):
        return None
    rest = name[5:]
    return int(rest) if rest.isdigit() else None


def scale_to_fit(values: list[int], limit: int) -> list[int]:
    """Scale ``values`` down to sum to ``limit`` (floor; remainder to the largest first)."""
    total = sum(values)
    if total <= limit or total <= 0:
        return list(values)
    out = [v * limit // total for v in values]
    rest = limit - sum(out)
    for i in sorted(range(len(values)), key=lambda i: (-values[i], i)):
        if rest <= 0:
            break
        out[i] += 1
        rest -= 1
    return out


def reconcile(topo: NodeTopology, allocatable: Mapping[str, Any]) -> tuple[NodeTopology, list[str]]:
    """Make ``topo`` agree with the Node's ``status.allocatable``: the smaller wins. Returns
    the adjusted topology and one message per disagreement (empty when they agree)."""
    where = f"node {topo.node}: status.allocatable"
    node = {
        # whole cores of the millicores, as from_k8s_nodes counts them
        "core": _whole(allocatable.get("cpu", 0), f"{where}.cpu"),
        "memory": _whole(allocatable.get("memory", 0), f"{where}.memory", MIB),
        "gpu": sum(_whole(allocatable.get(r, 0), f"{where}.{r}") for r in GPU_RESOURCES),
    }
    mine = topo.totals()
    unit = {"core": "cores", "gpu": "GPUs", "memory": "MiB memory"}
    label = {"core": "cpu", "gpu": "gpu", "memory": "memory"}
    notes: list[str] = []
    cols = {"core": [z.cores for z in topo.zones], "gpu": [z.gpus for z in topo.zones],
            "memory": [z.memory for z in topo.zones]}
    for t in ("core", "gpu", "memory"):
        if mine[t] > node[t]:
            cols[t] = scale_to_fit(cols[t], node[t])
            notes.append(f"NodeResourceTopology {topo.node} places {mine[t]} {unit[t]} but the Node's "
                         f"allocatable {label[t]} is {node[t]}: using {node[t]}")
        elif mine[t] < node[t]:
            notes.append(f"NodeResourceTopology {topo.node} places {mine[t]} {unit[t]} but the Node's "
                         f"allocatable {label[t]} is {node[t]}: using {mine[t]} (what no zone holds "
                         "cannot be placed)")
    zones = tuple(
        Zone(z.numa, cols["core"][i], cols["gpu"][i], cols["memory"][i], z.extra, z.cost)
        for i, z in enumerate(topo.zones)
    )
    return NodeTopology(topo.node, zones, topo.policy, topo.scope), notes


def apply_topology(g: ResourceGraph, node: Vertex, topo: NodeTopology) -> None:
    """Replace the children of ``node`` (a flat node built by ``from_k8s_nodes``) with the
    socket subtree of ``topo``. Node-level extended pools no zone lists go to the first
    socket. A topology without zones leaves the node as it is."""
    if not topo.zones:
        return
    zone_types = {t for z in topo.zones for t in z.extra}
    leftovers: list[tuple[str, int]] = []
    for c in list(node.children):
        if c.type not in ("core", "gpu", "memory") and c.type not in zone_types:
            leftovers.append((c.type, c.size))
        g.remove_subtree(c)
    rank = node.rank
    counts: dict[str, int] = {}

    def add(vtype: str, parent: Vertex, size: int = 1, unit: str = "",
            props: dict[str, str] | None = None, vid: int | None = None) -> Vertex:
        if vid is None:
            vid = counts.get(vtype, 0)
            counts[vtype] = vid + 1
        name = f"{vertex_basename(vtype)}{vid}"
        v = Vertex(vtype, name=name, id=vid, rank=rank, size=size, unit=unit, properties=props,
                   path=f"{parent.path}/{name}")
        return g.add_vertex(v, parent)

    for i, z in enumerate(topo.zones):
        sock = add("socket", node, props={"numa": str(z.numa)}, vid=z.numa)
        for _ in range(max(0, z.cores)):
            add("core", sock)
        for _ in range(max(0, z.gpus)):
            add("gpu", sock)
        if z.memory > 0:
            add("memory", sock, size=z.memory, unit="MiB")
        for t, n in sorted(z.extra.items()):
            if n > 0:
                add(t, sock, size=n)
        if i == 0:
            for t, n in leftovers:
                add(t, sock, size=n)


def node_graph(node: Mapping[str, Any], topo: NodeTopology | None, *, rack_label: str = "fluxnetes.io/rack",
               cluster_name: str = "k8scluster0") -> tuple[ResourceGraph, list[str]]:
    """A graph holding one Node (with its zone/rack ancestors, as ``from_k8s_nodes([node])``
    builds it), topology-aware when ``topo`` is given. Returns it and the disagreements
    between the topology and the Node (see :func:`reconcile`)."""
    bare = _without_placed(node) if topo is not None and topo.zones else dict(node)
    g = from_k8s_nodes([bare], rack_label=rack_label, cluster_name=cluster_name)
    notes: list[str] = []
    if topo is not None:
        v = g.by_type["node"][0]
        alloc = (node.get("status") or {}).get("allocatable") or {}
        fitted, notes = reconcile(topo, alloc)
        apply_topology(g, v, fitted)
    return g, notes


def _without_placed(node: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of the Node whose allocatable lacks what the sockets place (cpu, memory, GPUs)."""
    status = dict(node.get("status") or {})
    alloc = status.get("allocatable") or {}
    status["allocatable"] = {k: v for k, v in alloc.items() if k not in ("cpu", "memory", *GPU_RESOURCES)}
    return {**node, "status": status}


def from_k8s_nodes_topology(nodes: list[dict[str, Any]], topologies: Mapping[str, NodeTopology], *,
                            rack_label: str = "fluxnetes.io/rack",
                            cluster_name: str = "k8scluster0") -> tuple[ResourceGraph, dict[str, list[str]]]:
    """``from_k8s_nodes`` with a socket subtree for every node that has a topology (by node
    name); the others stay flat. Returns the graph and, per node, the disagreements."""
    # nodes with a topology are built without their cpu/memory/GPUs (the sockets get them):
    # removing thousands of flat leaves afterwards would cost more than the whole build
    by_name = {str((n.get("metadata") or {}).get("name", "")): n for n in nodes if isinstance(n, Mapping)}
    bare: list[dict[str, Any]] = []
    for n in nodes:
        topo = topologies.get(str((n.get("metadata") or {}).get("name", ""))) if isinstance(n, Mapping) else None
        bare.append(_without_placed(n) if topo is not None and topo.zones else n)
    g = from_k8s_nodes(bare, rack_label=rack_label, cluster_name=cluster_name)
    notes: dict[str, list[str]] = {}
    for v in list(g.by_type.get("node", [])):
        topo = topologies.get(v.name)
        if topo is None or v.name not in by_name:
            continue
        alloc = (by_name[v.name].get("status") or {}).get("allocatable") or {}
        fitted, why = reconcile(topo, alloc)
        apply_topology(g, v, fitted)
        if why:
            notes[v.name] = why
    return g, notes
