"""Placement patches and node-share bookkeeping (pure)."""

from __future__ import annotations

from typing import Any

import pytest

from fluxnetes.k8s import names
from fluxnetes.k8s.resources import PodResources
from fluxnetes.k8s.scheduling import shares
from fluxnetes.k8s.scheduling.placement import assigned_node, place_patch


def gated(spec_extra: dict[str, Any] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "c"}],
                            "schedulingGates": [{"name": "other"}, {"name": names.GATE}]}
    spec.update(spec_extra or {})
    return {"metadata": {"name": "p", "labels": {"a": "b"}}, "spec": spec}


def test_place_patch_tests_and_removes_only_our_gate() -> None:
    ops = place_patch(gated(), "n1", jobid=7, fluxjob="fj", slot=2)
    assert ops is not None
    assert ops[0] == {"op": "test", "path": "/spec/schedulingGates/1/name", "value": names.GATE}
    assert {"op": "remove", "path": "/spec/schedulingGates/1"} in ops
    aff = next(o for o in ops if o["path"] == "/spec/affinity")["value"]
    term = aff["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]
    assert term == {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}
    assert {"op": "add", "path": "/metadata/labels/fluxnetes.io~1jobid", "value": "7"} in ops
    assert any(o["path"] == "/metadata/annotations" and o["value"]["fluxnetes.io/slot"] == "2" for o in ops)


def test_place_patch_adds_to_every_existing_term() -> None:
    terms = [{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
             {"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["x"]}]}]
    pod = gated({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
                                                {"nodeSelectorTerms": terms}}}})
    ops = place_patch(pod, "n2", jobid=1, fluxjob="fj", slot=0)
    assert ops is not None
    base = "/spec/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution/nodeSelectorTerms"
    paths = [o["path"] for o in ops if o["path"].startswith(base)]
    assert paths == [f"{base}/0/matchFields", f"{base}/1/matchFields/-"]


def test_place_patch_none_without_gate_and_assigned_node() -> None:
    pod = gated()
    pod["spec"]["schedulingGates"] = []
    assert place_patch(pod, "n", jobid=1, fluxjob="f", slot=0) is None
    ops = place_patch(gated(), "n9", jobid=1, fluxjob="f", slot=0)
    assert ops is not None
    placed = gated({"affinity": next(o for o in ops if o["path"] == "/spec/affinity")["value"]})
    assert assigned_node(placed) == "n9"
    assert assigned_node({"spec": {"nodeName": "n3"}}) == "n3"
    assert assigned_node({"spec": {}}) is None


def test_share_split_and_release_sum_to_whole() -> None:
    s = shares.Share("n", cores=12, gpus=3, memory=3000, extra={"fpga": 3})
    part = s.split(3)
    assert part == shares.Share("n", 4, 1, 1000, {"fpga": 1})
    rest = s - part - part
    assert rest == part and (rest - part).empty
    assert shares.Share.from_dict(s.as_dict()) == s


def test_foreign_pods_are_summed_before_rounding() -> None:
    reqs = [PodResources(cpu_millis=100, memory_bytes=1) for _ in range(10)]
    s = shares.of_pods("n", reqs)
    assert (s.cores, s.memory) == (1, 1)


@pytest.mark.parametrize(("exclusive", "expected"), [(False, ["a", "a", "a", "b"]), (True, ["a", "b"])])
def test_slots_per_node(exclusive: bool, expected: list[str]) -> None:
    held = [shares.Share("a", cores=12 if not exclusive else 16), shares.Share("b", cores=4 if not exclusive else 16)]
    size = 4 if not exclusive else 2
    assert shares.slots_per_node(held, size, 4, exclusive) == expected


def test_slots_for_user_jobspec_spread_over_nodes() -> None:
    held = [shares.Share("a", cores=3), shares.Share("b", cores=5)]
    slots = shares.slots_per_node(held, 3, 4, False)  # 3 pods don't map to the cores: spread
    assert sorted(slots) == ["a", "b", "b"]
