"""Match results and their serialisations (Fluxion JGF writer, RFC 20 R version 1)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

from fluxnetes.jobspec.constraints import encode_idset

if TYPE_CHECKING:
    from fluxnetes.match.jobmeta import JobEntry


class MatchStatus(enum.Enum):
    ALLOCATED = "ALLOCATED"
    RESERVED = "RESERVED"
    BUSY = "BUSY"  # cannot start now (or cannot be reserved), but fits this graph
    UNSATISFIABLE = "UNSATISFIABLE"  # can never fit this graph


class MatchError(Exception):
    """Bad use of the matcher (unknown job id, duplicate job id, bad placement...)."""


@dataclass
class NodeShare:
    """What a job holds (or should release / record) on one node."""

    name: str
    path: str = ""
    cores: int = 0
    gpus: int = 0
    memory: int = 0
    extra: dict[str, int] = field(default_factory=dict)

    def add(self, rtype: str, amount: int) -> None:
        """Count ``amount`` of a leaf resource of type ``rtype`` held on this node."""
        if rtype == "core":
            self.cores += amount
        elif rtype == "gpu":
            self.gpus += amount
        elif rtype == "memory":
            self.memory += amount
        else:
            self.extra[rtype] = self.extra.get(rtype, 0) + amount


class AllocVertex(NamedTuple):
    """One emitted vertex of an allocation (what Fluxion's writers print)."""

    uniq_id: int
    path: str
    type: str
    basename: str
    name: str
    id: int
    rank: int
    unit: str
    properties: dict[str, str] | None
    exclusive: bool
    size: int  # the allocated amount ("needs")
    parent_uniq: int  # -1 for the root


class MatchResult:
    """Answer of one match. ``vertices`` (emit order) and ``nodes`` are built on first use."""

    __slots__ = ("_core_shares", "_cores", "_emitted", "_nodes", "_vertices", "at", "duration", "jobid",
                 "podsets", "queue", "reason", "status")

    def __init__(self, status: MatchStatus, jobid: int, at: int = 0, duration: int = 0, reason: str = "",
                 nodes: list[NodeShare] | None = None, vertices: list[AllocVertex] | None = None,
                 queue: str = "", emitted: list[Any] | None = None,
                 podsets: dict[str, list[str]] | None = None) -> None:
        self.status = status
        self.jobid = jobid
        self.at = at
        self.duration = duration
        self.reason = reason
        self.queue = queue
        self._nodes = nodes
        self._vertices = vertices
        self._emitted = emitted  # engine Emitted records (vs, needs, excl), post-order
        self._core_shares: tuple[tuple[str, int], ...] | None = None
        self._cores: int | None = None
        # several pod sets (fluxnetes.match.gang): set label -> node of each of its slots
        self.podsets = podsets

    def __repr__(self) -> str:
        return (f"MatchResult(status={self.status.name}, jobid={self.jobid}, at={self.at}, "
                f"duration={self.duration}, reason={self.reason!r})")

    @property
    def vertices(self) -> list[AllocVertex]:
        if self._vertices is None:
            out: list[AllocVertex] = []
            for e in self._emitted or ():
                v = e.vs.v
                p = v.parent
                out.append(AllocVertex(v.uniq_id, v.path, v.type, v.basename, v.name, v.id, v.rank, v.unit,
                                       v.properties, e.excl, e.needs, p.uniq_id if p is not None else -1))
            self._vertices = out
        return self._vertices

    @property
    def nodes(self) -> list[NodeShare]:
        if self._nodes is None:
            self._nodes = node_shares(self.vertices) if self._emitted is None else _shares_from_emitted(self._emitted)
        return self._nodes

    @property
    def core_shares(self) -> tuple[tuple[str, int], ...]:
        """(node name, cores) per node of ``nodes``, built once (a queue asks it several
        times per job: its own counts, the core profile, the caller's record)."""
        if self._core_shares is None:
            self._core_shares = tuple((str(s.name), int(s.cores)) for s in self.nodes)
        return self._core_shares

    @property
    def cores_held(self) -> int:
        """Cores over all of ``core_shares`` (summed once: asked several times per job)."""
        if self._cores is None:
            self._cores = sum(cores for _name, cores in self.core_shares)
        return self._cores

    @property
    def ok(self) -> bool:
        return self.status in (MatchStatus.ALLOCATED, MatchStatus.RESERVED)

    @property
    def expiration(self) -> int:
        return self.at + self.duration

    def to_jgf(self) -> dict[str, Any]:
        return vertices_to_jgf(self.vertices)

    def to_rv1(self, *, with_scheduling: bool = True) -> dict[str, Any]:
        if self._emitted is not None and not with_scheduling:
            rows = [(e.vs.v.type, e.vs.v.id, e.vs.v.name, e.vs.v.rank, e.vs.v.properties) for e in self._emitted]
        else:
            rows = [(a.type, a.id, a.name, a.rank, a.properties) for a in self.vertices]
        out = rv1_execution(rows, self.at, self.at + self.duration, self.queue)
        if with_scheduling:
            out["scheduling"] = vertices_to_jgf(self.vertices)
            if "attributes" in out:
                out["attributes"] = out.pop("attributes")
        return out


def _shares_from_emitted(emitted: list[Any]) -> list[NodeShare]:
    nodes: dict[int, NodeShare] = {}
    order: list[tuple[int, int]] = []
    for e in emitted:
        v = e.vs.v
        if v.type == "node" and id(v) not in nodes:
            nodes[id(v)] = NodeShare(v.name, v.path)
            order.append((v.uniq_id, id(v)))
    if not nodes:
        return []
    for e in emitted:
        if not e.excl:
            continue
        v = e.vs.v
        t = v.type
        if t == "node" or t == "socket" or t == "numanode":
            continue
        p = v.parent
        while p is not None and id(p) not in nodes:
            p = p.parent
        if p is None:
            continue
        nodes[id(p)].add(t, e.needs)
    return [nodes[k] for _u, k in sorted(order)]


def node_shares(verts: list[AllocVertex]) -> list[NodeShare]:
    """Per node: exclusively held cores, gpus, memory and other leaf amounts."""
    nodes: dict[int, NodeShare] = {}
    parent: dict[int, int] = {}
    for a in verts:
        parent[a.uniq_id] = a.parent_uniq
        if a.type == "node":
            nodes[a.uniq_id] = NodeShare(a.name, a.path)
    if not nodes:
        return []
    for a in verts:
        if not a.exclusive or a.type in ("node", "socket", "numanode"):
            continue
        p = a.parent_uniq
        host = None
        while p >= 0:
            host = nodes.get(p)
            if host is not None:
                break
            p = parent.get(p, -1)
        if host is not None:
            host.add(a.type, a.size)
    return [nodes[k] for k in sorted(nodes)]


def vertices_to_jgf(vertices: list[AllocVertex]) -> dict[str, Any]:
    nodes: list[dict[str, Any]] = []
    edges: list[dict[str, Any]] = []
    emitted = {v.uniq_id for v in vertices}
    for v in vertices:
        meta: dict[str, Any] = {"type": v.type}
        if v.basename != v.type:
            meta["basename"] = v.basename
        if v.name != f"{v.basename}{v.id}":
            meta["name"] = v.name
        meta["id"] = v.id
        meta["rank"] = v.rank
        if v.properties:
            meta["properties"] = dict(v.properties)
        if v.unit:
            meta["unit"] = v.unit
        if v.exclusive:
            meta["exclusive"] = True
        if v.size != 1:
            meta["size"] = v.size
        meta["paths"] = {"containment": v.path}
        nodes.append({"id": str(v.uniq_id), "metadata": meta})
        if v.parent_uniq >= 0 and v.parent_uniq in emitted:
            edges.append({"source": str(v.parent_uniq), "target": str(v.uniq_id)})
    return {"graph": {"nodes": nodes, "edges": edges}}


def vertices_to_rv1(vertices: list[AllocVertex], start: int, end: int, queue: str = "",
                    *, with_scheduling: bool = True) -> dict[str, Any]:
    rows = [(a.type, a.id, a.name, a.rank, a.properties) for a in vertices]
    out = rv1_execution(rows, start, end, queue)
    if with_scheduling:
        out["scheduling"] = vertices_to_jgf(vertices)
        if "attributes" in out:
            out["attributes"] = out.pop("attributes")
    return out


def rv1_execution(rows: list[tuple[str, int, str, int, dict[str, str] | None]], start: int, end: int,
                  queue: str = "") -> dict[str, Any]:
    """RFC 20 R version 1 (without ``scheduling``) from emitted rows in post-order:
    per emitted node, the core/gpu ids emitted since the previous node (Fluxion's rlite)."""
    entries: list[tuple[int, dict[str, str]]] = []
    names: list[str] = []
    props: dict[str, list[int]] = {}
    cores: list[int] = []
    gpus: list[int] = []
    for t, vid, name, rank, vprops in rows:
        if t == "core":
            cores.append(vid)
        elif t == "gpu":
            gpus.append(vid)
        elif t == "node" or t == "storage_node":
            children = {}
            if cores:
                children["core"] = encode_idset(cores)
            if gpus:
                children["gpu"] = encode_idset(gpus)
            cores = []
            gpus = []
            if rank >= 0:
                entries.append((rank, children))
            names.append(name)
            for k, val in (vprops or {}).items():
                key = k if val == "" else f"{k}={val}"
                props.setdefault(key, []).append(rank)
    groups: dict[tuple[tuple[str, str], ...], list[int]] = {}
    for rank, children in entries:
        groups.setdefault(tuple(sorted(children.items())), []).append(rank)
    r_lite = [{"rank": encode_idset(ranks), "children": dict(ch)} for ch, ranks in groups.items()]
    execution: dict[str, Any] = {"R_lite": r_lite, "nodelist": names}
    if props:
        ok = {k: encode_idset(r) for k, r in props.items() if all(x >= 0 for x in r)}
        if ok:
            execution["properties"] = ok
    execution["starttime"] = start
    execution["expiration"] = end
    out: dict[str, Any] = {"version": 1, "execution": execution}
    if queue:
        out["attributes"] = {"system": {"scheduler": {"queue": queue}}}
    return out


class JobRecord:
    """A recorded allocation or reservation (read-only for callers)."""

    def __init__(self, jobid: int, at: int, duration: int, reserved: bool, nodes: list[NodeShare] | None,
                 vertices: list[AllocVertex] | None, entries: list[JobEntry] | None = None, queue: str = "",
                 result: MatchResult | None = None) -> None:
        self.jobid = jobid
        self.at = at
        self.duration = duration
        self.reserved = reserved
        self.entries: list[JobEntry] = entries or []
        self.queue = queue
        self._nodes = nodes
        self._vertices = vertices
        self._result = result

    def __repr__(self) -> str:
        return f"JobRecord(jobid={self.jobid}, mode={self.mode}, at={self.at}, duration={self.duration})"

    @property
    def nodes(self) -> list[NodeShare]:
        if self._nodes is None:
            self._nodes = self._result.nodes if self._result is not None else []
        return self._nodes

    @nodes.setter
    def nodes(self, val: list[NodeShare]) -> None:
        self._nodes = val

    @property
    def vertices(self) -> list[AllocVertex]:
        if self._vertices is None:
            self._vertices = self._result.vertices if self._result is not None else []
        return self._vertices

    @vertices.setter
    def vertices(self, val: list[AllocVertex]) -> None:
        self._vertices = val

    @property
    def mode(self) -> str:
        return "RESERVED" if self.reserved else "ALLOCATED"

    @property
    def end(self) -> int:
        return self.at + self.duration
