"""Ranks and parents of the agents' tree, from the membership (Flux's k-ary TBON).

Members are sorted by node name: rank 0 is the first (Ready) node by name, and the parent of
rank r is rank (r - 1) // fanout. A member whose agent is unreachable is routed around: its
children attach to the next live ancestor (``ancestors`` gives the order to try), so nothing
restarts when a node is lost. Pure functions and small dataclasses; no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

DEFAULT_FANOUT = 256
DEFAULT_PORT = 9946


class MembershipError(ValueError):
    """Bad membership input (a peer spec, a hostlist); the message names the rule."""


@dataclass(frozen=True, order=True)
class Member:
    name: str
    host: str
    port: int
    # where the address came from (messages only): "peers" (a static list), "annotation"
    # (the Node's ADDRESS_ANNOTATION) or "node" (its InternalIP and the agents' port)
    origin: str = field(default="peers", compare=False)

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


@dataclass(frozen=True)
class Tree:
    """The tree over one membership. ``members`` is kept sorted by name."""

    members: tuple[Member, ...]
    fanout: int = DEFAULT_FANOUT
    _index: dict[str, int] = field(init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_index", {m.name: i for i, m in enumerate(self.members)})

    @classmethod
    def build(cls, members: Iterable[Member], fanout: int = DEFAULT_FANOUT) -> Tree:
        if fanout < 1:
            raise MembershipError(f"fanout must be >= 1, got {fanout}")
        by_name: dict[str, Member] = {}
        for m in members:
            if m.name in by_name and by_name[m.name] != m:
                raise MembershipError(f"member {m.name!r} is listed twice with different addresses")
            by_name[m.name] = m
        return cls(tuple(sorted(by_name.values())), fanout)

    def __len__(self) -> int:
        return len(self.members)

    @property
    def names(self) -> list[str]:
        return [m.name for m in self.members]

    def rank(self, name: str) -> int | None:
        return self._index.get(name)

    def member(self, name: str) -> Member | None:
        r = self.rank(name)
        return None if r is None else self.members[r]

    def parent(self, name: str) -> Member | None:
        """The designated parent (None for rank 0 or a non-member)."""
        r = self.rank(name)
        p = parent_rank(r, self.fanout) if r is not None else None
        return None if p is None else self.members[p]

    def ancestors(self, name: str) -> list[Member]:
        """Parent, grandparent, ... up to rank 0: the order in which a child tries to attach."""
        r = self.rank(name)
        out: list[Member] = []
        while r is not None:
            r = parent_rank(r, self.fanout)
            if r is not None:
                out.append(self.members[r])
        return out

    def children(self, name: str) -> list[Member]:
        r = self.rank(name)
        if r is None:
            return []
        return [self.members[c] for c in children_ranks(r, self.fanout, len(self.members))]

    def depth(self) -> int:
        d, r = 0, len(self.members) - 1
        while r > 0:
            r = (r - 1) // self.fanout
            d += 1
        return d


def parent_rank(rank: int, fanout: int) -> int | None:
    return None if rank <= 0 else (rank - 1) // fanout


def children_ranks(rank: int, fanout: int, size: int) -> range:
    first = rank * fanout + 1
    return range(min(first, size), min(first + fanout, size))


# -- membership sources ----------------------------------------------------------------------

_PEER = re.compile(r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)=(?P<host>[^:=\s]+|\[[0-9a-fA-F:]+\]):(?P<port>\d+)$")


def parse_peers(text: str) -> list[Member]:
    """``name=host:port`` entries separated by commas, spaces or newlines (``#`` comments)."""
    out = []
    for raw_line in text.splitlines():
        line = raw_line.split("#", 1)[0]
        for item in re.split(r"[,\s]+", line.strip()):
            if not item:
                continue
            m = _PEER.match(item)
            if not m:
                raise MembershipError(f"peer {item!r}: expected NAME=HOST:PORT (e.g. node-1=10.0.0.5:9946)")
            port = int(m["port"])
            if not 0 < port < 65536:
                raise MembershipError(f"peer {item!r}: port must be 1..65535")
            out.append(Member(m["name"], m["host"].strip("[]"), port))
    return out


def node_ready(node: Mapping[str, Any]) -> bool:
    for cond in (node.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Ready":
            return bool(cond.get("status") == "True")
    return False


def node_address(node: Mapping[str, Any]) -> str | None:
    addrs = (node.get("status") or {}).get("addresses") or []
    for kind in ("InternalIP", "ExternalIP", "Hostname"):
        for a in addrs:
            if a.get("type") == kind and a.get("address"):
                return str(a["address"])
    return None


ADDRESS_ANNOTATION = "fluxnetes.io/agent-address"


def members_from_nodes(nodes: Iterable[Mapping[str, Any]], port: int,
                       selector: Mapping[str, str] | None = None) -> list[Member]:
    """Ready Nodes (with an address) matching ``selector`` labels, at InternalIP:port, or at
    the ``fluxnetes.io/agent-address: HOST:PORT`` annotation when a node carries one (agents
    behind NAT; fake nodes in tests)."""
    out = []
    for node in nodes:
        meta = node.get("metadata") or {}
        labels = meta.get("labels") or {}
        if selector and any(labels.get(k) != v for k, v in selector.items()):
            continue
        host: str | None = node_address(node)
        p, origin = port, "node"
        override = str((meta.get("annotations") or {}).get(ADDRESS_ANNOTATION, ""))
        h, sep, ps = override.rpartition(":")
        if sep and h and ps.isdigit():
            host, p, origin = h.strip("[]"), int(ps), "annotation"
        if meta.get("deletionTimestamp") or not host or not node_ready(node):
            continue
        out.append(Member(str(meta["name"]), host, p, origin))
    return out


# -- hostlists (Flux / Slurm syntax: node[1-3,7],login) ------------------------------------------

_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


def expand_hostlist(text: str) -> list[str]:
    """``node[01-03,7],login`` -> node01, node02, node03, node7, login (order kept, no duplicates)."""
    out: list[str] = []
    for part in _split_top(text.strip()):
        if not part:
            continue
        m = re.fullmatch(r"([^\[\]]*)\[([^\[\]]+)\]([^\[\]]*)", part)
        if not m:
            if "[" in part or "]" in part:
                raise MembershipError(f"hostlist {text!r}: bad brackets in {part!r}")
            out.append(part)
            continue
        prefix, body, suffix = m.groups()
        for rng in body.split(","):
            r = _RANGE.match(rng.strip())
            if not r:
                raise MembershipError(f"hostlist {text!r}: {rng!r} is not N or N-M")
            lo, hi = r.group(1), r.group(2) or r.group(1)
            if int(hi) < int(lo):
                raise MembershipError(f"hostlist {text!r}: range {rng!r} runs backwards")
            if int(hi) - int(lo) > 100_000:
                raise MembershipError(f"hostlist {text!r}: range {rng!r} is too large")
            width = len(lo) if lo.startswith("0") else 0
            out.extend(f"{prefix}{i:0{width}d}{suffix}" for i in range(int(lo), int(hi) + 1))
    return list(dict.fromkeys(out))


def _split_top(text: str) -> list[str]:
    """Split on commas outside brackets."""
    parts, depth, cur = [], 0, ""
    for ch in text:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur.strip())
            cur = ""
        else:
            cur += ch
    parts.append(cur.strip())
    return parts


def unknown(names: Sequence[str], tree: Tree) -> list[str]:
    known = set(tree.names)
    return [n for n in names if n not in known]
