"""The operator's store journal (SQLite; no cluster)."""

from __future__ import annotations

from pathlib import Path

from fluxnetes.k8s.fluxjob import Phase
from fluxnetes.k8s.journal import Journal
from fluxnetes.k8s.shares import Share


def test_journal_records_phases_allocations_and_releases(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'j.db'}"
    j = Journal(url)
    common = dict(namespace="ns", name="job-a", uid="u1", kind="Job", jobspec="version: 1", size=2,
                  duration=60, priority=0)
    j.phase(**common, phase=Phase.PENDING, reason="queued", now=10)
    j.phase(**common, phase=Phase.RUNNING, reason="allocated", now=11, at=11,
            shares=[Share("n1", cores=2, memory=100), Share("n2", cores=2, memory=100)])
    j.release_nodes(namespace="ns", name="job-a", uid="u1", nodes=["n1"], now=12, reason="pods ended")
    j.phase(**common, phase=Phase.COMPLETED, reason="all pods finished", now=13)
    j.close()
    rec = j.store.find("ns", "job-a", "u1")
    assert rec is not None and str(rec.state) == "completed"
    assert [str(e.to_state) for e in j.store.events(rec.id)] == ["provisional", "pending", "running", "completed"]
    assert all(a.job_id != rec.id for a in j.store.allocations())  # released with the job


def test_journal_survives_illegal_transitions(tmp_path: Path) -> None:
    j = Journal(f"sqlite:///{tmp_path / 'j.db'}")
    common = dict(namespace="ns", name="pod-x", uid="p1", kind="Pod", jobspec="", size=1, duration=0, priority=0)
    j.phase(**common, phase=Phase.CANCELLED, reason="deleted", now=1)
    j.phase(**common, phase=Phase.PENDING, reason="queued", now=2)  # terminal: logged, ignored
    j.close()
    rec = j.store.find("ns", "pod-x", "p1")
    assert rec is not None and str(rec.state) == "cancelled"
