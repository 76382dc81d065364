"""Workload kinds fluxnetes understands, discovered from the modules of this package.

Each module defines ``KIND``, an instance of :class:`~fluxnetes.k8s.workloads.base.WorkloadKind`.
"""

from __future__ import annotations

import importlib
import pkgutil

from fluxnetes.k8s.workloads.base import WorkloadKind


def _discover() -> dict[str, WorkloadKind]:
    kinds: dict[str, WorkloadKind] = {}
    for info in pkgutil.iter_modules(__path__):
        if info.name == "base":
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        kind = getattr(module, "KIND", None)
        if isinstance(kind, WorkloadKind):
            kinds[kind.kind] = kind
    return kinds


KINDS: dict[str, WorkloadKind] = _discover()


def kind_of(kind: str) -> WorkloadKind | None:
    return KINDS.get(kind)


__all__ = ["KINDS", "WorkloadKind", "kind_of"]
