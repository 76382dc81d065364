"""Resource requests of a pod spec, by Kubernetes' own rules.

The effective request of a pod for one resource is (kubernetes resourcehelper.PodRequests):

    max(sum(regular containers) + sum(sidecars), max over init containers of the request seen
        while it runs) + overhead

where a sidecar is an init container with ``restartPolicy: Always`` (it keeps running, so it
adds up with everything started after it). A container with a limit but no request gets the
limit as request (API defaulting; templates and webhook input are not defaulted yet).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "": Decimal(1),
    "k": Decimal("1e3"),
    "M": Decimal("1e6"),
    "G": Decimal("1e9"),
    "T": Decimal("1e12"),
    "P": Decimal("1e15"),
    "E": Decimal("1e18"),
}

GPU = "nvidia.com/gpu"
# resources every node has that are not part of a pod's placement request
_IGNORED = {"pods", "ephemeral-storage", "storage"}


class ResourceError(ValueError):
    """A resource quantity or request that cannot be read; the message names the field."""


# quantities already read, by their text: a cluster's pods and nodes repeat a handful of them
# ("1", "500m", "64Mi"), read again for every Job and pod the operator groups (Decimal is
# immutable, so the same object is handed out)
_QUANTITIES: dict[str, Decimal] = {}
_QUANTITIES_MAX = 4096


def parse_quantity(value: object, where: str = "quantity") -> Decimal:
    """Parse a Kubernetes quantity ("100m", "1.5Gi", "2e3", 4) into a Decimal."""
    if isinstance(value, str):
        known = _QUANTITIES.get(value)
        if known is not None:
            return known
        amount = _parse_text(value, where)
        if len(_QUANTITIES) >= _QUANTITIES_MAX:
            _QUANTITIES.clear()
        _QUANTITIES[value] = amount
        return amount
    if isinstance(value, bool):
        raise ResourceError(f"{where}: {value!r} is not a quantity")
    if isinstance(value, int | float):
        return Decimal(str(value))
    raise ResourceError(f"{where}: {value!r} is not a quantity")


def _parse_text(value: str, where: str) -> Decimal:
    if not value.strip():
        raise ResourceError(f"{where}: {value!r} is not a quantity")
    text = value.strip()
    number, mult = text, Decimal(1)
    if text[-2:] in _BINARY:
        number, mult = text[:-2], Decimal(_BINARY[text[-2:]])
    elif text[-1:] in _DECIMAL and text[-1:] != "":
        # "1e3" ends with a digit; "2E" would be exa, which needs a number before it
        number, mult = text[:-1], _DECIMAL[text[-1:]]
    try:
        amount = Decimal(number) * mult
    except InvalidOperation:
        raise ResourceError(f"{where}: {value!r} is not a quantity") from None
    if not amount.is_finite() or amount < 0:
        raise ResourceError(f"{where}: {value!r} must be a finite, non-negative quantity")
    return amount


def cpu_millis(value: object, where: str = "cpu") -> int:
    return math.ceil(parse_quantity(value, where) * 1000)


def whole(value: object, where: str) -> int:
    return math.ceil(parse_quantity(value, where))


@dataclass(frozen=True)
class PodResources:
    """What one pod asks for: cpu in millicores, memory in bytes, GPUs, other extended ones."""

    cpu_millis: int = 0
    memory_bytes: int = 0
    gpus: int = 0
    extended: Mapping[str, int] = field(default_factory=dict)

    def __add__(self, other: PodResources) -> PodResources:
        ext = dict(self.extended)
        for k, v in other.extended.items():
            ext[k] = ext.get(k, 0) + v
        return PodResources(
            self.cpu_millis + other.cpu_millis,
            self.memory_bytes + other.memory_bytes,
            self.gpus + other.gpus,
            ext,
        )

    def max(self, other: PodResources) -> PodResources:
        ext = dict(self.extended)
        for k, v in other.extended.items():
            ext[k] = max(ext.get(k, 0), v)
        return PodResources(
            max(self.cpu_millis, other.cpu_millis),
            max(self.memory_bytes, other.memory_bytes),
            max(self.gpus, other.gpus),
            ext,
        )

    def as_dict(self) -> dict[str, int]:
        out = {"cpu": self.cpu_millis, "memory": self.memory_bytes, GPU: self.gpus}
        out.update(self.extended)
        return out


def _from_mapping(req: Mapping[str, Any], where: str) -> PodResources:
    cpu = mem = gpu = 0
    ext: dict[str, int] = {}
    for name, value in req.items():
        w = f"{where}.{name}"
        if name == "cpu":
            cpu = cpu_millis(value, w)
        elif name == "memory":
            mem = whole(value, w)
        elif name == GPU:
            gpu = whole(value, w)
        elif name in _IGNORED or name.startswith("hugepages-"):
            continue
        else:
            ext[name] = whole(value, w)
    return PodResources(cpu, mem, gpu, ext)


def container_request(container: Mapping[str, Any], where: str) -> PodResources:
    res = container.get("resources") or {}
    if not isinstance(res, Mapping):
        raise ResourceError(f"{where}.resources: must be a mapping")
    requests = dict(res.get("limits") or {})  # a limit alone defaults the request
    requests.update(res.get("requests") or {})
    return _from_mapping(requests, f"{where}.resources.requests")


def pod_request(spec: Mapping[str, Any]) -> PodResources:
    """Effective request of a pod spec (see module docstring)."""
    containers = spec.get("containers") or []
    if len(containers) == 1 and not spec.get("initContainers") and not spec.get("overhead"):
        return container_request(containers[0], "spec.containers[0]")  # (most pods: the same sum)
    total = PodResources()
    for i, c in enumerate(spec.get("containers") or []):
        total = total + container_request(c, f"spec.containers[{i}]")
    sidecars = PodResources()
    init_peak = PodResources()
    for i, c in enumerate(spec.get("initContainers") or []):
        req = container_request(c, f"spec.initContainers[{i}]")
        if c.get("restartPolicy") == "Always":
            sidecars = sidecars + req
            init_peak = init_peak.max(sidecars)
        else:
            init_peak = init_peak.max(sidecars + req)
    effective = (total + sidecars).max(init_peak)
    overhead = spec.get("overhead")
    if overhead:
        effective = effective + _from_mapping(overhead, "spec.overhead")
    return effective


def node_allocatable(node: Mapping[str, Any]) -> PodResources:
    status = node.get("status") or {}
    alloc = status.get("allocatable") or status.get("capacity") or {}
    return _from_mapping(alloc, "status.allocatable")
