"""Resource graph: Fluxion-style vertices ("resource pools") in a containment tree.

Vertices carry Fluxion's fields (fluxion-spec §1.2). The containment subsystem is a tree:
every vertex but the root has exactly one parent; children keep insertion order (Fluxion's
out-edge order, which decides emit order and the visit order of most policies). Indexes by
type, name, path and uniq_id are maintained on every change. Scheduling state does not live
here: a :class:`fluxnetes.match.Matcher` keeps its own per-vertex state, so one graph can be
inspected or written while matchers use it.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

UP = 0
DOWN = 1


def vertex_basename(vtype: str) -> str:
    """The name stem of a vertex of type ``vtype``: the type, with '/' (the path separator)
    as '_'. An extended resource keeps its full name as its *type* (``example.com/fpga``);
    its vertices are named ``example.com_fpga0`` so that paths stay one level per vertex.
    A Kubernetes domain cannot hold '_', so two resource names never share a stem."""
    return vtype.replace("/", "_")


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while building many objects at once.

    Building a 500k-vertex graph triggers dozens of full collections that each scan
    everything built so far (quadratic); reference counting still frees memory meanwhile.
    The previous state is restored on exit; new objects are then moved to the oldest
    generation, unless the process froze objects itself (the move would unfreeze them)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            # what was built while paused sits in the youngest generation; moving it to the
            # oldest one (freeze + unfreeze splices lists, no scan) spares the next young
            # collections from walking every new vertex. unfreeze() empties the whole
            # permanent generation, so it is skipped when the process keeps objects frozen
            # on purpose (k8s/operator.py, store/service.py freeze their start-up objects)
            if gc.get_freeze_count() == 0:
                gc.freeze()
                gc.unfreeze()
            gc.enable()


NO_CHILDREN: list[Any] = []  # shared by leaves of read graphs; never mutated in place


class GraphError(ValueError):
    """Malformed graph input; the message names the vertex/edge and the rule."""


class Vertex:
    __slots__ = (
        "_paths",
        "basename",
        "children",
        "extra",
        "id",
        "idx",
        "jgf_id",
        "name",
        "parent",
        "path",
        "properties",
        "rank",
        "size",
        "status",
        "type",
        "uniq_id",
        "unit",
    )

    def __init__(
        self,
        type: str,
        *,
        basename: str | None = None,
        name: str | None = None,
        id: int | None = None,
        uniq_id: int = -1,
        rank: int = -1,
        size: int = 1,
        unit: str = "",
        properties: dict[str, str] | None = None,
        path: str = "",
        paths: dict[str, str] | None = None,
        status: int = UP,
    ) -> None:
        self.type = type
        self.basename = basename if basename is not None else vertex_basename(type)
        self.uniq_id = uniq_id
        if id is None:
            id = uniq_id
        self.id = id
        self.name = name if name is not None else f"{self.basename}{id}"
        self.rank = rank
        self.size = size
        self.unit = unit
        self.properties = properties or None
        if paths is None:
            paths = {"containment": path}
        self.path = paths.get("containment", path)
        self.paths = paths
        self.status = status
        self.parent: Vertex | None = None
        self.children: list[Vertex] = []
        self.idx = -1
        self.jgf_id = ""
        self.extra: dict[str, Any] | None = None  # unknown JGF metadata kept for round trip

    def __repr__(self) -> str:
        return f"Vertex({self.type} {self.path} size={self.size})"

    @property
    def paths(self) -> dict[str, str]:
        """Paths per subsystem. Most vertices have only their containment path: that dict is
        made on demand instead of kept per vertex (a dict each is ~10% of a big graph)."""
        p = self._paths
        return {"containment": self.path} if p is None else p

    @paths.setter
    def paths(self, val: dict[str, str]) -> None:
        only_containment = len(val) == 1 and val.get("containment") == self.path
        self._paths = None if only_containment else val


class ResourceGraph:
    """Containment tree of :class:`Vertex` with indexes; vertices are numbered by ``idx``."""

    def __init__(self) -> None:
        self.vertices: list[Vertex | None] = []
        self.root: Vertex | None = None
        self.by_type: dict[str, list[Vertex]] = {}
        self.by_name: dict[str, list[Vertex]] = {}
        self.by_path: dict[str, Vertex] = {}
        self.by_uniq: dict[int, Vertex] = {}
        # edges of other subsystems (power, ibnet...) kept verbatim for a lossless round trip
        self.other_edges: list[dict[str, Any]] = []
        # graph-level settings; "split_pools": pools are shared by amount (Kubernetes graphs)
        self.meta: dict[str, Any] = {}
        self.version = 0  # bumped on every structural change (matchers watch it)

    # ------------------------------------------------------------------ queries
    def __len__(self) -> int:
        return len(self.by_path)

    def __iter__(self) -> Iterator[Vertex]:
        for v in self.vertices:
            if v is not None:
                yield v

    def walk(self, start: Vertex | None = None) -> Iterator[Vertex]:
        """Pre-order DFS in child order."""
        top = start or self.root
        if top is None:
            return
        stack = [top]
        while stack:
            v = stack.pop()
            yield v
            stack.extend(reversed(v.children))

    def get(self, key: str) -> Vertex:
        """Vertex by containment path, or by unique name (e.g. a node name)."""
        v = self.by_path.get(key)
        if v is not None:
            return v
        vs = self.by_name.get(key)
        if vs and len(vs) == 1:
            return vs[0]
        if vs:
            raise GraphError(f"name '{key}' is ambiguous ({len(vs)} vertices); use a path")
        raise GraphError(f"no vertex with path or name '{key}'")

    def find(self, key: str) -> Vertex | None:
        try:
            return self.get(key)
        except GraphError:
            return None

    def count(self, type: str) -> int:
        return len(self.by_type.get(type, ()))

    def types(self) -> list[str]:
        return list(self.by_type)

    def summary(self) -> dict[str, int]:
        return {t: sum(v.size for v in vs) for t, vs in self.by_type.items()}

    def next_uniq_id(self) -> int:
        nxt = getattr(self, "_next_uniq", None)
        if nxt is None or nxt in self.by_uniq:
            nxt = (max(self.by_uniq) + 1) if self.by_uniq else 0
        self._next_uniq = nxt + 1
        return nxt

    # ------------------------------------------------------------------ changes
    def add_vertex(self, v: Vertex, parent: Vertex | None) -> Vertex:
        """Insert ``v`` under ``parent`` (None = the root). Paths must be unique."""
        if v.path in self.by_path:
            raise GraphError(f"vertex {v.path}: duplicate path")
        if parent is None:
            if self.root is not None:
                raise GraphError(
                    f"vertex {v.path}: second containment root (the root is {self.root.path})"
                )
            self.root = v
        else:
            v.parent = parent
            if parent.children is NO_CHILDREN:
                parent.children = [v]
            else:
                parent.children.append(v)
        if v.uniq_id < 0 or v.uniq_id in self.by_uniq:
            # no id, or one already taken (e.g. a subgraph built on its own and attached):
            # give it a fresh one
            v.uniq_id = self.next_uniq_id()
        v.idx = len(self.vertices)
        self.vertices.append(v)
        self.by_type.setdefault(v.type, []).append(v)
        self.by_name.setdefault(v.name, []).append(v)
        self.by_path[v.path] = v
        self.by_uniq[v.uniq_id] = v
        self.version += 1
        return v

    def remove_subtree(self, v: Vertex) -> list[Vertex]:
        """Detach ``v`` and its descendants; returns the removed vertices (pre-order)."""
        gone = list(self.walk(v))
        if v.parent is not None:
            v.parent.children = [c for c in v.parent.children if c is not v]
        elif v is self.root:
            self.root = None
        for x in gone:
            self.vertices[x.idx] = None
            self.by_type[x.type].remove(x)
            if not self.by_type[x.type]:
                del self.by_type[x.type]
            self.by_name[x.name].remove(x)
            if not self.by_name[x.name]:
                del self.by_name[x.name]
            del self.by_path[x.path]
            del self.by_uniq[x.uniq_id]
        self.version += 1
        return gone

    def check(self) -> None:
        """Structural checks (tree, paths consistent with parents, sizes)."""
        if self.root is None:
            raise GraphError("graph has no containment root")
        for v in self:
            if v.size < 0:
                raise GraphError(f"vertex {v.path}: size must be >= 0")
            if v.parent is not None and not v.path.startswith(v.parent.path + "/"):
                raise GraphError(
                    f"edge {v.parent.path} -> {v.path}: child path must extend the parent path"
                )
