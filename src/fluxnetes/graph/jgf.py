"""JSON Graph Format reader and writer, following Fluxion's JGF reader (fluxion-spec §1.4).

Reader rules: ``graph.nodes`` and ``graph.edges`` are required; each vertex needs a string
``id`` and ``metadata`` with ``type`` and ``paths`` (containment); defaults as Fluxion's
``apply_defaults`` (basename = type, id = uniq_id or the digits of a node name, name =
basename + id, size 1, rank -1, status up). Edges default to the containment subsystem;
edges of other subsystems are kept verbatim. The Kubernetes projects write every
containment edge twice (parent->child and child->parent, §2.9): the back edge (target path is
a prefix of the source path) is dropped. Errors name the vertex or edge and the rule.

Writer: the full graph with every field explicit (as Fluxion's generators write it), which
Fluxion's reader accepts and which reads back to an identical graph.
"""

from __future__ import annotations

import json
import re
from typing import Any, NoReturn

from fluxnetes.graph.model import (
    DOWN,
    NO_CHILDREN,
    UP,
    GraphError,
    ResourceGraph,
    Vertex,
    gc_paused,
)

_KNOWN_META = frozenset(
    {"type", "basename", "name", "id", "uniq_id", "rank", "status", "exclusive", "unit", "size",
     "paths", "properties"}
)
_DIGITS = re.compile(r"(\d+)$")


def parse_json(text: str | bytes) -> Any:
    """JSON text -> objects, with the cyclic GC paused (the standard library parser: its
    peak memory on a 100 MB JGF is ~230 MB lower than orjson's, at a similar speed once the
    collector is out of the way)."""
    with gc_paused():
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise GraphError(f"JGF is not valid JSON: {exc}") from None
        except UnicodeDecodeError as exc:
            raise GraphError(f"JGF is not valid UTF-8: {exc}") from None


_CONTAINMENT_EDGE = {"subsystem": "containment"}  # shared by the parsed containment edges


def parse_jgf_compact(text: str | bytes) -> Any:
    """JSON text -> objects like :func:`parse_json`, but each well-formed JGF vertex object
    becomes its :class:`Vertex` and each plain containment edge a ``(source, target)`` tuple
    as soon as the parser has read it, so the document's per-vertex dicts never all exist at
    once (they were most of the peak memory of loading a big graph). Anything else (other
    subsystems, extra keys, malformed vertices) stays as parsed and is read (and reported)
    by :func:`read_jgf` as before. For new graphs only (``read_jgf`` without ``graph``)."""
    strs: dict[str, str] = {}

    def hook(d: dict[str, Any]) -> Any:
        md = d.get("metadata")
        if md is None:
            if len(d) == 1 and d.get("subsystem") == "containment":
                return _CONTAINMENT_EDGE
            return d
        if "source" in d:
            if md is _CONTAINMENT_EDGE and len(d) == 3:
                src = d.get("source")
                tgt = d.get("target")
                if type(src) is str and type(tgt) is str:
                    return (src, tgt)
            return d
        if len(d) == 2 and "id" in d:
            return _fast_vertex(d, strs) or d
        return d

    with gc_paused():
        try:
            return json.loads(text, object_hook=hook)
        except json.JSONDecodeError as exc:
            raise GraphError(f"JGF is not valid JSON: {exc}") from None
        except UnicodeDecodeError as exc:
            raise GraphError(f"JGF is not valid UTF-8: {exc}") from None


def _int_field(meta: dict[str, Any], key: str, vid: str) -> int | None:
    if key not in meta:
        return None
    val = meta[key]
    if isinstance(val, bool) or not isinstance(val, int):
        raise GraphError(f"vertex {vid}: metadata.{key} must be an integer")
    return val


def _str_field(meta: dict[str, Any], key: str, vid: str) -> str | None:
    if key not in meta:
        return None
    val = meta[key]
    if not isinstance(val, str):
        raise GraphError(f"vertex {vid}: metadata.{key} must be a string")
    return val


def _vertex_from_jgf(node: Any, i: int) -> Vertex:
    if not isinstance(node, dict):
        raise GraphError(f"graph.nodes[{i}]: must be an object")
    vid = node.get("id")
    if not isinstance(vid, str):
        raise GraphError(f"graph.nodes[{i}]: 'id' must be a string")
    meta = node.get("metadata")
    if not isinstance(meta, dict):
        raise GraphError(f"vertex {vid}: 'metadata' object is required")
    vtype = meta.get("type")
    if not isinstance(vtype, str) or not vtype:
        raise GraphError(f"vertex {vid}: metadata.type must be a non-empty string")
    paths = meta.get("paths")
    if not isinstance(paths, dict) or not paths:
        raise GraphError(f"vertex {vid}: metadata.paths is required (e.g. {{\"containment\": \"/cluster0/...\"}})")
    for k, p in paths.items():
        if not isinstance(p, str) or not p.startswith("/"):
            raise GraphError(f"vertex {vid}: metadata.paths.{k} must be a string starting with '/'")
    if "containment" not in paths:
        raise GraphError(f"vertex {vid}: metadata.paths.containment is required")
    uniq = _int_field(meta, "uniq_id", vid)
    if uniq is None:
        try:
            uniq = int(vid)
        except ValueError:
            raise GraphError(
                f"vertex {vid}: metadata.uniq_id is missing and the JGF id is not an integer"
            ) from None
    basename = _str_field(meta, "basename", vid)
    if basename is None:
        basename = vtype
    name = _str_field(meta, "name", vid)
    lid = _int_field(meta, "id", vid)
    if lid is None:
        lid = uniq
        if vtype == "node" and name is not None:
            m = _DIGITS.search(name)
            if m:
                lid = int(m.group(1))
    rank = _int_field(meta, "rank", vid)
    size = _int_field(meta, "size", vid)
    if size is not None and size < 0:
        raise GraphError(f"vertex {vid}: metadata.size must be >= 0")
    status = _int_field(meta, "status", vid)
    if status is not None and status not in (UP, DOWN):
        raise GraphError(f"vertex {vid}: metadata.status must be 0 (up) or 1 (down)")
    unit = _str_field(meta, "unit", vid)
    if "exclusive" in meta and not isinstance(meta["exclusive"], bool):
        raise GraphError(f"vertex {vid}: metadata.exclusive must be a boolean")
    props = meta.get("properties")
    if props is not None and (not isinstance(props, dict) or not all(isinstance(x, str) for x in props.values())):
            raise GraphError(f"vertex {vid}: metadata.properties must map strings to strings")
    v = Vertex(
        vtype,
        basename=basename,
        name=name,
        id=lid,
        uniq_id=uniq,
        rank=-1 if rank is None else rank,
        size=1 if size is None else size,
        unit=unit or "",
        properties=dict(props) if props else None,
        paths=dict(paths),
        status=UP if status is None else status,
    )
    v.jgf_id = vid
    extra = {k: val for k, val in meta.items() if k not in _KNOWN_META}
    if extra:
        v.extra = extra
    return v


def _fast_vertex(node: Any, strs: dict[str, str] | None = None) -> Vertex | None:
    """The common, well-formed case without per-field error reporting (None: use the
    validating path, which names what is wrong). ``strs``: equal type, basename, unit and
    name strings are shared through it (the JSON parser makes a new string for every
    occurrence: "core" and "core7" thousands of times)."""
    try:
        vid = node["id"]
        md = node["metadata"]
        vtype = md["type"]
        paths = md["paths"]
        path = paths["containment"]
        uniq = md["uniq_id"]
        lid = md["id"]
    except (KeyError, TypeError):
        return None
    if (type(vid) is not str or type(vtype) is not str or not vtype or type(path) is not str
            or type(uniq) is not int or type(lid) is not int or len(paths) != 1
            or not path.startswith("/")):
        return None
    for k in md:
        if k not in _KNOWN_META:
            return None
    basename = md.get("basename", vtype)
    name = md.get("name")
    rank = md.get("rank", -1)
    size = md.get("size", 1)
    unit = md.get("unit", "")
    status = md.get("status", UP)
    props = md.get("properties")
    excl = md.get("exclusive", False)
    if (type(basename) is not str or (name is not None and type(name) is not str) or type(rank) is not int
            or type(size) is not int or size < 0 or type(unit) is not str or type(excl) is not bool
            or (status != UP and status != DOWN) or type(status) is not int):
        return None
    if props is not None:
        if type(props) is not dict:
            return None
        for pv in props.values():
            if type(pv) is not str:
                return None
    if name is None:
        name = f"{basename}{lid}"
    if strs is not None:
        vtype = strs.setdefault(vtype, vtype)
        basename = strs.setdefault(basename, basename)
        unit = strs.setdefault(unit, unit)
        name = strs.setdefault(name, name)
    v = Vertex.__new__(Vertex)
    v.type = vtype
    v.basename = basename
    v.uniq_id = uniq
    v.id = lid
    v.name = name
    v.rank = rank
    v.size = size
    v.unit = unit
    v.properties = dict(props) if props else None
    v._paths = None  # (only the containment path: Vertex.paths makes the dict on demand)
    v.path = path
    v.status = status
    v.parent = None
    v.children = NO_CHILDREN
    v.idx = -1
    v.jgf_id = vid
    v.extra = None
    return v


def read_jgf(obj: dict[str, Any] | str | bytes, graph: ResourceGraph | None = None, *,
             consume: bool = False) -> ResourceGraph:
    """Load JGF (mapping or text). With ``graph`` given, attach ("grow"): vertices whose path
    already exists are matched, new ones are added under their parents. ``consume``: the
    caller hands the parsed document over; its vertex list is emptied while reading (lower
    peak memory on big graphs)."""
    with gc_paused():
        return _read_jgf(obj, graph, consume)


def _read_jgf(obj: dict[str, Any] | str | bytes, graph: ResourceGraph | None, consume: bool = False) -> ResourceGraph:
    if isinstance(obj, str | bytes):
        obj = parse_json(obj) if graph is not None else parse_jgf_compact(obj)
        consume = True
    if not isinstance(obj, dict) or not isinstance(obj.get("graph"), dict):
        raise GraphError("JGF: top-level object with a 'graph' object is required")
    g = obj["graph"]
    nodes = g.get("nodes")
    edges = g.get("edges")
    if not isinstance(nodes, list):
        raise GraphError("JGF: graph.nodes must be a list")
    if not isinstance(edges, list):
        raise GraphError("JGF: graph.edges must be a list")

    attach = graph is not None
    out = graph if graph is not None else ResourceGraph()
    gmeta = g.get("metadata")
    if not attach and isinstance(gmeta, dict) and isinstance(gmeta.get("fluxnetes"), dict):
        out.meta.update(gmeta["fluxnetes"])
    by_id: dict[str, Vertex] = {}
    if not attach:
        return _read_new(out, nodes, edges, by_id, consume)
    new_ids: set[str] = set()
    for i, node in enumerate(nodes):
        v = _fast_vertex(node) or _vertex_from_jgf(node, i)
        if v.jgf_id in by_id:
            raise GraphError(f"vertex {v.jgf_id}: duplicate JGF id")
        existing = out.by_path.get(v.path)
        if existing is not None:
            by_id[v.jgf_id] = existing
        else:
            by_id[v.jgf_id] = v
            new_ids.add(v.jgf_id)

    parent_of: dict[str, Vertex] = {}
    children: dict[str, list[Vertex]] = {}
    seen_paths: dict[str, str] = {}
    for vid in new_ids:
        p = by_id[vid].path
        if p in seen_paths:
            raise GraphError(f"vertex {vid}: duplicate containment path {p} (also vertex {seen_paths[p]})")
        seen_paths[p] = vid
    for j, e in enumerate(edges):
        s, t = _edge_ends(j, e, by_id)
        emeta = e.get("metadata") or {}
        if not isinstance(emeta, dict):
            raise GraphError(f"edge {j} ({s} -> {t}): metadata must be an object")
        subsystem = emeta.get("subsystem", "containment")
        if subsystem != "containment":
            if attach and s not in new_ids and t not in new_ids:
                continue
            out.other_edges.append(e)
            continue
        src, tgt = by_id[s], by_id[t]
        if src.path.startswith(tgt.path + "/"):
            continue  # Kubernetes projects' back edge (child -> parent): drop
        if s not in new_ids and t not in new_ids:
            continue  # both exist already (attach): Fluxion adds no edge
        if not tgt.path.startswith(src.path + "/"):
            raise GraphError(
                f"edge {j} ({s} -> {t}): containment target {tgt.path} is not below source {src.path}"
            )
        if t not in new_ids:
            raise GraphError(f"edge {j} ({s} -> {t}): target {tgt.path} already has a parent")
        prev = parent_of.get(t)
        if prev is not None:
            if prev is src:
                continue  # duplicated edge
            raise GraphError(f"edge {j} ({s} -> {t}): vertex {t} has two parents ({prev.path}, {src.path})")
        parent_of[t] = src
        children.setdefault(s, []).append(tgt)

    # attach: new subtrees hang below existing vertices (by edge, or else by path)
    tops: list[tuple[Vertex, Vertex]] = []
    for vid in new_ids:
        v = by_id[vid]
        par = parent_of.get(vid)
        if par is None:
            parent_path = v.path.rsplit("/", 1)[0]
            par = out.by_path.get(parent_path)
            if par is None:
                raise GraphError(f"vertex {vid} ({v.path}): parent {parent_path or '/'} not found in graph")
            tops.append((v, par))
        elif par.jgf_id not in new_ids or by_id.get(par.jgf_id) is not par:
            tops.append((v, par))
    tops.sort(key=lambda t: t[0].uniq_id)
    for v, par in tops:
        _insert_tree(out, v, par, children, by_id)
    return out


def _below(child: str, parent: str) -> bool:
    """Is path ``child`` strictly below path ``parent``?"""
    n = len(parent)
    return len(child) > n and child[n] == "/" and child.startswith(parent)


def _read_new(out: ResourceGraph, nodes: list[Any], edges: list[Any], by_id: dict[str, Vertex],
              consume: bool) -> ResourceGraph:
    """Load a whole graph (no attach): the fast path for big core-level JGFs."""
    strs: dict[str, str] = {}
    for i, node in enumerate(nodes):
        # (parse_jgf_compact has made most vertices already)
        v = node if type(node) is Vertex else (_fast_vertex(node, strs) or _vertex_from_jgf(node, i))
        if v.jgf_id in by_id:
            raise GraphError(f"vertex {v.jgf_id}: duplicate JGF id")
        by_id[v.jgf_id] = v
        if consume:
            nodes[i] = None
    other = out.other_edges
    for j, e in enumerate(edges):
        if type(e) is tuple:  # a plain containment edge (parse_jgf_compact)
            s, t = e
            src = by_id.get(s)
            tgt = by_id.get(t)
            if src is None or tgt is None:
                _edge_error(j, {"source": s, "target": t, "metadata": dict(_CONTAINMENT_EDGE)}, by_id)
            emeta = None
        else:
            try:
                s = e["source"]
                t = e["target"]
                src = by_id[s]
                tgt = by_id[t]
            except (KeyError, TypeError):
                _edge_error(j, e, by_id)
            emeta = e.get("metadata")
        if emeta:
            if not isinstance(emeta, dict):
                raise GraphError(f"edge {j} ({s} -> {t}): metadata must be an object")
            if emeta.get("subsystem", "containment") != "containment":
                other.append(e)
                continue
        sp, tp = src.path, tgt.path
        if not _below(tp, sp):
            if _below(sp, tp):
                continue  # Kubernetes projects' back edge (child -> parent): drop
            raise GraphError(f"edge {j} ({s} -> {t}): containment target {tp} is not below source {sp}")
        prev = tgt.parent
        if prev is not None:
            if prev is src:
                continue  # duplicated edge
            raise GraphError(f"edge {j} ({s} -> {t}): vertex {t} has two parents ({prev.path}, {sp})")
        tgt.parent = src
        if src.children is NO_CHILDREN:
            src.children = [tgt]
        else:
            src.children.append(tgt)
        if consume:
            edges[j] = None
    roots = [v for v in by_id.values() if v.parent is None]
    true_roots = [v for v in roots if v.path.count("/") == 1]
    if len(true_roots) > 1:
        names = ", ".join(sorted(r.path for r in true_roots))
        raise GraphError(f"JGF: two containment roots ({names}); a graph has one root")
    for v in roots:
        if v.path.count("/") != 1:
            raise GraphError(f"vertex {v.jgf_id} ({v.path}): not connected to the root (no containment in-edge)")
    if not true_roots:
        raise GraphError("JGF: no containment root (a vertex whose path has one '/')")
    root = true_roots[0]
    out.root = root
    vertices = out.vertices
    by_type = out.by_type
    by_name = out.by_name
    by_path = out.by_path
    by_uniq = out.by_uniq
    stack = [root]
    while stack:
        v = stack.pop()
        if v.path in by_path:
            raise GraphError(f"vertex {v.jgf_id}: duplicate containment path {v.path}")
        if v.uniq_id in by_uniq:
            raise GraphError(f"vertex {v.jgf_id} ({v.path}): duplicate uniq_id {v.uniq_id}")
        v.idx = len(vertices)
        vertices.append(v)
        lst = by_type.get(v.type)
        if lst is None:
            by_type[v.type] = [v]
        else:
            lst.append(v)
        lst = by_name.get(v.name)
        if lst is None:
            by_name[v.name] = [v]
        else:
            lst.append(v)
        by_path[v.path] = v
        by_uniq[v.uniq_id] = v
        kids = v.children
        if kids:
            stack.extend(reversed(kids))
    if len(vertices) != len(by_id):
        raise GraphError("JGF: some vertices are not connected to the root")
    out.version += 1
    return out


def _edge_ends(j: int, e: Any, by_id: dict[str, Vertex]) -> tuple[str, str]:
    """The source and target ids of edge ``j``, both vertices of ``by_id``; else a GraphError."""
    if isinstance(e, dict):
        s, t = e.get("source"), e.get("target")
        if isinstance(s, str) and isinstance(t, str) and s in by_id and t in by_id:
            return s, t
    _edge_error(j, e, by_id)


def _edge_error(j: int, e: Any, by_id: dict[str, Vertex]) -> NoReturn:
    """Raise the GraphError naming what is wrong with edge ``j`` (one that is known bad)."""
    if not isinstance(e, dict):
        raise GraphError(f"graph.edges[{j}]: must be an object")
    s, t = e.get("source"), e.get("target")
    if not isinstance(s, str) or not isinstance(t, str):
        raise GraphError(f"edge {j} ({s!r} -> {t!r}): source and target must be vertex id strings")
    if s not in by_id:
        raise GraphError(f"edge {j} ({s} -> {t}): source '{s}' is not a vertex of this document")
    raise GraphError(f"edge {j} ({s} -> {t}): target '{t}' is not a vertex of this document")


def _insert_tree(
    out: ResourceGraph,
    top: Vertex,
    parent: Vertex | None,
    children: dict[str, list[Vertex]],
    by_id: dict[str, Vertex],
) -> None:
    stack: list[tuple[Vertex, Vertex | None]] = [(top, parent)]
    while stack:
        v, p = stack.pop()
        out.add_vertex(v, p)
        kids = children.get(v.jgf_id)
        if kids:
            for c in reversed(kids):
                stack.append((c, v))


def vertex_to_jgf(v: Vertex) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "type": v.type,
        "basename": v.basename,
        "name": v.name,
        "id": v.id,
        "uniq_id": v.uniq_id,
        "rank": v.rank,
        "exclusive": False,
        "unit": v.unit,
        "size": v.size,
        "paths": dict(v.paths),
    }
    if v.status != UP:
        meta["status"] = v.status
    if v.properties:
        meta["properties"] = dict(v.properties)
    if v.extra:
        meta.update(v.extra)
    return {"id": str(v.uniq_id), "metadata": meta}


def write_jgf(graph: ResourceGraph) -> dict[str, Any]:
    """The whole graph as JGF (vertex ids = uniq_id strings; edges in child order)."""
    nodes: list[dict[str, Any]] = []
    edges: list[dict[str, Any]] = []
    remap: dict[str, str] = {}
    for v in graph.walk():
        nodes.append(vertex_to_jgf(v))
        if v.jgf_id:
            remap[v.jgf_id] = str(v.uniq_id)
        if v.parent is not None:
            edges.append({"source": str(v.parent.uniq_id), "target": str(v.uniq_id),
                          "metadata": {"subsystem": "containment"}})
    for e in graph.other_edges:
        e2 = dict(e)
        e2["source"] = remap.get(e["source"], e["source"])
        e2["target"] = remap.get(e["target"], e["target"])
        edges.append(e2)
    out: dict[str, Any] = {"graph": {"directed": True, "nodes": nodes, "edges": edges}}
    if graph.meta:
        out["graph"]["metadata"] = {"fluxnetes": dict(graph.meta)}
    return out
