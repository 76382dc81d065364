"""jobspec/batch.py: the jobspecs of batch jobs (SWF): per core, whole nodes, rack-packed."""

from __future__ import annotations

import pytest

from fluxnetes.graph import from_description
from fluxnetes.jobspec import JobspecError
from fluxnetes.jobspec.batch import batch_jobspec, with_duration
from fluxnetes.match import Matcher, MatchStatus


def test_per_core_and_whole_node_shapes_are_the_v1_ones() -> None:
    per_core = batch_jobspec(5, 60)
    assert per_core.to_dict()["version"] == 1
    assert per_core.to_dict()["resources"] == [
        {"type": "slot", "count": 5, "label": "task", "with": [{"type": "core", "count": 1}]}]
    assert per_core.duration == 60
    whole = batch_jobspec(5, 60, exclusive_nodes=True, nodes=2)
    assert whole.to_dict()["resources"] == [
        {"type": "node", "count": 2, "exclusive": True,
         "with": [{"type": "slot", "count": 1, "label": "task", "with": [{"type": "core", "count": 1}]}]}]


def test_rack_packed_shape_puts_the_nodes_under_one_rack() -> None:
    spec = batch_jobspec(5, 60, exclusive_nodes=True, nodes=2, pack="rack")
    top = spec.to_dict()["resources"]
    assert top == [{"type": "rack", "count": 1, "with": [
        {"type": "node", "count": 2, "exclusive": True,
         "with": [{"type": "slot", "count": 1, "label": "task", "with": [{"type": "core", "count": 1}]}]}]}]
    assert spec.totals["rack"] == 1 and spec.totals["node"] == 2
    # and the matcher places it within one rack
    graph = from_description({"cluster": "c", "node": {"sockets": 0, "cores": 1},
                              "racks": [{"name": "r0", "nodes": 2}, {"name": "r1", "nodes": 3}]})
    m = Matcher(graph, policy="first")
    one = batch_jobspec(1, 60, exclusive_nodes=True, nodes=1)
    assert m.allocate(one, jobid=1).status is MatchStatus.ALLOCATED
    r = m.allocate(spec, jobid=2)
    assert r.status is MatchStatus.ALLOCATED
    names = sorted(n.name for n in r.nodes)
    # r0 holds node0-1, r1 node2-4
    assert names in (["node0", "node1"], ["node2", "node3"], ["node2", "node4"], ["node3", "node4"])


@pytest.mark.parametrize(("kwargs", "path", "rule"), [
    ({"procs": 0}, "procs", "integer >= 1"),
    ({"procs": 4, "pack": "zone", "exclusive_nodes": True, "nodes": 1}, "pack", "must be one of rack"),
    ({"procs": 4, "pack": "rack"}, "pack", "whole (exclusive) nodes"),
    ({"procs": 4, "exclusive_nodes": True, "nodes": 0}, "nodes", "integer >= 1"),
])
def test_bad_requests_name_the_field(kwargs: dict[str, object], path: str, rule: str) -> None:
    procs = kwargs.pop("procs")
    with pytest.raises(JobspecError) as info:
        batch_jobspec(procs, 60, **kwargs)  # type: ignore[arg-type]
    assert info.value.path == path and rule in info.value.rule


@pytest.mark.parametrize("kwargs", [{}, {"exclusive_nodes": True, "nodes": 2},
                                    {"exclusive_nodes": True, "nodes": 2, "pack": "rack"}])
@pytest.mark.parametrize("duration", [0, 1, 3600])
def test_with_duration_is_the_jobspec_parsed_with_that_duration(
        kwargs: dict[str, object], duration: int) -> None:
    base = batch_jobspec(5, 60, **kwargs)  # type: ignore[arg-type]
    other = with_duration(base, duration)
    parsed = batch_jobspec(5, duration, **kwargs)  # type: ignore[arg-type]
    assert other.duration == parsed.duration == duration
    assert other.to_dict() == parsed.to_dict()
    assert (other.totals, other.types, other.sets, other.queue, other.constraint) == \
        (parsed.totals, parsed.types, parsed.sets, parsed.queue, parsed.constraint)
    assert other.resources is base.resources  # shared, not parsed again
    assert base.duration == 60 and base.to_dict()["attributes"]["system"]["duration"] == 60


@pytest.mark.parametrize("duration", [-1, 1.5, True, "60"])
def test_with_duration_names_the_field(duration: object) -> None:
    with pytest.raises(JobspecError) as info:
        with_duration(batch_jobspec(5, 60), duration)  # type: ignore[arg-type]
    assert info.value.path == "attributes.system.duration" and ">= 0" in info.value.rule
