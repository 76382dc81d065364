"""Unit level (no cluster): fair share and preemption wired into the operator's cycle.

The Controller is driven with watch events (FluxAccounts, Namespaces, PriorityClasses, Jobs,
pods), its API writes go to a recording fake, its clock is a variable. Checked: without a
FluxAccount nothing changes; with accounts the queue is ordered by fair share, a limit holds
work with the limit named, a bad account keeps the last good configuration with an Event,
what runs is charged and the usage survives a restart through the store; a high-QoS gang
preempts whole lower-QoS groups, which are requeued once their pods are gone, and starts.
"""

from __future__ import annotations

import asyncio
import copy
import itertools
from typing import Any

from fluxnetes.k8s import names
from fluxnetes.k8s.config import OperatorConfig
from fluxnetes.k8s.controller import Controller
from fluxnetes.k8s.persistence.fluxjob import Phase
from fluxnetes.k8s.workloads.job import ANN_SUSPENDED_BY
from test_k8s_prune import RecordingKube, node

_uid = itertools.count(1)


class Kube(RecordingKube):
    """The recording fake, also keeping Events and Job patches."""

    def __init__(self) -> None:
        super().__init__()
        self.events: list[dict[str, Any]] = []
        self.job_patches: list[tuple[str, dict[str, Any]]] = []

    async def create(self, res: Any, body: Any, namespace: str | None = None, **kw: Any) -> dict[str, Any]:
        if res.plural == "events":
            self.events.append(body)
        return await super().create(res, body, namespace, **kw)

    async def patch(self, res: Any, name: str, body: Any, namespace: str | None = None, **kw: Any) -> dict[str, Any]:
        if res.plural == "jobs":
            self.job_patches.append((name, body))
        return await super().patch(res, name, body, namespace, **kw)


class Clock:
    def __init__(self, t: float = 1_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def controller(store: str | None = None, clock: Clock | None = None, **cfg: Any) -> tuple[Controller, Kube]:
    kube = Kube()
    c = Controller(kube, OperatorConfig(store=store, **cfg), clock=clock or Clock())  # type: ignore[arg-type]
    for n in ("n0", "n1", "n2", "n3"):  # 4 x 16 cores
        c.cluster.know_node(node(n))
    c.cluster.build_matcher()
    c.reconciled = True
    return c, kube


async def settle(c: Controller) -> None:
    c.scheduling.run_cycle()
    await asyncio.sleep(0)
    await c.status.flush_fluxjobs()
    while c._tasks:
        await asyncio.gather(*list(c._tasks), return_exceptions=True)


def job(name: str, ns: str, size: int = 1, cpu: str = "1", pc: str | None = None) -> dict[str, Any]:
    tspec: dict[str, Any] = {"schedulingGates": [{"name": names.GATE}],
                             "containers": [{"name": "c", "resources": {"requests": {"cpu": cpu}}}]}
    if pc:
        tspec["priorityClassName"] = pc
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": name, "namespace": ns, "uid": f"job-{ns}-{name}",
                         "annotations": {ANN_SUSPENDED_BY: "fluxnetes"}},
            "spec": {"parallelism": size, "completions": size, "suspend": True,
                     "template": {"metadata": {"labels": {names.LABEL_MANAGED: "true"}}, "spec": tspec}}}


def job_pod(j: dict[str, Any], i: int) -> dict[str, Any]:
    m = j["metadata"]
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"{m['name']}-{i}", "namespace": m["namespace"], "uid": f"pod-{next(_uid)}",
                         "labels": {names.LABEL_MANAGED: "true"},
                         "annotations": {"batch.kubernetes.io/job-completion-index": str(i)},
                         "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": m["name"],
                                              "uid": m["uid"], "controller": True}]},
            "spec": copy.deepcopy(j["spec"]["template"]["spec"]), "status": {"phase": "Pending"}}


def account(name: str, shares: int = 1, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "fluxnetes.io/v1alpha1", "kind": "FluxAccount",
            "metadata": {"name": name, "uid": f"fa-{name}"}, "spec": {"shares": shares, **spec}}


def namespace(name: str, acct: str | None = None) -> dict[str, Any]:
    labels = {"fluxnetes.io/account": acct} if acct else {}
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "uid": f"ns-{name}", "labels": labels}}


def group(c: Controller, ns: str, name: str) -> Any:
    return c.groups[(ns, f"job-{name}")]


def running(c: Controller, ns: str) -> int:
    return sum(1 for g in c.groups.values() if g.spec.namespace == ns and g.phase == Phase.RUNNING)


def submit_many(c: Controller, ns: str, count: int, prefix: str) -> None:
    for i in range(count):
        c.handle(("Job", "ADDED", job(f"{prefix}{i}", ns)))


def test_without_accounts_the_queue_keeps_its_plain_order() -> None:
    async def main() -> None:
        c, _ = controller()
        for ns in ("ns-a", "ns-b"):
            c.handle(("Namespace", "ADDED", namespace(ns)))
        submit_many(c, "ns-a", 64, "a")
        await settle(c)
        submit_many(c, "ns-b", 8, "b")
        await settle(c)
        assert not c.scheduling.fairshare.enabled
        assert running(c, "ns-a") == 64 and running(c, "ns-b") == 0  # first come, first served
        assert all(not g.reason.startswith("held") for g in c.groups.values())

    asyncio.run(main())


def test_fair_share_orders_the_queue_by_account_usage() -> None:
    async def main() -> None:
        clock = Clock()
        c, _ = controller(clock=clock)
        c.handle(("FluxAccount", "ADDED", account("a", 70)))
        c.handle(("FluxAccount", "ADDED", account("b", 30)))
        c.handle(("Namespace", "ADDED", namespace("ns-a", "a")))
        c.handle(("Namespace", "ADDED", namespace("ns-b", "b")))
        await settle(c)
        assert c.scheduling.fairshare.enabled
        # account a used the whole cluster for an hour already; b used nothing
        c.scheduling.fairshare.fs.usage.charge("a", 64 * 3600.0, int(clock()))
        submit_many(c, "ns-a", 64, "a")
        clock.t += 1
        submit_many(c, "ns-b", 10, "b")  # submitted later: plain order would put them last
        for _ in range(4):
            await settle(c)
        assert running(c, "ns-b") == 10 and running(c, "ns-a") == 54
        a0 = group(c, "ns-a", "a63")
        assert a0.phase == Phase.PENDING
        line = c.scheduling.explain_priority(a0)
        assert "fairshare" in line and "account a" in line, line
        # what runs is charged to its account
        run = c.scheduling.fairshare.fs.usage.running_resources()
        assert sum(r.cores for leaf, r in run.values() if leaf == "b") == 10
        assert sum(r.cores for leaf, r in run.values() if leaf == "a") == 54

    asyncio.run(main())


def test_an_account_limit_holds_work_and_names_the_limit() -> None:
    async def main() -> None:
        c, _ = controller()
        c.handle(("FluxAccount", "ADDED", account("a", 1, limits={"maxRunningJobs": 3})))
        c.handle(("Namespace", "ADDED", namespace("ns-a", "a")))
        submit_many(c, "ns-a", 5, "a")
        await settle(c)
        assert running(c, "ns-a") == 3
        held = [g for g in c.groups.values() if g.phase == Phase.PENDING]
        assert len(held) == 2
        for g in held:
            assert g.reason.startswith("held: account a: max running jobs 3"), g.reason
        # one ends: exactly one more may start
        first = next(g for g in c.groups.values() if g.phase == Phase.RUNNING)
        c.handle(("Job", "DELETED", job(first.spec.name.removeprefix("job-"), "ns-a")))
        await settle(c)
        await settle(c)
        assert running(c, "ns-a") == 3
        assert sum(1 for g in c.groups.values() if g.phase == Phase.PENDING) == 1

    asyncio.run(main())


def test_a_bad_account_keeps_the_last_good_configuration_and_says_why() -> None:
    async def main() -> None:
        c, kube = controller()
        c.handle(("FluxAccount", "ADDED", account("a", 70)))
        c.handle(("FluxAccount", "ADDED", account("b", 30)))
        await settle(c)
        good = c.scheduling.fairshare.accounts
        c.handle(("FluxAccount", "MODIFIED", account("a", 70, parent="c")))
        c.handle(("FluxAccount", "ADDED", account("c", 1, parent="a")))
        await settle(c)
        assert c.scheduling.fairshare.accounts is good  # the last good configuration stays in force
        bad = [e for e in kube.events if e["reason"] == "InvalidAccount"]
        assert bad and "spec.parent" in bad[0]["message"] and "cycle" in bad[0]["message"], bad
        assert bad[0]["involvedObject"]["kind"] == "FluxAccount"
        # a namespace naming an unknown account costs only that namespace
        c.handle(("FluxAccount", "MODIFIED", account("a", 70)))
        c.handle(("FluxAccount", "DELETED", account("c")))
        c.handle(("Namespace", "ADDED", namespace("ns-x", "nosuch")))
        await settle(c)
        assert c.scheduling.fairshare.error is None
        msgs = [e["message"] for e in kube.events if e["involvedObject"].get("kind") == "Namespace"]
        assert any("unknown FluxAccount 'nosuch'" in m for m in msgs), msgs

    asyncio.run(main())


def test_usage_survives_a_restart_through_the_store(store_url: str) -> None:
    async def main() -> None:
        url = store_url
        clock = Clock()
        c, _ = controller(store=url, clock=clock)
        c.handle(("FluxAccount", "ADDED", account("a", 1)))
        c.handle(("Namespace", "ADDED", namespace("ns-a", "a")))
        c.handle(("Job", "ADDED", job("big", "ns-a", size=8, cpu="2")))  # 16 cores
        await settle(c)
        assert group(c, "ns-a", "big").phase == Phase.RUNNING
        clock.t += 100
        await settle(c)
        used = c.scheduling.fairshare.fs.usage.of("a", int(clock()))
        assert 1500 < used <= 1600  # 16 cores x 100 s, barely decayed (half-life 7 days)
        c.ready.set()
        await c.stop()  # saves the usage
        clock.t += 10
        again, _ = controller(store=url, clock=clock)
        again.handle(("FluxAccount", "ADDED", account("a", 1)))
        await settle(again)
        assert abs(again.scheduling.fairshare.fs.usage.of("a", int(clock())) - used) < 1.0
        if again.journal is not None:
            again.journal.close()

    asyncio.run(main())


def test_a_high_qos_gang_preempts_whole_lower_qos_groups_which_run_again_later() -> None:
    async def main() -> None:
        c, kube = controller(preemption=True)
        c.handle(("PriorityClass", "ADDED", {"metadata": {"name": "low"}, "value": 10}))
        c.handle(("PriorityClass", "ADDED", {"metadata": {"name": "high"}, "value": 1000}))
        lows = [job(f"low{i}", "ns", size=8, cpu="1", pc="low") for i in range(8)]  # 8 x 8 = the cluster
        pods: dict[str, list[dict[str, Any]]] = {}
        for j in lows:
            c.handle(("Job", "ADDED", j))
        await settle(c)
        for j in lows:
            pods[j["metadata"]["name"]] = [job_pod(j, i) for i in range(8)]
            for p in pods[j["metadata"]["name"]]:
                c.handle(("Pod", "ADDED", p))
        await settle(c)
        assert all(group(c, "ns", f"low{i}").phase == Phase.RUNNING for i in range(8))
        urgent = job("urgent", "ns", size=16, cpu="1", pc="high")  # 16 cores: two low groups
        c.handle(("Job", "ADDED", urgent))
        await settle(c)
        victims = [g for g in c.groups.values() if g.phase == Phase.PREEMPTED]
        assert len(victims) == 2, [(g.qid, g.phase) for g in c.groups.values()]
        for v in victims:
            assert "preempted by ns/job-urgent (QoS high > low)" in v.reason
            # suspended again by fluxnetes (so it is resumed when allocated again)
            assert any(name == v.spec.owner.name and body["spec"]["suspend"] is True
                       for name, body in kube.job_patches)
        assert any(e["reason"] == "Preempted" and "ns/job-urgent" in e["message"] for e in kube.events)
        assert group(c, "ns", "urgent").phase in (Phase.PENDING, Phase.RESERVED)
        # while the victims' pods go, nothing else starts (a new low job waits)
        c.handle(("Job", "ADDED", job("zlate", "ns", size=1, pc="low")))
        # the Job controller deletes the suspended Jobs' pods
        for v in victims:
            for p in pods[v.spec.owner.name][:4]:
                c.handle(("Pod", "DELETED", p))
        await settle(c)
        assert group(c, "ns", "zlate").phase != Phase.RUNNING
        for v in victims:
            for p in pods[v.spec.owner.name][4:]:
                c.handle(("Pod", "DELETED", p))
        await settle(c)
        await settle(c)
        assert group(c, "ns", "urgent").phase == Phase.RUNNING
        for v in victims:
            assert v.phase in (Phase.PENDING, Phase.RESERVED), (v.qid, v.phase, v.reason)
            assert v.reason == "queued again: preempted by ns/job-urgent" or v.phase == Phase.RESERVED
            assert any(cond["type"] == "Preempted" for cond in v.fj_status.get("conditions") or [])
        c.cluster.matcher.check_invariants()  # nothing double-booked
        held = sum(s.cores for g in c.groups.values() if g.phase == Phase.RUNNING for s in g.held.values())
        assert held == 64
        # the urgent job ends: the victims run again
        c.handle(("Job", "DELETED", urgent))
        await settle(c)
        await settle(c)
        assert all(v.phase == Phase.RUNNING for v in victims), [(g.qid, g.phase, g.reason) for g in victims]

    asyncio.run(main())


def test_preemption_never_touches_protected_or_equal_qos_work() -> None:
    async def main() -> None:
        c, _ = controller(preemption=True, preemption_protected=("precious",))
        c.handle(("PriorityClass", "ADDED", {"metadata": {"name": "precious"}, "value": 10}))
        c.handle(("PriorityClass", "ADDED", {"metadata": {"name": "high"}, "value": 1000}))
        for i in range(4):
            c.handle(("Job", "ADDED", job(f"p{i}", "ns", size=16, cpu="1", pc="precious")))
        await settle(c)
        c.handle(("Job", "ADDED", job("h0", "ns", size=16, cpu="1", pc="high")))
        await settle(c)
        assert not any(g.phase == Phase.PREEMPTED for g in c.groups.values())
        assert "no running work of lower QoS" in c.preemption.preempt_notes.get("ns/job-h0", "")

    asyncio.run(main())


def test_explain_shows_the_priority_factors_and_the_limit_that_holds_a_job() -> None:
    from datetime import UTC, datetime, timedelta

    from fluxnetes.cli.ctl.explain import priority_factors

    now = datetime(2026, 11, 26, 12, 0, tzinfo=UTC)
    fj = {"metadata": {"namespace": "ns-a", "name": "job-x"},
          "spec": {"size": 4, "priority": 10, "request": {"cpu": 1000}},
          "status": {"phase": "Pending", "submitTime": (now - timedelta(days=1)).strftime("%Y-%m-%dT%H:%M:%SZ"),
                     "reason": "held: account a: max running jobs 3 reached (3 running)"}}
    fa = account("a", 70)
    fa["status"] = {"fairShare": 0.25}
    classes = [{"metadata": {"name": "low"}, "value": 10}, {"metadata": {"name": "high"}, "value": 1000}]
    out = priority_factors(fj, [fa, account("b", 30)], namespace("ns-a", "a"), classes,
                           [node(f"n{i}") for i in range(4)], now)
    assert out is not None
    assert out["account"] == "a" and out["fairshare"] == 0.25
    assert out["qos"] == 0.01 and out["jobSize"] == 4 / 64
    assert abs(out["age"] - 1 / 7) < 1e-6
    assert out["priority"] == round(1000 / 7 + 10000 * 0.25 + 1000 * 4 / 64 + 1000 * 0.01, 1)
    assert out["heldBy"] == "account a: max running jobs 3 reached (3 running)"
    assert "fairshare 10000*0.2500" in out["line"] and "[account a]" in out["line"]
    # no FluxAccount: fair share is off, nothing to show
    assert priority_factors(fj, [], None, classes, [], now) is None
