"""Node shares of an allocation, in the matcher's units (cores, gpus, memory MiB, extra).

The operator keeps its own copy of what each group (and each node's foreign pods) holds, so
that it can give back one pod's part (partial cancel), persist what is left in the FluxJob
status, and re-record it after a restart (update_allocate). Conversions to and from the
matcher's ``NodeShare`` live here and nowhere else.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from fluxnetes.k8s.resources import PodResources

MIB = 1024 * 1024


@dataclass(frozen=True)
class Share:
    node: str
    cores: int = 0
    gpus: int = 0
    memory: int = 0  # MiB
    extra: Mapping[str, int] = field(default_factory=dict)

    def __sub__(self, other: Share) -> Share:
        extra = {k: v - other.extra.get(k, 0) for k, v in self.extra.items()}
        return Share(self.node, self.cores - other.cores, self.gpus - other.gpus, self.memory - other.memory,
                     {k: v for k, v in extra.items() if v})

    def split(self, parts: int) -> Share:
        """One of ``parts`` equal parts (floor); the last part takes the remainder."""
        parts = max(1, parts)
        return Share(self.node, self.cores // parts, self.gpus // parts, self.memory // parts,
                     {k: v // parts for k, v in self.extra.items()})

    def slot_part(self, slots_left: int) -> Share:
        """What one slot gives back of this node's share when ``slots_left`` slots (itself
        included) still hold it: an even part (``split``), the last slot the rest."""
        return self if slots_left <= 1 else self.split(slots_left)

    @property
    def empty(self) -> bool:
        return self.cores <= 0 and self.gpus <= 0 and self.memory <= 0 and not any(v > 0 for v in self.extra.values())

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"node": self.node, "cores": self.cores, "gpus": self.gpus, "memory": self.memory}
        if self.extra:
            out["extra"] = dict(self.extra)
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Share:
        return cls(str(d["node"]), int(d.get("cores", 0)), int(d.get("gpus", 0)), int(d.get("memory", 0)),
                   {str(k): int(v) for k, v in (d.get("extra") or {}).items()})


def from_match(nodes: Iterable[Any]) -> list[Share]:
    """Shares of a MatchResult's ``nodes`` (NodeShare: name, cores, gpus, memory, extra)."""
    merged: dict[str, Share] = {}
    for ns in nodes:
        name = str(getattr(ns, "name", ""))
        s = Share(name, int(getattr(ns, "cores", 0) or 0), int(getattr(ns, "gpus", 0) or 0),
                  int(getattr(ns, "memory", 0) or 0), dict(getattr(ns, "extra", None) or {}))
        if name in merged:
            m = merged[name]
            extra = dict(m.extra)
            for k, v in s.extra.items():
                extra[k] = extra.get(k, 0) + v
            s = Share(name, m.cores + s.cores, m.gpus + s.gpus, m.memory + s.memory, extra)
        merged[name] = s
    return list(merged.values())


def to_match(shares: Sequence[Share], paths: Mapping[str, str] | None = None) -> list[Any]:
    from fluxnetes.match.results import NodeShare

    out = []
    for s in shares:
        out.append(NodeShare(name=s.node, path=(paths or {}).get(s.node, ""), cores=s.cores, gpus=s.gpus,
                             memory=s.memory, extra=dict(s.extra)))
    return out


def of_pods(node: str, requests: Iterable[PodResources]) -> Share:
    """What a set of pods on one node holds in whole cores / MiB (foreign pods: summed first,
    so ten 100m pods take one core, as they do on the node)."""
    total = PodResources()
    for r in requests:
        total = total + r
    from fluxnetes.jobspec.pods import extended_type

    return Share(node, -(-total.cpu_millis // 1000), total.gpus, -(-total.memory_bytes // MIB),
                 {extended_type(k): v for k, v in total.extended.items() if v})


def slots_per_node(shares: Sequence[Share], size: int, cores_per_pod: int, exclusive: bool) -> list[str]:
    """Node of each slot (pod index) of an allocation of ``size`` pods."""
    slots: list[str] = []
    if exclusive:
        for s in shares:
            slots.append(s.node)
    else:
        for s in shares:
            n = s.cores // cores_per_pod if cores_per_pod > 0 else 0
            slots.extend([s.node] * n)
    if len(slots) != size:
        # a user-written jobspec: spread the pods over the nodes, biggest shares first
        order = sorted(shares, key=lambda s: (-s.cores, s.node))
        slots = [order[i % len(order)].node for i in range(size)] if order else []
    return sorted(slots[:size])
