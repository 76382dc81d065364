"""Fake (kwok) nodes: their shape, their topology labels and their Node manifests."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

ZONE_LABEL = "topology.kubernetes.io/zone"
RACK_LABEL = "fluxnetes.io/rack"
DEV_NODE_LABEL = "fluxnetes.io/dev-node"  # marks nodes made by the dev cluster
KWOK_ANNOTATION = "kwok.x-k8s.io/node"  # kwok manages nodes with kwok.x-k8s.io/node=fake
GPU_RESOURCE = "nvidia.com/gpu"

# Kubernetes resource.Quantity (plain decimal with an optional SI or binary suffix)
_QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$")
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


class NodeSpecError(ValueError):
    """Bad node shape given by the user; the message names the option and the rule."""


@dataclass(frozen=True)
class NodeShape:
    """How many fake nodes, what each holds, and how they are spread over zones and racks.

    `racks` is racks per zone; nodes fill racks in order (node 0.. in rack-0 of zone-0, ...).
    """

    count: int = 3
    cpu: str = "32"
    memory: str = "256Gi"
    gpus: int = 0
    pods: int = 110
    zones: int = 1
    racks: int = 1
    prefix: str = "kwok-node"

    def validate(self) -> NodeShape:
        if self.count < 0:
            raise NodeSpecError(f"--nodes must be >= 0 (got {self.count})")
        for opt, value in (("--cpu", self.cpu), ("--memory", self.memory)):
            if not _QUANTITY.match(value):
                raise NodeSpecError(
                    f"{opt} must be a Kubernetes quantity such as 32, 500m, 256Gi (got {value!r})"
                )
        if self.gpus < 0:
            raise NodeSpecError(f"--gpus must be >= 0 (got {self.gpus})")
        if self.pods < 1:
            raise NodeSpecError(f"--pods must be >= 1 (got {self.pods})")
        if self.zones < 1:
            raise NodeSpecError(f"--zones must be >= 1 (got {self.zones})")
        if self.racks < 1:
            raise NodeSpecError(f"--racks (per zone) must be >= 1 (got {self.racks})")
        if not _NAME.match(self.prefix) or len(self.prefix) > 200:
            raise NodeSpecError(
                f"node prefix must be a lowercase DNS label such as kwok-node (got {self.prefix!r})"
            )
        return self

    def placement(self, index: int) -> tuple[str, str]:
        """(zone, rack) label values of node `index`: contiguous blocks, as even as possible."""
        total_racks = self.zones * self.racks
        rack = index * total_racks // self.count if self.count else 0
        return f"zone-{rack // self.racks}", f"rack-{rack}"

    def node_name(self, index: int) -> str:
        return f"{self.prefix}-{index}"

    def resources(self) -> dict[str, str]:
        res = {"cpu": self.cpu, "memory": self.memory, "pods": str(self.pods)}
        if self.gpus:
            res[GPU_RESOURCE] = str(self.gpus)
        return res

    def manifest(self, index: int) -> dict[str, Any]:
        """The Node object; its status is kept on create, and kwok then marks it Ready."""
        name = self.node_name(index)
        zone, rack = self.placement(index)
        return {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": name,
                "annotations": {"node.alpha.kubernetes.io/ttl": "0", KWOK_ANNOTATION: "fake"},
                "labels": {
                    "kubernetes.io/hostname": name,
                    "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": "amd64",
                    "type": "kwok",
                    DEV_NODE_LABEL: "true",
                    ZONE_LABEL: zone,
                    RACK_LABEL: rack,
                },
            },
            "spec": {},
            "status": {"capacity": self.resources(), "allocatable": self.resources()},
        }

    def manifests(self) -> list[dict[str, Any]]:
        return [self.manifest(i) for i in range(self.count)]


NOT_READY_TAINT = "node.kubernetes.io/not-ready"


def has_ready_condition(node: dict[str, Any]) -> bool:
    conditions = node.get("status", {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def not_ready_tainted(node: dict[str, Any]) -> bool:
    taints = node.get("spec", {}).get("taints") or []
    return any(t.get("key") == NOT_READY_TAINT for t in taints)


def is_ready(node: dict[str, Any]) -> bool:
    """Ready condition True and no not-ready taint left (the scheduler would skip the node)."""
    return has_ready_condition(node) and not not_ready_tainted(node)
