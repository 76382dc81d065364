"""A pod's own node rules (nodeSelector, required node affinity, taints/tolerations): the
rules themselves (Kubernetes' semantics), the hostlist they become in a group's jobspec, and
the controller using them (driven with watch events, API writes to a recording fake)."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fluxnetes.jobspec import PodRequest, jobspec_from_pods, parse_jobspec
from fluxnetes.jobspec.constraints import expand_hostlist
from fluxnetes.k8s.cluster import nodefit as nf
from fluxnetes.k8s.controller import Controller
from test_k8s_prune import job, make_controller, node, settle


def mk(name: str, labels: dict[str, str] | None = None, taints: list[dict[str, str]] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": labels or {}}, "spec": {"taints": taints or []}}


def req(key: str, op: str, *values: str) -> dict[str, Any]:
    return {"key": key, "operator": op, "values": list(values)}


def affinity(*terms: dict[str, Any]) -> dict[str, Any]:
    return {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": list(terms)}}}}


# ------------------------------------------------------------------ requirements
@pytest.mark.parametrize(("op", "values", "labels", "expected"), [
    ("In", ["a", "b"], {"k": "a"}, True),
    ("In", ["a", "b"], {"k": "c"}, False),
    ("In", ["a"], {}, False),
    ("In", [], {"k": "a"}, False),
    ("NotIn", ["a"], {"k": "a"}, False),
    ("NotIn", ["a"], {"k": "b"}, True),
    ("NotIn", ["a"], {}, True),  # an absent label is "not in"
    ("Exists", [], {"k": ""}, True),
    ("Exists", [], {}, False),
    ("DoesNotExist", [], {"k": "x"}, False),
    ("DoesNotExist", [], {}, True),
    ("Gt", ["5"], {"k": "6"}, True),
    ("Gt", ["5"], {"k": "5"}, False),
    ("Gt", ["5"], {"k": "-7"}, False),
    ("Lt", ["5"], {"k": "4"}, True),
    ("Lt", ["5"], {"k": "5"}, False),
    ("Lt", ["-3"], {"k": "-4"}, True),
    ("Gt", ["5"], {"k": "+6"}, True),  # strconv.ParseInt accepts a sign
    ("Gt", ["5"], {"k": "6.0"}, False),  # not an integer: no match
    ("Gt", ["5"], {"k": " 6"}, False),
    ("Gt", ["5"], {"k": "1_000"}, False),  # Python's int() would accept it; Go does not
    ("Gt", ["5"], {}, False),  # Gt/Lt need the label
    ("Gt", ["x"], {"k": "6"}, False),
    ("Gt", ["1", "2"], {"k": "6"}, False),  # exactly one value
    ("Gt", ["0"], {"k": "9223372036854775808"}, False),  # beyond int64
    ("Lt", ["0"], {"k": "-9223372036854775808"}, True),  # int64 minimum
    ("Bogus", ["a"], {"k": "a"}, False),
])
def test_requirement_operators(op: str, values: list[str], labels: dict[str, str], expected: bool) -> None:
    assert nf.requirement_matches(req("k", op, *values), labels) is expected


@given(st.dictionaries(st.sampled_from(["a", "b", "c"]), st.sampled_from(["x", "y", "z"])),
       st.lists(st.sampled_from(["x", "y", "z"]), max_size=3))
def test_notin_and_doesnotexist_are_complements(labels: dict[str, str], values: list[str]) -> None:
    assert nf.requirement_matches(req("a", "NotIn", *values), labels) != \
        nf.requirement_matches(req("a", "In", *values), labels)
    assert nf.requirement_matches(req("a", "DoesNotExist"), labels) != \
        nf.requirement_matches(req("a", "Exists"), labels)


@given(st.integers(-(2**63), 2**63 - 1), st.integers(-(2**63), 2**63 - 1))
def test_gt_lt_compare_as_int64(have: int, bound: int) -> None:
    labels = {"k": str(have)}
    assert nf.requirement_matches(req("k", "Gt", str(bound)), labels) is (have > bound)
    assert nf.requirement_matches(req("k", "Lt", str(bound)), labels) is (have < bound)


# ------------------------------------------------------------------ selector and affinity
def test_node_selector_needs_every_label_equal() -> None:
    n = mk("n", {"disktype": "ssd", "zone": "a"})
    assert nf.eligible({"nodeSelector": {"disktype": "ssd"}}, n)
    assert nf.eligible({"nodeSelector": {"disktype": "ssd", "zone": "a"}}, n)
    assert not nf.eligible({"nodeSelector": {"disktype": "ssd", "zone": "b"}}, n)
    assert not nf.eligible({"nodeSelector": {"gpu": "true"}}, n)
    assert nf.eligible({"nodeSelector": {}}, n) and nf.eligible({}, n)


def test_affinity_terms_are_ored_and_expressions_anded() -> None:
    n = mk("node-7", {"zone": "a", "disk": "ssd"})
    t_zone_b = {"matchExpressions": [req("zone", "In", "b")]}
    t_a_ssd = {"matchExpressions": [req("zone", "In", "a"), req("disk", "In", "ssd")]}
    t_a_hdd = {"matchExpressions": [req("zone", "In", "a"), req("disk", "In", "hdd")]}
    assert nf.eligible(affinity(t_zone_b, t_a_ssd), n)
    assert not nf.eligible(affinity(t_zone_b, t_a_hdd), n)
    assert not nf.eligible(affinity(), n)  # no term: nothing matches
    assert not nf.eligible(affinity({}), n)  # an empty term matches nothing
    assert not nf.eligible(affinity({"matchExpressions": []}, {"matchFields": []}), n)
    # a term with an unknown operator fails alone; the other terms still count
    assert nf.eligible(affinity({"matchExpressions": [req("zone", "Near", "a")]}, t_a_ssd), n)
    # nodeSelector and affinity must both hold
    assert not nf.eligible({"nodeSelector": {"zone": "b"}, **affinity(t_a_ssd)}, n)
    # preferred affinity is soft: never excludes
    soft = {"affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 1, "preference": t_zone_b}]}}}
    assert nf.eligible(soft, n)


def test_match_fields_name_the_node() -> None:
    n = mk("node-7", {"zone": "a"})
    assert nf.eligible(affinity({"matchFields": [req("metadata.name", "In", "node-7")]}), n)
    assert not nf.eligible(affinity({"matchFields": [req("metadata.name", "In", "node-8")]}), n)
    assert nf.eligible(affinity({"matchFields": [req("metadata.name", "NotIn", "node-8")]}), n)
    assert not nf.eligible(affinity({"matchFields": [req("metadata.name", "NotIn", "node-7")]}), n)
    both = {"matchExpressions": [req("zone", "In", "a")], "matchFields": [req("metadata.name", "In", "node-8")]}
    assert not nf.eligible(affinity(both), n)  # fields and expressions of one term are ANDed


# ------------------------------------------------------------------ taints
T_GPU = {"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}


@pytest.mark.parametrize(("toleration", "taint", "expected"), [
    ({"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}, T_GPU, True),
    ({"key": "dedicated", "value": "gpu"}, T_GPU, True),  # operator defaults to Equal, effect to all
    ({"key": "dedicated", "value": "cpu"}, T_GPU, False),
    ({"key": "dedicated", "operator": "Exists"}, T_GPU, True),
    ({"key": "other", "operator": "Exists"}, T_GPU, False),
    ({"operator": "Exists"}, T_GPU, True),  # empty key + Exists: every taint
    ({"operator": "Exists", "effect": "NoExecute"}, T_GPU, False),  # ... of that effect
    ({"key": "dedicated", "operator": "Exists", "effect": "NoExecute"}, T_GPU, False),
    ({"key": "flag", "operator": "Equal"}, {"key": "flag", "effect": "NoSchedule"}, True),  # both values empty
    ({"key": "flag", "value": "x"}, {"key": "flag", "effect": "NoSchedule"}, False),
    ({"key": "dedicated", "operator": "Gt", "value": "1"}, T_GPU, False),  # gated operator: off
])
def test_toleration_semantics(toleration: dict[str, str], taint: dict[str, str], expected: bool) -> None:
    assert nf.tolerates(toleration, taint) is expected


def test_only_noschedule_and_noexecute_taints_exclude() -> None:
    soft = mk("n", taints=[{"key": "k", "effect": "PreferNoSchedule"}])
    hard = mk("n", taints=[{"key": "k", "value": "v", "effect": "NoExecute"}])
    assert nf.eligible({}, soft)
    assert not nf.eligible({}, hard)
    assert nf.why_not({}, hard) == "taint k=v:NoExecute"
    assert nf.eligible({"tolerations": [{"key": "k", "operator": "Exists", "tolerationSeconds": 30}]}, hard)
    two = mk("n", taints=[T_GPU, {"key": "k", "value": "v", "effect": "NoExecute"}])
    assert not nf.eligible({"tolerations": [{"key": "dedicated", "operator": "Exists"}]}, two)  # every taint
    assert nf.eligible({"tolerations": [{"key": "dedicated", "operator": "Exists"},
                                        {"key": "k", "value": "v"}]}, two)


def test_condition_taints_are_left_to_the_graphs_node_status() -> None:
    cordoned = mk("n", taints=[{"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}])
    assert not nf.eligible({}, cordoned)  # Kubernetes' rule, as such
    assert nf.eligible({}, cordoned, conditions=False)
    assert nf.fit({}, [cordoned]).eligible == ("n",)  # a short outage is not "can never run"


# ------------------------------------------------------------------ a group's nodes
NODES = [mk("kwok-node-0", {"disktype": "ssd"}), mk("kwok-node-1"), mk("kwok-node-2", taints=[T_GPU]),
         mk("kwok-node-3", {"disktype": "hdd"})]


def test_fit_names_eligible_nodes_and_why() -> None:
    f = nf.fit({"nodeSelector": {"disktype": "ssd"}}, NODES)
    assert f.eligible == ("kwok-node-0",) and f.restricted and not f.none
    assert "1 of 4 nodes" in f.reason and "nodeSelector disktype=ssd" in f.reason
    none = nf.fit({"nodeSelector": {"disktype": "nvme"}}, NODES)
    assert none.none and none.reason == "no node matches nodeSelector disktype=nvme"
    aff = nf.fit(affinity({"matchExpressions": [req("gpu", "Exists")]}), NODES)
    assert aff.none and aff.reason == "no node matches required node affinity [gpu Exists]"
    tainted = nf.fit({}, [NODES[2]])
    assert tainted.none and tainted.reason == "every node has a taint dedicated=gpu:NoSchedule the pods do not tolerate"
    mixed = nf.fit({"nodeSelector": {"disktype": "ssd"}}, [mk("t", {"disktype": "ssd"}, [T_GPU]), NODES[3]])
    assert mixed.none and "no node allows the pods" in mixed.reason
    assert "taint dedicated=gpu:NoSchedule" in mixed.reason and "nodeSelector disktype=ssd" in mixed.reason
    free = nf.fit({"tolerations": [{"operator": "Exists"}]}, NODES)
    assert not free.restricted and free.reason == ""


def test_node_view_changes_version_only_for_labels_and_taints() -> None:
    v = nf.NodeView()
    v.reset(NODES)
    version = v.version
    beat = copy.deepcopy(NODES[1])
    beat["status"] = {"conditions": [{"type": "Ready", "status": "True", "lastHeartbeatTime": "now"}]}
    assert not v.update("kwok-node-1", beat) and v.version == version  # a heartbeat
    cordon = copy.deepcopy(NODES[1])
    cordon["spec"]["taints"] = [{"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}]
    assert not v.update("kwok-node-1", cordon)  # a condition taint: the graph's status handles it
    relabel = copy.deepcopy(NODES[1])
    relabel["metadata"]["labels"] = {"disktype": "ssd"}
    assert v.update("kwok-node-1", relabel) and v.version > version
    assert v.fit({"nodeSelector": {"disktype": "ssd"}}).eligible == ("kwok-node-0", "kwok-node-1")
    assert v.update("kwok-node-0", None)
    assert v.fit({"nodeSelector": {"disktype": "ssd"}}).eligible == ("kwok-node-1",)
    assert not v.update("kwok-node-0", None)


# ------------------------------------------------------------------ jobspecs
@given(st.sets(st.from_regex(r"[a-z]([a-z0-9.-]{0,8}[a-z0-9])?", fullmatch=True), min_size=1, max_size=30))
def test_hostlist_encoding_round_trips(names: set[str]) -> None:
    entries = nf.encode_hostlist(names)
    out: list[str] = []
    for e in entries:
        out.extend(expand_hostlist(e))
    assert sorted(out) == sorted(names)


def test_hostlist_encoding_is_short_for_numbered_nodes() -> None:
    names = [f"kwok-node-{i}" for i in range(1000) if i != 500]
    assert nf.encode_hostlist(names) == ["kwok-node-[0-499,501-999]"]


USER_CONSTRAINTS = st.sampled_from([None, {}, {"properties": ["disktype"]},
                                    {"or": [{"hostlist": ["kwok-node-[0-1]"]}, {"ranks": ["3"]}]}])


@settings(max_examples=60)
@given(USER_CONSTRAINTS, st.sets(st.sampled_from([n["metadata"]["name"] for n in NODES])))
def test_constrain_adds_a_hostlist_and_unconstrained_gives_the_jobspec_back(
        own: dict[str, Any] | None, allowed: set[str]) -> None:
    d = jobspec_from_pods(2, PodRequest(1500)).to_dict()
    if own is not None:
        d["attributes"]["system"]["constraints"] = own
    js = parse_jobspec(d)
    f = nf.Fit(tuple(sorted(allowed)), len(NODES), "why")
    c = nf.constrain(js, f)
    back = nf.unconstrained(c)
    assert back.to_dict() == js.to_dict()
    if not f.restricted:
        assert c.to_dict() == js.to_dict() and nf.note(c) == ""
        return
    assert nf.note(c) == "; why"
    for n in NODES:  # the constraint: the user's AND the eligible nodes
        v = _vertex(n)
        assert c.constraint is not None
        expected = n["metadata"]["name"] in allowed and (js.constraint is None or js.constraint.match(v))
        assert c.constraint.match(v) is expected
    assert nf.constrain(c, f).to_dict() == c.to_dict()  # again: the same, not nested


def _vertex(n: dict[str, Any]) -> Any:
    class V:
        name = n["metadata"]["name"]
        rank = int(name.rsplit("-", 1)[1])
        properties = n["metadata"]["labels"] or None

    return V()


def test_constrain_text_round_trips_through_yaml() -> None:
    js = jobspec_from_pods(3, PodRequest(1000), duration=60)
    c = nf.constrain(js, nf.fit({"nodeSelector": {"disktype": "ssd"}}, NODES))
    again = parse_jobspec(c.to_yaml())  # what the FluxJob spec holds, read back after a restart
    assert again.constraint == c.constraint
    assert nf.unconstrained(again).to_dict() == js.to_dict()


# ------------------------------------------------------------------ the controller
def labelled(name: str, labels: dict[str, str] | None = None, taints: list[dict[str, str]] | None = None) -> dict[str, Any]:
    n = node(name)
    n["metadata"]["labels"].update(labels or {})
    if taints:
        n["spec"] = {"taints": taints}
    return n


def controller(*nodes: dict[str, Any]) -> Controller:
    c, _kube = make_controller()
    c.cluster.know_only(list(nodes))
    c.cluster.build_matcher()
    return c


def selector_job(name: str, size: int, pod_spec: dict[str, Any]) -> dict[str, Any]:
    j = job(name, size)
    j["spec"]["template"]["spec"].update(copy.deepcopy(pod_spec))
    return j


FOUR = ("n0", "n1", "n2", "n3")


def test_unrestricted_groups_keep_todays_jobspec() -> None:
    async def main() -> None:
        c = controller(*(labelled(n) for n in FOUR))
        c.handle(("Job", "ADDED", job("plain", 2)))
        g = c.groups[("ns", "job-plain")]
        before = g.jobspec
        await settle(c)
        assert g.jobspec is before and g.jobspec.constraint is None
        assert "nodefit" not in c.status.jobspec_text(g)
        assert str(g.phase) == "Running"

    asyncio.run(main())


def test_a_node_selector_group_runs_only_on_matching_nodes() -> None:
    async def main() -> None:
        c = controller(labelled("n0"), labelled("n1", {"disktype": "ssd"}), labelled("n2"),
                       labelled("n3", {"disktype": "ssd"}))
        c.handle(("Job", "ADDED", selector_job("ssd", 4, {"nodeSelector": {"disktype": "ssd"}})))
        g = c.groups[("ns", "job-ssd")]
        await settle(c)
        assert str(g.phase) == "Running", g.reason
        assert set(g.slots) <= {"n1", "n3"} and len(g.slots) == 4  # 2-cpu pods, 16-cpu nodes
        assert "hostlist" in c.status.jobspec_text(g) and "nodeSelector disktype=ssd" in c.status.jobspec_text(g)

    asyncio.run(main())


def test_a_tainted_node_is_used_only_by_tolerating_pods() -> None:
    async def main() -> None:
        taint = [{"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}]
        c = controller(labelled("n0", taints=taint), labelled("n1"))
        big = {"containers": [{"name": "c", "resources": {"requests": {"cpu": "16"}}}]}
        c.handle(("Job", "ADDED", selector_job("plain", 1, big)))
        tol = {**big, "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}]}
        c.handle(("Job", "ADDED", selector_job("tol", 1, tol)))
        await settle(c)
        plain, tolerant = c.groups[("ns", "job-plain")], c.groups[("ns", "job-tol")]
        assert plain.slots == ["n1"] and tolerant.slots == ["n0"]
        # a second intolerant 16-cpu pod waits for n1 instead of going to the tainted n0
        c.handle(("Job", "ADDED", selector_job("plain2", 1, big)))
        await settle(c)
        waiting = c.groups[("ns", "job-plain2")]
        assert str(waiting.phase) == "Pending" and waiting.slots == []
        # its reason says why it may not take the node that looks free
        assert waiting.reason == ("waiting for resources; the pods may use 1 of 2 nodes "
                                  "(excluded: 1 by taint dedicated=gpu:NoSchedule)")

    asyncio.run(main())


def test_no_eligible_node_is_unsatisfiable_with_the_rule_named() -> None:
    async def main() -> None:
        c = controller(*(labelled(n) for n in FOUR))
        c.handle(("Job", "ADDED", selector_job("nvme", 1, {"nodeSelector": {"disktype": "nvme"}})))
        g = c.groups[("ns", "job-nvme")]
        await settle(c)
        assert str(g.phase) == "Unsatisfiable"
        assert g.reason == "can never run on this cluster: no node matches nodeSelector disktype=nvme"
        # too few eligible nodes for the gang: the matcher's verdict says why nodes were excluded
        c.handle(("Job", "ADDED", selector_job("wide", 2, {
            "nodeSelector": {"kubernetes.io/hostname": "n0"},
            "containers": [{"name": "c", "resources": {"requests": {"cpu": "16"}}}]})))
        w = c.groups[("ns", "job-wide")]
        await settle(c)
        assert str(w.phase) == "Unsatisfiable" and "1 of 4 nodes" in w.reason, w.reason

    asyncio.run(main())


def test_node_changes_refit_waiting_groups() -> None:
    async def main() -> None:
        c = controller(labelled("n0"), labelled("n1"))
        big = {"containers": [{"name": "c", "resources": {"requests": {"cpu": "16"}}}]}
        c.handle(("Job", "ADDED", selector_job("hog", 2, big)))  # fills both nodes
        await settle(c)
        assert str(c.groups[("ns", "job-hog")].phase) == "Running"
        c.handle(("Job", "ADDED", selector_job("ssd", 1, {**big, "nodeSelector": {"disktype": "ssd"}})))
        # not queued yet when judged? it is queued at once (a Job): no node is ssd -> unsatisfiable
        await settle(c)
        assert str(c.groups[("ns", "job-ssd")].phase) == "Unsatisfiable"
        # a group waiting for a busy cluster follows a relabel: n1 gets ssd, the group may only use n1
        c.handle(("Job", "ADDED", selector_job("any", 1, {**big, "nodeSelector": {"pool": "x"}})))
        c.handle(("Node", "MODIFIED", labelled("n0", {"pool": "x"})))
        await settle(c)
        g = c.groups[("ns", "job-any")]
        assert str(g.phase) in ("Pending", "Reserved") and "n0" in c.status.jobspec_text(g)
        c.handle(("Node", "MODIFIED", labelled("n0")))
        c.handle(("Node", "MODIFIED", labelled("n1", {"pool": "x"})))
        c.scheduling.run_cycle()
        assert "n1" in c.status.jobspec_text(g) and "n0" not in c.status.jobspec_text(g).split("nodefit")[0]

    asyncio.run(main())


def test_a_jobspec_read_back_after_a_restart_is_fitted_to_todays_nodes() -> None:
    async def main() -> None:
        c = controller(labelled("n0", {"pool": "x"}), labelled("n1"))
        big = {"containers": [{"name": "c", "resources": {"requests": {"cpu": "16"}}}]}
        c.handle(("Job", "ADDED", selector_job("hog", 2, big)))
        await settle(c)
        c.handle(("Job", "ADDED", selector_job("any", 1, {**big, "nodeSelector": {"pool": "x"}})))
        await settle(c)
        g = c.groups[("ns", "job-any")]
        text = c.status.jobspec_text(g)
        assert "hostlist" in text and "- n0" in text
        # as recover() does with the FluxJob's spec.jobspec; meanwhile the pool moved to n1
        g.jobspec = parse_jobspec(text)
        c.cluster.on_node("MODIFIED", labelled("n0"))
        c.cluster.on_node("MODIFIED", labelled("n1", {"pool": "x"}))
        c.scheduling.run_cycle()
        after = c.status.jobspec_text(g)
        assert "- n1" in after and "- n0" not in after and after.count("hostlist") == 1, after

    asyncio.run(main())
