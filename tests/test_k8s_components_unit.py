"""Unit level (no cluster, no controller): one component of the operator built alone over the
shared ``Context``, with fakes of the components it meets (its side's Protocols): the group
book (k8s/groups/groupbook.py) and allocation (k8s/scheduling/allocation.py)."""

from __future__ import annotations

from typing import Any

import pytest

from fluxnetes.k8s import names
from fluxnetes.k8s.config import OperatorConfig
from fluxnetes.k8s.context import Context
from fluxnetes.k8s.groups import GroupSpec, OwnerRef
from fluxnetes.k8s.groups.group import Group
from fluxnetes.k8s.groups.groupbook import GroupBook
from fluxnetes.k8s.persistence.fluxjob import Phase
from fluxnetes.k8s.resources import PodResources
from fluxnetes.k8s.scheduling.allocation import Allocation
from fluxnetes.k8s.scheduling.shares import Share
from test_k8s_prune import RecordingKube, pod


class Calls:
    """Records every call made of it (``calls``: (name, args)); ``answers`` gives what a call
    returns (None unless told)."""

    def __init__(self, **answers: Any) -> None:
        self.calls: list[tuple[str, tuple[Any, ...]]] = []
        self.answers = answers

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)

        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls.append((name, args))
            return self.answers.get(name)

        return call

    def names(self) -> list[str]:
        return [n for n, _ in self.calls]


class FakeStatus(Calls):
    """The status writer: a phase is set on the group (as the real one does), the rest recorded."""

    def set_phase(self, g: Group, phase: Phase, reason: str) -> None:
        self.calls.append(("set_phase", (g.qid, phase)))
        g.phase, g.reason = phase, reason


class FakeScheduler(Calls):
    def __init__(self) -> None:
        super().__init__()
        self.running: dict[str, Any] = {}


class FakeScaling(Calls):
    """Scaling: no workload family here (a label group of pods), names as asked."""

    def __init__(self) -> None:
        super().__init__(scale_groups={})

    def name_for_new_group(self, spec: GroupSpec) -> GroupSpec:
        self.calls.append(("name_for_new_group", (spec.key,)))
        return spec


class FakeCluster:
    def __init__(self) -> None:
        self.matcher = Calls()
        self.scheduler = FakeScheduler()


class Side:
    """Every component's side at once: the fakes above, handed out under the components' names."""

    def __init__(self) -> None:
        self.cluster = FakeCluster()
        self.status = FakeStatus()
        self.store_recovery = Calls(unclaimed=False)
        self.allocation = Calls()
        self.scaling = FakeScaling()
        self.podsets = Calls(join_addon=False)
        self.book = Calls()


def ctx() -> Context:
    c = Context(RecordingKube(), OperatorConfig(), clock=lambda: 1_000)  # type: ignore[arg-type]
    c.reconciled = True
    return c


def labelled(name: str, size: int) -> dict[str, Any]:
    return pod(name, labels={names.LABEL_GROUP: "g", names.LABEL_GROUP_SIZE: str(size)})


def test_the_book_alone_forms_a_group_queues_it_complete_and_withdraws_it_when_a_pod_goes() -> None:
    side = Side()
    book = GroupBook(ctx(), side)  # type: ignore[arg-type]
    pods = [labelled(f"g-{i}", 3) for i in range(3)]
    for p in pods[:2]:
        book.join_group(p["metadata"]["uid"], p)
    g = book.groups[("ns", "g")]
    assert g.phase == Phase.PROVISIONAL and g.reason == "waiting for the group: 2/3 pods"
    assert ("index_group", (g,)) in side.scaling.calls  # the family's indexes are scaling's
    book.join_group(pods[2]["metadata"]["uid"], pods[2])
    assert g.phase == Phase.PENDING and ("set_phase", (g.qid, Phase.PENDING)) in side.status.calls
    assert side.store_recovery.names() == ["unclaimed"]
    book.member_gone(g, pods[2]["metadata"]["uid"], pods[2])
    assert g.phase == Phase.PROVISIONAL and side.cluster.scheduler.calls == [("withdraw", (g.qid,))]
    assert dict(book.member_of) == {"pod-g-0": ("ns", "g"), "pod-g-1": ("ns", "g")}
    assert not side.allocation.calls  # nothing was started, so nothing is released


def test_the_book_hands_out_read_only_views_and_changes_only_through_its_methods() -> None:
    book = GroupBook(ctx(), Side())  # type: ignore[arg-type]
    p = labelled("g-0", 2)
    book.park("u", p)
    with pytest.raises(TypeError):
        book.parked["v"] = p  # type: ignore[index]
    with pytest.raises(TypeError):
        book.member_of["u"] = ("ns", "g")  # type: ignore[index]
    assert book.unpark("u") is p and not book.parked
    book.set_owner("Job", "ns", "j", {"metadata": {"uid": "new"}})
    book.owner_deleted("Job", "ns", "j", "old")  # the earlier object's delete, seen late: kept
    assert book.owner_obj(OwnerRef("batch/v1", "Job", "j", "new"), "ns") is not None
    book.owner_deleted("Job", "ns", "j", "new")
    assert not book.owners


def running(size: int, node: str, cores: int) -> Group:
    spec = GroupSpec(namespace="ns", name="g", size=size, request=PodResources(1000, 0, 0, {}))
    g = Group(spec=spec)
    g.phase, g.jobid = Phase.RUNNING, 7
    g.held = {node: Share(node, cores=cores)}
    g.slots, g.slot_pod, g.released = [node] * size, [None] * size, set()
    return g


def test_allocation_alone_gives_back_a_slot_s_part_then_the_whole_and_finishes() -> None:
    side = Side()
    alloc = Allocation(ctx(), side)  # type: ignore[arg-type]
    g = running(2, "n0", 4)
    alloc.release_slot(g, 0)
    assert g.held["n0"].cores == 2 and g.released == {0}
    (name, (jobid, part)), = side.cluster.matcher.calls
    assert name == "partial_cancel" and jobid == 7 and [s.cores for s in part] == [2]
    assert side.cluster.scheduler.calls == [("released_part", (g.qid, "n0", 2))]
    alloc.release_slot(g, 1)  # the last part: the whole allocation goes
    assert not g.held and side.cluster.matcher.calls[-1] == ("cancel", (7,))
    assert side.cluster.scheduler.calls[-1] == ("freed", ({"n0"},))
    alloc.finish_group(g)
    assert g.phase == Phase.COMPLETED and g.reason == "all pods finished"
    assert not side.book.calls  # (no workload: nothing asked of the book)


def own_bases_per_class() -> dict[str, list[str]]:
    """Every class of ``fluxnetes.k8s`` -> its bases that are classes of ``fluxnetes.k8s`` too."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent / "src" / "fluxnetes" / "k8s"
    trees = {p: ast.parse(p.read_text(), str(p)) for p in root.rglob("*.py")}
    ours = {n.name for t in trees.values() for n in ast.walk(t) if isinstance(n, ast.ClassDef)}
    out: dict[str, list[str]] = {}
    for path, tree in trees.items():
        for n in ast.walk(tree):
            if isinstance(n, ast.ClassDef):
                names = [b.id if isinstance(b, ast.Name) else b.attr if isinstance(b, ast.Attribute) else ""
                         for b in n.bases]
                out[f"{path.relative_to(root)}:{n.name}"] = [b for b in names if b in ours]
    return out


def test_no_class_of_the_operator_joins_parts_of_its_own() -> None:
    """Components, not mixins (#30): no class inherits more than one base of its own."""
    classes = own_bases_per_class()
    assert "controller.py:Controller" in classes
    joined = {c: bases for c, bases in classes.items() if len(bases) > 1}
    assert not joined, f"classes joining parts of their own: {joined}"
