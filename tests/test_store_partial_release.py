"""A group's share of a node given back in part (one of its pods there ended, others of the
group still run on that node) reaches the store, so that a restart from the store lays the
group out with what it holds now, not with the node's amount at its start.

(Was: only whole nodes given back were written, ``journal.release_nodes``; after a crash the
store's larger amount came back and the ended pod's cores stayed held until the group ended: a
leak.) Unit level, on SQLite and a real PostgreSQL (``store_url``); the restart is played as in
tests/test_k8s_recovery_unit.py.
"""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import pytest

import test_k8s_recovery_unit as recovery_unit
from fluxnetes.k8s.persistence.fluxjob import Phase
from fluxnetes.store import AllocationError, JobState, NodeAmount, Store, Submission
from test_k8s_prune import job, pod, settle
from test_k8s_recovery_unit import Kube, controller, placed, restart, resumed, used


def _ended(p: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(p)
    out["status"] = {"phase": "Succeeded"}
    return out


def _cpu(obj: dict[str, Any], cpu: str) -> dict[str, Any]:
    """``obj`` (a Job or a pod of the helpers) asking ``cpu`` per pod."""
    out = copy.deepcopy(obj)
    spec = out["spec"]["template"]["spec"] if out["kind"] == "Job" else out["spec"]
    spec["containers"][0]["resources"]["requests"]["cpu"] = cpu
    return out


async def _pair_with_pod_0_ended(c: Any, j: dict[str, Any]) -> list[dict[str, Any]]:
    """The first life: the Job ``j`` of 2 pods placed on n0 (both slots), then pod 0 ends;
    the pods as placed."""
    c.reconciled = True
    c.handle(("Job", "ADDED", j))
    await settle(c)
    g = c.groups[("ns", "job-pair")]
    assert g.phase == Phase.RUNNING and g.slots == ["n0", "n0"]
    ps = [placed(pod(f"pair-{i}", owner=j), "n0", i, int(g.jobid or 0), "job-pair") for i in range(2)]
    for p in ps:
        c.handle(("Pod", "ADDED", p))
    await settle(c)
    c.handle(("Pod", "MODIFIED", _ended(ps[0])))
    await settle(c)
    return ps


def test_partial_release_on_a_shared_node_survives_a_restart(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One node (16 cores). A Job of 2 pods (2 cores each) runs there; pod 0 ends (and is
    deleted), pod 1 runs on. The operator dies with no FluxJob written (the store is all that
    says what the group held) and a new one starts: the group holds pod 1's 2 cores on the
    node, not the 4 it started with, and a Job asking the other 14 cores runs at once."""
    monkeypatch.setattr(recovery_unit, "NODES", ("n0",))

    async def main() -> None:
        kube = Kube()
        j = job("pair", 2)
        c = controller(kube, store_url)
        ps = await _pair_with_pod_0_ended(c, j)
        assert used(c) == {"n0": 2}  # the live operator gave pod 0's share back
        assert c.journal is not None and c.journal.drain()
        row = c.journal.store.find("ns", "job-pair", j["metadata"]["uid"])
        assert row is not None and row.state == JobState.RUNNING
        [alloc] = [a for a in c.journal.store.allocations() if a.job_id == row.id]
        assert [(n.name, n.cores) for n in alloc.nodes] == [("n0", 2)]  # what it holds now
        await c.stop()

        # the new leader: pod 0 gone, pod 1 runs, no FluxJob
        kube.pods = [ps[1]]
        c2 = restart(kube, [resumed(j)], [], [ps[1]], store=store_url)
        g2 = c2.groups[("ns", "job-pair")]
        assert g2.phase == Phase.RUNNING
        assert used(c2) == {"n0": 2}, used(c2)  # (was {'n0': 4}: pod 0's share leaked)
        await settle(c2)
        check = await c2.accounting.accounting_check()
        assert check is not None and check["ok"], check

        # the freed room is usable: a Job of one pod asking 14 cores fits on n0 now
        big = _cpu(job("big", 1), "14")
        c2.handle(("Job", "ADDED", big))
        c2.handle(("Pod", "ADDED", _cpu(pod("big-0", owner=big), "14")))
        await settle(c2)
        assert c2.groups[("ns", "job-big")].phase == Phase.RUNNING, c2.groups[("ns", "job-big")].reason
        assert used(c2) == {"n0": 16}
        await c2.stop()

    asyncio.run(main())


def test_store_allocation_taken_up_after_a_partial_release_opens_no_slot_it_does_not_hold(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same release, but the new leader finds the group's FluxJob saying Pending (its
    Running status was never written): the store's allocation is taken up as it stands (2
    cores on n0 for a group of 2 pods of 2 cores). Only one slot may stay open: laid out over
    both, the ended pod's slot would wait open with no share behind it, and a new pod of the
    group (a Job's replacement pod) would be placed there, onto cores the graph gives away."""
    monkeypatch.setattr(recovery_unit, "NODES", ("n0",))

    async def main() -> None:
        kube = Kube()
        j = job("pair", 2)
        c = controller(kube, store_url)
        ps = await _pair_with_pod_0_ended(c, j)
        assert c.journal is not None and c.journal.drain()
        await c.stop()
        fj = copy.deepcopy(kube.fluxjobs[("ns", "job-pair")])
        fj["status"].update(phase="Pending", shares=None, released=None)  # the Running write lost
        kube.pods = [ps[1]]
        c2 = restart(kube, [resumed(j)], [fj], [ps[1]], store=store_url)
        g2 = c2.groups[("ns", "job-pair")]
        assert g2.phase == Phase.RUNNING and used(c2) == {"n0": 2}
        open_slots = [i for i in range(len(g2.slots)) if i not in g2.released]
        assert len(open_slots) == 1, (g2.slots, g2.released)  # (was: 2 open, 2 cores held)
        await settle(c2)
        # a new pod of the group (the Job replaces one) goes nowhere the graph does not hold
        c2.handle(("Pod", "ADDED", pod("pair-2", owner=j)))
        await settle(c2)
        filler = _cpu(job("filler", 1), "14")
        c2.handle(("Job", "ADDED", filler))
        c2.handle(("Pod", "ADDED", _cpu(pod("filler-0", owner=filler), "14")))
        await settle(c2)
        # the pods on n0: the group's in its slots, pod 1 (if it is foreign now), the filler
        on_n0 = 2 * sum(1 for u in g2.slot_pod if u is not None) + 2 * len(c2.cluster.foreign_node)
        if c2.groups[("ns", "job-filler")].phase == Phase.RUNNING:
            on_n0 += 14
        assert on_n0 <= 16, (g2.slot_pod, g2.released, c2.cluster.foreign_node, used(c2))
        await c2.stop()

    asyncio.run(main())


# -- the store's side ---------------------------------------------------------------------------


def _running(store: Store, nodes: list[NodeAmount]) -> int:
    [jid] = store.submit_many(
        [Submission(namespace="ns", name="g", jobspec="{}", size=3, duration=0)], 1
    )
    store.start(jid, 2, at=2, duration=0, nodes=nodes)
    return jid


def _held(store: Store, jid: int) -> dict[str, tuple[int, int, int, dict[str, Any], str]]:
    [a] = [a for a in store.allocations() if a.job_id == jid]
    return {n.name: (n.cores, n.gpus, n.memory, n.extra, n.path) for n in a.nodes}


def test_shrink_nodes_records_what_is_left_and_is_safe_to_repeat(store: Store) -> None:
    jid = _running(
        store,
        [
            NodeAmount("a", "/c/a", cores=6, gpus=2, memory=300, extra={"nic": 3}),
            NodeAmount("b", "/c/b", cores=4),
        ],
    )
    rev = store.allocations()[0].revision
    left = [NodeAmount("a", cores=4, gpus=1, memory=200, extra={"nic": 2})]
    assert store.shrink_nodes(jid, left, 3) is True
    # a write retried after its commit was not acknowledged sets the same amounts again
    assert store.shrink_nodes(jid, left, 3) is True
    assert _held(store, jid) == {
        "a": (4, 1, 200, {"nic": 2}, "/c/a"),  # the path stays
        "b": (4, 0, 0, {}, "/c/b"),
    }
    assert store.allocations()[0].revision == rev + 2  # a service replays it again
    assert store.get(jid).state == JobState.RUNNING and store.get(jid).updated_time == 3


def test_shrink_nodes_never_grows_or_adds_a_node(store: Store) -> None:
    jid = _running(store, [NodeAmount("a", cores=4)])
    with pytest.raises(AllocationError, match=r"node 'a': cores 5 > 4 held"):
        store.shrink_nodes(jid, [NodeAmount("a", cores=5)], 3)
    with pytest.raises(AllocationError, match=r"node 'z' is not held"):
        store.shrink_nodes(jid, [NodeAmount("z", cores=1)], 3)
    assert _held(store, jid) == {"a": (4, 0, 0, {}, "")}  # nothing changed


def test_shrink_nodes_of_a_job_no_longer_running_changes_nothing(store: Store) -> None:
    """The journal may write a release late (queued behind the job's end): no error, no row."""
    jid = _running(store, [NodeAmount("a", cores=4)])
    store.transition(jid, JobState.COMPLETED, 5, "all pods finished")
    assert store.shrink_nodes(jid, [NodeAmount("a", cores=2)], 6) is False
    assert store.get(jid).state == JobState.COMPLETED
    assert store.allocations() == []


def test_without_a_store_the_fluxjob_status_keeps_the_shrunk_share(monkeypatch: pytest.MonkeyPatch) -> None:
    """The claim that without ``--store`` nothing leaks here: the FluxJob status the new
    leader reads says what the group holds now (its shares follow each release)."""
    monkeypatch.setattr(recovery_unit, "NODES", ("n0",))

    async def main() -> None:
        kube = Kube()
        j = job("pair", 2)
        c = controller(kube)
        ps = await _pair_with_pod_0_ended(c, j)
        await c.stop()
        fj = kube.fluxjobs[("ns", "job-pair")]
        assert fj["status"]["shares"] == [{"node": "n0", "cores": 2, "gpus": 0, "memory": 0}]
        kube.pods = [ps[1]]
        c2 = restart(kube, [resumed(j)], [copy.deepcopy(fj)], [ps[1]])
        assert c2.groups[("ns", "job-pair")].phase == Phase.RUNNING
        assert used(c2) == {"n0": 2}
        await c2.stop()

    asyncio.run(main())


# -- the journal's side (SQLite: the batching is the journal's, not the database's) -------------


def _journal_with_a_running_group(tmp_path: Any) -> tuple[Any, Any, int]:
    from fluxnetes.k8s.persistence.journal import GroupRecord, Journal
    from fluxnetes.k8s.scheduling.shares import Share

    j = Journal(f"sqlite:///{tmp_path / 'j.db'}")
    rec = GroupRecord(namespace="ns", name="g", uid="u", kind="Job", jobspec="version: 1", size=4,
                      duration=0, priority=0, submit=1, phase=Phase.RUNNING, reason="allocated", start=1,
                      shares=(Share("a", cores=8, memory=400), Share("b", cores=8)))
    j.record(rec, now=1)
    assert j.drain()
    row = j.store.find("ns", "g", "u")
    assert row is not None and row.state == JobState.RUNNING
    return j, rec, row.id


def _hold_worker(j: Any) -> Any:
    """Keep the journal's worker busy until the returned event is set (writes queue up)."""
    import threading

    busy, go = threading.Event(), threading.Event()

    def hold() -> None:
        busy.set()
        go.wait(10)

    j._put(hold)
    assert busy.wait(10)
    return go


def _count_transactions(monkeypatch: pytest.MonkeyPatch, store: Store) -> list[int]:
    """Transactions the store opens from now on (a batch's inner calls use its one)."""
    opened: list[int] = []
    inner = store.session

    def counting(*, write: bool = True) -> Any:
        if getattr(store._local, "session", None) is None:
            opened.append(1)
        return inner(write=write)

    monkeypatch.setattr(store, "session", counting)
    return opened


def test_journal_writes_a_burst_of_partial_releases_in_one_transaction(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three pods of the group end while the worker is busy: one transaction, the latest
    amount per node (a whole-node release costs two: the state read, then the release)."""
    from fluxnetes.k8s.scheduling.shares import Share

    j, rec, jid = _journal_with_a_running_group(tmp_path)
    opened = _count_transactions(monkeypatch, j.store)
    go = _hold_worker(j)
    j.release_part(rec, Share("a", cores=6, memory=300), now=5)
    j.release_part(rec, Share("b", cores=4), now=6)
    j.release_part(rec, Share("a", cores=4, memory=200), now=7)
    go.set()
    assert j.drain()
    assert len(opened) == 1
    [a] = j.store.allocations()
    assert {(n.name, n.cores, n.memory) for n in a.nodes} == {("a", 4, 200), ("b", 4, 0)}
    assert j.store.get(jid).updated_time == 7
    j.close()


def test_journal_never_writes_a_partial_release_before_a_write_queued_ahead_of_it(tmp_path: Any) -> None:
    """Order is kept: a release queued after the group's end is not merged into a batch
    queued before it (it would land on the running row, before the end)."""
    from dataclasses import replace

    from fluxnetes.k8s.scheduling.shares import Share

    j, rec, jid = _journal_with_a_running_group(tmp_path)
    go = _hold_worker(j)
    j.release_part(rec, Share("a", cores=4, memory=200), now=5)
    j.release_nodes(rec, ["b"], now=6, reason="its pods ended")
    j.release_part(rec, Share("a", cores=2, memory=100), now=7)  # a new batch, after the drop
    go.set()
    assert j.drain()
    [a] = j.store.allocations()
    assert [(n.name, n.cores, n.memory) for n in a.nodes] == [("a", 2, 100)]
    assert a.revision == 3
    # after the group's end a late release changes nothing (no error, no row)
    j.record(replace(rec, phase=Phase.COMPLETED, reason="all pods finished"), now=8)
    j.release_part(rec, Share("a", cores=0, memory=50), now=9)
    assert j.drain()
    assert j.store.get(jid).state == JobState.COMPLETED and j.store.allocations() == []
    j.close()


def test_journal_retries_a_partial_release_whose_commit_was_not_acknowledged(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The transaction commits, then the connection fails before the answer (twice): the
    journal retries until it goes through, and the amount recorded is the one written (the
    node's amount after the release, not the release taken off three times)."""
    import contextlib
    from collections.abc import Iterator

    from fluxnetes.k8s.scheduling.shares import Share
    from fluxnetes.store import StoreUnavailable

    j, rec, _ = _journal_with_a_running_group(tmp_path)
    j.retry_seconds = 0.01
    inner = j.store.batch
    commits: list[int] = []

    @contextlib.contextmanager
    def lost_answer() -> Iterator[None]:
        with inner():
            yield
        commits.append(1)
        if len(commits) < 3:
            raise StoreUnavailable("connection lost after the commit (test)")

    monkeypatch.setattr(j.store, "batch", lost_answer)
    j.release_part(rec, Share("a", cores=4, memory=200), now=5)
    assert j.drain()
    assert len(commits) == 3 and j.ok
    [a] = j.store.allocations()
    assert {(n.name, n.cores, n.memory) for n in a.nodes} == {("a", 4, 200), ("b", 8, 0)}
    j.close()
