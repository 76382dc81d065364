"""Graph builders: a compact cluster description (YAML) and Kubernetes Node objects.

Cluster description (all keys optional except some nodes)::

    cluster: mycluster          # root name (type cluster), default "cluster0"
    node:                       # default node shape, overridable per rack / per node
      sockets: 2                # 0 = cores/gpus/memory directly under the node
      cores: 16                 # per socket (or per node when sockets == 0)
      gpus: 1                   # per socket (or per node)
      memory: 64                # pool size per socket (or per node); 0 = none
      memory_unit: GB
      properties: {ssd: ""}
    zones:                      # optional level (type zone) ...
      - name: zone-a
        racks:                  # ... and/or racks (type rack) ...
          - name: rack0
            nodes: 4            # a count, or a list of node shapes {name?, count?, ...}
    # without zones: `racks: [...]`; without racks: `nodes: 4` or a list.

Numbering follows Fluxion's generators: nodes are numbered across the cluster (node0,
node1, ...; id = rank = that number); cores, gpus and memory pools are numbered per node
(core0..coreN-1 across its sockets); uniq_ids follow depth-first order.

Kubernetes Nodes (plain dicts as the API returns them): cluster -> zone (label
``topology.kubernetes.io/zone``) -> rack (label ``rack_label``) -> node -> cores, gpus,
memory pool, extended-resource pools. Zone and rack levels exist only when some node has
the label (others go under ``unknown``). Mapping:

* cores: ``floor(allocatable cpu millicores / 1000)`` core vertices (whole cores; a pod's cpu
  request is rounded up to whole cores by ``jobspec_from_pods``, so 250m pods each take one);
* memory: one ``memory`` pool vertex, size = allocatable memory in MiB (floor), unit "MiB";
* ``nvidia.com/gpu``: that many ``gpu`` vertices;
* other extended resources (name with a '/', not hugepages-/ephemeral-storage): one pool
  vertex typed ``extended_type(name)`` (the full name, domain included; its vertex is named
  ``vertex_basename`` of it: ``example.com_fpga0``) with size = the count;
* node vertex: name = Kubernetes node name, id = rank = position in the (name-sorted) list,
  properties = the node labels; status down when ``spec.unschedulable`` or the Ready
  condition is not "True".

Kubernetes graphs set ``graph.meta["split_pools"] = True``: pools are shared by amount
(several pods take MiB from one node's memory pool) - see fluxnetes/match/README.md.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from decimal import Decimal, InvalidOperation
from typing import Any

from fluxnetes.graph.model import DOWN, UP, GraphError, ResourceGraph, Vertex, vertex_basename
from fluxnetes.jobspec.pods import extended_type

ZONE_LABEL = "topology.kubernetes.io/zone"
DEFAULT_RACK_LABEL = "fluxnetes.io/rack"
MIB = 1024 * 1024

_NODE_KEYS = {"sockets", "cores", "gpus", "memory", "memory_unit", "properties", "name", "count",
              "status"}


class _Builder:
    def __init__(self) -> None:
        self.g = ResourceGraph()
        self.uniq = 0

    def add(self, vtype: str, parent: Vertex | None, *, name: str | None = None,
            basename: str | None = None, id: int = 0, rank: int = -1, size: int = 1,
            unit: str = "", properties: dict[str, str] | None = None, status: int = UP) -> Vertex:
        base = basename if basename is not None else vertex_basename(vtype)
        nm = name if name is not None else f"{base}{id}"
        path = (parent.path if parent else "") + "/" + nm
        v = Vertex(vtype, basename=base, name=nm, id=id, uniq_id=self.uniq, rank=rank, size=size,
                   unit=unit, properties=properties, path=path, status=status)
        self.uniq += 1
        self.g.add_vertex(v, parent)
        return v


def _int(d: Mapping[str, Any], key: str, path: str, default: int) -> int:
    val = d.get(key, default)
    if isinstance(val, bool) or not isinstance(val, int) or val < 0:
        raise GraphError(f"{path}.{key}: must be an integer >= 0")
    return val


def from_description(desc: Mapping[str, Any]) -> ResourceGraph:
    if not isinstance(desc, Mapping):
        raise GraphError("description: must be a mapping")
    for k in desc:
        if k not in ("cluster", "node", "zones", "racks", "nodes"):
            raise GraphError(f"description.{k}: unknown key (allowed: cluster, node, zones, racks, nodes)")
    b = _Builder()
    cname = desc.get("cluster", "cluster0")
    if not isinstance(cname, str) or not cname or "/" in cname:
        raise GraphError("description.cluster: must be a name without '/'")
    m = re.search(r"(\d+)$", cname)
    root = b.add("cluster", None, name=cname, id=int(m.group(1)) if m else 0)
    default = dict(desc.get("node") or {})
    _check_node_shape(default, "description.node")
    counter = [0]

    def add_nodes(parent: Vertex, spec: Any, path: str, shape: dict[str, Any]) -> None:
        if isinstance(spec, bool) or spec is None:
            raise GraphError(f"{path}: must be a node count or a list of node shapes")
        if isinstance(spec, int):
            if spec < 0:
                raise GraphError(f"{path}: must be >= 0")
            items: list[dict[str, Any]] = [{"count": spec}]
        elif isinstance(spec, list):
            items = []
            for i, it in enumerate(spec):
                if not isinstance(it, Mapping):
                    raise GraphError(f"{path}[{i}]: must be a mapping (node shape)")
                _check_node_shape(it, f"{path}[{i}]")
                items.append(dict(it))
        else:
            raise GraphError(f"{path}: must be a node count or a list of node shapes")
        for i, it in enumerate(items):
            merged = {**shape, **it}
            n = _int(merged, "count", f"{path}[{i}]", 1)
            for _ in range(n):
                _add_node(b, parent, merged, counter, f"{path}[{i}]", explicit_name=n == 1 and "name" in it)

    def add_racks(parent: Vertex, racks: Any, path: str, shape: dict[str, Any]) -> None:
        if not isinstance(racks, list):
            raise GraphError(f"{path}: must be a list of racks")
        for i, r in enumerate(racks):
            if not isinstance(r, Mapping):
                raise GraphError(f"{path}[{i}]: must be a mapping")
            for k in r:
                if k not in ("name", "nodes", "node"):
                    raise GraphError(f"{path}[{i}].{k}: unknown key (allowed: name, nodes, node)")
            rshape = {**shape, **(r.get("node") or {})}
            _check_node_shape(rshape, f"{path}[{i}].node")
            rname = r.get("name", f"rack{len(b.g.by_type.get('rack', []))}")
            rm = re.search(r"(\d+)$", str(rname))
            rack = b.add("rack", parent, name=str(rname), basename="rack",
                         id=int(rm.group(1)) if rm else len(b.g.by_type.get("rack", [])))
            add_nodes(rack, r.get("nodes", 0), f"{path}[{i}].nodes", rshape)

    if "zones" in desc:
        zones = desc["zones"]
        if not isinstance(zones, list):
            raise GraphError("description.zones: must be a list")
        for i, z in enumerate(zones):
            if not isinstance(z, Mapping):
                raise GraphError(f"description.zones[{i}]: must be a mapping")
            zname = str(z.get("name", f"zone{i}"))
            zone = b.add("zone", root, name=zname, basename="zone", id=i)
            zshape = {**default, **(z.get("node") or {})}
            if "racks" in z:
                add_racks(zone, z["racks"], f"description.zones[{i}].racks", zshape)
            if "nodes" in z:
                add_nodes(zone, z["nodes"], f"description.zones[{i}].nodes", zshape)
    if "racks" in desc:
        add_racks(root, desc["racks"], "description.racks", default)
    if "nodes" in desc:
        add_nodes(root, desc["nodes"], "description.nodes", default)
    if not b.g.by_type.get("node"):
        raise GraphError("description: no nodes (give nodes, racks or zones)")
    return b.g


def _check_node_shape(shape: Mapping[str, Any], path: str) -> None:
    for k in shape:
        if k not in _NODE_KEYS:
            raise GraphError(f"{path}.{k}: unknown key (allowed: {', '.join(sorted(_NODE_KEYS))})")
    if "properties" in shape and shape["properties"] is not None:
        props = shape["properties"]
        if not isinstance(props, Mapping):
            raise GraphError(f"{path}.properties: must be a mapping of strings")


def _add_node(b: _Builder, parent: Vertex, shape: dict[str, Any], counter: list[int], path: str,
              explicit_name: bool) -> None:
    n = counter[0]
    counter[0] += 1
    sockets = _int(shape, "sockets", path, 0)
    cores = _int(shape, "cores", path, 1)
    gpus = _int(shape, "gpus", path, 0)
    memory = _int(shape, "memory", path, 0)
    unit = str(shape.get("memory_unit", "GB"))
    props = {str(k): "" if v is None else str(v) for k, v in (shape.get("properties") or {}).items()}
    status = DOWN if shape.get("status") == "down" else UP
    name = str(shape["name"]) if explicit_name else f"node{n}"
    node = b.add("node", parent, name=name, basename="node", id=n, rank=n, properties=props or None,
                 status=status)
    counts = {"core": 0, "gpu": 0, "memory": 0}

    def fill(host: Vertex) -> None:
        for _ in range(cores):
            b.add("core", host, id=counts["core"], rank=n)
            counts["core"] += 1
        for _ in range(gpus):
            b.add("gpu", host, id=counts["gpu"], rank=n)
            counts["gpu"] += 1
        if memory:
            b.add("memory", host, id=counts["memory"], rank=n, size=memory, unit=unit)
            counts["memory"] += 1

    if sockets:
        for s in range(sockets):
            sock = b.add("socket", node, id=s, rank=n)
            fill(sock)
    else:
        fill(node)


# ----------------------------------------------------------------------------- Kubernetes

_SUFFIX: dict[str, int | Decimal] = {
    "Ki": 1024, "Mi": 1024**2, "Gi": 1024**3, "Ti": 1024**4, "Pi": 1024**5, "Ei": 1024**6,
    "n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "": 1,
    "k": 1000, "M": 1000**2, "G": 1000**3, "T": 1000**4, "P": 1000**5, "E": 1000**6,
}
_QTY = re.compile(r"^([+-]?[0-9.]+(?:[eE][+-]?\d+)?)([a-zA-Z]*)$")


def parse_quantity(q: Any, path: str = "quantity") -> Decimal:
    """Kubernetes resource.Quantity ("3500m", "16Gi", "1e9", 4) -> Decimal in base units."""
    if isinstance(q, bool):
        raise GraphError(f"{path}: not a quantity: {q!r}")
    if isinstance(q, int | float):
        return Decimal(str(q))
    if not isinstance(q, str):
        raise GraphError(f"{path}: not a quantity: {q!r}")
    m = _QTY.match(q.strip())
    if not m or m.group(2) not in _SUFFIX:
        raise GraphError(f"{path}: not a Kubernetes quantity: {q!r}")
    try:
        return Decimal(m.group(1)) * Decimal(_SUFFIX[m.group(2)])
    except InvalidOperation:
        raise GraphError(f"{path}: not a Kubernetes quantity: {q!r}") from None


def node_is_down(node: Mapping[str, Any]) -> bool:
    spec = node.get("spec") or {}
    if spec.get("unschedulable"):
        return True
    conds = (node.get("status") or {}).get("conditions") or []
    for c in conds:
        if c.get("type") == "Ready":
            return str(c.get("status")) != "True"
    return True  # no Ready condition reported: not ready


def from_k8s_nodes(nodes: list[dict[str, Any]], rack_label: str = DEFAULT_RACK_LABEL,
                   cluster_name: str = "k8scluster0") -> ResourceGraph:
    if not isinstance(nodes, list):
        raise GraphError("nodes: must be a list of Node objects")
    parsed: list[tuple[str, dict[str, str], dict[str, Any], bool]] = []
    seen: set[str] = set()
    for i, n in enumerate(nodes):
        if not isinstance(n, Mapping):
            raise GraphError(f"nodes[{i}]: must be a mapping (a Node object)")
        md = n.get("metadata") or {}
        name = md.get("name")
        if not isinstance(name, str) or not name:
            raise GraphError(f"nodes[{i}].metadata.name: is required")
        if "/" in name:
            raise GraphError(f"nodes[{i}].metadata.name: must not contain '/'")
        if name in seen:
            raise GraphError(f"nodes[{i}].metadata.name: duplicate node name '{name}'")
        seen.add(name)
        labels = {str(k): str(v) for k, v in (md.get("labels") or {}).items()}
        alloc = (n.get("status") or {}).get("allocatable") or {}
        parsed.append((name, labels, dict(alloc), node_is_down(n)))
    parsed.sort(key=lambda t: t[0])
    use_zone = any(ZONE_LABEL in lab for _, lab, _, _ in parsed)
    use_rack = any(rack_label in lab for _, lab, _, _ in parsed)
    b = _Builder()
    root = b.add("cluster", None, name=cluster_name, basename="k8scluster", id=0)
    zones: dict[str, Vertex] = {}
    racks: dict[tuple[str, str], Vertex] = {}
    for rank, (name, labels, alloc, down) in enumerate(parsed):
        parent = root
        zname = ""
        if use_zone:
            zname = _safe(labels.get(ZONE_LABEL, "unknown"))
            if zname not in zones:
                zones[zname] = b.add("zone", root, name=zname, basename="zone", id=len(zones))
            parent = zones[zname]
        if use_rack:
            rname = _safe(labels.get(rack_label, "unknown"))
            key = (zname, rname)
            if key not in racks:
                racks[key] = b.add("rack", parent, name=rname, basename="rack", id=len(racks))
            parent = racks[key]
        where = f"node {name}: status.allocatable"
        cpu = parse_quantity(alloc.get("cpu", 0), f"{where}.cpu")
        millis = int(cpu * 1000)
        mem = parse_quantity(alloc.get("memory", 0), f"{where}.memory")
        gpus = int(parse_quantity(alloc.get("nvidia.com/gpu", 0), f"{where}.nvidia.com/gpu"))
        node = b.add("node", parent, name=name, basename=name, id=rank, rank=rank,
                     properties=labels or None, status=DOWN if down else UP)
        for c in range(max(0, millis // 1000)):
            b.add("core", node, id=c, rank=rank)
        for gi in range(max(0, gpus)):
            b.add("gpu", node, id=gi, rank=rank)
        mib = int(mem) // MIB
        if mib > 0:
            b.add("memory", node, id=0, rank=rank, size=mib, unit="MiB")
        for rname_, qty in sorted(alloc.items()):
            if "/" not in rname_ or rname_ == "nvidia.com/gpu" or rname_.startswith("hugepages-"):
                continue
            cnt = int(parse_quantity(qty, f"{where}.{rname_}"))
            if cnt > 0:
                t = extended_type(rname_)
                b.add(t, node, id=0, rank=rank, size=cnt)
    b.g.meta["split_pools"] = True
    b.g.meta["rack_label"] = rack_label
    return b.g


def _safe(s: str) -> str:
    return s.replace("/", "_") or "unknown"
