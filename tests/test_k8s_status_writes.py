"""Unit level: FluxJob writes are coalesced per group (``status_interval``).

In a burst a group goes Provisional/Pending, Running and placed within a fraction of a second;
the operator writes its FluxJob once when the interval has passed (one create that carries the
status: the CRD has no status subresource), with
the latest state, instead of once per transition. With ``status_interval=0`` every flush
writes. The Controller is driven directly; its API writes go to a counting fake.
"""

from __future__ import annotations

import asyncio
import copy
from typing import Any

from fluxnetes.k8s import names
from fluxnetes.k8s.config import OperatorConfig
from fluxnetes.k8s.controller import Controller
from test_k8s_prune import bound, node, pod


class CountingKube:
    def __init__(self) -> None:
        self.creates: list[str] = []
        self.statuses: list[tuple[str, str]] = []  # (FluxJob, phase written), by create or patch
        self.patches = 0

    async def create(self, res: Any, body: Any, namespace: str | None = None, **_: Any) -> dict[str, Any]:
        out = copy.deepcopy(dict(body))
        out.setdefault("metadata", {})["uid"] = f"uid-{len(self.creates)}"
        if res.plural == "fluxjobs":
            self.creates.append(out["metadata"]["name"])
            if "status" in body:
                self.statuses.append((out["metadata"]["name"], body["status"]["phase"]))
        return out

    async def patch(self, res: Any, name: str, body: Any, namespace: str | None = None, *,
                    sub: str | None = None, **_: Any) -> dict[str, Any]:
        if res.plural == "fluxjobs":
            self.patches += 1
            if "status" in body:
                self.statuses.append((name, body["status"]["phase"]))
        return {}


def controller(interval: float) -> tuple[Controller, CountingKube]:
    kube = CountingKube()
    # counts the status writes of FluxJobs: every group gets one (--fluxjobs all; the default,
    # waiting, gives none to a group placed at once)
    c = Controller(kube, OperatorConfig(status_interval=interval, event_rate=0, fluxjobs="all"))  # type: ignore[arg-type]
    for n in ("n0", "n1"):
        c.cluster.know_node(node(n))
    c.cluster.build_matcher()
    c.reconciled = True
    return c, kube


async def drain(c: Controller) -> None:
    while c._tasks:
        await asyncio.gather(*list(c._tasks), return_exceptions=True)


def arrive(c: Controller) -> list[dict[str, Any]]:
    """A labelled group of two pods arrives (watch events)."""
    pods = [pod(f"g-{i}", labels={names.LABEL_GROUP: "g", names.LABEL_GROUP_SIZE: "2"}) for i in range(2)]
    for p in pods:
        c.handle(("Pod", "ADDED", p))
    return pods


def test_a_burst_of_transitions_is_one_status_write() -> None:
    async def main() -> None:
        c, kube = controller(1.0)
        t0 = 1000.0
        pods = arrive(c)
        assert c.status.fluxjobs_due(t0) == 1.0  # dirty from now on, due in a second
        c.scheduling.run_cycle()  # Pending -> Running, placement patches sent
        await drain(c)
        for p in pods:
            c.handle(("Pod", "MODIFIED", bound(p, "n0")))
        assert c.status.fluxjobs_due(t0 + 0.5) == 0.5
        await c.status.flush_fluxjobs(now=t0 + 0.5)
        assert kube.creates == [] and kube.statuses == []  # not yet
        assert c.status.fluxjobs_due(t0 + 1.0) == 0.0
        await c.status.flush_fluxjobs(now=t0 + 1.0)
        assert kube.creates == ["g"]
        assert kube.statuses == [("g", "Running")]  # the latest state, written once
        assert kube.patches == 0  # by the create itself: one write
        assert c.status.fluxjobs_due(t0 + 2.0) is None  # nothing left to write

        # a later change waits its own interval
        for p in pods:
            c.handle(("Pod", "MODIFIED", {**bound(p, "n0"), "status": {"phase": "Succeeded"}}))
        assert c.status.fluxjobs_due(t0 + 5.0) == 1.0
        await c.status.flush_fluxjobs(now=t0 + 6.0)
        assert kube.statuses == [("g", "Running"), ("g", "Completed")]

    asyncio.run(main())


def test_interval_zero_writes_every_flush() -> None:
    async def main() -> None:
        c, kube = controller(0.0)
        t0 = 50.0
        arrive(c)
        assert c.status.fluxjobs_due(t0) == 0.0
        await c.status.flush_fluxjobs(now=t0)
        c.scheduling.run_cycle()
        await drain(c)
        c.status.fluxjobs_due(t0)
        await c.status.flush_fluxjobs(now=t0)
        assert kube.creates == ["g"]
        assert [phase for _, phase in kube.statuses] == ["Pending", "Running"]

    asyncio.run(main())
