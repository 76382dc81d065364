"""Parking (queue/cycle.py, pinned reservations): a job that could not start is not asked
again until something it could use was freed, and a cycle where nothing changed asks the
matcher nothing. The decisions must be exactly those of the full re-evaluation
(``parking=False``, qmanager's cancel-everything-and-walk), which the property test checks
with the real matcher on random event sequences."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fluxnetes.graph.builders import from_k8s_nodes
from fluxnetes.jobspec import PodRequest, jobspec_from_pods
from fluxnetes.match.matcher import Matcher
from fluxnetes.queue import QueuedJob, QueuePolicy, Scheduler

GI = 1024**3


def k8s_node(name: str, cpu: int, mem_gi: int = 8) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {}},
        "status": {
            "allocatable": {"cpu": str(cpu), "memory": f"{mem_gi}Gi"},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


class Counting:
    """The real matcher, counting the calls a cycle makes."""

    def __init__(self, matcher: Matcher) -> None:
        self.m = matcher
        self.calls = 0

    def allocate(self, js: Any, *, now: int, jobid: Any = None) -> Any:
        self.calls += 1
        return self.m.allocate(js, now=now)

    def allocate_orelse_reserve(self, js: Any, *, now: int, jobid: Any = None) -> Any:
        self.calls += 1
        return self.m.allocate_orelse_reserve(js, now=now)

    def satisfiability(self, js: Any) -> Any:
        self.calls += 1
        return self.m.satisfiability(js)

    def cancel(self, jobid: Any) -> Any:
        return self.m.cancel(jobid)

    def partial_cancel(self, jobid: Any, release: Any) -> Any:
        return self.m.partial_cancel(jobid, release)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.m, name)


def job(job_id: str, cpu: int, *, size: int = 1, duration: int = 0, submit: int = 0,
        priority: int = 0, mem_gi: int = 0, exclusive: bool = False) -> QueuedJob:
    spec = jobspec_from_pods(size, PodRequest(cpu * 1000, mem_gi * GI, 0, {}), duration=duration,
                             exclusive_nodes=exclusive, name=job_id)
    return QueuedJob(id=job_id, jobspec=spec, submit_time=submit, priority=priority)


def shares(res: Any) -> tuple[Any, ...]:
    return tuple(sorted((n.name, n.cores, n.memory) for n in res.nodes))


def view(result: Any) -> tuple[Any, ...]:
    """A cycle's decisions, without the matcher's job ids (fewer calls, other ids)."""
    return (
        [(j.id, int(r.at), shares(r)) for j, r in result.started],
        [(j.id, int(r.at), shares(r)) for j, r in result.reserved],
        [j.id for j, _ in result.unsatisfiable],
        [j.id for j in result.blocked],
        result.considered,
    )


# ------------------------------------------------------------------ examples


def test_idle_cycle_asks_the_matcher_nothing() -> None:
    m = Counting(Matcher(from_k8s_nodes([k8s_node("n0", 4), k8s_node("n1", 4)]), "lonode"))
    sched = Scheduler(m, QueuePolicy("easy", queue_depth=None), node_cores={"n0": 4, "n1": 4})
    first = sched.cycle([job("a", 3), job("b", 3)], now=0)
    assert [j.id for j, _ in first.started] == ["a", "b"]
    pending = [job(str(i), 3, submit=i) for i in range(1, 6)]
    sched.cycle(pending, now=1)  # head reserved (never: a and b hold forever) or blocked
    calls = m.calls
    again = sched.cycle(pending, now=2)
    assert again.mode == "idle" and m.calls == calls
    assert [j.id for j in again.blocked] == [j.id for j in pending]


def test_release_on_a_node_without_room_wakes_nobody() -> None:
    nodes = {f"n{i}": 4 for i in range(3)}
    m = Counting(Matcher(from_k8s_nodes([k8s_node(n, c) for n, c in nodes.items()]), "lonode"))
    sched = Scheduler(m, QueuePolicy("fcfs", queue_depth=None), node_cores=nodes)
    running = [job(f"r{i}", 1, submit=0) for i in range(12)]  # every core taken
    assert len(sched.cycle(running, now=0).started) == 12
    big = [job(f"b{i}", 2, submit=1 + i) for i in range(4)]  # need 2 cores on one node
    sched.cycle(big, now=1)
    where = {j: sched.allocation(j).nodes[0].name for j in ("r0", "r1", "r4")}
    sched.release("r0")  # one core back on its node: a 2-core slot still does not fit
    calls = m.calls
    result = sched.cycle(big, now=2)
    assert result.parked == 1 and m.calls == calls  # the fcfs head answered from the park
    other = next(j for j in ("r1", "r4") if where[j] == where["r0"])
    sched.release(other)  # two cores on that node: the head is asked again and starts
    result = sched.cycle(big, now=3)
    assert [j.id for j, _ in result.started] == ["b0"]


def test_dropped_running_job_is_noticed_as_freed() -> None:
    # the operator cancels in the matcher itself and pops `running` (no release call)
    nodes = {"n0": 2}
    matcher = Matcher(from_k8s_nodes([k8s_node("n0", 2)]), "lonode")
    sched = Scheduler(matcher, QueuePolicy("fcfs"), node_cores=nodes)
    sched.cycle([job("r", 2)], now=0)
    sched.cycle([job("w", 2, submit=1)], now=1)
    matcher.cancel(sched.running.pop("r").result.jobid)
    result = sched.cycle([job("w", 2, submit=1)], now=2)
    assert [j.id for j, _ in result.started] == ["w"]


def test_node_cores_of_a_graph() -> None:
    from fluxnetes.queue.satisfy import node_cores

    graph = from_k8s_nodes([k8s_node("a", 4), k8s_node("b", 32)])
    assert node_cores(graph) == {"a": 4, "b": 32}


def test_changed_request_is_not_parked() -> None:
    # the operator may rebuild a waiting group's jobspec (node rules): parked is per request
    m = Counting(Matcher(from_k8s_nodes([k8s_node("n0", 4)]), "lonode"))
    sched = Scheduler(m, QueuePolicy("fcfs"), node_cores={"n0": 4})
    sched.cycle([job("r", 3)], now=0)
    assert sched.cycle([job("w", 2, submit=1)], now=1).blocked
    assert sched.cycle([job("w", 2, submit=1)], now=2).mode == "idle"
    smaller = sched.cycle([job("w", 1, submit=1)], now=3)
    assert [j.id for j, _ in smaller.started] == ["w"]


def test_finite_job_recorded_behind_the_schedulers_back_keeps_reservations_asked() -> None:
    # after a restart the operator re-records a group with its duration (update_allocate)
    # without telling the scheduler: the head must still get its reservation at its end
    from fluxnetes.match.results import NodeShare

    m = Counting(Matcher(from_k8s_nodes([k8s_node("n0", 4)]), "lonode"))
    m.m.update_allocate(m.m.next_jobid, [NodeShare(name="n0", cores=4)], at=0, duration=100)
    sched = Scheduler(m, QueuePolicy("easy"), node_cores={"n0": 4})
    result = sched.cycle([job("w", 2, submit=1)], now=1)
    assert [(j.id, int(r.at)) for j, r in result.reserved] == [("w", 100)]


def test_same_shape_is_asked_once_per_walk() -> None:
    m = Counting(Matcher(from_k8s_nodes([k8s_node("n0", 4)]), "lonode"))
    sched = Scheduler(m, QueuePolicy("easy", queue_depth=None))
    sched.cycle([job("r", 3)], now=0)
    calls = m.calls
    result = sched.cycle([job(str(i), 2, submit=1 + i) for i in range(50)], now=1)
    assert len(result.blocked) + len(result.reserved) == 50
    assert result.memo >= 48 and m.calls - calls <= 2


def test_running_job_passing_its_planned_end_wakes_everyone() -> None:
    # the matcher's state may change by itself once `now` reaches a running job's planned
    # end: parked jobs are asked again then (the real matcher keeps the cores allocated
    # until cancelled, so the answer is still BUSY here; other matchers may differ)
    m = Counting(Matcher(from_k8s_nodes([k8s_node("n0", 2)]), "lonode"))
    sched = Scheduler(m, QueuePolicy("fcfs"), node_cores={"n0": 2})
    sched.cycle([job("r", 2, duration=10)], now=0)
    w = job("w", 2, submit=1)
    assert sched.cycle([w], now=1).blocked == [w]
    sched.freed(["n0"])  # said freed, but r still holds both cores: w stays parked
    assert sched.cycle([w], now=5).parked == 1
    sched.freed(["n0"])
    late = sched.cycle([w], now=10)
    assert late.parked == 0 and late.matcher_calls == 1 and late.blocked == [w]


# ------------------------------------------------------------------ property


SUBMIT = st.tuples(st.just("submit"), st.integers(1, 3), st.integers(1, 6), st.sampled_from([0, 0, 0, 5, 20, 60]),
                   st.integers(0, 2), st.integers(0, 3), st.booleans())
EVENT = st.one_of(
    SUBMIT, SUBMIT, SUBMIT, SUBMIT,
    st.tuples(st.just("release"), st.integers(0, 50)),
    st.tuples(st.just("drop"), st.integers(0, 50)),
    st.tuples(st.just("withdraw"), st.integers(0, 50)),
    st.tuples(st.just("priority"), st.integers(0, 50), st.integers(0, 3)),
    st.tuples(st.just("respec"), st.integers(0, 50), st.integers(1, 6)),
    st.tuples(st.just("advance"), st.integers(0, 30)),
    st.tuples(st.just("idle"),),
    st.tuples(st.just("node_add"), st.integers(2, 8)),
    st.tuples(st.just("node_status"), st.integers(0, 10), st.booleans()),
)


class World:
    """One scheduler + matcher and the caller's view (pending, running), driven by events."""

    def __init__(self, nodes: list[int], policy: QueuePolicy, match_policy: str, parking: bool) -> None:
        self.names = [f"n{i}" for i in range(len(nodes))]
        self.cores = dict(zip(self.names, nodes, strict=True))
        graph = from_k8s_nodes([k8s_node(n, c) for n, c in self.cores.items()])
        self.matcher = Matcher(graph, match_policy)
        self.sched = Scheduler(self.matcher, policy, node_cores=self.cores, parking=parking)
        self.pending: dict[str, QueuedJob] = {}
        self.running: list[str] = []

    def apply(self, event: tuple[Any, ...], serial: int, now: int) -> None:
        kind = event[0]
        if kind == "submit":
            _, size, cpu, duration, mem, prio, excl = event
            self.pending[f"j{serial}"] = job(f"j{serial}", cpu, size=size, duration=duration, submit=now,
                                             priority=prio, mem_gi=mem, exclusive=excl)
        elif kind in ("release", "drop") and self.running:
            job_id = self.running.pop(event[1] % len(self.running))
            if kind == "release":
                self.sched.release(job_id)
            else:  # the operator's way: cancel in the matcher, forget it, say where
                alloc = self.sched.running.pop(job_id).result
                self.matcher.cancel(alloc.jobid)
                self.sched.freed(n.name for n in alloc.nodes)
        elif kind == "withdraw" and self.pending:
            job_id = sorted(self.pending)[event[1] % len(self.pending)]
            del self.pending[job_id]
            self.sched.withdraw(job_id)
        elif kind == "priority" and self.pending:
            job_id = sorted(self.pending)[event[1] % len(self.pending)]
            self.pending[job_id] = self.pending[job_id].replace(priority=event[2])
        elif kind == "respec" and self.pending:  # its request rebuilt (no invalidate)
            old = self.pending[sorted(self.pending)[event[1] % len(self.pending)]]
            new = job(old.id, event[2], submit=old.submit_time, priority=old.priority)
            self.pending[old.id] = new
        elif kind == "node_add":
            name = f"n{len(self.names)}"
            self.names.append(name)
            self.cores[name] = event[1]
            self.matcher.add_subgraph(from_k8s_nodes([k8s_node(name, event[1])]))
            self.sched.set_node_cores(self.cores)
            self.sched.invalidate()
        elif kind == "node_status":
            self.matcher.set_status(self.names[event[1] % len(self.names)], event[2])
            self.sched.invalidate()

    def cycle(self, now: int) -> tuple[Any, ...]:
        result = self.sched.cycle(list(self.pending.values()), now)
        for j, _ in result.started:
            del self.pending[j.id]
            self.running.append(j.id)
        for j, _ in result.unsatisfiable:
            del self.pending[j.id]
            self.sched.withdraw(j.id)
        return view(result)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    nodes=st.lists(st.integers(2, 8), min_size=1, max_size=5),
    policy=st.sampled_from(["fcfs", "easy", "conservative", "hybrid:2"]),
    depth=st.sampled_from([None, 3]),
    match_policy=st.sampled_from(["lonode", "first", "low"]),
    events=st.lists(EVENT, min_size=1, max_size=40),
)
def test_parking_decides_exactly_as_full_reevaluation(
    nodes: list[int], policy: str, depth: int | None, match_policy: str, events: list[tuple[Any, ...]]
) -> None:
    qp = QueuePolicy.parse(policy, queue_depth=depth)
    full = World(nodes, qp, match_policy, parking=False)
    parked = World(nodes, qp, match_policy, parking=True)
    now = 0
    for serial, event in enumerate(events):
        if event[0] == "advance":
            now += event[1]
        for world in (full, parked):
            world.apply(event, serial, now)
        assert parked.cycle(now) == full.cycle(now), (serial, event)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    raw=st.lists(st.tuples(st.integers(0, 40), st.integers(1, 30), st.integers(0, 30), st.integers(1, 8)),
                 min_size=1, max_size=25),
    policy=st.sampled_from(["fcfs", "easy", "conservative", "hybrid:2"]),
    match_policy=st.sampled_from(["first", "lonode"]),
    profile=st.booleans(),
)
def test_simulation_is_the_same_with_and_without_parking(
    raw: list[tuple[int, int, int, int]], policy: str, match_policy: str, profile: bool
) -> None:
    # the simulator's queue engine with pinned reservations (jobs end at or before their
    # requested time, releases come as the jobs end), with and without the core profile
    import copy

    from fluxnetes.sim.engine import SimJob, simulate
    from fluxnetes.sim.machine import machine_from_size

    machine = machine_from_size(4, 2)
    jobs = [SimJob(str(i + 1), s, r, r + e, p) for i, (s, r, e, p) in enumerate(raw)]

    def run(parking: bool) -> list[tuple[str, int | None, tuple[Any, ...]]]:
        scheduler = Scheduler(
            Matcher(copy.deepcopy(machine.graph), match_policy),
            QueuePolicy.parse(policy, queue_depth=None),
            capacity_cores=machine.total_cores if profile else None,
            node_cores=machine.node_cores(), parking=parking)
        out = simulate(jobs, scheduler, machine.jobspec, total_cores=machine.total_cores,
                       min_cores_for=machine.min_cores)
        return [(o.job.id, o.start, o.shares) for o in out.outcomes]

    assert run(True) == run(False)
