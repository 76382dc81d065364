"""Helpers for the store tests: a real matcher on a small graph, jobspec texts, a per-test
PostgreSQL database, and the worker process the crash and concurrency tests run. No tests here."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import uuid
from collections.abc import Iterator
from typing import Any


def jobspec_text(nodes: int, cores: int, duration: int) -> str:
    """A jobspec V1: ``nodes`` nodes, one slot of ``cores`` cores on each."""
    return json.dumps(
        {
            "version": 1,
            "resources": [
                {
                    "type": "node",
                    "count": nodes,
                    "with": [
                        {
                            "type": "slot",
                            "count": 1,
                            "label": "task",
                            "with": [{"type": "core", "count": cores}],
                        }
                    ],
                }
            ],
            "tasks": [{"command": ["app"], "slot": "task", "count": {"per_slot": 1}}],
            "attributes": {"system": {"duration": duration}},
        }
    )


def make_matcher(nodes: int, cores: int) -> Any:
    """A fresh real Matcher on ``nodes`` nodes of ``cores`` cores (node0..nodeN-1)."""
    from fluxnetes.graph import from_description
    from fluxnetes.match import Matcher

    return Matcher(from_description({"cluster": "test0", "node": {"cores": cores}, "nodes": nodes}))


def matcher_use(matcher: Any) -> dict[str, int]:
    """Cores the matcher holds for allocations (not reservations), per node."""
    matcher.check_invariants()
    out: dict[str, int] = {}
    for rec in matcher.jobs.values():
        if not rec.reserved:
            for n in rec.nodes:
                out[n.name] = out.get(n.name, 0) + n.cores
    return out


def recorded_use(store: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for a in store.allocations():
        for n in a.nodes:
            out[n.name] = out.get(n.name, 0) + n.cores
    return out


# ----------------------------------------------------------------------------- PostgreSQL


def pg_url() -> str | None:
    return os.environ.get("FLUXNETES_TEST_PG_URL") or None


def fresh_pg_database() -> Iterator[str]:
    """A new empty database on the test server (dropped afterwards)."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    base = pg_url()
    assert base
    name = "fx_" + uuid.uuid4().hex[:12]
    admin = create_engine(base, isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        c.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield make_url(base).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as c:
            c.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


# ----------------------------------------------------------------------------- worker


def worker_main(
    url: str, nodes: int, cores: int, total: int, batch: int, seed: int, step: bool = False
) -> None:
    """A stream of submissions interleaved with cycles and completions, at a fake clock that
    advances one second per step. Resubmits from the start (submissions are idempotent), so
    running it again after a SIGKILL continues where the store says it stopped.

    With ``step`` the worker waits for a line on stdin after each round: a test that kills it
    then knows it is still inside the stream, however slow or fast the machine is."""
    import random
    import sys

    from fluxnetes.queue.policy import QueuePolicy
    from fluxnetes.store import IllegalTransition, JobState, Store, Submission
    from fluxnetes.store.service import QueueService

    rng = random.Random(seed)
    store = Store.open(url)
    # time never goes backwards across restarts: continue after the last recorded change
    clock = {"t": max((j.updated_time for j in store.jobs()), default=1_000) + 1}
    svc = QueueService(
        store,
        lambda: make_matcher(nodes, cores),
        clock=lambda: clock["t"],
        policy=QueuePolicy(name="easy", queue_depth=16),
    )
    subs = [
        Submission(
            "crash",
            f"job{i}",
            jobspec_text(rng.randint(1, 2), rng.randint(1, cores), 0),
            size=1,
            duration=0,
        )
        for i in range(total)
    ]
    for start in range(0, total, batch):
        clock["t"] += 1
        store.submit_many(subs[start : start + batch], clock["t"])
        svc.run_cycle()
        for job in store.jobs([JobState.RUNNING]):
            if rng.random() < 0.5:
                # another worker may have completed it first
                with contextlib.suppress(IllegalTransition):
                    store.transition(job.id, JobState.COMPLETED, clock["t"], "finished")
        print(f"round {start // batch}", flush=True)
        if step:
            sys.stdin.readline()
    print("worker done", flush=True)


if __name__ == "__main__":
    import sys

    a = sys.argv[1:]
    worker_main(a[0], int(a[1]), int(a[2]), int(a[3]), int(a[4]), int(a[5]), "step" in a[6:])


def check_store(store: Any, nodes: int, cores: int) -> None:
    """Invariants after any crash: each group once, every job's events form a legal chain that
    ends in its current state, at most one start per job run, no node overcommitted, and a
    fresh matcher takes every recorded allocation (resources recorded == resources in use)."""
    from fluxnetes.store import JobState, check_transition
    from fluxnetes.store.service import QueueService

    jobs = store.jobs()
    keys = [(j.namespace, j.name, j.uid) for j in jobs]
    assert len(keys) == len(set(keys)), "a group is present twice"
    by_job: dict[int, list[Any]] = {}
    for e in store.events():
        by_job.setdefault(e.job_id, []).append(e)
    for j in jobs:
        evs = by_job[j.id]
        assert evs[0].from_state is None
        for prev, cur in itertools.pairwise(evs):
            assert cur.from_state == prev.to_state, f"job {j.id}: broken event chain"
            check_transition(str(j.id), cur.from_state, cur.to_state)
        assert evs[-1].to_state == j.state, f"job {j.id}: state {j.state} but last event {evs[-1]}"
        starts = sum(1 for e in evs if e.to_state is JobState.RUNNING)
        requeues = sum(
            1 for e in evs if e.from_state is JobState.RUNNING and e.to_state is JobState.PENDING
        )
        assert starts <= 1 + requeues, f"job {j.id} started twice"
    allocs = store.allocations()
    assert sorted(a.job_id for a in allocs) == sorted(
        j.id for j in jobs if j.state is JobState.RUNNING
    )
    use = recorded_use(store)
    assert all(v <= cores for v in use.values()), f"overcommitted: {use}"
    svc = QueueService(store, lambda: make_matcher(nodes, cores), clock=lambda: 0)
    svc.recover()
    assert svc.replay_errors == {}
    assert matcher_use(svc.matcher) == use
