"""`--racks N`: a generated rack level for machines given by size, and how jobs spread."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fluxnetes.cli.main import app
from fluxnetes.sim.engine import JobOutcome, SimJob
from fluxnetes.sim.machine import MachineError, machine_from_size, rack_sizes
from fluxnetes.sim.topology import fragmentation, rack_spread, racks_of


def test_racks_split_the_nodes_evenly_and_keep_node_names() -> None:
    assert rack_sizes(10, 3) == [4, 3, 3]
    machine = machine_from_size(10, 2, racks=3)
    rack_of = racks_of(machine.graph)
    assert [rack_of[f"node{i}"] for i in range(10)] == ["rack0"] * 4 + ["rack1"] * 3 + ["rack2"] * 3
    assert machine.node_cores() == {f"node{i}": 2 for i in range(10)}
    assert racks_of(machine_from_size(4, 1).graph) == {}  # no rack level without --racks
    with pytest.raises(MachineError, match="--racks"):
        machine_from_size(4, 1, racks=5)


def test_rack_spread_counts_multi_node_jobs_only() -> None:
    rack_of = {"a": "r0", "b": "r0", "c": "r1"}

    def ran(shares: tuple[tuple[str, int], ...]) -> JobOutcome:
        return JobOutcome(SimJob("j", 0, 1, 1, 1), start=0, end=1, shares=shares)

    spread = rack_spread([ran((("a", 1),)), ran((("a", 1), ("b", 1))),
                          ran((("b", 1), ("c", 1))), JobOutcome(SimJob("k", 0, 1, 1, 2))], rack_of)
    assert spread["multi_node_jobs"] == 2 and spread["spanning_racks"] == 1
    assert spread["mean_racks"] == 1.5 and spread["mean_excess_racks"] == 0.5
    assert rack_spread([], {}) == {}


def test_cli_racks(tmp_path: Path) -> None:
    path = tmp_path / "t.swf"
    path.write_text("; MaxNodes: 4\n; MaxProcs: 4\n"
                    "1 0 -1 10 2 -1 -1 2 10 -1 1 1 1 -1 1 -1 -1 -1\n"
                    "2 1 -1 10 2 -1 -1 2 10 -1 1 1 1 -1 1 -1 -1 -1\n")
    cli = CliRunner()
    result = cli.invoke(app, ["simulate", str(path), "--racks", "2", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["racks"]["multi_node_jobs"] == 2 and data["matcher_calls"] > 0
    result = cli.invoke(app, ["simulate", str(path), "--racks", "9"])
    assert result.exit_code == 2 and "--racks" in result.stderr
    graph = tmp_path / "g.yaml"
    graph.write_text("nodes: 2\nnode: {sockets: 0, cores: 2}\n")
    result = cli.invoke(app, ["simulate", str(path), "--graph", str(graph), "--racks", "2"])
    assert result.exit_code == 2 and "--racks" in result.stderr


def _node(name: str, rack: str, cpu: str) -> dict[str, object]:
    return {"metadata": {"name": name, "labels": {"fluxnetes.io/rack": rack}},
            "status": {"conditions": [{"type": "Ready", "status": "True"}],
                       "allocatable": {"cpu": cpu, "memory": "8Gi", "pods": "110"},
                       "capacity": {"cpu": cpu, "memory": "8Gi", "pods": "110"}}}


def test_cli_from_cluster_builds_the_operators_graph(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from fluxnetes.cli.ctl import common

    nodes = [_node(f"n{i}", f"r{i // 2}", "2") for i in range(4)]
    seen: list[object] = []

    def fetch(conn: common.Conn, **kwargs: object) -> common.ClusterView:
        seen.append(conn.kubeconfig)
        return common.ClusterView(nodes=nodes)

    monkeypatch.setattr(common, "fetch", fetch)
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("apiVersion: v1\n")
    path = tmp_path / "t.swf"
    path.write_text("1 0 -1 10 3 -1 -1 3 10 -1 1 1 1 -1 1 -1 -1 -1\n"
                    "2 1 -1 10 2 -1 -1 2 10 -1 1 1 1 -1 1 -1 -1 -1\n")
    cli = CliRunner()
    result = cli.invoke(app, ["simulate", str(path), "--from-cluster", str(kubeconfig), "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert seen == [kubeconfig] and data["jobs"] == 2 and data["cores"] == 8
    assert data["racks"]["multi_node_jobs"] >= 1  # racks from the Nodes' labels
    result = cli.invoke(app, ["simulate", str(path), "--from-cluster", str(tmp_path / "none")])
    assert result.exit_code == 2 and "no such kubeconfig" in result.stderr
    result = cli.invoke(app, ["simulate", str(path), "--from-cluster", str(kubeconfig),
                              "--nodes", "2", "--cores", "1"])
    assert result.exit_code == 2 and "one way" in result.stderr


def test_pack_racks_keeps_a_job_in_one_rack_where_first_spreads_it(tmp_path: Path) -> None:
    """4 one-core nodes in 2 racks, whole nodes: jobs 1 and 2 take a node in each rack
    (`first` balances availability), so job 3 (2 nodes) spans both racks at once under
    `first`; rack-packed, it waits for a whole rack."""
    path = tmp_path / "t.swf"
    path.write_text("; MaxNodes: 4\n; MaxProcs: 4\n"
                    "1 0 -1 100 1 -1 -1 1 100 -1 1 1 1 -1 1 -1 -1 -1\n"
                    "2 1 -1 100 1 -1 -1 1 100 -1 1 1 1 -1 1 -1 -1 -1\n"
                    "3 2 -1 10 2 -1 -1 2 10 -1 1 1 1 -1 1 -1 -1 -1\n")
    cli = CliRunner()
    rack_of = {"node0": "rack0", "node1": "rack0", "node2": "rack1", "node3": "rack1"}
    placed: dict[str, tuple[int, set[str]]] = {}
    for pack in ("none", "racks"):
        csv_file = tmp_path / f"{pack}.csv"
        result = cli.invoke(app, ["simulate", str(path), "--racks", "2", "--whole-nodes",
                                  "--pack", pack, "--csv", str(csv_file), "--json"])
        assert result.exit_code == 0, result.output
        data = json.loads(result.stdout)
        assert data["jobs"] == 3 and "fragmentation" in data
        for line in csv_file.read_text().splitlines()[1:]:
            fields = line.split(",")
            if fields[1] == "3":
                placed[pack] = (int(fields[3]), {rack_of[n] for n in fields[9].split()})
    assert placed["none"] == (2, {"rack0", "rack1"})
    assert placed["racks"][0] == 100 and len(placed["racks"][1]) == 1


def test_pack_racks_bad_combinations_name_the_flag(tmp_path: Path) -> None:
    path = tmp_path / "t.swf"
    path.write_text("; MaxNodes: 4\n; MaxProcs: 4\n1 0 -1 10 2 -1 -1 2 10 -1 1 1 1 -1 1 -1 -1 -1\n")
    cli = CliRunner()
    for args, words in ((["--racks", "2"], "needs --whole-nodes"),
                        (["--whole-nodes"], "no racks"),
                        (["--racks", "2", "--whole-nodes", "--engine", "count"], "queue engine"),
                        (["--racks", "2", "--whole-nodes", "--pack", "rack"], "must be racks or none")):
        result = cli.invoke(app, ["simulate", str(path), *args,
                                  *([] if "--pack" in args else ["--pack", "racks"])])
        assert result.exit_code == 2 and "--pack" in result.stderr and words in result.stderr, result.output


def test_fragmentation_is_a_time_average_of_the_free_machine() -> None:
    node_cores = {"a": 2, "b": 2, "c": 2, "d": 2}
    rack_of = {"a": "r0", "b": "r0", "c": "r1", "d": "r1"}
    # [0, 10): a 1-core job on a (1 free core stranded on a, free: r0 3, r1 4);
    # [10, 20): also a whole-node 1-processor job holding c (1 core held, not asked for)
    jobs = [JobOutcome(SimJob("1", 0, 20, 20, 1), start=0, end=20, cores=1, shares=(("a", 1),)),
            JobOutcome(SimJob("2", 0, 10, 10, 1), start=10, end=20, cores=2, shares=(("c", 2),))]
    frag = fragmentation(jobs, node_cores, rack_of)
    assert frag["stranded_core_share"] == pytest.approx(1 / 8)
    assert frag["held_unused_share"] == pytest.approx(0.5 * 1 / 8)
    # free outside the freest rack: [0, 10) 3 of 7, [10, 20) 2 of 5
    assert frag["rack_fragmentation"] == pytest.approx(0.5 * 3 / 7 + 0.5 * 2 / 5)
    assert fragmentation([], node_cores, rack_of) == {}
