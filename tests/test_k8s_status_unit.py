"""Unit level (no cluster): the status writer (k8s/persistence/status.py) alone, with a fake of
the group book it meets: the Event rate limit, FluxJob
write coalescing, and every phase kept as a condition even when writes are coalesced."""

from __future__ import annotations

import asyncio
from typing import Any

from fluxnetes.k8s.config import OperatorConfig
from fluxnetes.k8s.context import Context
from fluxnetes.k8s.groups import GroupSpec, OwnerRef
from fluxnetes.k8s.groups.group import Group
from fluxnetes.k8s.groups.grouptable import GroupTable
from fluxnetes.k8s.kube import ApiError
from fluxnetes.k8s.persistence.fluxjob import Phase
from fluxnetes.k8s.persistence.status import EVENT_BURST, StatusWriter
from fluxnetes.k8s.resources import PodResources
from fluxnetes.k8s.workloads import kind_of
from test_k8s_prune import RecordingKube


class Events(RecordingKube):
    def __init__(self) -> None:
        super().__init__()
        self.events: list[dict[str, Any]] = []

    async def create(self, res: Any, body: Any, namespace: str | None = None, **kw: Any) -> dict[str, Any]:
        if res.plural == "events":
            self.events.append(body)
        return await super().create(res, body, namespace, **kw)


class FakeBook:
    """The group book as the status writer sees it (StatusBook): a table of groups, the ended
    groups it is told about; no workloads (``owner_obj`` finds none)."""

    def __init__(self) -> None:
        self.groups: GroupTable = GroupTable()
        self.pruned: dict[str, int] = {}
        self.finished: set[tuple[str, str]] = set()
        self.names_spent: list[str] = []
        self.rechecked: list[str] = []

    def spend_name(self, g: Group) -> None:
        self.names_spent.append(g.qid)

    def mark_finished(self, key: tuple[str, str]) -> None:
        self.finished.add(key)

    def recheck_prune(self, g: Group) -> None:
        self.rechecked.append(g.qid)

    def owner_obj(self, ref: OwnerRef | None, namespace: str) -> dict[str, Any] | None:
        return None


def book(kube: Events | None = None, **config: Any) -> tuple[StatusWriter, FakeBook, Events]:
    """The status writer alone, with a fake book and a recording API server."""
    kube = kube if kube is not None else Events()
    # the FluxJob writes are what these tests check: every group gets one (--fluxjobs all)
    # unless a test asks for the default, waiting
    config = {"fluxjobs": "all", **config}
    ctx = Context(kube, OperatorConfig(**config), clock=lambda: 1_000)  # type: ignore[arg-type]
    fake = FakeBook()
    return StatusWriter(ctx, fake), fake, kube


def group(name: str = "g", kind: str | None = None) -> Group:
    spec = GroupSpec(namespace="ns", name=name, size=1, request=PodResources(1000, 0, 0, {}), duration=0,
                     priority=0, owner=None)
    return Group(spec=spec, kind=kind_of(kind) if kind else None)


async def drain(w: StatusWriter) -> None:
    ctx = w._ctx  # (the test looks at the background tasks it started)
    while ctx._tasks:
        await asyncio.gather(*list(ctx._tasks), return_exceptions=True)


def test_normal_events_are_capped_warnings_never_dropped() -> None:
    async def main() -> None:
        b, _, kube = book(event_rate=0)  # no refill: only the burst goes out
        ref = {"apiVersion": "v1", "kind": "Pod", "name": "p", "namespace": "ns", "uid": "u"}
        for i in range(int(EVENT_BURST) + 10):
            b.event(ref, "Normal", "Test", f"normal {i}")
        b.event(ref, "Warning", "Test", "a warning")
        await drain(b)
        normal = [e for e in kube.events if e["type"] == "Normal"]
        assert len(normal) == int(EVENT_BURST) and b.events_dropped == 10
        warning = [e for e in kube.events if e["type"] == "Warning"]
        assert len(warning) == 1 and warning[0]["involvedObject"]["uid"] == "u"

    asyncio.run(main())


def test_status_writes_wait_the_interval_then_go_out_once() -> None:
    async def main() -> None:
        b, fake, kube = book(status_interval=5.0)
        g = fake.groups[("ns", "g")] = group()
        assert b.fluxjobs_due(100.0) == 5.0  # first needed now: due in 5 s
        assert b.fluxjobs_due(103.0) == 2.0
        await b.flush_fluxjobs(now=103.0)
        assert kube.fluxjob_status == {}  # not due yet
        assert b.fluxjobs_due(105.0) == 0.0
        await b.flush_fluxjobs(now=105.0)
        assert kube.fluxjob_status[("ns", "g")]["phase"] == str(Phase.PROVISIONAL)
        assert not g.fj_dirty and b.fluxjobs_due(106.0) is None

    asyncio.run(main())


def test_a_phase_between_two_writes_stays_a_condition() -> None:
    async def main() -> None:
        b, fake, kube = book(status_interval=0.0)
        g = fake.groups[("ns", "g")] = group()
        b.set_phase(g, Phase.PENDING, "queued")
        b.fluxjobs_due(0.0)
        await b.flush_fluxjobs(now=0.0)
        g.start = 990
        b.set_phase(g, Phase.RUNNING, "allocated on n0")
        b.set_phase(g, Phase.COMPLETED, "all pods finished")  # Running was never written
        assert g.key in fake.finished and fake.names_spent == ["ns/g"]  # the book is told
        b.fluxjobs_due(1.0)
        await b.flush_fluxjobs(now=1.0)
        st = kube.fluxjob_status[("ns", "g")]
        assert st["phase"] == str(Phase.COMPLETED)
        running = [c for c in st["conditions"] if c["type"] == str(Phase.RUNNING)]
        assert len(running) == 1 and running[0]["status"] == "False"
        assert running[0]["message"] == "allocated on n0"
        assert fake.rechecked == ["ns/g", "ns/g"]  # after each write, the book may forget it

    asyncio.run(main())


def test_the_history_keeps_every_transition_in_time_order_repeats_included() -> None:
    """Issue #29 item 6: conditions keep one entry per phase, so Pending, Unsatisfiable,
    Pending again lost the first Pending and listed the phases out of time order."""
    async def main() -> None:
        now = [1_000]
        b, fake, kube = book(status_interval=0.0)
        b._ctx.clock = lambda: now[0]
        g = fake.groups[("ns", "g")] = group()
        steps = [(Phase.PENDING, "queued"), (Phase.UNSATISFIABLE, "can never run"),
                 (Phase.PENDING, "queued again"), (Phase.RESERVED, "reserved; at 1"),
                 (Phase.RESERVED, "reserved; at 2"), (Phase.RUNNING, "allocated on n0")]
        for i, (phase, reason) in enumerate(steps):
            now[0] = 1_000 + 10 * i
            b.set_phase(g, phase, reason)
            if i in (0, 3):  # two writes; the other transitions pass between them
                b.fluxjobs_due(float(i))
                await b.flush_fluxjobs(now=float(i))
        b.fluxjobs_due(9.0)
        await b.flush_fluxjobs(now=9.0)
        hist = kube.fluxjob_status[("ns", "g")]["history"]
        assert [(h["phase"], h["message"]) for h in hist] == [
            ("Provisional", ""), ("Pending", "queued"), ("Unsatisfiable", "can never run"),
            ("Pending", "queued again"), ("Reserved", "reserved; at 2"), ("Running", "allocated on n0")]
        times = [h["time"] for h in hist]
        assert times == sorted(times) and times[1] < times[2] < times[3]

    asyncio.run(main())


class Refusing(Events):
    """The API server is away (its restart): every status write fails to connect."""

    def __init__(self) -> None:
        super().__init__()
        self.away = True

    async def patch(self, res: Any, name: str, body: Any, namespace: str | None = None, **kw: Any) -> dict[str, Any]:
        if self.away:
            raise ConnectionRefusedError(111, "Connect call failed")
        return await super().patch(res, name, body, namespace, **kw)

    async def create(self, res: Any, body: Any, namespace: str | None = None, **kw: Any) -> dict[str, Any]:
        if self.away:
            raise ConnectionRefusedError(111, "Connect call failed")
        return await super().create(res, body, namespace, **kw)


def test_a_status_write_lost_to_an_api_server_outage_is_written_again() -> None:
    """Issue #11's soak: FluxJob statuses of groups that ended while the API server restarted
    stayed Running (the write failed with a connection error, the group was no longer due)."""
    async def main() -> None:
        kube = Refusing()
        b, fake, _ = book(kube, status_interval=0.0)
        g = fake.groups[("ns", "g")] = group()
        b.set_phase(g, Phase.COMPLETED, "all pods finished")
        b.fluxjobs_due(100.0)
        await b.flush_fluxjobs(now=100.0)  # refused: no exception escapes, still due
        assert g.fj_dirty and kube.fluxjob_status == {}
        kube.away = False
        b.fluxjobs_due(101.0)
        await b.flush_fluxjobs(now=101.0)
        assert not g.fj_dirty and kube.fluxjob_status[("ns", "g")]["phase"] == str(Phase.COMPLETED)

    asyncio.run(main())


def test_a_fluxjob_is_created_with_its_status_in_one_write() -> None:
    """Issue 17 (API writes per pod): a group that went Pending and Running within the status
    interval costs one FluxJob write (the create carries the status; the CRD has no status
    subresource); a later change is one merge patch."""
    async def main() -> None:
        b, fake, kube = book(status_interval=1.0)
        g = fake.groups[("ns", "g")] = group()
        b.set_phase(g, Phase.PENDING, "queued")
        b.fluxjobs_due(100.0)
        b.set_phase(g, Phase.RUNNING, "allocated")
        await b.flush_fluxjobs(now=101.0)
        assert kube.fluxjob_writes == 1
        st = kube.fluxjob_status[("ns", "g")]
        assert st["phase"] == str(Phase.RUNNING)
        assert {c["type"] for c in st["conditions"]} == {str(Phase.PENDING), str(Phase.RUNNING)}
        b.set_phase(g, Phase.COMPLETED, "all pods finished")
        b.fluxjobs_due(102.0)
        await b.flush_fluxjobs(now=103.0)
        assert kube.fluxjob_writes == 2
        assert kube.fluxjob_status[("ns", "g")]["phase"] == str(Phase.COMPLETED)

    asyncio.run(main())


class Terminating(Events):
    """Namespace ``ns`` is being deleted: the API server refuses every new object there."""

    def __init__(self) -> None:
        super().__init__()
        self.refused = 0

    async def create(self, res: Any, body: Any, namespace: str | None = None, **kw: Any) -> dict[str, Any]:
        if res.plural == "fluxjobs" and namespace == "ns":
            self.refused += 1
            raise ApiError(403, {"kind": "Status", "reason": "Forbidden", "message": (
                "fluxjobs.fluxnetes.io \"g\" is forbidden: unable to create new content in namespace ns "
                "because it is being terminated"), "details": {"causes": [
                    {"reason": "NamespaceTerminating", "message": "namespace ns is being terminated",
                     "field": "metadata.namespace"}]}}, "POST", "/apis/fluxnetes.io/v1alpha1/namespaces/ns/fluxjobs")
        return await super().create(res, body, namespace, **kw)


def test_a_fluxjob_refused_by_a_namespace_being_deleted_is_not_retried() -> None:
    """A namespace of 10,000 Jobs deleted: its FluxJob creates were refused and retried every
    second until the Jobs were gone (operator_bench at 5,000 nodes, thousands of refused writes);
    it is tried again only when the group changes."""
    async def main() -> None:
        kube = Terminating()
        b, fake, _ = book(kube, status_interval=0.0)
        g = fake.groups[("ns", "g")] = group()
        b.set_phase(g, Phase.PENDING, "queued")
        for t in (100.0, 101.0, 102.0):
            b.fluxjobs_due(t)
            await b.flush_fluxjobs(now=t)
        assert kube.refused == 1 and not g.fj_dirty and not g.fj_exists
        b.set_phase(g, Phase.CANCELLED, "its Job was deleted")  # a change: tried again, once
        b.fluxjobs_due(103.0)
        await b.flush_fluxjobs(now=103.0)
        assert kube.refused == 2 and not g.fj_dirty

    asyncio.run(main())


def test_the_history_is_written_only_once_a_phase_repeats() -> None:
    """A group that never enters a phase twice (most) writes no history: its conditions
    say the same, and the FluxJob write stays as small as before."""
    async def main() -> None:
        b, fake, kube = book(status_interval=0.0)
        g = fake.groups[("ns", "g")] = group()
        for phase, reason in ((Phase.PENDING, "queued"), (Phase.RUNNING, "allocated on n0")):
            b.set_phase(g, phase, reason)
            b.fluxjobs_due(0.0)
            await b.flush_fluxjobs(now=0.0)
            assert "history" not in kube.fluxjob_status[("ns", "g")]
        b.set_phase(g, Phase.PREEMPTED, "evicted")
        b.set_phase(g, Phase.PENDING, "queued again")
        b.fluxjobs_due(1.0)
        await b.flush_fluxjobs(now=1.0)
        hist = kube.fluxjob_status[("ns", "g")]["history"]
        assert [h["phase"] for h in hist] == ["Provisional", "Pending", "Running", "Preempted", "Pending"]

    asyncio.run(main())


def test_fluxjobs_waiting_a_group_started_at_once_gets_none() -> None:
    """Issue 31 (--fluxjobs waiting): a group placed within the status interval of its arrival
    and completed gets no FluxJob (no write at all), and the book may still forget it."""
    async def main() -> None:
        b, fake, kube = book(status_interval=1.0, fluxjobs="waiting")
        g = fake.groups[("ns", "g")] = group(kind="Job")
        b.set_phase(g, Phase.PENDING, "queued")
        b.fluxjobs_due(100.0)
        b.set_phase(g, Phase.RUNNING, "allocated")
        await b.flush_fluxjobs(now=101.0)
        assert kube.fluxjob_writes == 0 and not g.fj_dirty and not g.fj_exists
        b.set_phase(g, Phase.COMPLETED, "all pods finished")
        b.fluxjobs_due(102.0)
        await b.flush_fluxjobs(now=103.0)
        assert kube.fluxjob_writes == 0 and not g.fj_dirty
        assert fake.rechecked == ["ns/g", "ns/g"]  # the book may forget it all the same

    asyncio.run(main())


def test_fluxjobs_waiting_a_group_that_waits_gets_one_with_its_whole_history() -> None:
    """Still queued when its write is due: it waited, so it gets its FluxJob then, and keeps it
    up to date afterwards (Running, Completed), every earlier phase kept as a condition."""
    async def main() -> None:
        b, fake, kube = book(status_interval=1.0, fluxjobs="waiting")
        g = fake.groups[("ns", "g")] = group(kind="Job")
        b.set_phase(g, Phase.PENDING, "queued")
        b.fluxjobs_due(100.0)
        await b.flush_fluxjobs(now=101.0)
        assert kube.fluxjob_writes == 1 and kube.fluxjob_status[("ns", "g")]["phase"] == str(Phase.PENDING)
        b.set_phase(g, Phase.RUNNING, "allocated")
        b.set_phase(g, Phase.COMPLETED, "all pods finished")
        b.fluxjobs_due(102.0)
        await b.flush_fluxjobs(now=103.0)
        st = kube.fluxjob_status[("ns", "g")]
        assert kube.fluxjob_writes == 2 and st["phase"] == str(Phase.COMPLETED)
        assert {c["type"] for c in st["conditions"]} >= {str(Phase.PENDING), str(Phase.RUNNING)}

    asyncio.run(main())


def test_fluxjobs_waiting_a_running_group_that_fails_gets_one() -> None:
    """Placed at once (no FluxJob), then ended otherwise than Completed (its node was lost):
    the FluxJob is written then, with its Running condition, so the failure is shown."""
    async def main() -> None:
        b, fake, kube = book(status_interval=1.0, fluxjobs="waiting")
        g = fake.groups[("ns", "g")] = group(kind="Job")
        b.set_phase(g, Phase.PENDING, "queued")
        b.set_phase(g, Phase.RUNNING, "allocated on n0")
        b.fluxjobs_due(100.0)
        await b.flush_fluxjobs(now=101.0)
        assert kube.fluxjob_writes == 0
        b.set_phase(g, Phase.FAILED, "node n0 lost")
        b.fluxjobs_due(102.0)
        await b.flush_fluxjobs(now=103.0)
        st = kube.fluxjob_status[("ns", "g")]
        assert kube.fluxjob_writes == 1 and st["phase"] == str(Phase.FAILED)
        assert str(Phase.RUNNING) in {c["type"] for c in st["conditions"]}

    asyncio.run(main())


def test_fluxjobs_waiting_which_kinds_go_without() -> None:
    """A group started at once goes without a FluxJob when its placed pods alone bring it back
    after a restart: a Job's, a ReplicaSet's, a StatefulSet's, a label group, a lone pod.
    A multi-role workload's (pod sets), an exclusive one, one with the user's jobspec and a
    scale group keep one (their recovery needs it, or was not soaked in this mode)."""
    from dataclasses import replace

    from fluxnetes.jobspec.podsets import PodSet
    from fluxnetes.k8s.workloads import any_kind_of

    async def main() -> None:
        b, fake, kube = book(status_interval=1.0, fluxjobs="waiting")
        without = {"job": "Job", "rs": "ReplicaSet", "sts": "StatefulSet", "pods": None}
        for name, kind in without.items():
            fake.groups[("ns", name)] = group(name, kind=kind)
        jobset = group("jobset")
        jobset.kind = any_kind_of("JobSet")
        keep = {"jobset": jobset, "excl": group("excl", kind="Job"),
                "mine": group("mine", kind="Job"), "rs-scale-1": group("rs-scale-1", kind="ReplicaSet"),
                "sets": group("sets", kind="Job")}
        keep["excl"].spec = replace(keep["excl"].spec, exclusive=True)
        keep["mine"].spec = replace(keep["mine"].spec, jobspec="version: 9999")
        keep["sets"].sets = [PodSet(name="workers", count=1)]
        for name, g in keep.items():
            fake.groups[("ns", name)] = g
        for g in fake.groups.values():
            b.set_phase(g, Phase.PENDING, "queued")
            b.set_phase(g, Phase.RUNNING, "allocated")
        b.fluxjobs_due(100.0)
        await b.flush_fluxjobs(now=101.0)
        assert {k[1] for k in kube.fluxjob_status} == set(keep)

    asyncio.run(main())


def test_run_refuses_an_unknown_fluxjobs_value_naming_the_flag() -> None:
    import typer
    from typer.testing import CliRunner

    from fluxnetes.cli import run_cmd

    app = typer.Typer()

    @app.callback()
    def _root() -> None:
        pass

    run_cmd.register(app)
    res = CliRunner().invoke(app, ["run", "--fluxjobs", "some"])
    assert res.exit_code == 2 and "--fluxjobs" in res.output and "all or waiting" in res.output, res.output


def test_the_default_is_fluxjobs_waiting() -> None:
    """Issue 31: only work that waits gets a FluxJob unless the user asks for all; the command
    line (the image's entrypoint is `fluxnetes run`) and the operator's config agree."""
    import inspect

    import typer

    from fluxnetes.cli import run_cmd

    app = typer.Typer()
    run_cmd.register(app)
    (cmd,) = [c for c in app.registered_commands if c.callback is not None and c.callback.__name__ == "run"]
    assert cmd.callback is not None
    assert inspect.signature(cmd.callback).parameters["fluxjobs"].default == "waiting"
    assert OperatorConfig().fluxjobs == "waiting"


def test_group_events_name_an_object_that_exists() -> None:
    """Under ``--fluxjobs waiting`` (the default) a group placed at once gets no FluxJob: its
    Events name its workload, with the workload's uid (``kubectl describe job`` lists them),
    or for bare pods the pods themselves. A group that waits gets a FluxJob: from then on its
    Events name it, with its uid (``kubectl describe`` lists only the Events whose
    involvedObject carries the object's uid). (Was: every group Event named a FluxJob by name
    only: for a group placed at once an object that never existed, and never found by
    ``kubectl describe`` for one that did.)"""
    from fluxnetes.k8s import names
    from fluxnetes.k8s.controller import Controller
    from test_k8s_prune import bound, finished, job, node, pod, settle

    def sized(p: dict[str, Any], cpu: str) -> dict[str, Any]:
        p["spec"]["containers"][0]["resources"]["requests"]["cpu"] = cpu
        return p

    async def main() -> None:
        kube = Events()
        c = Controller(kube, OperatorConfig())  # type: ignore[arg-type]
        assert c.config.fluxjobs == "waiting"
        for n in ("n0", "n1", "n2"):
            c.cluster.know_node(node(n))
        c.cluster.build_matcher()
        c.reconciled = True
        j = job("j", 2)
        j["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "16"
        c.handle(("Job", "ADDED", j))
        jp = [sized(pod(f"j-{i}", owner=j), "16") for i in range(2)]
        for p in jp:
            c.handle(("Pod", "ADDED", p))
        await settle(c)
        gj = c.groups[("ns", "job-j")]
        assert gj.phase == Phase.RUNNING and not gj.fj_exists
        about = [e["involvedObject"] for e in kube.events if e["reason"] in ("Queued", "Allocated")]
        assert about and all(o == {"apiVersion": "batch/v1", "kind": "Job", "name": "j", "namespace": "ns",
                                   "uid": "job-j"} for o in about), about
        # a gang of bare pods that waits (one node of 16 cores free for two 16-core pods): a
        # FluxJob once written
        kube.events.clear()
        labels = {names.LABEL_GROUP: "gang", names.LABEL_GROUP_SIZE: "2"}
        gang = [sized(pod(f"gang-{i}", labels=labels), "16") for i in range(2)]
        for p in gang:
            c.handle(("Pod", "ADDED", p))
        await settle(c)
        gg = c.groups[("ns", "gang")]
        assert gg.phase != Phase.RUNNING and gg.fj_exists and gg.fj_uid
        for p in jp:
            c.handle(("Pod", "MODIFIED", finished(bound(p, "n0"))))
        await settle(c)
        assert gg.phase == Phase.RUNNING, (gg.phase, gg.reason)
        allocated = [e["involvedObject"] for e in kube.events if e["reason"] == "Allocated"]
        assert allocated == [{"apiVersion": "fluxnetes.io/v1alpha1", "kind": "FluxJob", "name": "gang",
                              "namespace": "ns", "uid": gg.fj_uid}], allocated
        # a gang of bare pods placed at once: no FluxJob, no workload: its first pod is told
        kube.events.clear()
        labels = {names.LABEL_GROUP: "now", names.LABEL_GROUP_SIZE: "2"}
        now = [pod(f"now-{i}", labels=labels) for i in range(2)]
        for p in now:
            c.handle(("Pod", "ADDED", p))
        await settle(c)
        gn = c.groups[("ns", "now")]
        assert gn.phase == Phase.RUNNING and not gn.fj_exists
        about = [e["involvedObject"] for e in kube.events if e["reason"] == "Allocated"]
        assert about == [{"apiVersion": "v1", "kind": "Pod", "name": "now-0", "namespace": "ns",
                          "uid": "pod-now-0"}], about

    asyncio.run(main())
