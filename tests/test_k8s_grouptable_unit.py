"""The group table's indexes (k8s/groups/grouptable.py) and the fair-share charges that follow only the
groups it marks as touched, checked against a full recount of every group.

Unit level: the table alone, then the Controller driven by watch events (the recording fake of
test_k8s_prune) through random arrivals, binds, pod ends and deletions, Job deletions and node
losses, with fair share on. After every step: each phase's index, the FluxJob writes due and
the fair-share ledger's running charges equal what a sweep over every group finds.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest

from fluxnetes.k8s.controller import Controller
from fluxnetes.k8s.groups import GroupSpec
from fluxnetes.k8s.groups.groupbook import Group
from fluxnetes.k8s.groups.grouptable import GroupTable
from fluxnetes.k8s.persistence.fluxjob import Phase
from fluxnetes.k8s.resources import PodResources
from test_fairshare_operator import account, namespace
from test_k8s_node_loss import cpu_pod
from test_k8s_prune import bound, finished, job, make_controller, node, settle


def group(name: str) -> Group:
    return Group(spec=GroupSpec(name=name, namespace="ns", size=1, request=PodResources(cpu_millis=1000)))


def test_the_table_indexes_follow_phases_and_writes_due() -> None:
    t = GroupTable()
    a, b = group("a"), group("b")
    t[a.key], t[b.key] = a, b
    assert t.take_touched() == {a.key, b.key}
    assert [g.spec.name for g in t.in_phase(Phase.PROVISIONAL)] == ["a", "b"]
    assert set(t.fj_dirty) == {a.key, b.key}  # a new group's FluxJob is to be written
    a.phase = Phase.RUNNING
    b.fj_dirty = False
    assert t.in_phase(Phase.RUNNING) == [a] and t.in_phase(Phase.PROVISIONAL) == [b]
    assert set(t.fj_dirty) == {a.key}
    assert t.take_touched() == {a.key}  # its phase changed; b's write is not a holding
    a.held = {}
    b.holdings_changed()
    assert t.take_touched() == {a.key, b.key}
    assert t.phase_counts() == {"Provisional": 1, "Running": 1}
    # a new group under a's key replaces it: the old one is no longer indexed
    a2 = group("a")
    t[a.key] = a2
    a.phase = Phase.FAILED
    assert t.in_phase(Phase.FAILED) == [] and t.in_phase(Phase.PROVISIONAL) == [b, a2]
    assert a.table is None and a2.table is t
    assert t.pop(b.key) is b and t.pop(b.key, None) is None
    del t[a2.key]
    assert t.phase_counts() == {} and not t.fj_dirty
    with pytest.raises(TypeError, match="GroupTable"):
        t.update({b.key: b})
    with pytest.raises(TypeError, match="GroupTable"):
        t.setdefault(b.key, b)


def check(c: Controller) -> None:
    t = c.groups
    for p in Phase:
        assert set(t.by_phase[p]) == {k for k, g in t.items() if g.phase == p}, p
    assert set(t.fj_dirty) == {k for k, g in t.items() if g.fj_dirty}
    # writes due are noted oldest first: the noted ones before the others, their times in order
    since = [g.fj_since for g in t.fj_dirty.values()]
    noted = [s for s in since if s is not None]
    assert since[:len(noted)] == noted and noted == sorted(noted)
    assert all(g.fj_since is None for g in t.values() if not g.fj_dirty)
    counts = {}
    for g in t.values():
        counts[str(g.phase)] = counts.get(str(g.phase), 0) + 1
    assert t.phase_counts() == counts
    # the charges, brought up to date from the touched groups only, equal a full recount
    c.scheduling.sync_fairshare_usage(int(c.now()))
    book = c.scheduling.fairshare
    truth = {g.qid: book.resources_of(g.held.values()) for g in t.values() if g.phase == Phase.RUNNING and g.held}
    ledger = {qid: res for qid, (_leaf, res) in book.fs.usage.running_resources().items()}
    assert ledger == truth


def test_fair_share_charges_follow_touched_groups_exactly() -> None:
    async def main() -> None:
        rnd = random.Random(17)
        c, _kube = make_controller()  # n0..n3, 16 cpu each
        for extra in ("n4", "n5", "n6", "n7"):
            c.cluster.know_node(node(extra))
        c.cluster.build_matcher()
        c.handle(("FluxAccount", "ADDED", account("a")))
        c.handle(("Namespace", "ADDED", namespace("ns", "a")))
        await settle(c)
        assert c.scheduling.fairshare.enabled
        pods: dict[str, dict[str, Any]] = {}  # live gang pods by name
        jobs: dict[str, dict[str, Any]] = {}
        lost: list[str] = []
        for step in range(120):
            r = rnd.random()
            if r < 0.3:  # a gang of 1-4 pods
                size, cpu = rnd.randint(1, 4), rnd.choice(["2", "4", "8"])
                for i in range(size):
                    p = cpu_pod(f"s{step}-{i}", cpu, f"s{step}", size)
                    pods[p["metadata"]["name"]] = p
                    c.handle(("Pod", "ADDED", p))
            elif r < 0.45:  # a Job
                j = job(f"j{step}", rnd.randint(1, 3))
                jobs[j["metadata"]["name"]] = j
                c.handle(("Job", "ADDED", j))
            elif r < 0.75 and pods:  # a placed pod binds, ends or goes
                name = rnd.choice(sorted(pods))
                p = pods[name]
                key = c.member_of.get(p["metadata"]["uid"])
                g = c.groups.get(key) if key else None
                if g is None or p["metadata"]["uid"] not in g.slot_pod:
                    continue
                at = g.slots[g.slot_pod.index(p["metadata"]["uid"])]
                what = rnd.choice(["bind", "end", "delete"])
                if what == "bind":
                    c.handle(("Pod", "MODIFIED", bound(p, at)))
                elif what == "end":
                    c.handle(("Pod", "MODIFIED", finished(bound(p, at))))
                    del pods[name]
                else:
                    c.handle(("Pod", "DELETED", bound(p, at)))
                    del pods[name]
            elif r < 0.85 and jobs:
                name = rnd.choice(sorted(jobs))
                c.handle(("Job", "DELETED", jobs.pop(name)))
            elif r < 0.9 and len(lost) < 3:
                name = rnd.choice(sorted(n for n in c.cluster.nodes if n not in lost))
                lost.append(name)
                c.handle(("Node", "DELETED", node(name)))
            elif lost:
                name = lost.pop()
                c.handle(("Node", "ADDED", node(name)))
            if rnd.random() < 0.5:
                c.status.fluxjobs_due(float(step))
            check(c)
            if rnd.random() < 0.5:
                await settle(c)
                check(c)
        kinds = {str(g.phase) for g in c.groups.values()}
        assert "Running" in kinds  # (the walk did run work, and ended some)
        assert c.scheduling.fairshare.fs.usage.running_count() > 0

    asyncio.run(main())
