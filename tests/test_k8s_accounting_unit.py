"""Unit level (no cluster): the accounting invariant (k8s/cluster/accounting.py): the graph's use equals
the requests of the bound, unfinished pods, node by node, plus slots not bound yet. Checked on
the mirror alone (the check built on it) and on a Controller running a Job."""

from __future__ import annotations

import asyncio

from fluxnetes.k8s.cluster.accounting import AccountingCheck
from test_k8s_mirror_unit import mirror, other
from test_k8s_prune import bound, finished, job, make_controller, pod, settle


def test_foreign_pods_match_the_graph_and_a_pod_it_does_not_know_is_a_mismatch() -> None:
    m = mirror("n0", "n1")  # the cluster view on its group book, no controller
    checked = AccountingCheck(m, m)
    a, b = other("a", "3", "n0"), other("b", "2", "n1")
    for p in (a, b):
        m.cluster.add_foreign(p["metadata"]["uid"], p, p["spec"]["nodeName"])
    m.cluster.flush_foreign()
    res = checked.check_accounting([a, b])
    assert res["ok"] and res["bound"] == 2 and res["unbound"] == 0 and res["nodes"] == 2
    surprise = other("c", "1", "n1")  # bound, but the mirror never saw it
    res = checked.check_accounting([a, b, surprise])
    assert not res["ok"] and res["problems"][0].startswith("n1: graph")
    gone = finished(a)  # a finished pod holds nothing: the graph still counts it -> mismatch
    assert not checked.check_accounting([gone, b])["ok"]


def test_a_running_job_counts_its_unbound_slots_then_its_bound_pods() -> None:
    async def main() -> None:
        c, _ = make_controller()
        j = job("j", 2)
        c.handle(("Job", "ADDED", j))
        await settle(c)
        pods = [pod(f"j-{i}", owner=j) for i in range(2)]
        for p in pods:
            c.handle(("Pod", "ADDED", p))
        await settle(c)
        res = c.accounting.check_accounting(pods)  # placed, not bound yet: their slots are still held
        assert res["ok"] and res["bound"] == 0 and res["unbound"] == 2
        g = c.groups[("ns", "job-j")]
        seen = [bound(p, g.slots[g.slot_pod.index(p["metadata"]["uid"])]) for p in pods]
        for p in seen:
            c.handle(("Pod", "MODIFIED", p))
        res = c.accounting.check_accounting(seen)
        assert res["ok"] and res["bound"] == 2 and res["unbound"] == 0
        # a pod bound elsewhere than its slot's node: it counts as foreign there, its slot as
        # not bound: the graph disagrees on the other node
        slot_node = seen[0]["spec"]["nodeName"]
        elsewhere = next(n for n in ("n0", "n1", "n2", "n3") if n != slot_node)
        moved = dict(seen[0], spec={**seen[0]["spec"], "nodeName": elsewhere})
        res = c.accounting.check_accounting([moved, seen[1]])
        assert not res["ok"] and res["unbound"] == 1
        assert any(p.startswith(f"{elsewhere}: graph") for p in res["problems"])

    asyncio.run(main())
