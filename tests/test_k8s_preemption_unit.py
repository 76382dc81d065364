"""Unit level (no cluster): preemption (k8s/scheduling/preemption.py) built alone, with fakes of
the parts it meets (PreemptionSide: the groups, the status writer, the workloads). After a
restart a group its FluxJob shows Preempted is picked up: while some of its pods run it waits;
once it holds nothing it is failed (its workload is gone, so it cannot be queued again)."""

from __future__ import annotations

from typing import Any

from fluxnetes.k8s.config import OperatorConfig
from fluxnetes.k8s.context import Context
from fluxnetes.k8s.groups import GroupSpec
from fluxnetes.k8s.groups.group import Group
from fluxnetes.k8s.groups.grouptable import GroupTable
from fluxnetes.k8s.persistence.fluxjob import Phase
from fluxnetes.k8s.resources import PodResources
from fluxnetes.k8s.scheduling import shares
from fluxnetes.k8s.scheduling.preemption import Preemption
from test_k8s_prune import RecordingKube


class FakeStatus:
    """The status writer as preemption uses it: phases and Events, recorded."""

    def __init__(self) -> None:
        self.phases: list[tuple[str, Phase, str]] = []
        self.events: list[tuple[str, str, str]] = []

    def set_phase(self, g: Group, phase: Phase, reason: str) -> None:
        g.phase, g.reason = phase, reason
        self.phases.append((g.qid, phase, reason))

    def group_event(self, g: Group, etype: str, reason: str, message: str, pods: bool = True) -> None:
        self.events.append((g.qid, etype, reason))


class FakeSide:
    def __init__(self) -> None:
        self.groups: GroupTable = GroupTable()
        self.status = FakeStatus()
        self.cluster: Any = None  # (no plan is made here: no matcher, no queue)
        self.scheduling: Any = None  # (nor fair share)

    async def evict(self, g: Group, pods: list[dict[str, Any]] | None = None) -> None:
        raise AssertionError("nothing is evicted here")

    def owner_obj(self, ref: Any, namespace: str) -> dict[str, Any] | None:
        return None  # every workload is gone


def group(name: str, phase: Phase) -> Group:
    spec = GroupSpec(namespace="ns", name=name, size=1, request=PodResources(1000, 0, 0, {}), duration=0,
                     priority=0, owner=None)
    return Group(spec=spec, phase=phase)


def test_a_preempted_group_waits_for_its_pods_then_ends() -> None:
    side = FakeSide()
    p = Preemption(Context(RecordingKube(), OperatorConfig()), side)  # type: ignore[arg-type]
    victim = side.groups[("ns", "v")] = group("v", Phase.PREEMPTED)
    victim.held = {"n0": shares.Share("n0", 1)}  # one of its pods still runs
    side.groups[("ns", "other")] = group("other", Phase.RUNNING)
    assert p.preemption_step(now=100) is None  # no preemption in flight
    assert side.status.phases == [] and victim.phase == Phase.PREEMPTED
    victim.held = {}  # its last pod is gone
    assert p.preemption_step(now=101) is None
    assert side.status.phases == [("ns/v", Phase.FAILED, "preempted")]
    assert side.status.events == [("ns/v", "Warning", "Failed")] and victim.end == 101
    assert p.preemption_step(now=102) is None and len(side.status.phases) == 1  # once
