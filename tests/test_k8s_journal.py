"""The operator's store journal: the queue's memory (SQLite; no cluster)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from fluxnetes.k8s.persistence.fluxjob import Phase
from fluxnetes.k8s.persistence.journal import GroupRecord, Journal
from fluxnetes.k8s.scheduling.shares import Share

SHARES = (Share("n1", cores=2, memory=100), Share("n2", cores=2, memory=100))


def rec(name: str = "job-a", **kw: object) -> GroupRecord:
    base = GroupRecord(namespace="ns", name=name, uid=f"u-{name}", kind="Job", jobspec="version: 1", size=2,
                       duration=60, priority=0, submit=10, phase=Phase.PENDING, reason="queued")
    return replace(base, **kw)  # type: ignore[arg-type]


def test_journal_records_submission_phases_allocations_and_releases(tmp_path: Path) -> None:
    j = Journal(f"sqlite:///{tmp_path / 'j.db'}")
    j.record(rec(priority=5), now=10)
    j.record(rec(phase=Phase.RUNNING, reason="allocated", start=11, shares=SHARES), now=11)
    j.release_nodes(rec(), ["n1"], now=12, reason="pods ended")
    j.record(rec(phase=Phase.COMPLETED, reason="all pods finished", shares=SHARES), now=13)
    j.close()
    r = j.store.find("ns", "job-a", "u-job-a")
    assert r is not None and str(r.state) == "completed"
    assert (r.submit_time, r.priority, r.size, r.duration, r.jobspec) == (10, 5, 2, 60, "version: 1")
    assert [str(e.to_state) for e in j.store.events(r.id)] == ["pending", "running", "completed"]
    assert all(a.job_id != r.id for a in j.store.allocations())  # released with the job


def test_a_completion_whose_start_was_not_written_is_bridged(tmp_path: Path) -> None:
    """The operator may decide start and end before the store saw the start (or recover a
    running group from its FluxJob): the store goes through running, legally."""
    j = Journal(f"sqlite:///{tmp_path / 'j.db'}")
    j.record(rec(phase=Phase.PROVISIONAL, reason="waiting"), now=9)
    j.record(rec(phase=Phase.COMPLETED, reason="all pods finished", start=11, shares=SHARES), now=13)
    j.record(rec(name="b", phase=Phase.RESERVED, reason="reserved"), now=14)
    j.close()
    r = j.store.find("ns", "job-a", "u-job-a")
    assert r is not None and str(r.state) == "completed" and r.start_time == 11
    assert [str(e.to_state) for e in j.store.events(r.id)] == ["provisional", "pending", "running", "completed"]
    b = j.store.find("ns", "b", "u-b")
    assert b is not None and [str(e.to_state) for e in j.store.events(b.id)] == ["pending", "reserved"]


def test_terminal_rows_never_change_and_live_jobs_come_back_in_queue_order(tmp_path: Path) -> None:
    j = Journal(f"sqlite:///{tmp_path / 'j.db'}")
    j.record(rec(name="x", phase=Phase.CANCELLED, reason="deleted"), now=1)
    j.record(rec(name="x", phase=Phase.PENDING, reason="queued"), now=2)  # terminal: ignored
    j.record(rec(name="late", submit=30), now=30)
    j.record(rec(name="early", submit=20), now=30)
    j.record(rec(name="urgent", submit=40, priority=9), now=40)
    assert j.drain()
    x = j.store.find("ns", "x", "u-x")
    assert x is not None and str(x.state) == "cancelled"
    assert [r.name for r in j.live_jobs()] == ["urgent", "early", "late"]
    j.cancel(j.live_jobs()[0].id, now=50, reason="its objects are gone")
    j.close()
    assert [r.name for r in j.live_jobs()] == ["early", "late"]


def test_a_completion_with_no_known_allocation_still_ends_the_row(tmp_path: Path) -> None:
    """Found finished after a restart with its pods gone: where it ran is unknown, but its
    row must end (a live row would be read back and queued again after the next restart)."""
    j = Journal(f"sqlite:///{tmp_path / 'j.db'}")
    j.record(rec(), now=10)
    j.record(rec(phase=Phase.COMPLETED, reason="Job completed before this operator allocated it"), now=20)
    j.close()
    r = j.store.find("ns", "job-a", "u-job-a")
    assert r is not None and str(r.state) == "cancelled"
    assert j.live_jobs() == []


def test_no_write_goes_out_once_the_leader_fence_has_closed(tmp_path: Path) -> None:
    """A leader that lost its lease (or stops) must not write late: another replica may lead."""
    from fluxnetes.k8s.kube import Fence

    fence = Fence()
    fence.extend(10**9)
    j = Journal(f"sqlite:///{tmp_path / 'j.db'}", fence=lambda: fence)
    j.record(rec(name="before"), now=1)
    assert j.drain()
    fence.close()
    j.record(rec(name="after"), now=2)
    j.record(rec(name="before", phase=Phase.RUNNING, reason="allocated", start=2, shares=SHARES), now=2)
    assert j.drain()  # the drain marker itself is not a write: it still answers
    j.close()
    before = j.store.find("ns", "before", "u-before")
    assert before is not None and str(before.state) == "pending"
    assert j.store.find("ns", "after", "u-after") is None
    assert j.dropped == 2
