"""Packing and exclusivity of a gang, read from a workload's annotations (pure).

* ``fluxnetes.io/pack: node|rack|zone`` - all pods of the workload within one node / one
  rack / one zone (the graph levels ``fluxnetes.graph.from_k8s_nodes`` builds from the node
  labels ``topology.kubernetes.io/zone`` and the configured rack label);
* ``fluxnetes.io/exclusive: node`` - one pod per node and nothing else on those nodes
  (``true`` is read as ``node``, as the annotation meant before pod sets; ``false`` or
  absent: pods share nodes);
* Kueue's ``kueue.x-k8s.io/podset-required-topology: <node label key>`` is read as an alias
  of ``fluxnetes.io/pack``: the label key names the level (``kubernetes.io/hostname`` ->
  node, ``topology.kubernetes.io/zone`` -> zone, the rack label -> rack).

Bad values and conflicting combinations raise :class:`PackingError` naming the annotation and
the rule. These become graph levels above the slots in the jobspec
(:func:`fluxnetes.jobspec.podsets.jobspec_from_podsets`), so the match policy decides where.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

ANN_PACK = "fluxnetes.io/pack"
ANN_EXCLUSIVE = "fluxnetes.io/exclusive"
ANN_KUEUE_REQUIRED = "kueue.x-k8s.io/podset-required-topology"

LEVELS = ("node", "rack", "zone")
HOSTNAME_LABEL = "kubernetes.io/hostname"
ZONE_LABEL = "topology.kubernetes.io/zone"
DEFAULT_RACK_LABEL = "fluxnetes.io/rack"


class PackingError(ValueError):
    """A pack/exclusive annotation broke a rule; ``annotation`` names it."""

    def __init__(self, annotation: str, rule: str) -> None:
        self.annotation = annotation
        self.rule = rule
        super().__init__(f"annotation {annotation}: {rule}")


@dataclass(frozen=True)
class Packing:
    """``pack``: the level all pods share (None: anywhere); ``exclusive``: one pod per whole
    node."""

    pack: str | None = None
    exclusive: bool = False

    def check(self, pods: int, where: str = ANN_PACK) -> None:
        """Conflicts that depend on the gang's size: one node cannot be both the home of every
        pod and exclusive to each of them."""
        if self.pack == "node" and self.exclusive and pods > 1:
            raise PackingError(where, f"pack node with exclusive node asks for {pods} pods on one node and "
                                      "one pod per node: use one of them")


def level_of_label(key: str, rack_label: str = DEFAULT_RACK_LABEL) -> str | None:
    """The graph level a node label key stands for (None: not a level of the graph)."""
    if key == HOSTNAME_LABEL:
        return "node"
    if key == ZONE_LABEL:
        return "zone"
    if key == rack_label:
        return "rack"
    return None


def packing_from_annotations(annotations: Mapping[str, Any] | None, *, pods: int | None = None,
                             rack_label: str = DEFAULT_RACK_LABEL) -> Packing:
    """Read pack / exclusive (and the Kueue alias) from a workload's annotations; ``pods``
    (the gang's total pod count, when known) enables the size-dependent conflict check."""
    ann = annotations or {}
    pack: str | None = None
    raw = ann.get(ANN_PACK)
    if raw is not None:
        value = str(raw).strip().lower()
        if value not in LEVELS:
            raise PackingError(ANN_PACK, f"must be one of {', '.join(LEVELS)}, got {raw!r}")
        pack = value
    kueue = ann.get(ANN_KUEUE_REQUIRED)
    if kueue is not None:
        key = str(kueue).strip()
        level = level_of_label(key, rack_label)
        if level is None:
            raise PackingError(ANN_KUEUE_REQUIRED,
                               f"must be a node label key fluxnetes builds a level from ({HOSTNAME_LABEL}, "
                               f"{rack_label}, {ZONE_LABEL}), got {kueue!r}")
        if pack is not None and pack != level:
            raise PackingError(ANN_KUEUE_REQUIRED,
                               f"asks for {level} ({key}) but {ANN_PACK} asks for {pack}: give one level")
        pack = level
    exclusive = False
    raw_x = ann.get(ANN_EXCLUSIVE)
    if raw_x is not None:
        value = str(raw_x).strip().lower()
        # true/false/1/0/yes/no: what the annotation already meant for single-template groups
        if value in ("node", "true", "1", "yes"):
            exclusive = True
        elif value not in ("false", "0", "no"):
            raise PackingError(ANN_EXCLUSIVE, f"must be node (or true / false), got {raw_x!r}")
    out = Packing(pack, exclusive)
    if pods is not None:
        out.check(pods, ANN_EXCLUSIVE if raw_x is not None else ANN_PACK)
    return out
