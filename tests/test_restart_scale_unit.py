"""Unit level (no cluster): what a restart costs before the first cycle (issue 17, item 4).

A restart is played as in tests/test_k8s_recovery_unit.py (a fresh Controller over the caches,
``recover``, ``recover_store``, ``recover_from_cluster``, the replay, ``reconcile``), here with
a store (SQLite), then ``reconcile_store`` as the operator's loop runs it right before its
first cycle after the replay.
"""

from __future__ import annotations

import asyncio
import copy
from pathlib import Path
from typing import Any

from fluxnetes.k8s.controller import Controller
from fluxnetes.k8s.persistence.fluxjob import Phase
from fluxnetes.store import JobState
from test_k8s_prune import job, pod, settle
from test_k8s_recovery_unit import Kube, controller, placed, restart, resumed


def first_life(kube: Kube, url: str, names: list[str]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """An operator with a store runs one single-pod Job per name (each placed, its pod bound),
    then dies. Returns (the Jobs as they are now, their bound pods)."""
    jobs = [job(n, 1) for n in names]
    pods: list[dict[str, Any]] = []

    async def main() -> None:
        c = controller(kube, url)
        c.reconciled = True
        for j in jobs:
            c.handle(("Job", "ADDED", j))
        await settle(c)
        for j in jobs:
            g = c.groups[("ns", f"job-{j['metadata']['name']}")]
            assert g.phase == Phase.RUNNING, g.reason
            p = placed(pod(f"{j['metadata']['name']}-0", owner=j), g.slots[0], 0, int(g.jobid or 0), g.spec.name)
            c.handle(("Pod", "ADDED", p))
            pods.append(p)
        await settle(c)
        assert c.journal is not None and c.journal.drain()
        await c.stop()

    asyncio.run(main())
    return [resumed(j) for j in jobs], pods


def count_records(c: Controller) -> list[str]:
    """The groups ``reconcile_store`` asks the journal to record (the journal still records them)."""
    assert c.journal is not None
    journal = c.journal
    seen: list[str] = []
    real = journal.record

    def record(rec: Any, now: int) -> None:
        seen.append(rec.name)
        real(rec, now)

    journal.record = record
    c.store_recovery.reconcile_store()
    journal.record = real
    return seen


def test_reconcile_store_skips_rows_already_in_their_state(tmp_path: Path) -> None:
    """After a restart, groups whose store row already says what their phase says are not
    recorded again (each record dumps the jobspec as YAML and reads the row: at thousands of
    groups that held the loop for seconds before the first cycle); a row that is behind (here
    pending while the group runs: its write was lost) is still brought up to date."""
    url = f"sqlite:///{tmp_path / 's.db'}"
    kube = Kube()
    names = ["a", "b", "c"]
    jobs, pods = first_life(kube, url, names)
    kube.pods = copy.deepcopy(pods)

    async def main() -> None:
        # the store lost b's start (as if the write never reached it): its row says pending
        probe = controller(Kube(), url)
        assert probe.journal is not None
        row = next(r for r in probe.journal.store.jobs() if r.name == "job-b")
        probe.journal.store.transition(row.id, JobState.PENDING, 1, "test: the start was lost")
        await probe.stop()

        fluxjobs = list(copy.deepcopy(kube.fluxjobs).values())
        c = restart(kube, jobs, fluxjobs, copy.deepcopy(pods), store=url)
        assert all(c.groups[("ns", f"job-{n}")].phase == Phase.RUNNING for n in names)
        assert count_records(c) == ["job-b"]
        assert c.journal is not None and c.journal.drain()
        states = {r.name: str(r.state) for r in c.journal.store.jobs()}
        assert states == {"job-a": "running", "job-b": "running", "job-c": "running"}
        await c.stop()

    asyncio.run(main())


def test_recover_derives_fluxnetes_jobspecs_instead_of_parsing_them(monkeypatch: Any) -> None:
    """FluxJobs whose jobspec is the one fluxnetes derives for their group are not parsed at
    a restart (6,000 parses took seconds before the first bind at 1,000 nodes): the group's
    jobspec is derived again, equal to what parsing gives; any other text is still parsed."""
    import fluxnetes.jobspec as jobspec_mod
    from fluxnetes.k8s.objects import _dump_jobspec
    from test_k8s_recovery_unit import fluxjob, one_job

    kube = Kube()
    c = controller(kube)
    jobs = [one_job(f"p{i}") for i in range(5)]
    fjs = []
    for j in jobs:
        fj = fluxjob(f"job-{j['metadata']['name']}", j, {"phase": "Pending", "reason": "queued"})
        g = c.new_group(_spec_of(fj), None)
        fj["spec"]["jobspec"] = _dump_jobspec(g.jobspec)
        c.groups.pop(g.key)
        fjs.append(fj)
    custom = copy.deepcopy(fjs[-1])
    custom["metadata"]["name"] = "job-custom"
    custom["spec"]["jobspec"] = fjs[-1]["spec"]["jobspec"].replace("count: 2", "count: 3")
    assert custom["spec"]["jobspec"] != fjs[-1]["spec"]["jobspec"]
    parsed: list[str] = []
    real = jobspec_mod.parse_jobspec

    def counting(source: Any) -> Any:
        parsed.append(str(source))
        return real(source)

    monkeypatch.setattr(jobspec_mod, "parse_jobspec", counting)
    c2 = controller(Kube())
    c2.recovery.recover([*fjs, custom])
    assert parsed == [custom["spec"]["jobspec"]]
    for fj in fjs:
        g = c2.groups[("ns", fj["metadata"]["name"])]
        assert g.jobspec == real(fj["spec"]["jobspec"])
        assert _dump_jobspec(g.jobspec) == fj["spec"]["jobspec"]
    assert c2.groups[("ns", "job-custom")].jobspec == real(custom["spec"]["jobspec"])


def _spec_of(fj: dict[str, Any]) -> Any:
    """The GroupSpec ``recover`` makes of a FluxJob (without a jobspec of the user's)."""
    from fluxnetes.k8s.groups import GroupSpec, OwnerRef
    from fluxnetes.k8s.resources import PodResources

    spec, wl = fj["spec"], fj["spec"]["workload"]
    return GroupSpec(namespace=fj["metadata"]["namespace"], name=fj["metadata"]["name"], size=int(spec["size"]),
                     request=PodResources(int(spec["request"].get("cpu", 0))), duration=int(spec["duration"]),
                     priority=int(spec["priority"]), owner=OwnerRef(wl["apiVersion"], wl["kind"], wl["name"], wl["uid"]),
                     jobspec=None, exclusive=False)
