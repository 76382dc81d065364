"""Fair share on Kubernetes without a cluster: FluxAccounts + Namespaces -> the account tree
(fluxnetes.k8s.fairshare.accounts), QoS from PriorityClasses, and the operator's FairShareBook
(order, limits, snapshot, metrics, bad configuration kept out, `kubectl fluxnetes accounts`
rows). The cluster half is tests/test_k8s_accounts_cluster.py; the store half
tests/test_store_usage.py."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from fluxnetes.cli.ctl.accounts import account_rows, fmt_limits
from fluxnetes.k8s.fairshare.accounts import (
    AccountConfigError,
    parse_accounts,
    priority_classes_of,
    qos_factor,
    qos_max,
    qos_priority,
)
from fluxnetes.k8s.fairshare.fairshare_book import AccountMetrics, FairShareBook
from fluxnetes.queue.job import QueuedJob
from fluxnetes.queue.priority import FairShareConfig, PriorityWeights
from fluxnetes.queue.usage import Resources

ROOT = Path(__file__).resolve().parents[1]
HOUR = 3600


def account(name: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "fluxnetes.io/v1alpha1", "kind": "FluxAccount", "metadata": {"name": name},
            "spec": spec}


def namespace(name: str, label: str | None = None, annotation: str | None = None) -> dict[str, Any]:
    md: dict[str, Any] = {"name": name}
    if label is not None:
        md["labels"] = {"fluxnetes.io/account": label}
    if annotation is not None:
        md["annotations"] = {"fluxnetes.io/account": annotation}
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": md}


@dataclass
class Spec:
    totals: dict[str, int] = field(default_factory=dict)


def job(job_id: str, submit: int = 0, cores: int = 1, gpus: int = 0, priority: int = 0) -> QueuedJob:
    totals = {"core": cores}
    if gpus:
        totals["gpu"] = gpus
    return QueuedJob(id=job_id, jobspec=Spec(totals), submit_time=submit, priority=priority)


def example() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    docs = [d for d in yaml.safe_load_all((ROOT / "examples/accounts.yaml").read_text()) if d]
    return [d for d in docs if d["kind"] == "FluxAccount"], [d for d in docs if d["kind"] == "Namespace"]


# --- parsing ------------------------------------------------------------------------------------


def test_example_builds_the_tree_limits_and_namespace_map() -> None:
    accounts, namespaces = example()
    cfg = parse_accounts(accounts, [*namespaces, namespace("other")])
    tree = cfg.tree
    assert cfg.enabled and not cfg.implicit_default
    assert cfg.default == "operations"  # spec.default
    assert tree.children["research"] == ["research-ml", "research-sim"]
    assert tree.nodes["research"].shares == 70 and tree.nodes["operations"].shares == 30
    assert tree.nodes["research-ml"].limits.max_running_gpus == 8
    assert tree.nodes["research-ml"].limits.max_queued_jobs == 500
    assert tree.nodes["operations"].limits.max_running_cores == 64
    assert cfg.namespaces == {"ml-team": "research-ml", "sim-team": "research-sim"}
    assert cfg.account_of_namespace("other") == "operations"
    assert cfg.declared == ("research", "research-ml", "research-sim", "operations")
    assert cfg.problems == ()


def test_default_account_is_named_or_implicit() -> None:
    named = parse_accounts([account("a", shares=3), account("default", shares=2)])
    assert named.default == "default" and not named.implicit_default
    assert named.tree.nodes["default"].shares == 2
    implicit = parse_accounts([account("a", shares=3)], default_account="rest")
    assert implicit.default == "rest" and implicit.implicit_default
    assert implicit.tree.nodes["rest"].shares == 1 and implicit.tree.is_leaf("rest")
    assert implicit.declared == ("a",)
    off = parse_accounts([])
    assert not off.enabled and off.default == "default"


@pytest.mark.parametrize(("objs", "message"), [
    ([account("a", shares=0)], "FluxAccount a: spec.shares: must be >= 1, got 0"),
    ([account("a", shares="x")], "FluxAccount a: spec.shares: must be an integer >= 1, got 'x'"),
    ([account("a", limits={"maxRunningCores": -1})], "FluxAccount a: spec.limits.maxRunningCores: must be >= 0, got -1"),
    ([account("a", limits={"maxCores": 1})], "FluxAccount a: spec.limits.maxCores: unknown limit"),
    ([account("a", quota=1)], "FluxAccount a: spec.quota: unknown field"),
    ([account("a", parent="nobody")], "FluxAccount a: spec.parent: unknown account 'nobody'"),
    ([account("a", parent="a")], "FluxAccount a: spec.parent: an account cannot be its own parent"),
    ([account("a", parent="c"), account("b", parent="a"), account("c", parent="b")],
     "spec.parent: cycle: "),
    ([account("a", default=True), account("b", default=True)],
     "FluxAccount b: spec.default: only one account may be the default (also a)"),
    ([account("a", default=True), account("b", parent="a")],
     "FluxAccount a: spec.default: 'a' has users or sub-accounts; name a leaf"),
    ([account("root")], "FluxAccount root: metadata.name: 'root' is the implicit top"),
    ([account("default"), account("x", parent="default")],
     "FluxAccount default: metadata.name: 'default' has users or sub-accounts; name a leaf (it is the "
     "default account by its name; mark a leaf account with spec.default: true)"),
    ([account("a"), account("a")], "FluxAccount a: metadata.name: declared twice"),
    ([account("a", default="yes")], "FluxAccount a: spec.default: must be true or false"),
])
def test_bad_accounts_are_refused_naming_the_object_and_field(objs: list[dict[str, Any]], message: str) -> None:
    with pytest.raises(AccountConfigError) as info:
        parse_accounts(objs)
    assert message in str(info.value)
    assert str(info.value).startswith("FluxAccount ")


def test_dotted_account_names_are_named_whole() -> None:
    with pytest.raises(AccountConfigError, match=r"^FluxAccount team\.a: spec\.parent: unknown account"):
        parse_accounts([account("team.a", parent="x")])


def test_bad_namespaces_cost_only_themselves() -> None:
    cfg = parse_accounts(
        [account("a"), account("b"), account("b1", parent="b")],
        [namespace("n1", "zz"), namespace("n2", "b"), namespace("n3", "a", annotation="b1"),
         namespace("n4", annotation="b1"), namespace("n5", "default")],
    )
    assert cfg.namespaces == {"n3": "a", "n4": "b1", "n5": "default"}
    text = [str(p) for p in cfg.problems]
    assert ("Namespace n1: metadata.labels[fluxnetes.io/account]: unknown FluxAccount 'zz'; "
            "charging the default account 'default'") in text
    assert any(t.startswith("Namespace n2: metadata.labels[fluxnetes.io/account]: FluxAccount 'b' has "
                            "sub-accounts (name one of b1)") for t in text)
    assert any(t.startswith("Namespace n3: metadata.annotations[fluxnetes.io/account]: says 'b1' but the "
                            "label says 'a'") for t in text)
    assert len(text) == 3


def test_qos_from_priority_classes() -> None:
    classes = priority_classes_of([
        {"metadata": {"name": "system-node-critical"}, "value": 2000001000},
        {"metadata": {"name": "high"}, "value": 1000},
        {"metadata": {"name": "low"}, "value": 10, "globalDefault": True},
        {"metadata": {"name": "broken"}, "value": "x"},
    ])
    assert classes == {"system-node-critical": 2000001000, "high": 1000, "low": 10, "": 10}
    assert qos_max(classes) == 1000  # the system classes do not count
    assert qos_max({}) == 0
    assert qos_priority({"priorityClassName": "high"}, classes) == 1000
    assert qos_priority({"priority": 7, "priorityClassName": "high"}, classes) == 7
    assert qos_priority({}, classes) == 10  # the globalDefault class
    assert qos_factor(1000, 1000) == 1.0 and qos_factor(10, 1000) == 0.01
    assert qos_factor(-5, 1000) == 0.0 and qos_factor(2000001000, 1000) == 1.0 and qos_factor(5, 0) == 0.0


def test_the_book_applies_the_priority_classes_to_qos() -> None:
    book = FairShareBook(FairShareConfig(weights=PriorityWeights(age=0, fairshare=0, job_size=0, qos=1000)))
    book.configure([account("a")], [], 0)
    book.set_priority_classes({"high": 1000, "low": 10, "system-cluster-critical": 2000000000})
    assert book.config.qos_max == 1000
    jobs = [job("ns/low", priority=10), job("ns/high", priority=1000), job("ns/sys", priority=2000000000)]
    # the system class is capped at 1.0 like "high": submit time and id break the tie
    assert [j.id for j in book.order(jobs, 0)] == ["ns/high", "ns/sys", "ns/low"]


# --- the book -------------------------------------------------------------------------------------


def team_book(**kw: Any) -> FairShareBook:
    book = FairShareBook(FairShareConfig(half_life=HOUR, **kw))
    notices = book.configure(
        [account("team-a", shares=70), account("team-b", shares=30)],
        [namespace("a1", "team-a"), namespace("b1", "team-b")], 0)
    assert notices == []
    return book


def test_without_accounts_the_order_is_the_plain_one_and_nothing_is_held() -> None:
    book = FairShareBook()
    assert not book.enabled
    jobs = [job("x/3", submit=5), job("x/2", submit=5, priority=9), job("y/1", submit=1)]
    ordered, held = book.arrange(jobs, 100)
    assert [j.id for j in ordered] == ["x/2", "y/1", "x/3"] and held == {}


def test_the_account_under_its_share_goes_first() -> None:
    book = team_book()
    # team-a ran 60 cores for an hour: far over its 70 % of what was used (100 %)
    for i in range(60):
        book.record_start(job(f"a1/r{i}"), 0)
    for i in range(60):
        assert book.record_end(f"a1/r{i}", HOUR)
    jobs = [job("a1/early", submit=0), job("b1/late", submit=HOUR - 10)]
    ordered, held = book.arrange(jobs, HOUR)
    assert [j.id for j in ordered] == ["b1/late", "a1/early"] and held == {}
    rows = {r.name: r for r in book.snapshot(HOUR)}
    assert rows["team-b"].factor > rows["team-a"].factor
    assert rows["team-a"].usage == pytest.approx(60 * HOUR / 2 / 0.6931471805599453, rel=1e-6)
    # the implicit default account has 1 share next to 70 + 30
    assert rows["team-a"].shares_norm == pytest.approx(70 / 101)
    assert rows["team-a"].queued == 1 and rows["team-b"].queued == 1
    assert rows["team-a"].namespaces == ("a1",)
    # the implicit default account is shown too (it is a leaf of the tree)
    assert rows["default"].declared is False and rows["team-a"].declared is True


def test_breakdown_explains_the_priority() -> None:
    book = team_book()
    book.record_start(job("a1/r", cores=4), 0)
    b = book.breakdown(job("b1/x", submit=0), HOUR)
    assert b.account == "team-b" and b.fairshare > book.breakdown(job("a1/y"), HOUR).fairshare
    assert b.priority == pytest.approx(sum(b.contributions().values()))
    assert "fairshare" in b.explain()


def test_the_crd_is_packaged_and_matches_the_copies() -> None:
    from fluxnetes.k8s.fairshare.accounts import crd_manifest

    crd = crd_manifest()
    assert crd["metadata"]["name"] == "fluxaccounts.fluxnetes.io" and crd["spec"]["scope"] == "Cluster"
    for copy in ("deploy/crds", "deploy/chart/crds"):
        assert yaml.safe_load((ROOT / copy / "fluxaccounts.fluxnetes.io.yaml").read_text()) == crd
    limits = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["limits"]
    from fluxnetes.k8s.fairshare.accounts import LIMIT_FIELDS

    assert set(limits["properties"]) == set(LIMIT_FIELDS)


def test_a_limit_holds_work_with_the_reason_naming_it() -> None:
    book = FairShareBook(FairShareConfig(half_life=HOUR))
    book.configure([account("a", limits={"maxRunningCores": 4, "maxQueuedJobs": 3}), account("b")],
                   [namespace("ns-a", "a"), namespace("ns-b", "b")], 0)
    assert book.record_start(job("ns-a/run", cores=3), 0, Resources(cores=3, nodes=1))
    assert not book.record_start(job("ns-a/run", cores=3), 0)  # recorded once
    assert not book.record_start("ns-a/run", 0, Resources(cores=3))
    with pytest.raises(TypeError, match="needs the resources"):
        book.record_start("ns-a/other", 0)
    pending = [job("ns-a/one", submit=1), job("ns-a/two", submit=2), job("ns-b/big", submit=3, cores=16)]
    ordered, held = book.arrange(pending, 10)
    # b has used nothing (a has a job running): b's job first
    assert [j.id for j in ordered] == ["ns-b/big", "ns-a/one"]
    assert held == {"ns-a/two": "account a: max running cores 4 would be exceeded "
                                "(3 running, 1 for jobs ahead in the queue, 1 requested)"}
    assert book.held(None, pending, 10) == held
    # the same with the running jobs passed in (what the controller sees)
    assert book.held([job("ns-a/run", cores=3)], pending, 10) == held
    rows = {r.name: r for r in book.snapshot(10)}
    assert (rows["a"].running, rows["a"].running_cores, rows["a"].queued, rows["a"].held) == (1, 3, 2, 1)
    # the running job ends: both fit; the queue cap keeps the first 3 of the account's jobs
    book.record_end("ns-a/run", 20)
    more = [job(f"ns-a/q{i}", submit=i) for i in range(5)]
    _, held = book.arrange(more, 30)
    assert sorted(held) == ["ns-a/q3", "ns-a/q4"]
    assert held["ns-a/q3"] == "account a: max queued jobs 3 reached (3 queued ahead)"


def test_a_resize_changes_what_is_charged() -> None:
    book = team_book()
    book.record_start(job("a1/g", cores=8), 0, Resources(cores=8, nodes=2))
    assert book.record_resize("a1/g", Resources(cores=2, nodes=1), HOUR)
    book.record_end("a1/g", 2 * HOUR)
    assert not book.record_end("a1/g", 2 * HOUR)
    assert not book.record_resize("a1/g", Resources(cores=1), 2 * HOUR)
    both = {r.name: r.usage for r in book.snapshot(2 * HOUR)}
    only8 = team_book()
    only8.record_start(job("a1/g", cores=8), 0, Resources(cores=8, nodes=2))
    only8.record_end("a1/g", 2 * HOUR)
    assert 0 < both["team-a"] < only8.snapshot(2 * HOUR)[0].usage


def test_resources_of_an_allocation() -> None:
    from fluxnetes.k8s.scheduling.shares import Share

    res = FairShareBook.resources_of([Share("n1", 4, 1), Share("n1", 2), Share("n2", 8, 2)])
    assert res == Resources(cores=14, gpus=3, nodes=2)


def test_a_bad_configuration_keeps_the_last_good_one() -> None:
    book = team_book()
    book.record_start(job("a1/x", cores=4), 0)
    notices = book.configure([account("team-a", shares=70, parent="team-b"),
                              account("team-b", shares=30, parent="team-a")],
                             [namespace("a1", "team-a")], 100)
    assert len(notices) == 1
    assert notices[0].ref == {"apiVersion": "fluxnetes.io/v1alpha1", "kind": "FluxAccount", "name": "team-a"} \
        or notices[0].ref["name"] == "team-b"
    assert "spec.parent: cycle" in notices[0].message and "keeping the last good" in notices[0].message
    assert book.enabled and book.fs.tree.nodes["team-a"].parent == "root"  # still in force
    assert book.configure([account("team-a", parent="team-b"), account("team-b", parent="team-a")], [], 200) == []
    status = book.statuses(200)
    bad = book.error.obj.removeprefix("FluxAccount ") if book.error else ""
    assert status[bad]["error"].startswith("spec.parent: cycle")
    assert all(s["error"] == "" for name, s in status.items() if name != bad)
    # fixed: a new tree, the running job still charged
    assert book.configure([account("team-a", shares=1), account("team-b", shares=1)],
                          [namespace("a1", "team-a")], 300) == []
    assert book.error is None and book.fs.tree.nodes["team-a"].shares == 1
    assert book.fs.usage.running() == {"a1/x": "team-a"}


def test_namespace_problems_are_noticed_once() -> None:
    book = FairShareBook()
    first = book.configure([account("a")], [namespace("n1", "zz")], 0)
    assert [(n.ref, n.reason) for n in first] == [
        ({"apiVersion": "v1", "kind": "Namespace", "name": "n1", "namespace": "n1"}, "InvalidAccount")]
    assert "unknown FluxAccount 'zz'" in first[0].message
    assert book.configure([account("a")], [namespace("n1", "zz")], 10) == []


def test_metrics_per_account() -> None:
    from prometheus_client import CollectorRegistry

    registry = CollectorRegistry()
    book = team_book()
    book.metrics = AccountMetrics(registry)
    book.record_start(job("b1/x", cores=2), 0)
    book.arrange([job("a1/q")], 10)
    book.update_metrics(10)

    def value(name: str, acct: str) -> float | None:
        return registry.get_sample_value(name, {"account": acct})

    assert value("fluxnetes_account_running_jobs", "team-b") == 1
    assert value("fluxnetes_account_running_cores", "team-b") == 2
    assert value("fluxnetes_account_queued_jobs", "team-a") == 1
    assert value("fluxnetes_account_shares_normalized", "team-a") == pytest.approx(70 / 101)
    assert value("fluxnetes_account_usage_resource_seconds", "team-b") > 0  # type: ignore[operator]
    assert 0 <= value("fluxnetes_account_fairshare_factor", "team-a") <= 1  # type: ignore[operator]
    # an account removed: its series go away
    book.configure([account("team-a")], [], 20)
    book.update_metrics(20)
    assert value("fluxnetes_account_running_jobs", "team-b") is None


# --- what `kubectl fluxnetes accounts` shows ---------------------------------------------------


def test_account_rows_in_tree_order_with_status() -> None:
    accounts, _ = example()
    accounts[0]["status"] = {"fairShare": 0.5, "usage": 12.0, "running": 1, "queued": 2}
    rows = account_rows(accounts)
    assert [(r["name"], r["depth"]) for r in rows] == [
        ("operations", 0), ("research", 0), ("research-ml", 1), ("research-sim", 1)]
    research = rows[1]
    assert (research["fairShare"], research["usage"], research["running"], research["queued"]) == (0.5, 12.0, 1, 2)
    assert rows[0]["default"] and rows[2]["fairShare"] is None
    assert fmt_limits(rows[2]["limits"]) == "gpus<=8,queued<=500"
    # a cycle (refused by the operator) is still listed, each account once
    cyc = account_rows([account("x", parent="y"), account("y", parent="x")])
    assert sorted(r["name"] for r in cyc) == ["x", "y"]


def test_accounts_command_without_a_cluster_says_so(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from fluxnetes.cli.ctl import build

    res = CliRunner().invoke(build(), ["accounts", "--kubeconfig", str(tmp_path / "nope")])
    assert res.exit_code == 1 and "cannot load the Kubernetes configuration" in res.output



def drive(shares: tuple[int, int], jobs: int, cap_b: int | None = None) -> tuple[float, set[str]]:
    """The controller's loop in miniature, with the real Scheduler and matcher on 16 cores:
    accounts team-a and team-b each submit ``jobs`` one-core jobs at time 0. Returns team-a's
    part of the cores held while both were backlogged (after a 300 s warm-up) and the hold
    reasons seen."""
    from fluxnetes.jobspec import parse_jobspec
    from fluxnetes.queue import QueuePolicy, Scheduler
    from test_store_helpers import jobspec_text, make_matcher

    book = FairShareBook(FairShareConfig(half_life=7 * 24 * HOUR))
    limits = {"limits": {"maxRunningCores": cap_b}} if cap_b is not None else {}
    book.configure([account("team-a", shares=shares[0]), account("team-b", shares=shares[1], **limits)],
                   [namespace("a", "team-a"), namespace("b", "team-b")], 0)
    sched = Scheduler(make_matcher(4, 4), QueuePolicy.parse("easy"))
    durations = [60 + (i * 37) % 120 for i in range(jobs)]
    spec = {d: parse_jobspec(jobspec_text(1, 1, d)) for d in set(durations)}
    pending = {f"{ns}/j{i:03d}": QueuedJob(id=f"{ns}/j{i:03d}", jobspec=spec[durations[i]], submit_time=0)
               for ns in ("a", "b") for i in range(jobs)}
    ends: dict[str, int] = {}
    now, reasons = 0, set()
    held_cores = {"a": 0.0, "b": 0.0}  # core-seconds while both are backlogged
    while pending or ends:
        for job_id in [j for j, t in ends.items() if t <= now]:
            del ends[job_id]
            sched.release(job_id)
            book.record_end(job_id, now)
        ordered, held = book.arrange(pending.values(), now)
        reasons.update(held.values())
        result = sched.cycle(ordered, now, ordered=True)
        for queued, _alloc in result.started:
            del pending[queued.id]
            ends[queued.id] = now + int(queued.jobspec.duration)
            book.record_start(queued, now, Resources(cores=1, nodes=1))
        running = {ns: sum(1 for j in ends if j.startswith(ns + "/")) for ns in ("a", "b")}
        assert sum(running.values()) <= 16  # nothing double-booked
        assert cap_b is None or running["b"] <= cap_b
        nxt = min(ends.values(), default=now)
        backlogged = all(any(j.startswith(ns + "/") for j in pending) for ns in ("a", "b"))
        if backlogged and now >= 300:
            for ns in ("a", "b"):
                held_cores[ns] += running[ns] * (nxt - now)
        if nxt == now:
            break
        now = nxt
    assert not pending and not ends
    total = held_cores["a"] + held_cores["b"]
    return (held_cores["a"] / total if total else float("nan")), reasons


@pytest.mark.parametrize(("shares", "low", "high"), [((70, 30), 0.6, 0.8), ((30, 70), 0.2, 0.4)])
def test_the_book_drives_the_real_scheduler_to_the_shares(shares: tuple[int, int], low: float,
                                                         high: float) -> None:
    share_a, reasons = drive(shares, 120)
    assert low <= share_a <= high, share_a
    assert reasons == set()


def test_a_cap_holds_in_the_real_cycle() -> None:
    _, reasons = drive((1, 1), 30, cap_b=3)
    assert reasons and all(r.startswith("account team-b: max running cores 3") for r in reasons)


def test_an_empty_queue_zeroes_the_queued_and_held_counts_with_or_without_limits() -> None:
    # the cycle asks arrange([]) whenever nothing is queued: it answers from its shortcut
    # (nothing held, every count 0), as the full computation did
    for limits in ({"maxRunningCores": 4, "maxQueuedJobs": 1}, None):
        book = FairShareBook(FairShareConfig(half_life=HOUR))
        book.configure([account("a", **({"limits": limits} if limits else {}))], [namespace("ns-a", "a")], 0)
        _, held = book.arrange([job("ns-a/one", submit=1), job("ns-a/two", submit=2)], 10)
        assert held == ({"ns-a/two": "account a: max queued jobs 1 reached (1 queued ahead)"} if limits else {})
        rows = {r.name: r for r in book.snapshot(10)}
        assert (rows["a"].queued, rows["a"].held) == ((2, 1) if limits else (2, 0))
        assert book.arrange([], 20) == ([], {})
        rows = {r.name: r for r in book.snapshot(20)}
        assert (rows["a"].queued, rows["a"].held) == (0, 0)
        assert book.arrange([], 30) == ([], {}) and book.held(None, [], 30) == {}
