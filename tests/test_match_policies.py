"""The `locality` and `variation` match policies and `set-property` (Fluxion semantics,
fluxion-spec §4.5-4.6; the recorded Fluxion answers are replayed in test_conformance.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from fluxnetes.graph import load_graph
from fluxnetes.graph.model import Vertex
from fluxnetes.jobspec import parse_jobspec
from fluxnetes.match import POLICIES, Matcher, MatchError, MatchStatus
from fluxnetes.match.scoring import perf_class, score_runs
from fluxnetes.match.session import Session
from helpers import cli_app

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "examples" / "graphs" / "demo.yaml"  # 2 racks x 4 nodes (ids 0-7), 2 sockets x 4 cores
TIE_BREAKS = ("stable", "fluxion")


def js(resources: list[dict[str, Any]]) -> Any:
    return parse_jobspec({"version": 9999, "resources": resources,
                          "tasks": [{"command": ["a"], "slot": "s", "count": {"per_slot": 1}}],
                          "attributes": {"system": {"duration": 3600}}})


def nodes_x(n: int) -> Any:
    """node[n] exclusive -> slot -> core[1]"""
    return js([{"type": "node", "count": n, "exclusive": True,
                "with": [{"type": "slot", "count": 1, "label": "s", "with": [{"type": "core", "count": 1}]}]}])


def names(r: Any) -> list[str]:
    assert r.status is MatchStatus.ALLOCATED, r.reason
    return sorted(n.name for n in r.nodes)


def test_policies_are_known_everywhere_policies_are_checked() -> None:
    assert {"locality", "variation", "firstnodex"} <= set(POLICIES)
    with pytest.raises(MatchError, match=r"locality.*variation"):
        Matcher(load_graph(DEMO), "nearest")


@pytest.mark.parametrize(("raw", "want"), [
    (None, 9999), ("3", 3), ("0", 0), ("9999", 9999), ("+5", 5), ("  7", 7), ("12abc", 12),
    ("-1", 9999), ("10000", 9999), ("abc", 9999), ("", 9999), ("99999999999999", 9999), (" -0", 0),
])
def test_perf_class_is_read_as_fluxion_reads_it(raw: str | None, want: int) -> None:
    v = Vertex("node", name="node0", properties={"perf_class": raw} if raw is not None else {"ssd": ""})
    assert perf_class(v) == want


def test_score_runs_join_consecutive_integers() -> None:
    assert score_runs({2, 3, 4, 6, 8, 9}) == {2: 2, 3: 2, 4: 2, 6: 6, 8: 8, 9: 8}
    assert score_runs(set()) == {}


@pytest.mark.parametrize("tie_break", TIE_BREAKS)
def test_locality_ranks_candidates_by_their_run_of_consecutive_ids(tie_break: str) -> None:
    # free nodes 0,1,2 | 4 | 6 (3, 5, 7 down): runs start at ids 0, 4 and 6; the highest runs
    # come first, and inside the run 0-2 the first one found (node0), where `high` takes node2
    got = {}
    for policy in ("locality", "high"):
        m = Matcher(load_graph(DEMO), policy, tie_break=tie_break)
        for n in ("node3", "node5", "node7"):
            m.set_status(n, False)
        got[policy] = names(m.allocate(nodes_x(3)))
        m.check_invariants()
    assert got == {"locality": ["node0", "node4", "node6"], "high": ["node2", "node4", "node6"]}


@pytest.mark.parametrize("tie_break", TIE_BREAKS)
def test_variation_prefers_the_lowest_perf_class(tie_break: str) -> None:
    m = Matcher(load_graph(DEMO), "variation", tie_break=tie_break)
    for i, pc in enumerate([3, 1, 2, 1, 4, 4, 0, 2]):
        m.set_property(f"/cluster0/rack{i // 4}/node{i}", "perf_class", str(pc))
    order = [names(m.allocate(nodes_x(1)))[0] for _ in range(4)]
    assert order[0] == "node6"  # class 0
    assert sorted(order[1:3]) == ["node1", "node3"]  # class 1
    assert order[3] in ("node2", "node7")  # class 2
    # a node without perf_class (or an invalid one) counts as the worst class, 9999
    m2 = Matcher(load_graph(DEMO), "variation", tie_break=tie_break)
    for i in range(8):
        m2.set_property(f"node{i}", "perf_class", "7" if i != 5 else "fast")
    m2.set_property("node4", "perf_class", "6")
    assert "node4" in names(m2.allocate(nodes_x(1)))
    assert names(m2.allocate(nodes_x(6))) == ["node0", "node1", "node2", "node3", "node6", "node7"]
    m.check_invariants()
    m2.check_invariants()


def test_set_property_affects_later_matches_only() -> None:
    m = Matcher(load_graph(DEMO), "variation")
    for i in range(8):
        m.set_property(f"node{i}", "perf_class", "5")
    m.set_property("node3", "perf_class", "1")
    first = m.allocate(nodes_x(1))
    assert names(first) == ["node3"]
    m.set_property("node5", "perf_class", "0")
    assert names(m.allocate(nodes_x(1))) == ["node5"]
    # the result already returned keeps the properties it was emitted with
    node3 = next(v for v in first.vertices if v.name == "node3")
    assert node3.properties == {"perf_class": "1"}
    m.set_property("node3", "perf_class", "2")
    assert node3.properties == {"perf_class": "1"}
    assert m.graph.get("node3").properties == {"perf_class": "2"}
    with pytest.raises(MatchError, match="no vertex with path or name 'node99'"):
        m.set_property("node99", "perf_class", "1")
    with pytest.raises(MatchError, match="property name"):
        m.set_property("node1", "", "1")


@pytest.mark.parametrize("policy", ["locality", "variation"])
def test_new_policies_reserve_cancel_and_keep_invariants(policy: str) -> None:
    m = Matcher(load_graph(DEMO), policy)
    ids = []
    for _ in range(8):
        r = m.allocate_orelse_reserve(nodes_x(1))
        assert r.status is MatchStatus.ALLOCATED
        ids.append(r.jobid)
    r = m.allocate_orelse_reserve(nodes_x(2))
    assert r.status is MatchStatus.RESERVED and r.at == 3600
    assert m.allocate_with_satisfiability(nodes_x(9)).status is MatchStatus.UNSATISFIABLE
    m.cancel(ids[0])
    m.check_invariants()
    assert m.allocate(nodes_x(1)).status is MatchStatus.ALLOCATED
    m.check_invariants()


def test_session_set_property_command() -> None:
    out: list[str] = []
    errs: list[str] = []
    sess = Session(Matcher(load_graph(DEMO), "variation"), out=out.append, err=errs.append)
    lines = ["set-property /cluster0/rack1/node6 perf_class=0", "set-property node2 perf_class",
             "set-property nodeX perf_class=1", "set-property node1 =3"]
    assert sess.run(lines) == 3
    assert out == ["/cluster0/rack1/node6: perf_class=0"]
    assert "usage: set-property PATH KEY=VALUE" in errs[0] and "nodeX" in errs[1] and "usage" in errs[2]
    assert sess.matcher.graph.get("node6").properties == {"ssd": "", "perf_class": "0"}  # others kept


def test_cli_variation_session(tmp_path: Path) -> None:
    from fluxnetes.cli import match_cmd

    spec = tmp_path / "node1x.yaml"
    spec.write_text("""version: 9999
resources:
  - type: node
    count: 1
    exclusive: true
    with:
      - type: slot
        count: 1
        label: s
        with:
          - type: core
            count: 1
tasks:
  - command: [app]
    slot: s
    count: {per_slot: 1}
attributes: {system: {duration: 60}}
""")
    cmds = tmp_path / "cmds"
    cmds.write_text("set-property node5 perf_class=2\nset-property node2 perf_class=1\n"
                    "match allocate node1x.yaml\nmatch allocate node1x.yaml\n")
    app = cli_app(match_cmd)
    res = CliRunner().invoke(app, ["match", "--graph", str(DEMO), "--policy", "variation",
                                   "--commands", str(cmds)])
    assert res.exit_code == 0, res.output
    first, second = res.output.split("INFO: JOBID=1")[0], res.output.split("INFO: JOBID=1")[1]
    assert "node2[1:x]" in first and "node5[1:x]" in second
    res = CliRunner().invoke(app, ["match", "--graph", str(DEMO), "--policy", "locality",
                                   "--commands", str(cmds)])
    assert res.exit_code == 0, res.output
    assert "RESOURCES=ALLOCATED" in res.output


def test_variation_on_a_kubernetes_graph_reads_the_node_label() -> None:
    from fluxnetes.graph import from_k8s_nodes
    from fluxnetes.jobspec import PodRequest, jobspec_from_pods

    classes = {"w0": "3", "w1": "1", "w2": None, "w3": "2"}
    nodes = [{"metadata": {"name": n, "labels": {"perf_class": c} if c is not None else {}},
              "status": {"allocatable": {"cpu": "4", "memory": "8Gi"},
                         "conditions": [{"type": "Ready", "status": "True"}]}} for n, c in classes.items()]
    m = Matcher(from_k8s_nodes(nodes), "variation")
    whole = jobspec_from_pods(1, PodRequest(cpu_millis=1000), exclusive_nodes=True)
    assert [names(m.allocate(whole)) for _ in range(4)] == [["w1"], ["w3"], ["w0"], ["w2"]]
    m.check_invariants()
