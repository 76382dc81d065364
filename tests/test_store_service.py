"""The queue service on the store: cycles persist decisions, the matcher is rebuilt from the
store, failures roll back, outages are survived. SQLite and PostgreSQL."""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fluxnetes.queue.policy import QueuePolicy
from fluxnetes.store import JobState, Store, StoreUnavailable, Submission
from fluxnetes.store.service import QueueService, wait_for_store
from fluxnetes.store.transitions import lock_job
from test_store_helpers import (
    fresh_pg_database,
    jobspec_text,
    make_matcher,
    matcher_use,
    pg_url,
    recorded_use,
)

NODES, CORES = 4, 4


pytestmark = pytest.mark.usefixtures("unfreeze_gc")


class Clock:
    def __init__(self, t: int = 100) -> None:
        self.t = t

    def __call__(self) -> int:
        return self.t


def service(store: Store, clock: Clock, policy: str = "easy", depth: int = 32) -> QueueService:
    return QueueService(
        store,
        lambda: make_matcher(NODES, CORES),
        clock=clock,
        policy=QueuePolicy(name=policy, queue_depth=depth),  # type: ignore[arg-type]
    )


def job(name: str, nodes: int = 1, cores: int = 4, duration: int = 100, **kw: Any) -> Submission:
    return Submission("ns", name, jobspec_text(nodes, cores, duration), duration=duration, **kw)


def test_cycle_starts_what_fits_reserves_the_next_and_records_allocations(store: Store) -> None:
    clock = Clock()
    svc = service(store, clock)
    ids = store.submit_many([job(f"j{i}") for i in range(6)], clock())
    report = svc.run_cycle()
    assert report.rebuilt and sorted(report.started) == ids[:4]
    assert report.reserved == {ids[4]: 200}  # easy: one reservation, at the first end
    assert store.get(ids[4]).state is JobState.RESERVED and store.get(ids[4]).expected_start == 200
    assert store.get(ids[5]).state is JobState.PENDING
    assert recorded_use(store) == {f"node{i}": 4 for i in range(4)}
    assert matcher_use(svc.matcher) == recorded_use(store)  # the matcher holds no reservation
    # a job finishes (recorded by someone else, e.g. the operator): the next cycle uses it
    store.transition(ids[0], JobState.COMPLETED, 150, "pods succeeded")
    clock.t = 150
    report = svc.run_cycle()
    assert report.started == [ids[4]] and not report.rebuilt
    assert store.get(ids[4]).state is JobState.RUNNING
    assert matcher_use(svc.matcher) == recorded_use(store)
    evs = [(e.from_state, e.to_state) for e in store.events(ids[4])]
    assert evs == [
        (None, JobState.PENDING),
        (JobState.PENDING, JobState.RESERVED),
        (JobState.RESERVED, JobState.RUNNING),
    ]


def test_a_new_service_rebuilds_the_graph_from_recorded_allocations(store: Store) -> None:
    clock = Clock()
    ids = store.submit_many([job(f"j{i}", cores=2) for i in range(12)], clock())
    first = service(store, clock).run_cycle()
    assert len(first.started) == 8
    # "restart": a new process with a fresh matcher
    svc = service(store, clock)
    assert svc.recover() == 8
    assert matcher_use(svc.matcher) == recorded_use(store)
    report = svc.run_cycle()
    assert report.started == []  # nothing started twice, nothing double-booked
    running = store.jobs([JobState.RUNNING])
    assert sorted(j.id for j in running) == sorted(ids[:8])
    for j in running:
        assert sum(1 for e in store.events(j.id) if e.to_state is JobState.RUNNING) == 1


def test_a_failure_before_commit_changes_nothing_and_the_next_cycle_rebuilds(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = Clock()
    ids = store.submit_many([job(f"j{i}") for i in range(3)], clock())
    svc = service(store, clock)
    real = store.persist_decisions

    def boom(*a: Any, **kw: Any) -> None:
        real(*a, **kw)  # the writes happen, then the transaction dies before commit
        raise RuntimeError("crash before commit")

    monkeypatch.setattr(store, "persist_decisions", boom)
    with pytest.raises(RuntimeError):
        svc.run_cycle()
    assert svc.matcher is None  # memory is not trusted after a failure
    assert all(store.get(i).state is JobState.PENDING for i in ids)
    assert store.allocations() == []
    monkeypatch.setattr(store, "persist_decisions", real)
    report = svc.run_cycle()
    assert report.rebuilt and sorted(report.started) == ids
    assert matcher_use(svc.matcher) == recorded_use(store)


def test_unsatisfiable_and_invalid_jobs_leave_the_queue_with_a_reason(store: Store) -> None:
    clock = Clock()
    [big, bad, ok] = store.submit_many(
        [job("big", nodes=9), Submission("ns", "bad", "version: 1\nresources: 3\n"), job("ok")],
        clock(),
    )
    report = service(store, clock).run_cycle()
    assert report.started == [ok]
    assert store.get(big).state is JobState.UNSATISFIABLE and store.get(big).reason
    failed = store.get(bad)
    assert failed.state is JobState.FAILED and "invalid jobspec" in failed.reason
    assert "resources" in failed.reason


def test_dropped_reservation_goes_back_to_pending(store: Store) -> None:
    clock = Clock()
    ids = store.submit_many([job(f"j{i}") for i in range(5)], clock())
    svc = service(store, clock)
    svc.run_cycle()
    assert store.get(ids[4]).state is JobState.RESERVED
    store.submit(job("urgent", priority=10), clock())  # now first in line: it takes the reservation
    clock.t = 101
    report = svc.run_cycle()
    assert ids[4] not in report.reserved
    assert store.get(ids[4]).state is JobState.PENDING
    assert store.find("ns", "urgent").state is JobState.RESERVED  # type: ignore[union-attr]


def test_cycle_loads_only_queue_depth_jobs(store: Store) -> None:
    clock = Clock()
    store.submit_many([job(f"j{i}", cores=1) for i in range(40)], clock())
    report = service(store, clock, policy="fcfs", depth=5).run_cycle()
    assert report.considered == 5 and len(report.started) == 5
    assert store.counts()[JobState.PENDING] == 35


# ----------------------------------------------------------------------------- outages


def test_database_down_is_logged_not_ready_and_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"postgresql+psycopg://nobody:secret@127.0.0.1:{port}/none"
    store = Store(url)
    svc = QueueService(store, lambda: make_matcher(1, 1), clock=Clock())
    with caplog.at_level(logging.WARNING, logger="fluxnetes.store"):
        assert svc.step() is None
        assert svc.step() is None
    assert svc.ready is False and "unavailable" in svc.last_error
    assert "secret" not in caplog.text and "unavailable" in caplog.text
    assert caplog.text.count("scheduling paused") == 1  # one line per outage, not per retry
    sleeps: list[float] = []
    with caplog.at_level(logging.WARNING, logger="fluxnetes.store"):
        assert wait_for_store(url, sleep=sleeps.append, attempts=4) is None
    assert sleeps == [0.5, 1.0, 2.0]  # exponential backoff


class Proxy:
    """A TCP forwarder we can cut and restore, to take the database away mid-run."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.lsock = socket.socket()
        self.lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.lsock.bind(("127.0.0.1", 0))
        self.lsock.listen(50)
        self.port = self.lsock.getsockname()[1]
        self.up = True
        self.conns: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                c, _ = self.lsock.accept()
            except OSError:
                return
            if not self.up:
                c.close()
                continue
            u = socket.create_connection(self.target)
            self.conns += [c, u]
            for a, b in ((c, u), (u, c)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(a: socket.socket, b: socket.socket) -> None:
        try:
            while data := a.recv(65536):
                b.sendall(data)
        except OSError:
            pass
        finally:
            for s in (a, b):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def cut(self) -> None:
        self.up = False
        for c in self.conns:
            with contextlib.suppress(OSError):
                c.shutdown(socket.SHUT_RDWR)
            c.close()
        self.conns.clear()

    def close(self) -> None:
        self.cut()
        self.lsock.close()


@pytest.mark.postgres
@pytest.mark.skipif(pg_url() is None, reason="FLUXNETES_TEST_PG_URL is not set")
def test_postgres_outage_mid_run_pauses_then_resumes_without_losing_jobs() -> None:
    from sqlalchemy.engine import make_url

    for url in fresh_pg_database():
        u = make_url(url)
        proxy = Proxy((u.host or "127.0.0.1", u.port or 5432))
        try:
            store = Store.open(u.set(host="127.0.0.1", port=proxy.port).render_as_string(False))
            clock = Clock()
            svc = service(store, clock)
            ids = store.submit_many([job(f"j{i}") for i in range(6)], clock())
            assert len(svc.run_cycle().started) == 4
            proxy.cut()
            clock.t = 150  # the first jobs still hold their nodes
            assert svc.step() is None and svc.ready is False
            with pytest.raises(StoreUnavailable):
                store.submit(job("during-outage"), clock())
            proxy.up = True
            report = svc.step()
            assert report is not None and svc.ready is True
            assert report.rebuilt  # the failed cycle dropped the in-memory state
            states = {store.get(i).state for i in ids}
            assert states <= {JobState.RUNNING, JobState.RESERVED, JobState.PENDING}
            assert store.counts()[JobState.RUNNING] == 4
            assert matcher_use(svc.matcher) == recorded_use(store)
            store.close()
        finally:
            proxy.close()


def test_busy_answers_are_reused_within_a_cycle_without_changing_decisions(store: Store) -> None:
    """On a full cluster, requests dominated by one already BUSY in the cycle are not asked
    again; the decisions are the ones the plain cycle makes on an identical matcher."""
    from fluxnetes.queue.cycle import schedule_cycle
    from fluxnetes.queue.job import QueuedJob
    from fluxnetes.store.service import _IdMatcher, _Tagged

    clock = Clock()
    subs = [job(f"fill{i}", cores=3) for i in range(4)]  # 1 core left on each node
    subs += [job(f"w{i}", cores=2, duration=50 + i) for i in range(10)]  # BUSY, longer and longer
    subs += [job("small", cores=1, duration=500)]  # fits in the leftovers
    subs += [job("short", cores=2, duration=10)]  # shorter than any BUSY one: must be asked
    subs += [job("bigger", nodes=2, cores=2, duration=60)]  # more of everything: known BUSY
    ids = store.submit_many(subs, clock())
    calls: list[int] = []

    class Spy:
        def __init__(self) -> None:
            self.m = make_matcher(NODES, CORES)

        def allocate(self, js: Any, **kw: Any) -> Any:
            calls.append(kw["jobid"])
            return self.m.allocate(js, **kw)

        def __getattr__(self, name: str) -> Any:
            return getattr(self.m, name)

    svc = QueueService(store, Spy, clock=clock, policy=QueuePolicy(name="easy", queue_depth=100))
    report = svc.run_cycle()
    # reference: the plain cycle on a fresh matcher, no reuse
    from fluxnetes.jobspec import parse_jobspec

    ref_matcher = make_matcher(NODES, CORES)
    queued = [
        QueuedJob(id=str(i), jobspec=_Tagged(parse_jobspec(s.jobspec), i), submit_time=100)
        for i, s in zip(ids, subs, strict=True)
    ]

    class Plain(_IdMatcher):
        def allocate(self, jobspec: Any, *, now: int, jobid: Any = None) -> Any:
            return self._inner.allocate(jobspec.spec, now=now, jobid=jobspec.job_id)

    ref = schedule_cycle(queued, Plain(ref_matcher), 100, QueuePolicy(name="easy", queue_depth=100))
    assert sorted(report.started) == sorted(int(j.id) for j, _ in ref.started)
    assert report.reserved == {int(j.id): r.at for j, r in ref.reserved}
    assert ids[-3] in report.started  # "small" fit the leftovers
    # w0 took easy's one reservation; w1 was asked and was BUSY; w2..w9 (same request,
    # longer) and "bigger" (more nodes, longer) were answered from it; "short" was asked
    busy_calls = [c for c in calls if c in ids[4:14] or c in ids[-2:]]
    assert busy_calls == [ids[5], ids[-2]]
    assert store.get(ids[-1]).state is JobState.PENDING


def test_a_simulation_can_be_recorded_in_the_store(store: Store) -> None:
    from dataclasses import dataclass

    from fluxnetes.jobspec import parse_jobspec
    from fluxnetes.store.recorder import StoreRecorder

    @dataclass(frozen=True)
    class SimJob:  # the fields of fluxnetes.sim.engine.SimJob the recorder reads
        id: str
        estimate: int
        priority: int = 0

    matcher = make_matcher(NODES, CORES)
    rec = StoreRecorder(store, jobspec_for=lambda j: jobspec_text(1, 4, j.estimate))
    a, b, c = SimJob("1", 100), SimJob("2", 50), SimJob("3", 0)
    for j in (a, b, c):
        rec.on_submit(j, 10)
    alloc = matcher.allocate(parse_jobspec(jobspec_text(1, 4, 100)), now=10, jobid=1)
    rec.on_start(a, 10, alloc)
    rec.on_reject(c, 10, "needs 9 nodes")
    rec.on_start(b, 20, matcher.allocate(parse_jobspec(jobspec_text(1, 4, 50)), now=20, jobid=2))
    rec.on_end(a, 110)
    rec.close()
    ja, jb, jc = (store.get(rec.ids[x]) for x in "123")
    assert (ja.state, ja.start_time, ja.end_time) == (JobState.COMPLETED, 10, 110)
    assert jb.state is JobState.RUNNING and jc.state is JobState.UNSATISFIABLE
    assert jc.reason == "needs 9 nodes"
    [live] = store.allocations()
    assert live.job_id == jb.id and live.nodes[0].cores == 4 and live.r["version"] == 1


@settings(max_examples=300, deadline=None)
@given(
    jobs=st.lists(
        st.tuples(st.integers(1, 3), st.integers(1, 4), st.integers(0, 200)),
        min_size=1,
        max_size=25,
    ),
    policy=st.sampled_from(["fcfs", "easy", "conservative", "hybrid"]),
)
def test_busy_reuse_never_changes_a_decision(jobs: list[tuple[int, int, int]], policy: str) -> None:
    """Property: the service's matcher wrapper and the bare matcher give the same cycle."""
    from fluxnetes.jobspec import parse_jobspec
    from fluxnetes.queue.cycle import schedule_cycle
    from fluxnetes.queue.job import QueuedJob
    from fluxnetes.store.service import _IdMatcher, _Tagged

    class Plain(_IdMatcher):
        def allocate(self, jobspec: Any, *, now: int, jobid: Any = None) -> Any:
            return self._inner.allocate(jobspec.spec, now=now, jobid=jobspec.job_id)

    def run(wrapper: type[_IdMatcher]) -> tuple[list[tuple[int, int, list[str]]], list[int]]:
        m = make_matcher(NODES, CORES)
        queued = [
            QueuedJob(
                id=str(i + 1),
                jobspec=_Tagged(parse_jobspec(jobspec_text(n, c, d)), i + 1),
                submit_time=i,
            )
            for i, (n, c, d) in enumerate(jobs)
        ]
        res = schedule_cycle(queued, wrapper(m), 0, QueuePolicy(name=policy, queue_depth=None))  # type: ignore[arg-type]
        placed = [
            (int(j.id), int(r.at), sorted(n.name for n in r.nodes))
            for j, r in [*res.started, *res.reserved]
        ]
        return placed, sorted(int(j.id) for j, _ in res.unsatisfiable)

    assert run(_IdMatcher) == run(Plain)


@pytest.mark.postgres
@pytest.mark.skipif(pg_url() is None, reason="FLUXNETES_TEST_PG_URL is not set")
def test_postgres_one_cycle_at_a_time_and_rows_being_changed_are_skipped() -> None:
    for url in fresh_pg_database():
        a, b = Store.open(url), Store(url)
        clock = Clock()
        ids = a.submit_many([job(f"j{i}", cores=1) for i in range(3)], clock())
        with a.cycle_session() as held:  # process A is in the middle of a cycle
            assert held is not None
            report = service(b, clock).run_cycle()
            assert report.skipped and report.started == []
        with a.session() as s:  # A is changing j0 (e.g. cancelling it) right now
            lock_job(s, a.backend, ids[0])
            report = service(b, clock).run_cycle()
            assert sorted(report.started) == ids[1:]  # j0 is left for the next cycle
        assert b.get(ids[0]).state is JobState.PENDING
        report = service(b, clock).run_cycle()
        assert report.started == [ids[0]]
        a.close()
        b.close()


def test_run_loop_cycles_until_stopped_and_survives_an_outage(tmp_path: Path) -> None:
    store = Store.open(f"sqlite:///{tmp_path / 'run.db'}")
    clock = Clock()
    ids = store.submit_many([job(f"j{i}", cores=1) for i in range(3)], clock())
    svc = service(store, clock)
    stop = threading.Event()
    reports: list[Any] = []

    def on_cycle(report: Any) -> None:
        reports.append(report)
        if len(reports) >= 2:
            stop.set()

    svc.run(stop, interval=0.01, on_cycle=on_cycle)
    assert sorted(reports[0].started) == ids and svc.ready
    # the database goes away: the loop keeps retrying (not ready) until stopped, no exception
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    down = QueueService(
        Store(f"postgresql+psycopg://x@127.0.0.1:{port}/db"),
        lambda: make_matcher(1, 1),
        clock=clock,
    )
    stop = threading.Event()
    t = threading.Thread(target=down.run, args=(stop,), kwargs={"interval": 0.01})
    t.start()
    while not down.last_error:
        stop.wait(0.01)
    stop.set()
    t.join(timeout=60)
    assert not t.is_alive() and down.ready is False


def test_partial_release_and_requeue_done_elsewhere_reach_the_matcher(store: Store) -> None:
    clock = Clock()
    [two, one] = store.submit_many([job("two", nodes=2, cores=4), job("one", cores=4)], clock())
    svc = service(store, clock)
    assert sorted(svc.run_cycle().started) == [two, one]
    alloc = {a.job_id: a for a in store.allocations()}
    gone = alloc[two].nodes[0].name
    store.release_nodes(two, [gone], clock(), "one pod finished")  # e.g. by the operator
    store.transition(one, JobState.PENDING, clock(), "node lost: requeued")
    svc.run_cycle()  # syncs: re-records "two" on its remaining node, drops "one", restarts it
    assert matcher_use(svc.matcher) == recorded_use(store)
    assert gone not in {n.name for a in store.allocations() if a.job_id == two for n in a.nodes}
    assert store.get(one).state is JobState.RUNNING  # started again on the freed resources
    starts = [e for e in store.events(one) if e.to_state is JobState.RUNNING]
    assert len(starts) == 2


def test_a_release_within_a_node_done_elsewhere_reaches_the_matcher(store: Store) -> None:
    """``shrink_nodes`` (the operator: some pods of a job ended on a node where others of it
    run on) bumps the revision like a whole-node release: the next cycle re-records the
    smaller amount, and the room it freed goes to a waiting job."""
    clock = Clock()
    full = store.submit_many([job(f"full{i}", cores=CORES) for i in range(NODES)], clock())
    svc = service(store, clock)
    assert sorted(svc.run_cycle().started) == sorted(full)
    [late] = store.submit_many([job("late", cores=CORES - 1)], clock())
    svc.run_cycle()
    assert store.get(late).state is not JobState.RUNNING  # the cluster is full
    [node] = next(a.nodes for a in store.allocations() if a.job_id == full[0])
    assert store.shrink_nodes(full[0], [replace(node, cores=1)], clock())
    svc.run_cycle()
    assert store.get(late).state is JobState.RUNNING
    [(on, cores)] = [(n.name, n.cores) for a in store.allocations() if a.job_id == late for n in a.nodes]
    assert (on, cores) == (node.name, CORES - 1)
    assert matcher_use(svc.matcher) == recorded_use(store)


def test_a_matcher_error_fails_that_job_only_and_the_matcher_is_rebuilt(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    clock = Clock()
    [bad, ok] = store.submit_many([job("bad", nodes=3, cores=1), job("ok", cores=1)], clock())
    built: list[Any] = []

    class Faulty:
        def __init__(self) -> None:
            self.m = make_matcher(NODES, CORES)
            built.append(self)

        def allocate_orelse_reserve(self, js: Any, **kw: Any) -> Any:
            if js.totals.get("node") == 3:
                raise RuntimeError("traverser bug")
            return self.m.allocate_orelse_reserve(js, **kw)

        def __getattr__(self, name: str) -> Any:
            return getattr(self.m, name)

    svc = QueueService(
        store, Faulty, clock=clock, policy=QueuePolicy(name="conservative", queue_depth=10)
    )
    with caplog.at_level(logging.ERROR, logger="fluxnetes.store"):
        report = svc.run_cycle()
    assert report.started == [ok] and bad in report.failed
    failed = store.get(bad)
    assert failed.state is JobState.FAILED and "traverser bug" in failed.reason
    assert "traverser bug" in caplog.text
    assert svc.matcher is None  # suspect after an exception: rebuilt from the store
    report = svc.run_cycle()
    assert report.rebuilt and len(built) == 2
    assert matcher_use(svc.matcher) == recorded_use(store)
