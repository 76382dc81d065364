"""Store: schema and migrations, transitions, submissions, groups, allocations — on SQLite and
on PostgreSQL (the PostgreSQL cases skip only when FLUXNETES_TEST_PG_URL is unset)."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from fluxnetes.store import (
    TRANSITIONS,
    IllegalTransition,
    JobState,
    NodeAmount,
    Store,
    StoreConfigError,
    Submission,
    SubmissionError,
    check_transition,
    check_url,
)
from helpers import cli_app
from test_store_helpers import jobspec_text


def sub(name: str, **kw: object) -> Submission:
    return Submission(namespace="ns", name=name, jobspec=jobspec_text(1, 1, 60), **kw)  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- schema


def test_migrations_create_the_models_schema_and_are_idempotent(store: Store) -> None:
    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext

    from fluxnetes.store.db import current_revision, head_revision
    from fluxnetes.store.models import Base

    assert current_revision(store.engine) == head_revision()
    with store.engine.connect() as c:
        diff = compare_metadata(
            MigrationContext.configure(c, opts={"compare_type": True}), Base.metadata
        )
    assert diff == []
    store.migrate()  # again: nothing to do, nothing lost
    store.ping()


def test_migrations_run_from_the_installed_package_without_alembic_ini(tmp_path: Path) -> None:
    import fluxnetes.store

    mig = Path(fluxnetes.store.__file__).parent / "migrations" / "versions"
    assert any(p.name.endswith("_initial.py") for p in mig.iterdir())
    s = Store.open(f"sqlite:///{tmp_path / 'deep' / 'dir' / 'x.db'}")  # parent dirs created
    s.ping()


def test_ping_reports_unmigrated_schema_as_not_ready(tmp_path: Path) -> None:
    from fluxnetes.store import StoreUnavailable

    s = Store(f"sqlite:///{tmp_path / 'x.db'}")
    with pytest.raises(StoreUnavailable, match="migrations have not run"):
        s.ping()


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("mysql://u@h/db", "unsupported database 'mysql'"),
        ("postgresql://u@h/db", "psycopg driver"),
        ("not a url", "malformed"),
    ],
)
def test_bad_store_urls_are_rejected_with_the_rule(url: str, message: str) -> None:
    with pytest.raises(StoreConfigError, match=message):
        check_url(url)


def test_settings_default_to_a_sqlite_file_in_the_user_data_dir(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from pydantic import ValidationError

    from fluxnetes.config import Settings

    default = Settings.from_env({})
    assert default.store_url.startswith("sqlite:///") and default.store_url.endswith("fluxnetes.db")
    assert "fluxnetes" in default.store_url
    given = Settings.from_env({"FLUXNETES_STORE_URL": "postgresql+psycopg://u@h:5/db"})
    assert given.store_url == "postgresql+psycopg://u@h:5/db"
    with pytest.raises(ValidationError, match="unsupported database"):
        Settings.from_env({"FLUXNETES_STORE_URL": "mysql://x/y"})


# ----------------------------------------------------------------------------- transitions


def test_transition_table_is_complete_and_terminal_states_are_final() -> None:
    assert set(TRANSITIONS) == set(JobState)
    for a, b in itertools.product(JobState, JobState):
        if b in TRANSITIONS[a]:
            check_transition("j", a, b)
        else:
            with pytest.raises(IllegalTransition) as e:
                check_transition("j", a, b)
            assert f"{a.value} -> {b.value}" in str(e.value)
    for terminal in (
        JobState.COMPLETED,
        JobState.FAILED,
        JobState.CANCELLED,
        JobState.UNSATISFIABLE,
    ):
        assert TRANSITIONS[terminal] == frozenset()
    # the path
    assert JobState.PENDING in TRANSITIONS[JobState.PROVISIONAL]
    assert {JobState.RESERVED, JobState.RUNNING, JobState.UNSATISFIABLE} <= TRANSITIONS[
        JobState.PENDING
    ]
    assert {JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED} <= TRANSITIONS[
        JobState.RUNNING
    ]


def test_illegal_transition_names_both_states_and_changes_nothing(store: Store) -> None:
    job = store.submit(sub("a"), now=10)
    store.transition(job.id, JobState.CANCELLED, now=11, reason="owner deleted")
    before = store.events(job.id)
    with pytest.raises(IllegalTransition, match="cancelled -> pending"):
        store.transition(job.id, JobState.PENDING, now=12)
    after = store.get(job.id)
    assert after.state is JobState.CANCELLED and after.end_time == 11
    assert store.events(job.id) == before


def test_pending_cannot_complete_without_running(store: Store) -> None:
    job = store.submit(sub("a"), now=10)
    with pytest.raises(IllegalTransition, match="pending -> completed"):
        store.transition(job.id, JobState.COMPLETED, now=11)


def test_running_needs_an_allocation_and_leaving_it_releases_it(store: Store) -> None:
    job = store.submit(sub("a"), now=10)
    with pytest.raises(SubmissionError, match="needs an allocation"):
        store.transition(job.id, JobState.RUNNING, now=11)
    store.start(job.id, 12, at=12, duration=60, nodes=[NodeAmount("n1", cores=2)], r={"version": 1})
    rec = store.get(job.id)
    assert rec.state is JobState.RUNNING and rec.start_time == 12 and rec.matcher_jobid == job.id
    [alloc] = store.allocations()
    assert alloc.job_id == job.id and alloc.nodes[0].cores == 2 and alloc.r == {"version": 1}
    store.transition(job.id, JobState.COMPLETED, now=70, reason="pods succeeded")
    assert store.allocations() == []
    done = store.get(job.id)
    assert done.state is JobState.COMPLETED and done.end_time == 70
    assert [(e.from_state, e.to_state) for e in store.events(job.id)] == [
        (None, JobState.PENDING),
        (JobState.PENDING, JobState.RUNNING),
        (JobState.RUNNING, JobState.COMPLETED),
    ]


def test_requeue_of_a_running_job_releases_and_allows_a_new_start(store: Store) -> None:
    job = store.submit(sub("a"), now=1)
    store.start(job.id, 2, at=2, duration=0, nodes=[NodeAmount("n1", cores=1)])
    store.transition(job.id, JobState.PENDING, 3, "node lost")
    assert store.allocations() == [] and store.get(job.id).start_time is None
    store.start(job.id, 4, at=4, duration=0, nodes=[NodeAmount("n2", cores=1)])
    [alloc] = store.allocations()
    assert [n.name for n in alloc.nodes] == ["n2"]


def test_partial_release_keeps_the_rest_and_the_last_node_completes(store: Store) -> None:
    job = store.submit(sub("a", size=3), now=1)
    store.start(
        job.id,
        2,
        at=2,
        duration=0,
        nodes=[NodeAmount("n1", cores=1), NodeAmount("n2", cores=1), NodeAmount("n3", cores=1)],
    )
    assert store.release_nodes(job.id, ["n1"], 3) == 2
    [alloc] = store.allocations()
    assert [n.name for n in alloc.nodes] == ["n2", "n3"] and alloc.revision == 1
    assert store.release_nodes(job.id, ["n2", "n3"], 4) == 0
    assert store.get(job.id).state is JobState.COMPLETED
    assert store.allocations() == []


# ----------------------------------------------------------------------------- submissions


def test_submit_many_is_batched_ordered_and_idempotent(store: Store) -> None:
    subs = [sub(f"j{i}", priority=i % 3) for i in range(1_203)]  # crosses batch boundaries
    ids = store.submit_many(subs, now=5)
    assert len(set(ids)) == len(subs)
    assert [store.get(i).name for i in ids[:3]] == ["j0", "j1", "j2"]
    again = store.submit_many([subs[7], sub("new"), subs[1_200]], now=6)
    assert again[0] == ids[7] and again[2] == ids[1_200] and again[1] not in ids
    assert store.counts()[JobState.PENDING] == len(subs) + 1
    assert len(store.events()) == len(subs) + 1  # one "submitted" event per new group only


def test_same_name_with_a_new_uid_is_a_new_group(store: Store) -> None:
    a = store.submit(sub("a", uid="u1"), now=1)
    b = store.submit(sub("a", uid="u2"), now=2)
    assert a.id != b.id


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        ({"size": 0}, "submission.size"),
        ({"duration": -1}, "submission.duration"),
        ({"name": ""}, "submission.name"),
        ({"namespace": "x" * 300}, "submission.namespace"),
    ],
)
def test_bad_submissions_name_the_field(store: Store, kw: dict[str, object], field: str) -> None:
    args: dict[str, object] = {"namespace": "ns", "name": "a", "jobspec": "{}"}
    args.update(kw)
    with pytest.raises(SubmissionError, match=field):
        store.submit(Submission(**args), now=1)  # type: ignore[arg-type]
    assert store.jobs() == []


def test_group_is_provisional_until_all_its_pods_were_seen(store: Store) -> None:
    group = sub("g", size=3, kind="Job")
    job, seen = store.observe_member(group, "pod-a", now=1)
    assert job.state is JobState.PROVISIONAL and seen == 1
    job, seen = store.observe_member(group, "pod-a", now=2)  # the same pod again
    assert job.state is JobState.PROVISIONAL and seen == 1
    job, seen = store.observe_member(group, "pod-b", now=3)
    assert job.state is JobState.PROVISIONAL and seen == 2
    job, seen = store.observe_member(group, "pod-c", now=4)
    assert job.state is JobState.PENDING and seen == 3 and job.submit_time == 4
    assert store.members(job.id) == ["pod-a", "pod-b", "pod-c"]
    assert [e.to_state for e in store.events(job.id)] == [JobState.PROVISIONAL, JobState.PENDING]
    # a late extra pod neither adds a member nor changes state
    job2, seen = store.observe_member(group, "pod-d", now=5)
    assert job2.id == job.id and job2.state is JobState.PENDING and seen == 3


# ----------------------------------------------------------------------------- CLI


def test_store_cli_migrate_status_and_jobs(store_url: str) -> None:
    import json

    from typer.testing import CliRunner

    from fluxnetes.cli import store_cmd

    app = cli_app(store_cmd)
    runner = CliRunner()
    res = runner.invoke(app, ["store", "migrate", "--store", store_url])
    assert res.exit_code == 0, res.output
    from fluxnetes.store.db import head_revision

    assert f"revision {head_revision()}" in res.output
    s = Store(store_url)
    s.submit(sub("visible"), now=3)
    s.close()
    res = runner.invoke(app, ["store", "status", "--store", store_url, "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert doc["jobs"]["pending"] == 1 and doc["revision"] == doc["head"]
    res = runner.invoke(app, ["store", "jobs", "--store", store_url, "--state", "pending"])
    assert res.exit_code == 0 and "ns/visible" in res.output
    res = runner.invoke(app, ["store", "jobs", "--store", store_url, "--state", "bogus"])
    assert res.exit_code == 1 and "--state: 'bogus' is not one of" in res.output
    res = runner.invoke(app, ["store", "status", "--store", "mysql://u@h/db"])
    assert res.exit_code == 1 and "unsupported database" in res.output


def test_transition_many_is_all_or_nothing(store: Store) -> None:
    ids = store.submit_many([sub(f"j{i}") for i in range(5)], now=1)
    store.start(ids[0], 2, at=2, duration=0, nodes=[NodeAmount("n1", cores=1)])
    store.transition(ids[4], JobState.CANCELLED, 2)
    with pytest.raises(IllegalTransition, match="cancelled -> failed"):
        store.transition_many(ids, JobState.FAILED, 3, "node lost")
    assert [store.get(i).state for i in ids] == [JobState.RUNNING] + [JobState.PENDING] * 3 + [
        JobState.CANCELLED
    ]
    store.transition_many(ids[:4], JobState.FAILED, 4, "node lost")
    assert all(
        store.get(i).state is JobState.FAILED and store.get(i).end_time == 4 for i in ids[:4]
    )
    assert store.allocations() == []  # the running one gave its resources back
    assert [e.to_state for e in store.events(ids[0])][-1] is JobState.FAILED


def test_a_pod_leaving_a_provisional_group_no_longer_counts(store: Store) -> None:
    group = sub("g", size=2)
    job, _ = store.observe_member(group, "a", now=1)
    assert store.forget_member(job.id, "a", now=2) == 0
    job, seen = store.observe_member(group, "b", now=3)
    assert job.state is JobState.PROVISIONAL and seen == 1
    job, seen = store.observe_member(group, "c", now=4)
    assert job.state is JobState.PENDING and store.members(job.id) == ["b", "c"]
    assert store.forget_member(job.id, "b", now=5) == 2  # complete groups keep their members
