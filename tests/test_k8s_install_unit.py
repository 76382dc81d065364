"""Unit level (no cluster): the FluxJob CRD check at start-up (every restart goes through it)."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

from fluxnetes.k8s.admission.install import ensure_crd
from fluxnetes.k8s.persistence import fluxjob


class Crds:
    """Answers the CRD reads and writes of ``ensure_crd``; counts them."""

    def __init__(self, current: dict[str, Any] | None) -> None:
        self.current = current
        self.calls: list[str] = []

    async def get_or_none(self, res: Any, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        self.calls.append("get")
        return copy.deepcopy(self.current)

    async def get(self, res: Any, name: str, namespace: str | None = None) -> dict[str, Any]:
        self.calls.append("get")
        assert self.current is not None
        return copy.deepcopy(self.current)

    async def create(self, res: Any, body: Any, namespace: str | None = None, **_: Any) -> dict[str, Any]:
        self.calls.append("create")
        self.current = {**body, "status": {"conditions": [{"type": "Established", "status": "True"}]}}
        return self.current

    async def replace(self, res: Any, name: str, body: Any, namespace: str | None = None) -> dict[str, Any]:
        self.calls.append("replace")
        self.current = {**body, "status": (self.current or {}).get("status", {})}
        return self.current


def established(crd: dict[str, Any]) -> dict[str, Any]:
    crd = copy.deepcopy(crd)
    crd["metadata"]["resourceVersion"] = "7"
    crd["status"] = {"conditions": [{"type": "Established", "status": "True"}]}
    return crd


def test_an_established_crd_costs_one_read() -> None:
    kube = Crds(established(fluxjob.crd_manifest()))
    asyncio.run(ensure_crd(kube))  # type: ignore[arg-type]
    assert kube.calls == ["get"]


def test_a_missing_crd_is_created_and_waited_for() -> None:
    kube = Crds(None)
    asyncio.run(ensure_crd(kube))  # type: ignore[arg-type]
    assert kube.calls == ["get", "create", "get"]


def test_an_older_crd_is_replaced_and_waited_for() -> None:
    old = established(fluxjob.crd_manifest())
    old["spec"]["versions"] = []
    kube = Crds(old)
    asyncio.run(ensure_crd(kube))  # type: ignore[arg-type]
    assert kube.calls == ["get", "replace", "get"]
    assert kube.current is not None and kube.current["spec"]["versions"] == fluxjob.crd_manifest()["spec"]["versions"]
